"""The seam between the data mover and whatever runs the job: one protocol, a few small results.

Why a protocol: the local sandbox, Kubernetes and the tests' fake must be interchangeable
under the same steps (submit → verify → status → logs → cancel), so the CLI and the Prefect
flows compose the same calls whatever runs the job. Results are small JSON-able models with
``to_dict()``/``describe()``, in the TAO vocabulary users know (PENDING, RUNNING, COMPLETE,
ERROR, CANCELED; UNKNOWN when the backend has forgotten the job and the record must decide).
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol, Self, runtime_checkable

from pydantic import Field, ValidationError

from ..errors import UsageError
from ..records import JobRecord
from ..request import JobRequest
from ..schema import Strict, describe_validation_error
from ..tier import Capabilities, ClusterFacts
from ..vocabulary import TERMINAL_STATES, State
from .plan import LaunchPlan
from .probe import Verdict

#: The record's states, and UNKNOWN: the backend has forgotten the job, and the record decides.
BackendState = Literal[State, Literal["UNKNOWN"]]
#: TAO's error classes: the program failed, or the infrastructure did (OOM, a lost node, a pull).
ErrClass = Literal["ERR_PROGRAM", "ERR_INFRA"]
DEFAULT_VERIFY_TIMEOUT_S = 600.0


class BackendSettings(Strict):
    """What a backend is built from, and what its ``config()`` gives back for the job record: one
    model per backend, declared once, that the backend, its target block (which embeds it) and
    the CLI (which fills it from flags) all use. Names and paths only, never a credential value:
    the record and the block are shown wherever they are read."""

    #: The backend's name: what a job record keeps (``JobRecord.backend``) and the registry looks up.
    name: ClassVar[str]

    @classmethod
    def from_workdir(cls, workdir: Path) -> dict[str, Any]:
        """The settings a command line's ``--workdir`` implies for this backend when they are not
        given otherwise (none by default): a backend that keeps each job's state on this host keeps
        it under the workdir a user names, so one flag keeps a whole run apart from the others."""
        return {}

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> Self:
        """The settings ``values`` give, or a :class:`UsageError` naming each refused field, its
        value and the fix: the one place a settings ``ValidationError`` becomes a usage error (a
        CLI flag, a record's ``backend_config``, a plan's claim), so the CLI exits 2 with the
        field translated to its flag and a task does not retry."""
        try:
            return cls.model_validate(dict(values))
        except ValidationError as exc:
            what = f"the {cls.name} backend's settings"
            raise UsageError(describe_validation_error(exc, what, whole=None)) from None


class RunRootSettings(BackendSettings):
    """The settings of a backend that keeps each job's run directory under a run root on this host
    (:class:`~tao_data_io.launch.rundir.RunRoot`: the local frame, Docker, SLURM): a command line's
    ``--workdir`` is its run root too, so a job's run state sits beside its staging directory."""

    run_root: str | None

    @classmethod
    def from_workdir(cls, workdir: Path) -> dict[str, Any]:
        return {"run_root": str(workdir)}

    def resolved(self, environ: Mapping[str, str] | None = None) -> Self:
        """These settings with what the environment decides (the run root first) decided once: a
        later process with another environment must find the same jobs."""
        raise NotImplementedError


class JobStatus(Strict):
    state: BackendState
    message: str = ""
    exit_code: int | None = None
    err_class: ErrClass | None = None

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def describe(self) -> str:
        return self.state + (f": {self.message}" if self.message else "")


class FailureAnalysis(Strict):
    """What TAO users expect after an ERROR: the class, the reason, a fix."""

    err_class: ErrClass
    reason: str
    suggestion: str

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def describe(self) -> str:
        return f"{self.err_class}: {self.reason} — {self.suggestion}"

    @classmethod
    def deadline_passed(cls, seconds: int | str | None) -> FailureAnalysis:
        """The run passed its ``compute_shape.deadline_seconds`` and was ended: every backend says so alike."""
        return cls(err_class="ERR_PROGRAM", reason=f"the job ran longer than its compute_shape.deadline_seconds "
                   f"({seconds} s) and was ended", suggestion="raise compute_shape.deadline_seconds, or make the run "
                   "shorter (fewer epochs); its results so far were kept")


def error_status(err_class: ErrClass, reason: str, suggestion: str, code: int | None = None
                 ) -> tuple[JobStatus, FailureAnalysis]:
    """An ERROR status and its analysis, saying the same reason: how a backend reports a job that failed."""
    analysis = FailureAnalysis(err_class=err_class, reason=reason, suggestion=suggestion)
    return JobStatus(state="ERROR", message=reason, exit_code=code, err_class=err_class), analysis


def program_failed(who: str, code: int) -> tuple[JobStatus, FailureAnalysis]:
    """The ERROR of a command that exited ``code`` on its own: the program's failure, naming the
    signal a shell's ``128 + N`` says ended it."""
    return error_status("ERR_PROGRAM", f"{who} failed (exit code {code}{by_signal(code - 128)})",
                        "read the last lines of the job's log", code)


def by_signal(number: int) -> str:
    """``, signal SIGKILL`` for a signal's number; nothing for a number no signal has."""
    return f", signal {signal.Signals(number).name}" if number in _SIGNALS else ""


_SIGNALS = {int(s) for s in signal.Signals}


#: The most of a job's log one look returns (per rank): a job that prints faster than the
#: flow looks is shown in pieces, never all at once.
FOLLOW_BYTES = 64 * 1024
#: Where following a log starts when it has not been followed before: its last few lines.
FOLLOW_START_BYTES = 8 * 1024
#: The most of a job's log a tail of its last lines reads (per rank): a job that printed one
#: endless line still gives a failure report of bounded size.
TAIL_BYTES = 1024 * 1024


class LogChunk(Strict):
    """What a job printed since a cursor: whole lines (``[rank N]`` before each when there are
    several ranks), and the cursor the next look starts from — opaque to the caller, kept in the
    job's record so a watcher that restarts goes on where the last one stopped."""

    text: str
    cursor: str


def cursor_fields(cursor: str | None) -> dict[Any, Any]:
    """A cursor a backend's :meth:`Backend.follow_logs` gave, read back as the JSON object it
    wrote; anything else (none yet, a cursor of another backend or release) starts afresh: ``{}``.
    Each backend checks the fields' values itself: the cursor came back through a record."""
    try:
        data = json.loads(cursor) if cursor else {}
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


class Submission(Strict):
    """What ``submit`` made: the backend's handle on the job, recorded as ``backend_ref``."""

    backend_ref: str
    #: False when a retried submit found the job already running and started nothing.
    started: bool = True
    #: What was (or, in the job's own pods, will be) restored into the results directory before
    #: the command starts: a later attempt's (:attr:`LaunchPlan.restore_from`); None for nothing.
    restored: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def describe(self) -> str:
        return f"{'started' if self.started else 'already running'} as {self.backend_ref}"


class Waits(Strict):
    """How long a backend's own waits inside ``submit`` and ``verify`` may last for one plan, in
    seconds, by the backend's own bounds: what an orchestrator that runs them as steps must allow
    (the Prefect tasks' timeouts are these, plus the step's own work: ``tasks.policy``). ``None``:
    no bound of time — the wait moves bytes for as long as they take (a stage, a restore of
    earlier results) and ends when that work ends or fails — so nothing may cut it sooner.

    Why the backend says: only it knows what its submit waits for (a cluster's stage Job, a
    collective probe) and which of its budgets bound its verify (a queue's admission, a node, an
    image pull, the probe); a fixed timeout laid over them would end, when run by Prefect and not
    from the CLI, a wait the backend still allows."""

    #: ``submit``'s waits (besides its API calls and files): 0 when it waits for nothing.
    submit: float | None = Field(ge=0)
    #: ``verify``'s wait for the verdict, as :meth:`Backend.verify` is called with its default timeout.
    verify: float | None = Field(ge=0)


@dataclass(frozen=True)
class JobDocuments:
    """The request and the record a plan was built from. A backend whose pods stage their own
    inputs (``capabilities.stages_on_host`` False) ships both to them — the stager stages the request and
    reports into the record — so it needs them at preflight (to dry-run the objects) and submit;
    a backend that reads what this host staged ignores them."""

    request: JobRequest
    record: JobRecord


@runtime_checkable
class Backend(Protocol):
    """What runs jobs. Each call raises :class:`~tao_data_io.errors.UsageError` for a request the
    backend cannot run (naming what and why) and :class:`~tao_data_io.errors.BackendError` when
    the backend itself fails (saying whether a retry can help)."""

    name: str
    #: What this backend can do, without asking its cluster: whether the frame reads inputs staged
    #: on this host (the local sandbox) or the cluster stages them itself (a tier B stage Job, a
    #: tier C pod) and this host only materializes the config; and the request features it honours,
    #: refused before anything is written when it cannot (:func:`~tao_data_io.tier.refuse_unsupported`).
    #: ``facts()`` may say less of the cluster at hand.
    capabilities: Capabilities

    def config(self) -> dict[str, Any]:
        """What :func:`tao_data_io.backends.backend_for` rebuilds this backend from in another
        process (kept in the job's record): its settings' dump (a :class:`BackendSettings`), names
        and paths only, never a credential."""
        ...

    def facts(self) -> ClusterFacts:
        """What the backend offers, for the tier decision."""
        ...

    def preflight(self, plan: LaunchPlan, *, documents: JobDocuments | None = None) -> None:
        """Every check that can run before anything is created; raise on the first failure."""
        ...

    def waits(self, plan: LaunchPlan) -> Waits:
        """How long ``submit`` and ``verify`` may wait for ``plan`` by this backend's own bounds
        (see :class:`Waits`): an orchestrator's timeout for each is the wait's, never a fixed one.
        Answered from the settings and the plan alone, calling nothing: it is asked before each
        step starts."""
        ...

    def submit(self, plan: LaunchPlan, *, environ: Mapping[str, str] | None = None,
               documents: JobDocuments | None = None) -> Submission:
        """Start the job (idempotent: a retry for the same job id starts nothing new). The verify
        probe runs first, inside the frame; the command starts only if it passes. Credential
        values for ``plan.forward_env`` are read from ``environ`` here and go only to the frame."""
        ...

    def verify(self, ref: str, plan: LaunchPlan, *, timeout: float = DEFAULT_VERIFY_TIMEOUT_S) -> Verdict:
        """Wait for the probe's verdict (bounded by ``timeout``); a failed verdict means the job's
        command never started and the backend has released what it held."""
        ...

    def status(self, ref: str) -> JobStatus: ...

    def logs(self, ref: str, tail: int | None = None) -> str: ...

    def cancel(self, ref: str) -> bool:
        """Stop the job and everything it started; True if something was running. Of a job that
        has already ended, end only what it left running and keep what collect reads."""
        ...

    def failure_analysis(self, ref: str) -> FailureAnalysis | None: ...

    def results_path(self, ref: str) -> str | None:
        """Where this machine can read the job's results directory, or None when the backend
        moves the results itself (a tier C upload sidecar) or they live only in the cluster."""
        ...

    def follow_logs(self, ref: str, cursor: str | None) -> LogChunk:
        """Whole lines the job printed since ``cursor`` (None: its last few lines), at most
        :data:`FOLLOW_BYTES` per rank, and the cursor for the next look."""
        ...

    def training_status(self, ref: str) -> bytes | None:
        """The tail of TAO's ``status.json`` in the job's results
        (:data:`~tao_data_io.launch.training.STATUS_TAIL_BYTES` at most), or None while there is
        none. The file is the job's: read without following a link or blocking on a FIFO."""
        ...


def polls(timeout: float) -> Iterator[None]:
    """Yield until ``timeout`` has passed, sleeping a little longer each time (10 ms to 250 ms):
    quick for a fast job, cheap for a long one — how a backend waits for what its job writes."""
    deadline = time.monotonic() + timeout
    pause = 0.01
    while True:
        yield
        if time.monotonic() >= deadline:
            return
        time.sleep(pause)
        pause = min(pause * 1.5, 0.25)
