"""The job pipeline without an orchestrator: submit (record → tier → stage → config → plan →
preflight → launch → verify → RUNNING), collect (wait → record the end → upload with excludes →
logs and failure analysis) and resync, plus status and cancel by job id.

Why a module: the CLI runs a job with these functions, and the Prefect flows run the *same step
functions* as tasks — so each stage below is one small function a task can call, and the two
compositions end in the same record. Nothing here moves bytes or talks to a cluster itself; the
staging, routing, upload and backend modules do.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import UsageError
from .backends import backend_for
from .launch.backend import Backend, FailureAnalysis, JobDocuments, JobStatus, Submission
from .launch.plan import LaunchPlan, build_plan
from .launch.probe import Verdict
from .outputs import Kind, UploadOutcome, upload_results
from .records import TERMINAL_STATES, JobRecord, RecordStore, open_for
from .records.from_request import request_digest
from .reporting import ProgressCallback
from .request import JobRequest
from .routing import decide_route, record_route
from .staging.stage import plan_stage, stage
from .staging.stage_map import StagingMap
from .tier import TierDecision, choose_tier
from .vocabulary import DEFAULT_POLL_SECONDS, DEFAULT_WORKDIR, POLL_SECONDS_BOUNDS, WORKDIR_VARIABLE, seconds_within

DEFAULT_LOG_TAIL = 100

Say = Callable[[str], None]


class VerifyFailed(UsageError):
    """The verify probe found an input unreadable or the results directory unusable, inside the
    frame; the job's command never started. Not retryable: the same inputs fail the same way."""

    def __init__(self, job_id: str, verdict: Verdict | None = None) -> None:
        # Without a verdict, ``job_id`` is the whole message: how a stored flow result is rebuilt.
        super().__init__(f"job {job_id}: {verdict.describe()}" if verdict is not None else job_id)
        self.verdict = verdict


@dataclass(frozen=True)
class Submitted:
    """What submit did, small enough for a task's return value."""

    job_id: str
    backend_ref: str
    tier: str
    started: bool
    verdict: Verdict

    def to_dict(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "backend_ref": self.backend_ref, "tier": self.tier, "started": self.started,
                "verified_checks": len(self.verdict.checks)}

    def describe(self) -> str:
        return (f"job {self.job_id} {'running' if self.started else 'launched earlier'} as {self.backend_ref} "
                f"(tier {self.tier}; {self.verdict.describe()})")


@dataclass(frozen=True)
class Collected:
    job_id: str
    state: str
    message: str
    upload: UploadOutcome | None
    logs_tail: str | None = None
    failure: FailureAnalysis | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "state": self.state, "message": self.message,
                "upload": self.upload.to_dict() if self.upload else None,
                "failure": self.failure.to_dict() if self.failure else None}

    def describe(self) -> str:
        moved = f"; {self.upload.describe()}" if self.upload is not None else ""
        return f"job {self.job_id} {self.state}" + (f" ({self.message})" if self.message else "") + moved


# ----------------------------------------------------------------------------- the steps
def workdir_root(root: str | Path | None = None, environ: Mapping[str, str] | None = None) -> Path:
    """Where jobs' working directories live on this host: ``root``, ``$TAO_DATA_IO_WORKDIR`` or the
    default. The local backend keeps each job's run and results directories there too."""
    env = os.environ if environ is None else environ
    return Path(root or env.get(WORKDIR_VARIABLE) or DEFAULT_WORKDIR).expanduser().absolute()


def workdir_for(job_id: str, root: str | Path | None = None, environ: Mapping[str, str] | None = None) -> Path:
    """The job's working directory on this host: its staging root and materialized config."""
    return workdir_root(root, environ) / job_id


def open_record(request: JobRequest, backend: Backend, store: RecordStore, *, source: str = "cli") -> JobRecord:
    """Open (or re-open) the job's record; the request is pinned to the job id from here on."""
    return open_for(request, platform=backend.name, store=store, source=source)


def decide_tier(request: JobRequest, backend: Backend, store: RecordStore, job_id: str) -> TierDecision:
    """The tier from what the backend offers; stamped into the record before anything moves."""
    decision = choose_tier(request, backend.facts())
    store.set_tier(job_id, decision.tier, decision.reason)
    return decision


def stage_inputs(request: JobRequest, backend: Backend, workdir: Path, *,
                 environ: Mapping[str, str] | None = None) -> StagingMap:
    """Stage on this host when the backend reads from it (the local frame); otherwise only the
    config is materialized here and the cluster stages (tier B stage Job, tier C in the pod)."""
    if backend.stages_on_host:
        return stage(request, workdir, environ=environ)
    return plan_stage(request, workdir, environ=environ)


def route_outputs(store: RecordStore, job_id: str, environ: Mapping[str, str] | None = None) -> JobRecord:
    """Decide where results go and pin it in the record (a retry with the same decision is a no-op)."""
    return record_route(store, job_id, decide_route(job_id, os.environ if environ is None else environ))


def start(plan: LaunchPlan, backend: Backend, *, environ: Mapping[str, str] | None = None,
          documents: JobDocuments | None = None, store: RecordStore | None = None) -> Submission:
    """Preflight and submit (idempotent: a retry for a job already submitted starts nothing). The
    verify probe runs first inside the frame; :func:`confirm` waits for its verdict. ``documents``
    (the request and record the plan was built from) go to a backend whose pods stage for
    themselves."""
    backend.preflight(plan, documents=documents)
    if store is None:
        return backend.submit(plan, environ=environ, documents=documents)
    _claim_launch(store, plan.job_id, backend, documents)
    try:
        return backend.submit(plan, environ=environ, documents=documents)
    except UsageError:
        # Refused as bad input (a forwarded variable not set here, an object someone else owns):
        # nothing of the job runs, so the claim goes and a fixed request may take the job over.
        _release_launch(store, plan.job_id)
        raise


def _claim_launch(store: RecordStore, job_id: str, backend: Backend, documents: JobDocuments | None) -> None:
    """Pin where the job is launched (for every verb after this one: another process, another
    day) before the backend is asked — and, in the same atomic write, check that the record is
    still this request's: another submit may have replaced the request of a job that had not
    launched yet (:meth:`RecordStore.open`); then that submit launches it, not this one."""
    digest = request_digest(documents.request) if documents is not None else None

    def claim(record: JobRecord) -> JobRecord:
        if digest is not None and record.request_digest not in (None, digest):
            raise UsageError(f"job {job_id}: another submit opened it for a changed request while this one was "
                             "staging; that submit launches it, and this one started nothing")
        return record.model_copy(update={"backend_config": backend.config()})

    store.update(job_id, claim)


def _release_launch(store: RecordStore, job_id: str) -> None:
    """Undo :func:`_claim_launch` for a job that did not launch (no backend object recorded)."""
    store.update(job_id, lambda record: record if record.backend_ref is not None or record.state != "PENDING"
                 else record.model_copy(update={"backend_config": None}))


def confirm(plan: LaunchPlan, backend: Backend, store: RecordStore, submission: Submission, *,
            source: str = "cli") -> Verdict:
    """Wait for the verify verdict from inside the frame and store it in the record either way; a
    passed verdict marks the job RUNNING, a failed one marks it ERROR and raises :class:`VerifyFailed`
    (the command never started). A retry reads the same verdict and writes nothing new."""
    verdict = backend.verify(submission.backend_ref, plan)
    store.update(plan.job_id, lambda record: record.model_copy(update={"verify": verdict.to_dict()}))
    if not verdict.ok:
        store.mark(plan.job_id, "ERROR", source=source, backend_ref=submission.backend_ref,
                   message=f"verify failed: {verdict.describe()}")
        raise VerifyFailed(plan.job_id, verdict)
    store.mark(plan.job_id, "RUNNING", source=source, backend_ref=submission.backend_ref)
    return verdict


def launch(plan: LaunchPlan, backend: Backend, store: RecordStore, *, environ: Mapping[str, str] | None = None,
           source: str = "cli", documents: JobDocuments | None = None) -> tuple[str, bool, Verdict]:
    """:func:`start`, then :func:`confirm`."""
    submission = start(plan, backend, environ=environ, documents=documents, store=store)
    verdict = confirm(plan, backend, store, submission, source=source)
    return submission.backend_ref, submission.started, verdict


def submit(request: JobRequest, backend: Backend, store: RecordStore, *, workdir_root: str | Path | None = None,
           environ: Mapping[str, str] | None = None, source: str = "cli", say: Say | None = None) -> Submitted:
    """Run the whole submit pipeline for ``request`` (see the module docstring)."""
    tell = say or (lambda _: None)
    record = open_record(request, backend, store, source=source)
    launched = already_launched(record)
    if launched is not None:  # a retried submit: the job runs; its inputs are not staged again under it
        tell(launched.describe())
        return launched
    request = request.model_copy(update={"job_id": record.job_id})
    decision = decide_tier(request, backend, store, record.job_id)
    tell(f"job {record.job_id}: {decision.describe()}")
    staging_map = stage_inputs(request, backend, workdir_for(record.job_id, workdir_root, environ), environ=environ)
    tell(staging_map.describe())
    record = route_outputs(store, record.job_id, environ)
    assert record.output_route is not None
    plan = build_plan(request, staging_map, decision, record, record.output_route, environ=environ)
    ref, started, verdict = launch(plan, backend, store, environ=environ, source=source,
                                   documents=JobDocuments(request, record))
    return Submitted(record.job_id, ref, decision.tier, started, verdict)


def already_launched(record: JobRecord) -> Submitted | None:
    """The submission of a job that was launched already (opened again by a retried submit of the
    same request): staging again would change inputs under a running job, so nothing moves. A
    job whose verify failed was never started, and its submit fails again the same way
    (:class:`VerifyFailed`): a retried submit must not report a job that never ran as launched."""
    if record.backend_ref is None:
        return None
    verdict = Verdict.model_validate(record.verify) if record.verify else Verdict(ok=True)
    if not verdict.ok:
        raise VerifyFailed(record.job_id, verdict)
    return Submitted(record.job_id, record.backend_ref, record.storage_tier or "A", False, verdict)


def backend_of(record: JobRecord, overrides: Mapping[str, Any] | None = None) -> Backend:
    """The backend a recorded job runs on: its ``platform``, built from the config recorded at
    launch (``overrides`` win, e.g. a work root given on the command line)."""
    return backend_for(record.platform, {**(record.backend_config or {}), **(overrides or {})})


def _known(record: JobRecord, status: JobStatus, backend: Backend) -> None:
    """A job the backend has no trace of, while the record says it is not over, is a wrong place
    to look (another work root, another cluster) — never a reason to record an end."""
    if status.state == "UNKNOWN" and record.state not in TERMINAL_STATES and record.backend_ref is not None:
        raise UsageError(f"job {record.job_id} is {record.state} in its record, but the {backend.name} backend "
                         f"here has no trace of {record.backend_ref} ({status.message}). Look where it was "
                         f"submitted (its record says {record.backend_config or 'nothing about where'}); if it "
                         "ended there before its end was recorded (a Kubernetes Job's TTL), its end is unknown: "
                         "marking its record ERROR closes it")


def observe(record: JobRecord, backend: Backend) -> JobStatus:
    """The backend's view of the job, writing nothing; a job the backend has forgotten (UNKNOWN)
    defers to a final state in the record."""
    if record.backend_ref is None:
        return JobStatus(state=record.state, message="not launched yet")  # type: ignore[arg-type]
    status = backend.status(record.backend_ref)
    if status.state == "UNKNOWN" and record.state in TERMINAL_STATES:
        return JobStatus(state=record.state, message=f"{status.message}; the record says {record.state}")  # type: ignore[arg-type]
    return status


def record_end(store: RecordStore, job_id: str, status: JobStatus, *, source: str = "cli") -> JobRecord:
    """Fold a terminal status into the record (marking it, once: terminal states are final);
    anything else changes nothing."""
    record = store.get(job_id)
    if status.terminal and record.state != status.state and record.state not in TERMINAL_STATES:
        return store.mark(job_id, status.state, source=source, message=status.message)
    return record


def current_status(record: JobRecord, backend: Backend, store: RecordStore, *, source: str = "cli") -> JobStatus:
    """:func:`observe`, with a terminal state recorded (:func:`record_end`); a job the backend has
    no trace of while its record says it is not over is a wrong place to look (:func:`_known`)."""
    status = observe(record, backend)
    _known(record, status, backend)
    record_end(store, record.job_id, status, source=source)
    return status


def wait_for_end(job_id: str, backend: Backend, store: RecordStore, *, poll_seconds: float = DEFAULT_POLL_SECONDS,
                 timeout: float | None = None, say: Say | None = None) -> JobStatus:
    """Poll until the job is terminal (long PENDING is normal: no timeout unless one is given),
    saying each change; writes nothing — :func:`record_end` records the end."""
    seconds_within(poll_seconds, POLL_SECONDS_BOUNDS, name="poll_seconds")
    if timeout is not None and not timeout >= 0:
        raise UsageError(f"the wait's timeout {timeout!r} must be 0 or more seconds, or none to wait for the end")
    started = time.monotonic()
    last = None
    while True:
        record = store.get(job_id)
        status = observe(record, backend)
        _known(record, status, backend)
        if status.terminal:
            return status
        if say is not None and status.describe() != last:
            say(f"job {job_id}: {status.describe()}")
            last = status.describe()
        if timeout is not None and time.monotonic() - started > timeout:
            return status
        time.sleep(poll_seconds)


def upload_job_results(job_id: str, backend: Backend, store: RecordStore, *, kind: Kind = "upload",
                       settle_seconds: float | None = None, environ: Mapping[str, str] | None = None,
                       progress: ProgressCallback | None = None, say: Say | None = None) -> UploadOutcome | None:
    """Upload what the job wrote (``kind="upload"``, after it ended — also after ERROR or
    CANCELED) or what is new while it runs (``kind="resync"``) to the recorded route, with the
    job's excludes; None when the backend moves the results itself (a tier C upload sidecar)."""
    record = store.get(job_id)
    results = backend.results_path(record.backend_ref) if record.backend_ref else None
    if results is None:
        return None
    if kind == "upload" and not Path(results).is_dir():
        return UploadOutcome("waiting", f"job {job_id} wrote no results directory ({results}); nothing to upload")
    return upload_results(store, job_id, Path(results), kind=kind, settle_seconds=settle_seconds, environ=environ,
                          progress=progress, on_wait=say)


def failure_report(job_id: str, backend: Backend, store: RecordStore, *,
                   tail: int = DEFAULT_LOG_TAIL) -> tuple[str | None, FailureAnalysis | None]:
    """The last lines of the job's log and the backend's analysis of why it failed."""
    record = store.get(job_id)
    if record.backend_ref is None:
        return None, None
    return backend.logs(record.backend_ref, tail), backend.failure_analysis(record.backend_ref)


def collect(job_id: str, backend: Backend, store: RecordStore, *, wait: bool = True,
            poll_seconds: float = DEFAULT_POLL_SECONDS, environ: Mapping[str, str] | None = None,
            say: Say | None = None, source: str = "cli") -> Collected:
    """Wait for the end (when ``wait``) and record it, then upload the results to the recorded
    route with the job's excludes — also after ERROR or CANCELED — and return the logs' tail and
    the failure analysis for an ERROR."""
    status = (wait_for_end(job_id, backend, store, poll_seconds=poll_seconds, say=say) if wait
              else observe(store.get(job_id), backend))
    _known(store.get(job_id), status, backend)
    if not status.terminal:
        return Collected(job_id, status.state, status.message or "not finished; collect again later", None)
    record_end(store, job_id, status, source=source)
    upload = upload_job_results(job_id, backend, store, environ=environ, say=say)
    tail = failure = None
    if status.state == "ERROR":
        tail, failure = failure_report(job_id, backend, store)
    return Collected(job_id, status.state, status.message, upload, tail, failure)


def resync(job_id: str, backend: Backend, store: RecordStore, *, settle_seconds: float | None = None,
           environ: Mapping[str, str] | None = None, progress: ProgressCallback | None = None) -> UploadOutcome | None:
    """What a schedule runs for a RUNNING job: upload what is new (see :func:`upload_job_results`);
    it leaves at once when another upload of the job holds the lock."""
    return upload_job_results(job_id, backend, store, kind="resync", settle_seconds=settle_seconds, environ=environ,
                              progress=progress)


def running_jobs(store: RecordStore, backend: Backend, *, say: Say | None = None) -> tuple[list[str], list[str]]:
    """The RUNNING jobs of the backend's platform: those it can see (what a resync through it can
    reach), and those it has no trace of — submitted through another target (another work root,
    another namespace) or lost with their host. A store that does not exist yet holds no jobs
    (a schedule may start before the first submit); ``say`` hears of it, since a mistyped
    location would look the same."""
    if not store.exists():
        if say is not None:
            say(f"the records location {store.location} does not exist (yet): no job to resync")
        return [], []
    seen: list[str] = []
    elsewhere: list[str] = []
    for record in store.list_records(state="RUNNING"):
        if record.platform == backend.name and record.backend_ref is not None:
            known = backend.status(record.backend_ref).state != "UNKNOWN"
            (seen if known else elsewhere).append(record.job_id)
    return seen, elsewhere


def cancel(job_id: str, backend: Backend, store: RecordStore, *, source: str = "cli") -> JobRecord:
    """Stop the job and everything it started and mark the record CANCELED — unless it already
    ended (terminal states are final: the backend ends only what it left running) or the backend
    cannot find it (see :func:`_known`). Returns the record as it now stands."""
    record = store.get(job_id)
    if record.state in TERMINAL_STATES:
        if record.backend_ref is not None:
            backend.cancel(record.backend_ref)
        return record
    if record.backend_ref is not None:
        _known(record, backend.status(record.backend_ref), backend)
        stopped = backend.cancel(record.backend_ref)
    else:
        stopped = False
    return store.mark(job_id, "CANCELED", source=source,
                      message="canceled" + ("" if stopped else " (nothing was running)"))
