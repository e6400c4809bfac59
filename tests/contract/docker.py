"""The Docker backend's adapter, against the session's own dockerd (:mod:`tests.docker_daemon`):
the job's command is a real ``sh`` in a container of the busybox test image that does, step by
step, what the suite writes into its ``/control`` mount (print, write ``status.json``, leave
results, exit, be killed by a signal, allocate past its memory limit) — so every outcome is the
container's own, as the daemon reports it."""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tao_data_io.backends.docker.backend import DockerBackend
from tao_data_io.backends.docker.containers import JOB_LABEL, RUN_LABEL
from tao_data_io.backends.docker.settings import DockerSettings
from tao_data_io.launch.plan import LaunchPlan
from tao_data_io.request import JobRequest

from ..docker_daemon import DockerDaemon
from ..helpers import wait_for
from .harness import Ending, Harness, Launched
from .local import PROGRAM

#: The container's memory limit: what the OOM ending allocates past.
MEMORY = "64Mi"
DEADLINE_SECONDS = 2


def docker_backend(daemon: DockerDaemon, run_root: Path) -> DockerBackend:
    return DockerBackend(DockerSettings(docker_host=daemon.host, run_root=str(run_root), cancel_grace_seconds=5))


class DockerHarness(Harness):
    name = "docker"
    backend: DockerBackend

    def __init__(self, daemon: DockerDaemon, tmp_path: Path, environ: Mapping[str, str]) -> None:
        super().__init__(docker_backend(daemon, tmp_path / "docker"), tmp_path, environ)
        self.daemon = daemon
        self._next: dict[str, int] = {}

    def control(self, job_id: str) -> Path:
        return self.tmp_path / f"control-{job_id}"

    def request(self, job_id: str, *, verify_fails: bool, deadline: bool) -> JobRequest:
        control = self.control(job_id)
        control.mkdir(exist_ok=True)
        control.chmod(0o1777)  # a read-write mount: writable by the job's user, whoever that is
        for done in [*control.glob("do-*"), *control.glob("done-*")]:  # an earlier attempt's
            done.unlink()
        self._next[job_id] = 0
        mounts: list[dict[str, Any]] = [{"source": str(control), "target": "/control", "read_only": False}]
        if verify_fails:
            unreadable = self.tmp_path / "unreadable"
            unreadable.mkdir(mode=0, exist_ok=True)  # the container's user cannot read it
            mounts.append({"source": str(unreadable), "target": "/unreadable"})
        shape: dict[str, Any] = {"gpus": 0, "memory": MEMORY, "shm_size": "16Mi", "ephemeral_storage": "16Mi"}
        if deadline:
            shape["deadline_seconds"] = 60
        return JobRequest.model_validate({
            "schema_version": "1", "job_id": job_id, "image": self.daemon.image, "mode": "args",
            "command": ["/bin/sh", "-c"], "args": [PROGRAM], "mounts": mounts, "compute_shape": shape})

    def tune(self, plan: LaunchPlan, *, deadline: bool) -> LaunchPlan:
        return plan.model_copy(update={"deadline_seconds": DEADLINE_SECONDS}) if deadline else plan

    def unknown_ref(self) -> str:
        return "docker/never-submitted"

    def starts(self, job: Launched) -> int:
        started = self.control(job.job_id) / "started"
        return len(started.read_text().splitlines()) if started.exists() else 0

    def running(self, job: Launched) -> list[str]:
        found = self.daemon.client.containers.list(filters={"label": [f"{JOB_LABEL}={job.job_id}",
                                                                       f"{RUN_LABEL}={self.backend.run_root}"]})
        return sorted(container.name for container in found)

    def close(self) -> None:
        """Cancel what a failed test left running: the daemon is the session's, shared by every test."""
        for run in self.backend.run_root.glob("*/run"):
            self.backend.cancel(f"docker/{run.parent.name}")

    def found_at_start(self, job: Launched) -> set[str]:
        return set((self.control(job.job_id) / "found").read_text().splitlines()[-1].split())

    def print(self, job: Launched, lines: list[str]) -> None:
        self._do(job, "printf '%s\\n' " + " ".join(shlex.quote(line) for line in lines))
        wait_for("the lines to reach the job's log", lambda: lines[-1] in self.backend.logs(job.ref))

    def progress(self, job: Launched, events: list[dict[str, Any]]) -> None:
        self._do(job, "printf '%s\\n' " + " ".join(shlex.quote(json.dumps(event)) for event in events)
                 + ' >> "$TAO_RESULTS_DIR/status.json"')

    def leave_results(self, job: Launched, files: Mapping[str, bytes]) -> None:
        self._do(job, "\n".join(f'printf %s {shlex.quote(data.decode())} > "$TAO_RESULTS_DIR"/{shlex.quote(name)}'
                                for name, data in files.items()))

    def end(self, job: Launched, ending: Ending) -> None:
        # A child is killed by the signal and the command exits with its status, as a shell
        # entrypoint does; the OOM killer takes the biggest process of the container: dd's buffer.
        said = {"exit": f"exit {ending.number}", "signal": f"sh -c 'kill -{ending.number} $$'; exit $?",
                "oom": "dd if=/dev/zero of=/dev/null bs=256M count=1; exit $?"}
        self._do(job, said[ending.kind], wait=False)

    def pass_deadline(self, job: Launched) -> None:
        """The frame's clock runs: its :data:`DEADLINE_SECONDS` pass on their own."""

    def _do(self, job: Launched, script: str, *, wait: bool = True) -> None:
        n = self._next[job.job_id]
        self._next[job.job_id] = n + 1
        control = self.control(job.job_id)
        (control / f".do-{n}").write_text(script + "\n")
        os.replace(control / f".do-{n}", control / f"do-{n}")  # whole, or not there
        if wait:
            wait_for(f"the command to run instruction {n}", lambda: (control / f"done-{n}").exists())
