"""The fake backend's adapter: its knobs (the verdict, the outcome, polls until the end, lines to
print) and the files a job writes in its results directory on this host."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tao_data_io.request import JobRequest

from ..fake_backend import FakeBackend
from ..helpers import write_tree
from .harness import Ending, Harness, Launched

#: Status polls before a fake job ends on its own: never, until the suite ends it.
FOREVER = 10**9


class FakeHarness(Harness):
    name = "fake"
    cannot = {"signal": "the fake runs no process for a signal to end",
              "oom": "the fake runs no process for the kernel to kill",
              "deadline": "the fake keeps no clock: nothing ends it at a deadline"}
    backend: FakeBackend

    def __init__(self, tmp_path: Path, environ: Mapping[str, str]) -> None:
        super().__init__(FakeBackend(tmp_path / "fake-results", polls_until_done=FOREVER), tmp_path, environ)

    def request(self, job_id: str, *, verify_fails: bool, deadline: bool) -> JobRequest:
        fake = self.backend
        fake.verify_ok, fake.outcome, fake.polls_until_done = not verify_fails, "COMPLETE", FOREVER
        return JobRequest.model_validate({"schema_version": "1", "job_id": job_id, "image": "fake", "mode": "args",
                                          "command": ["train"], "args": []})

    def unknown_ref(self) -> str:
        return "fake/never-submitted"

    def starts(self, job: Launched) -> int:
        return self.backend.commands_started(job.ref)

    def running(self, job: Launched) -> list[str]:
        return [job.ref] if self.backend.running(job.ref) else []

    def found_at_start(self, job: Launched) -> set[str]:
        """The fake's command writes nothing before its end: what is there now is what it found."""
        return {path.name for path in self._results(job).iterdir()}

    def print(self, job: Launched, lines: list[str]) -> None:
        self.backend.say(job.ref, lines)

    def progress(self, job: Launched, events: list[dict[str, Any]]) -> None:
        status = self._results(job) / "status.json"
        with status.open("a") as written:
            written.writelines(json.dumps(event) + "\n" for event in events)

    def leave_results(self, job: Launched, files: Mapping[str, bytes]) -> None:
        write_tree(self._results(job), files)

    def end(self, job: Launched, ending: Ending) -> None:
        self.backend.outcome = "COMPLETE" if ending.number == 0 else "ERROR"
        self.backend.exit_code, self.backend.polls_until_done = ending.number, 0

    def _results(self, job: Launched) -> Path:
        path = Path(str(self.backend.results_path(job.ref)))
        path.mkdir(parents=True, exist_ok=True)
        return path
