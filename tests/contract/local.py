"""The local backend's adapter: the scripted command (:mod:`.scripted`) in the bubblewrap frame,
every outcome the frame's own, as the supervisor records it."""

from __future__ import annotations

from tao_data_io.backends.local.backend import LocalBackend

from ..helpers import job_processes
from .harness import Launched
from .scripted import ScriptedHarness


class LocalHarness(ScriptedHarness):
    name = "local"
    cannot = {"oom": "a kernel OOM kill is a SIGKILL like any other to the frame: it reads 'killed, possibly out "
                     "of memory' (the SIGKILL row), never an OOM kill for certain"}
    backend: LocalBackend

    def unknown_ref(self) -> str:
        return "local/never-submitted"

    def running(self, job: Launched) -> list[str]:
        return sorted(job_processes(self.backend, job.job_id).values())
