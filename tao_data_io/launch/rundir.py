"""A job's run directory on this host, for backends that keep each job's state here (the local
frame's supervisor records, the Docker backend's decisions and saved logs): owner-only, each
record a JSON file written whole, and earlier attempts put away beside the current one.

Why shared: what the directory must guarantee — no reader ever sees half a record, no other user
reads a log of the job's output, an attempt's files never mix with the next one's — is the same
whichever backend writes the records in it; what records it holds is each backend's own.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timezone
import os
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel

from ..errors import UsageError
from ..fs.atomic import atomic_write
from ..fs.locks import file_lock
from ..fs.reading import read_job_file
from ..names import is_job_id
from ..outputs import restore_results
from ..schema import Strict
from ..vocabulary import TERMINAL_STATES
from .backend import FailureAnalysis, JobStatus, RunRootSettings
from .plan import LaunchPlan
from .probe import Verdict
from .sources import SourceRules, check_results_mount, check_results_ours, mark_state_root
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

    def over(self) -> bool:
        """Whether the job's end is recorded here for good, so a cancel has nothing to stop (a
        backend whose cancel goes through :meth:`RunRoot._canceling` says how it knows)."""
        raise NotImplementedError

    def ask_cancel(self) -> None:
        """Record that a cancel was asked, once (its first time kept); the caller holds the lock."""
        if self.canceled() is None:
            self.write(self.cancel_file, CancelRequest(requested_at=datetime.now(timezone.utc)))

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
Settings = TypeVar("Settings", bound=RunRootSettings)  # any such backend's settings


class RunRoot(Generic[Run, Record, Settings]):
    """The calls of a backend that keeps each job's run directory under a run root on this host
    (the local frame, Docker, SLURM's shared filesystem), written once for all of them: a job's
    ref is ``<namespace>/<job id>``, its run directory ``<run root>/<job id>/run``, its results
    where its launch record says, TAO's ``status.json`` read there as a job's file is."""

    #: The ``backend_ref`` namespace, and the backend's name in messages.
    namespace: ClassVar[str]
    title: ClassVar[str]
    #: The backend's run directory.
    run_type: ClassVar[type[RunFiles[Any]]]
    #: The backend's name (:attr:`~tao_data_io.launch.backend.Backend.name`).
    name: ClassVar[str]

    def __init__(self, settings: Settings) -> None:
        #: With the run root (and what else the environment decides) decided: what this backend
        #: runs with and the job record keeps.
        self.settings = settings.resolved()
        self.run_root = Path(str(self.settings.run_root))

    def config(self) -> dict[str, Any]:
        return self.settings.model_dump(mode="json")

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

    def _open_run(self, plan: LaunchPlan, *, mode: int) -> tuple[Run, str]:
        """``plan``'s run directory, made as a submit needs it, and the job's ref: ``mode`` on the
        job's directory and the run directory (0700: the backend's alone; 0711: a job's user passes
        through, never lists), and every state root marked so no request may mount it."""
        ref = f"{self.namespace}/{plan.job_id}"
        run = self._run_dir(ref)
        run.path.parent.mkdir(parents=True, exist_ok=True)
        run.create()
        for directory in (run.path.parent, run.path):
            os.chmod(directory, mode)
        for root in (self.run_root, *(Path(root) for root in plan.state_roots)):
            mark_state_root(root)
        return run, ref

    def _source_rules(self, plan: LaunchPlan) -> SourceRules:
        """What the request's host paths must keep to on this host (:func:`host_source_rules` and
        the backend's own)."""
        raise NotImplementedError

    def _checked_rules(self, plan: LaunchPlan) -> SourceRules:
        """:meth:`_source_rules`, with the results mount checked by them first: before a submit
        makes anything, and before a preflight says yes."""
        rules = self._source_rules(plan)
        check_results_mount(plan, rules)
        return rules

    @contextmanager
    def _canceling(self, ref: str) -> Iterator[tuple[Run, Record] | None]:
        """Under the run directory's lock, with the cancel asked: the run directory and launch
        record of the job to stop, for what the backend tells its frames before the lock is let
        go; None when there is nothing to cancel (never launched here, or over)."""
        run = self._known(ref)
        launch: Record | None = run.launch() if run is not None else None
        if run is None or launch is None:
            yield None
            return
        with file_lock(run.lock):
            if run.over():
                yield None
                return
            run.ask_cancel()
            yield run, launch

    def _results_host(self, plan: LaunchPlan) -> str:
        """Where the job's frame writes its results on this host: the route's mount, else beside
        its run directory."""
        if plan.route.route == "mount":
            return plan.route.destination
        return str(self.run_root / plan.job_id / "results")

    def _ready_results(self, plan: LaunchPlan, results_host: str, job_uid: int | None,
                       environ: Mapping[str, str] | None) -> str | None:
        """Make the job's results directory ready before its frame exists (the caller, a submit,
        holds the lock): a mounted one proved this job's to write (:func:`check_results_ours`, as
        this process or the job's user), made, and holding what the earlier attempts uploaded.
        Returns where that was restored from (None: nothing was)."""
        if plan.route.route == "mount":
            owners = {os.geteuid(), *([job_uid] if job_uid is not None else [])}
            check_results_ours(plan, Path(results_host), owners, self.name)
        Path(results_host).mkdir(parents=True, exist_ok=True)
        if plan.restore_from is None:
            return None
        return restore_results(plan.restore_from, Path(results_host), belongs_to=plan.route.belongs_to,
                               environ=environ)

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
