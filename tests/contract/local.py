"""The local backend's adapter: the job's command is a real ``sh`` in the bubblewrap frame that
does, step by step, what the suite writes into its ``/control`` mount (print, write
``status.json``, leave results, exit, be killed by a signal) — so every outcome is the frame's
own, as the supervisor records it."""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tao_data_io.launch.plan import LaunchPlan
from tao_data_io.backends.local.backend import LocalBackend
from tao_data_io.request import JobRequest

from ..helpers import job_processes, wait_for
from .harness import Ending, Harness, Launched

#: The job's command: it notes what its results directory holds and that it started, then runs
#: each instruction ``/control/do-N`` in turn (sourced: an ``exit`` in one ends the command) and
#: says it is done with it (``/control/done-N``).
PROGRAM = r"""
ls -A "$TAO_RESULTS_DIR" | tr '\n' ' ' >> /control/found; echo >> /control/found
echo started >> /control/started
n=0
while :; do
  if [ -e /control/do-$n ]; then
    . /control/do-$n
    : > /control/done-$n
    n=$((n + 1))
  else
    sleep 0.02
  fi
done
"""
#: The frame's deadline here: a request may ask for no less than 60 s.
DEADLINE_SECONDS = 2


class LocalHarness(Harness):
    name = "local"
    cannot = {"oom": "a kernel OOM kill is a SIGKILL like any other to the frame: it reads 'killed, possibly out "
                     "of memory' (the SIGKILL row), never an OOM kill for certain"}
    backend: LocalBackend

    def __init__(self, backend: LocalBackend, tmp_path: Path, environ: Mapping[str, str]) -> None:
        super().__init__(backend, tmp_path, environ)
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
            unreadable.mkdir(mode=0, exist_ok=True)  # the frame's user cannot read it
            mounts.append({"source": str(unreadable), "target": "/unreadable"})
        return JobRequest.model_validate({
            "schema_version": "1", "job_id": job_id, "image": "local", "mode": "args", "command": ["/bin/sh", "-c"],
            "args": [PROGRAM], "mounts": mounts,
            "compute_shape": {"deadline_seconds": 60} if deadline else {}})

    def tune(self, plan: LaunchPlan, *, deadline: bool) -> LaunchPlan:
        return plan.model_copy(update={"deadline_seconds": DEADLINE_SECONDS}) if deadline else plan

    def unknown_ref(self) -> str:
        return "local/never-submitted"

    def starts(self, job: Launched) -> int:
        started = self.control(job.job_id) / "started"
        return len(started.read_text().splitlines()) if started.exists() else 0

    def running(self, job: Launched) -> list[str]:
        return sorted(job_processes(self.backend, job.job_id).values())

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
        # The command is its frame's pid 1, which (as a container's) ignores even SIGKILL from inside
        # its namespace: the kernel's is outside it. So a child is killed by the signal, and the
        # command exits with its status, as a shell entrypoint does.
        said = {"exit": f"exit {ending.number}", "signal": f"sh -c 'kill -{ending.number} $$'; exit $?"}
        self._do(job, said[ending.kind], wait=False)

    def pass_deadline(self, job: Launched) -> None:
        """The frame's clock runs: its :data:`DEADLINE_SECONDS` pass on their own."""

    def _do(self, job: Launched, script: str, *, wait: bool = True) -> None:
        """Have the command run ``script`` next; with ``wait``, return once it has."""
        n = self._next[job.job_id]
        self._next[job.job_id] = n + 1
        control = self.control(job.job_id)
        (control / f".do-{n}").write_text(script + "\n")
        os.replace(control / f".do-{n}", control / f"do-{n}")  # whole, or not there
        if wait:
            wait_for(f"the command to run instruction {n}", lambda: (control / f"done-{n}").exists())
