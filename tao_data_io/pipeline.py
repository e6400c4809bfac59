"""The job pipeline without an orchestrator: submit (record → tier → stage → config → plan →
preflight → launch → verify → RUNNING) and collect (wait → route → upload with excludes →
record), plus status, logs and cancel by job id.

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
from .launch.backend import Backend, FailureAnalysis, JobDocuments, JobStatus, backend_for
from .launch.plan import LaunchPlan, build_plan
from .launch.probe import Verdict
from .outputs import UploadOutcome, upload_results
from .records import JobRecord, RecordStore, open_for
from .reporting import human_size
from .request import JobRequest
from .routing import decide_route, record_route
from .staging.stage import plan_stage, stage
from .staging.stage_map import StagingMap
from .tier import TierDecision, choose_tier
from .vocabulary import DEFAULT_POLL_SECONDS, DEFAULT_WORKDIR, WORKDIR_VARIABLE

DEFAULT_LOG_TAIL = 100

Say = Callable[[str], None]


class VerifyFailed(UsageError):
    """The verify probe found an input unreadable or the results directory unusable, inside the
    frame; the job's command never started. Not retryable: the same inputs fail the same way."""

    def __init__(self, job_id: str, verdict: Verdict) -> None:
        super().__init__(f"job {job_id}: {verdict.describe()}")
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
        return (f"job {self.job_id} {'running' if self.started else 'already running'} as {self.backend_ref} "
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
        upload = None
        if self.upload is not None:
            upload = {"status": self.upload.status, "message": self.upload.message,
                      **({"summary": self.upload.summary.to_dict()} if self.upload.summary else {})}
        return {"job_id": self.job_id, "state": self.state, "message": self.message, "upload": upload,
                "failure": self.failure.to_dict() if self.failure else None}

    def describe(self) -> str:
        moved = ""
        if self.upload is not None and self.upload.summary is not None:
            summary = self.upload.summary
            moved = (f"; uploaded {summary.transferred_files} files ({human_size(summary.transferred_bytes)}), "
                     f"{summary.excluded_files} excluded")
        elif self.upload is not None:
            moved = f"; {self.upload.message}"
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


def launch(plan: LaunchPlan, backend: Backend, store: RecordStore, *,
           environ: Mapping[str, str] | None = None, source: str = "cli",
           documents: JobDocuments | None = None) -> tuple[str, bool, Verdict]:
    """Preflight, submit, and wait for the verify verdict from inside the frame; stored in the
    record either way. A failed verdict marks the job ERROR and raises :class:`VerifyFailed`.
    ``documents`` (the request and record the plan was built from) go to a backend whose pods
    stage for themselves."""
    backend.preflight(plan, documents=documents)
    submission = backend.submit(plan, environ=environ, documents=documents)
    verdict = backend.verify(submission.backend_ref, plan)
    store.update(plan.job_id, lambda record: record.model_copy(update={"verify": verdict.to_dict()}))
    if not verdict.ok:
        store.mark(plan.job_id, "ERROR", source=source, backend_ref=submission.backend_ref,
                   message=f"verify failed: {verdict.describe()}")
        raise VerifyFailed(plan.job_id, verdict)
    store.mark(plan.job_id, "RUNNING", source=source, backend_ref=submission.backend_ref)
    return submission.backend_ref, submission.started, verdict


def submit(request: JobRequest, backend: Backend, store: RecordStore, *, workdir_root: str | Path | None = None,
           environ: Mapping[str, str] | None = None, source: str = "cli", say: Say | None = None) -> Submitted:
    """Run the whole submit pipeline for ``request`` (see the module docstring)."""
    tell = say or (lambda _: None)
    record = open_record(request, backend, store, source=source)
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


def backend_of(record: JobRecord, config: Mapping[str, Any] | None = None) -> Backend:
    """The backend a recorded job runs on (its ``platform``)."""
    return backend_for(record.platform, config)


def current_status(record: JobRecord, backend: Backend, store: RecordStore, *, source: str = "cli") -> JobStatus:
    """The backend's view of the job, folded into the record: a terminal state is recorded (and
    final); a job the backend has forgotten reads UNKNOWN and defers to the record."""
    if record.backend_ref is None:
        return JobStatus(state=record.state, message="not launched yet")  # type: ignore[arg-type]
    status = backend.status(record.backend_ref)
    if status.state == "UNKNOWN" and record.state in ("COMPLETE", "ERROR", "CANCELED"):
        return JobStatus(state=record.state, message=f"{status.message}; the record says {record.state}")  # type: ignore[arg-type]
    if status.terminal and record.state != status.state and record.state not in ("COMPLETE", "ERROR", "CANCELED"):
        store.mark(record.job_id, status.state, source=source, message=status.message)
    return status


def wait_for_end(record: JobRecord, backend: Backend, store: RecordStore, *, poll_seconds: float = DEFAULT_POLL_SECONDS,
                 timeout: float | None = None, say: Say | None = None) -> JobStatus:
    """Poll until the job is terminal (long PENDING is normal: no timeout unless one is given)."""
    started = time.monotonic()
    last = None
    while True:
        status = current_status(store.get(record.job_id), backend, store)
        if status.terminal or status.state == "UNKNOWN":
            return status
        if say is not None and status.describe() != last:
            say(f"job {record.job_id}: {status.describe()}")
            last = status.describe()
        if timeout is not None and time.monotonic() - started > timeout:
            return status
        time.sleep(poll_seconds)


def collect(job_id: str, backend: Backend, store: RecordStore, *, wait: bool = True,
            poll_seconds: float = DEFAULT_POLL_SECONDS, environ: Mapping[str, str] | None = None,
            say: Say | None = None) -> Collected:
    """Wait for the end (when ``wait``), then upload the results to the recorded route with the
    job's excludes — also after ERROR or CANCELED — and return the logs' tail and the failure
    analysis for an ERROR."""
    record = store.get(job_id)
    status = (wait_for_end(record, backend, store, poll_seconds=poll_seconds, say=say) if wait
              else current_status(record, backend, store))
    if not status.terminal:
        return Collected(job_id, status.state, status.message or "not finished; collect again later", None)
    results = backend.results_path(record.backend_ref) if record.backend_ref else None
    upload = None
    if results is not None and Path(results).is_dir():
        upload = upload_results(store, job_id, Path(results), kind="upload", environ=environ, on_wait=say)
    elif results is not None:
        upload = UploadOutcome("waiting", f"job {job_id} wrote no results directory ({results}); nothing to upload")
    tail = failure = None
    if status.state == "ERROR" and record.backend_ref:
        tail = backend.logs(record.backend_ref, DEFAULT_LOG_TAIL)
        failure = backend.failure_analysis(record.backend_ref)
    return Collected(job_id, status.state, status.message, upload, tail, failure)


def cancel(job_id: str, backend: Backend, store: RecordStore, *, source: str = "cli") -> bool:
    """Stop the job and everything it started; the record is marked CANCELED (final)."""
    record = store.get(job_id)
    stopped = backend.cancel(record.backend_ref) if record.backend_ref else False
    if record.state not in ("COMPLETE", "ERROR", "CANCELED"):
        store.mark(job_id, "CANCELED", source=source, message="canceled" + ("" if stopped else " (nothing was running)"))
    return stopped
