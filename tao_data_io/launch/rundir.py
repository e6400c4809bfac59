"""A job's run directory on this host, for backends that keep each job's state here (the local
frame's supervisor records, the Docker backend's decisions and saved logs): owner-only, each
record a JSON file written whole, and earlier attempts put away beside the current one.

Why shared: what the directory must guarantee — no reader ever sees half a record, no other user
reads a log of the job's output, an attempt's files never mix with the next one's — is the same
whichever backend writes the records in it; what records it holds is each backend's own.
"""

from __future__ import annotations

from datetime import datetime
import os
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel

from ..errors import UsageError
from ..fs.atomic import atomic_write
from ..fs.reading import read_job_file
from ..names import is_job_id
from ..schema import Strict
from ..vocabulary import TERMINAL_STATES
from .backend import FailureAnalysis, JobStatus
from .plan import LaunchPlan
from .probe import Verdict
from .sources import mark_state_root
from .training import STATUS_FILE, STATUS_TAIL_BYTES

Model = TypeVar("Model", bound=BaseModel)
ATTEMPTS = "attempts"


class LaunchRecord(Strict):
    """What every such backend's launch record holds (each adds its own): the plan submit ran, and
    where on this host the job writes its results."""

    plan: LaunchPlan
    #: The host directory the job's frame writes at ``plan.results_dir``.
    results_host: str


Record = TypeVar("Record", bound=LaunchRecord)


class CancelRequest(Strict):
    """That a cancel was asked, and when: once the job has ended, its status reads CANCELED."""

    requested_at: datetime


class RunFiles(Generic[Record]):
    """``<run root>/<job id>/run``: its lock, its launch record, and the records a backend adds."""

    #: The backend's launch record.
    launch_model: ClassVar[type[LaunchRecord]]

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = path / ".lock"
        self.launch_file = path / "launch.json"
        self.verdict_file = path / "verdict.json"
        self.cancel_file = path / "cancel.json"

    def create(self) -> None:
        """Owner-only: the logs hold whatever the job prints."""
        self.path.mkdir(mode=0o700, parents=True, exist_ok=True)

    def write(self, path: Path, record: BaseModel) -> None:
        """Whole or not at all; not ``durable`` (no directory fsync): the processes a record
        describes do not survive a power loss either."""
        atomic_write(path, record.model_dump_json(indent=2).encode() + b"\n", mode=0o600)

    def launch(self) -> Record | None:
        """The launch record, once submit wrote it."""
        return read_record(self.launch_file, self.launch_model)  # type: ignore[return-value]  # launch_model is the Record (a ClassVar cannot say so)

    def verdict(self) -> Verdict | None:
        """The verify probe's verdict, once the backend judged it."""
        return read_record(self.verdict_file, Verdict)

    def canceled(self) -> CancelRequest | None:
        return read_record(self.cancel_file, CancelRequest)

    def put_away(self, attempt: int, state: str, ref: str) -> None:
        """Move attempt ``attempt``'s files into ``attempts/<n>/`` for the next attempt to start
        clean (its results directory, elsewhere, stays: the next attempt continues in it). Only
        once it has ended (``state``): two attempts of one job never run at once."""
        if state not in TERMINAL_STATES:
            raise UsageError(f"attempt {attempt} of {ref} is still {state}; cancel it before launching the next "
                             "attempt")
        kept = self.path / ATTEMPTS / str(attempt)
        kept.mkdir(parents=True, exist_ok=True)
        for entry in self.path.iterdir():
            if entry.name not in (self.lock.name, ATTEMPTS):
                entry.rename(kept / entry.name)


def read_record(path: Path, model: type[Model]) -> Model | None:
    """The record at ``path``, or None when there is none yet."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    return model.model_validate_json(data)


Run = TypeVar("Run", bound="RunFiles[Any]")  # any backend's run directory


class RunRoot(Generic[Run, Record]):
    """The calls of a backend that keeps each job's run directory under a run root on this host
    (the local frame, Docker, SLURM's shared filesystem), written once for all of them: a job's
    ref is ``<namespace>/<job id>``, its run directory ``<run root>/<job id>/run``, its results
    where its launch record says, TAO's ``status.json`` read there as a job's file is."""

    #: The ``backend_ref`` namespace, and the backend's name in messages.
    namespace: ClassVar[str]
    title: ClassVar[str]
    #: The backend's run directory.
    run_type: ClassVar[type[RunFiles[Any]]]
    run_root: Path

    def _run_dir(self, ref: str) -> Run:
        namespace, _, job_id = ref.partition("/")
        if namespace != self.namespace or not is_job_id(job_id):
            raise UsageError(f"backend ref {ref!r} is not the {self.title} backend's: it is {self.namespace}/<job id>")
        return self.run_type(self.run_root / job_id / "run")  # type: ignore[return-value]  # run_type is the Run (a ClassVar cannot say so)

    def _known(self, ref: str) -> Run | None:
        run = self._run_dir(ref)
        return run if run.launch_file.exists() else None

    def _launched(self, ref: str) -> tuple[Run, Record]:
        """The job's run directory and launch record; a usage error for a job never submitted here."""
        run = self._known(ref)
        launch = run.launch() if run is not None else None
        if run is None or launch is None:
            raise UsageError(f"{ref} is not known to the {self.title} backend under {self.run_root}")
        return run, launch

    def status(self, ref: str) -> JobStatus:
        run = self._known(ref)
        if run is None:
            return JobStatus(state="UNKNOWN", message=f"{ref} is not known to the {self.title} backend under "
                                                      f"{self.run_root}")
        return self._outcome(run)[0]

    def failure_analysis(self, ref: str) -> FailureAnalysis | None:
        run = self._known(ref)
        return None if run is None else self._outcome(run)[1]

    def _outcome(self, run: Run, *, locked: bool = False) -> tuple[JobStatus, FailureAnalysis | None]:
        """The job's state and, after an ERROR, its analysis: each backend's own reading.
        ``locked``: the caller holds the run directory's lock (a submit putting an attempt away),
        which a backend that ends a job under that lock must not take again."""
        raise NotImplementedError

    def _open_run(self, plan: LaunchPlan, *, mode: int) -> Run:
        """``plan``'s run directory, made as a submit needs it: ``mode`` on the job's directory and
        the run directory (0700: the backend's alone; 0711: a job's user passes through, never
        lists), and every state root marked so no request may mount it."""
        run = self._run_dir(f"{self.namespace}/{plan.job_id}")
        run.path.parent.mkdir(parents=True, exist_ok=True)
        run.create()
        for directory in (run.path.parent, run.path):
            os.chmod(directory, mode)
        for root in (self.run_root, *(Path(root) for root in plan.state_roots)):
            mark_state_root(root)
        return run

    def _resubmitted(self, run: Run, plan: LaunchPlan) -> Record | None:
        """The launch record of ``plan`` when it was submitted already (a retried submit, which
        starts nothing new), else None; an earlier attempt is put away first (once it has ended),
        and another plan under this job id is refused. The caller holds the run directory's lock."""
        existing: Record | None = run.launch()
        if existing is not None and existing.plan.attempt < plan.attempt:
            run.put_away(existing.plan.attempt, self._outcome(run, locked=True)[0].state,
                         f"{self.namespace}/{plan.job_id}")
            return None
        if existing is not None and existing.plan != plan:
            raise UsageError(f"job {plan.job_id} was already submitted to the {self.title} backend with another plan "
                             f"({run.launch_file}); submit this one under a new job id")
        return existing

    def results_path(self, ref: str) -> str | None:
        run = self._known(ref)
        launch = run.launch() if run is not None else None
        return launch.results_host if launch is not None else None

    def training_status(self, ref: str) -> bytes | None:
        results = self.results_path(ref)
        return None if results is None else read_job_file(Path(results), STATUS_FILE, limit=STATUS_TAIL_BYTES)
