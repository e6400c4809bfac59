"""The adapter of a backend that runs real commands (the local frame, Docker): the job's command
is a real ``sh`` that does, step by step, what the suite writes into its ``/control`` mount (print,
write ``status.json``, leave results, exit, be killed by a signal) — so every outcome is the
frame's own, as the backend records it. Each such backend's adapter says only how its job is
asked for (:meth:`ScriptedHarness.shape`, its image) and how to see what still runs."""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tao_data_io.launch.backend import Backend
from tao_data_io.launch.plan import LaunchPlan
from tao_data_io.request import JobRequest

from ..helpers import wait_for
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


class ScriptedHarness(Harness):
    #: The request's image.
    image = "local"

    def __init__(self, backend: Backend, tmp_path: Path, environ: Mapping[str, str]) -> None:
        super().__init__(backend, tmp_path, environ)
        self._next: dict[str, int] = {}

    def shape(self) -> dict[str, Any]:
        """The request's ``compute_shape`` (with a deadline when the test asks for one)."""
        return {}

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
        shape = {**self.shape(), **({"deadline_seconds": 60} if deadline else {})}
        return JobRequest.model_validate({
            "schema_version": "1", "job_id": job_id, "image": self.image, "mode": "args", "command": ["/bin/sh", "-c"],
            "args": [PROGRAM], "mounts": mounts, "compute_shape": shape})

    def tune(self, plan: LaunchPlan, *, deadline: bool) -> LaunchPlan:
        return plan.model_copy(update={"deadline_seconds": DEADLINE_SECONDS}) if deadline else plan

    def starts(self, job: Launched) -> int:
        started = self.control(job.job_id) / "started"
        return len(started.read_text().splitlines()) if started.exists() else 0

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
        # The command is its frame's pid 1 (or the child of an init), so a child is killed by the
        # signal and the command exits with its status, as a shell entrypoint does; the OOM killer
        # takes the biggest process of a memory-limited frame: dd's buffer.
        said = {"exit": f"exit {ending.number}", "signal": f"sh -c 'kill -{ending.number} $$'; exit $?",
                "oom": "dd if=/dev/zero of=/dev/null bs=256M count=1; exit $?"}
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
