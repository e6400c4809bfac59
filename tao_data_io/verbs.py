"""A job's life, composed once: ``submit`` (record → tier → stage → config → plan → preflight →
launch → verify → RUNNING), ``collect`` (wait → record the end → upload with excludes → logs and
failure analysis), ``resync`` (what is new in every RUNNING job's results) and ``cancel``.

Why here, once: the CLI and the Prefect flows run the same verbs. Each verb runs its steps
(:mod:`tao_data_io.steps`, the staging and launch modules) through a runner
(:mod:`tao_data_io.runner`): the CLI's calls each step, the Prefect layer's runs each as its task.
The order of the steps, what each passes to the next and every decision between them are
written here and nowhere else, so a flow cannot drift from the CLI and a new step is added once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import UsageError
from .launch.backend import Backend, FailureAnalysis, JobDocuments, JobStatus, Submission
from .launch.plan import build_plan
from .launch.probe import Verdict
from .outputs import UploadOutcome
from .records import TERMINAL_STATES, JobRecord, RecordStore
from .request import JobRequest
from .runner import Runner, direct
from .staging.stage import plan_stage, stage
from .staging.stage_map import StagingMap
from .steps import (
    Say,
    VerifyFailed,
    cancel_job,
    confirm,
    decide_tier,
    fail_before_launch,
    failure_report,
    identified,
    observe,
    open_record,
    read_record,
    read_staging_map,
    state_roots,
    record_end,
    resync_job,
    route_outputs,
    running_jobs,
    staging_dir,
    start,
    upload_job_results,
    wait_for_end,
    watch,
)
from .tier import Tier
from .vocabulary import DEFAULT_POLL_SECONDS


@dataclass(frozen=True)
class Submitted:
    """What submit did, small enough for a flow's result."""

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
    """What collect found and did: the job's state, the upload, and for an ERROR the log's tail
    and the backend's analysis."""

    job_id: str
    state: str
    message: str
    upload: UploadOutcome | None
    logs_tail: str | None = None
    failure: FailureAnalysis | None = None

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL_STATES

    def to_dict(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "state": self.state, "message": self.message,
                "upload": self.upload.to_dict() if self.upload else None,
                "failure": self.failure.to_dict() if self.failure else None}

    def describe(self) -> str:
        moved = f"; {self.upload.describe()}" if self.upload is not None else ""
        return f"job {self.job_id} {self.state}" + (f" ({self.message})" if self.message else "") + moved

    def failure_summary(self) -> str:
        """One line for a job that did not complete: why (the analysis, else the backend's
        message), and where its results went — what a failed flow run says."""
        why = self.failure.describe() if self.failure else (self.message or "the backend gave no reason")
        kept = ""
        if self.upload is not None:
            kept = (f"; its results were uploaded to {self.upload.route.destination}"
                    if self.upload.status == "uploaded" and self.upload.route else f"; results: {self.upload.message}")
        return f"job {self.job_id} ended {self.state}: {why}{kept}"


@dataclass(frozen=True)
class Canceled:
    """What cancel found (``was``) and left (``record``)."""

    was: str
    record: JobRecord

    @property
    def already_ended(self) -> bool:
        return self.was in TERMINAL_STATES

    def to_dict(self) -> dict[str, Any]:
        return {"job_id": self.record.job_id, "was": self.was, "state": self.record.state,
                "message": self.record.message}

    def describe(self) -> str:
        if self.already_ended:
            return f"job {self.record.job_id} had already ended {self.was}; nothing to cancel"
        return f"job {self.record.job_id} {self.record.state}" + (f" ({self.record.message})"
                                                                  if self.record.message else "")


@dataclass(frozen=True)
class Ended:
    """A job its record said was RUNNING, which a resync found ended before anything recorded its
    end (it was submitted alone, its collect gave up or died, or its collect has not looked yet):
    its end as the backend told it, now in its record, and who watches the job (its record's
    ``owner``: a run that may still be collecting it)."""

    job_id: str
    status: JobStatus
    owner: str | None = None


@dataclass(frozen=True)
class Resynced:
    """What a resync of every RUNNING job did: each resynced job's outcome (None when its backend
    moves its results itself), each failed one's reason, and the RUNNING jobs of its kind the
    backend has no trace of."""

    outcomes: dict[str, UploadOutcome | None] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    elsewhere: list[str] = field(default_factory=list)
    #: RUNNING jobs canceled because their owner was.
    canceled: list[str] = field(default_factory=list)
    #: RUNNING jobs that had ended: their end is recorded now, after one more resync (in
    #: :attr:`outcomes`, or :attr:`failed` when it failed).
    ended: dict[str, Ended] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        statuses = [outcome.status if outcome else "backend uploads" for outcome in self.outcomes.values()]
        return {"jobs": len(self.outcomes) + len(self.failed) + len(self.canceled),
                **{status: statuses.count(status) for status in sorted(set(statuses))},
                **({"failed": len(self.failed)} if self.failed else {}),
                **({"canceled": len(self.canceled)} if self.canceled else {}),
                "not on this target": len(self.elsewhere),
                "outcomes": {job_id: outcome.to_dict() if outcome else None
                             for job_id, outcome in self.outcomes.items()},
                **({"ended": {job_id: ended.status.to_dict() for job_id, ended in self.ended.items()}}
                   if self.ended else {})}

    def describe(self) -> str:
        if not (self.outcomes or self.failed or self.canceled or self.elsewhere):
            return "no RUNNING job on this target: nothing to resync"
        failed = f", {len(self.failed)} failed ({', '.join(sorted(self.failed))})" if self.failed else ""
        elsewhere = f", {len(self.elsewhere)} not on this target" if self.elsewhere else ""
        canceled = f", {len(self.canceled)} canceled (their owner was)" if self.canceled else ""
        ended = (f", {len(self.ended)} found ended ("
                 + ", ".join(f"{job_id} {ended.status.state}" for job_id, ended in sorted(self.ended.items()))
                 + ": their end is recorded now)") if self.ended else ""
        return f"resynced {len(self.outcomes)} running jobs{ended}{failed}{canceled}{elsewhere}"


def submit(request: JobRequest, backend: Backend, store: RecordStore, *, staging_root: str | Path | None = None,
           environ: Mapping[str, str] | None = None, reporter: str = "cli", owner: str | None = None,
           run: Runner = direct, say: Say | None = None) -> Submitted:
    """Stage ``request``'s inputs, launch it, verify inside its frame and leave it RUNNING; a
    retry of the same request resumes the same job (and a job already launched is not staged
    again under it). A failure before launch is said in the record (ERROR, and why), and the
    same request submitted again resumes it. ``owner``: who watches the job from here (see
    :attr:`~tao_data_io.records.JobRecord.owner`). Raises
    :class:`~tao_data_io.steps.VerifyFailed` when the verdict fails."""
    tell = say or (lambda _: None)
    request = identified(request)
    record = run(open_record, request, backend, store, reporter=reporter)
    if owner is not None:
        record = run(watch, store, record.job_id, owner)
    if record.backend_ref is not None and record.state == "PENDING" and record.verify is None:
        # Launched, and the submit that launched it stopped before the verdict: wait for it now,
        # from what that submit staged and decided — nothing is staged again under the job.
        return _confirm_launched(request, backend, store, record, staging_root=staging_root, environ=environ,
                                 reporter=reporter, run=run)
    launched = already_launched(record)
    if launched is not None:
        tell(launched.describe())
        return launched
    try:
        return _launch(request, backend, store, record, staging_root=staging_root, environ=environ, reporter=reporter,
                       run=run, tell=tell)
    except VerifyFailed:
        raise  # recorded ERROR with the verdict already
    except Exception as exc:  # the submit's failure, whatever it is, is what the record must say
        try:
            run(fail_before_launch, store, record.job_id, request, exc, environ=environ, reporter=reporter)
        except Exception as unsaid:  # noqa: BLE001 - the first failure is the one to raise
            exc.add_note(f"(its record could not say so: {unsaid})")
        raise


def _launch(request: JobRequest, backend: Backend, store: RecordStore, record: JobRecord, *,
            staging_root: str | Path | None, environ: Mapping[str, str] | None, reporter: str, run: Runner,
            tell: Say) -> Submitted:
    """Submit's steps from the tier to the verdict, for a record opened and not launched yet."""
    decision = run(decide_tier, request, backend, store, record.job_id)
    tell(f"job {record.job_id}: {decision.describe()}")
    staging_map = stage_inputs(request, backend, staging_dir(record.job_id, staging_root, environ),
                               tier=decision.tier, environ=environ, run=run)
    tell(staging_map.describe())
    record = run(route_outputs, store, record.job_id, environ)
    assert record.output_route is not None
    plan = run(build_plan, request, staging_map, decision, record, record.output_route, environ=environ,
               state_roots=state_roots(store, staging_root, environ))
    submission = run(start, plan, backend, environ=environ, documents=JobDocuments(request, record), store=store,
                     reporter=reporter)
    verdict = run(confirm, plan, backend, store, submission, reporter=reporter)
    return Submitted(record.job_id, submission.backend_ref, decision.tier, submission.started, verdict)


def _confirm_launched(request: JobRequest, backend: Backend, store: RecordStore, record: JobRecord, *,
                      staging_root: str | Path | None, environ: Mapping[str, str] | None, reporter: str,
                      run: Runner) -> Submitted:
    """Submit's last step for a job launched by an earlier attempt: its plan rebuilt from the
    staging map that attempt published, its tier (decided again: the same answer, written once)
    and its recorded route; then the verdict."""
    assert record.backend_ref is not None
    if record.output_route is None:
        raise UsageError(f"job {record.job_id} was launched as {record.backend_ref} without an output route in its "
                         "record; follow it with status or collect, or cancel it")
    decision = run(decide_tier, request, backend, store, record.job_id)
    staging_map = run(read_staging_map, staging_dir(record.job_id, staging_root, environ))
    plan = run(build_plan, request, staging_map, decision, record, record.output_route, environ=environ,
               state_roots=state_roots(store, staging_root, environ))
    verdict = run(confirm, plan, backend, store, Submission(backend_ref=record.backend_ref, started=False),
                  reporter=reporter)
    return Submitted(record.job_id, record.backend_ref, decision.tier, False, verdict)


def already_launched(record: JobRecord) -> Submitted | None:
    """The submission of a job that was launched already (opened again by a retried submit of the
    same request): staging again would change inputs under a running job, so nothing moves. A
    job whose verify failed was never started, and its submit fails again the same way
    (:class:`VerifyFailed`): a retried submit must not report a job that never ran as launched."""
    if record.backend_ref is None:
        if record.state == "CANCELED":
            raise UsageError(f"job {record.job_id} was CANCELED before it launched ({record.message}); a canceled "
                             "job stays canceled: submit the request under another job id, or without one")
        return None
    verdict = Verdict.model_validate(record.verify) if record.verify else Verdict(ok=True)
    if not verdict.ok:
        raise VerifyFailed(record.job_id, verdict)
    return Submitted(record.job_id, record.backend_ref, record.storage_tier or "A", False, verdict)


def stage_inputs(request: JobRequest, backend: Backend, staging_dir: Path, *, tier: Tier,
                 environ: Mapping[str, str] | None = None, run: Runner = direct) -> StagingMap:
    """Stage on this host when the backend reads from it (the local frame), each input a step of
    its own; otherwise only plan it and materialize the config here — the cluster stages (tier
    B's stage Job, tier C's pod, whose own disk must hold the inputs: they are sized first)."""
    if backend.capabilities.stages_on_host:
        return stage(request, staging_dir, environ=environ, run=run)
    return run(plan_stage, request, staging_dir, environ=environ, size=tier == "C")


def collect(job_id: str, backend: Backend, store: RecordStore, *, wait: bool = True,
            poll_seconds: float = DEFAULT_POLL_SECONDS, max_wait_seconds: float | None = None,
            environ: Mapping[str, str] | None = None, reporter: str = "cli", owner: str | None = None,
            run: Runner = direct, say: Say | None = None) -> Collected:
    """Wait for the end (when ``wait``; at most ``max_wait_seconds``) and record it, then upload
    the results to the recorded route with the job's excludes — also after ERROR or CANCELED —
    and, for an ERROR, return the log's tail and the failure analysis. A job not finished yet is
    reported as it stands, nothing written. ``owner``: who watches the job from here (a collect
    that takes over from a crashed one)."""
    if owner is not None:
        run(watch, store, job_id, owner)
    status = (run(wait_for_end, job_id, backend, store, poll_seconds=poll_seconds, timeout=max_wait_seconds, say=say)
              if wait else run(observe, job_id, backend, store))
    if not status.terminal:
        waited = "" if max_wait_seconds is None or not wait else f" after waiting {max_wait_seconds:g} s"
        why = f"{status.message}; " if status.message else ""
        return Collected(job_id, status.state, f"still {status.state}{waited}: {why}it keeps running, collect again "
                                               "later", None)
    run(record_end, store, job_id, status, reporter=reporter)
    upload = run(upload_job_results, job_id, backend, store, environ=environ, say=say)
    tail = failure = None
    if status.state == "ERROR":
        tail, failure = run(failure_report, job_id, backend, store)
    return Collected(job_id, status.state, status.message, upload, tail, failure)


def resync(store: RecordStore, backend: Backend, *, settle_seconds: float | None = None,
           environ: Mapping[str, str] | None = None, abandoned: Callable[[str], bool] | None = None,
           reporter: str = "cli", run: Runner = direct, say: Say | None = None) -> Resynced:
    """What a schedule runs while jobs train: upload what is new in the results of every RUNNING
    job the backend can see, one after another (each transfer is concurrent inside already). One
    job's failure, after its runner's retries, does not keep the others from their resync: it is
    reported in :attr:`Resynced.failed`, and the next run tries it again.

    A RUNNING job the backend says has ended — nothing collected it: it was submitted alone, or
    its collect gave up or died — is resynced this once more and its end recorded
    (:attr:`Resynced.ended`), so its record, and whoever reads it, no longer says RUNNING; what
    is left (the files written within the settle time, the final upload, a failure's analysis) is
    a collect's, which finds the end recorded. Its end is recorded even when that resync fails.

    ``abandoned(owner)`` says whether a job's owner was canceled (its orchestrator knows): such a
    job is canceled, not resynced — a cancel whose own hook did not get to the job (hooks are
    best-effort) still stops it within one interval."""
    seen, elsewhere = run(running_jobs, store, backend, say=say)
    outcomes: dict[str, UploadOutcome | None] = {}
    failed: dict[str, str] = {}
    canceled: list[str] = []
    ended: dict[str, Ended] = {}
    for record in seen:
        job_id = record.job_id
        try:
            if _abandoned(record, abandoned, say):
                run(cancel_job, job_id, backend, store, reporter=reporter,
                    reason=f"its owner {record.owner} was canceled")
                canceled.append(job_id)
                continue
            status = run(observe, job_id, backend, store)
            try:
                outcomes[job_id] = run(resync_job, job_id, backend, store, settle_seconds=settle_seconds,
                                       environ=environ)
            finally:  # after its last resync (a job no longer RUNNING is not resynced), and whether it moved
                if status.terminal:
                    run(record_end, store, job_id, status, reporter=reporter)
                    ended[job_id] = Ended(job_id, status, record.owner)
        except Exception as exc:  # noqa: BLE001 - reported per job; the others still resync
            failed[job_id] = f"{type(exc).__name__}: {exc}"
    return Resynced(outcomes, failed, elsewhere, canceled, ended)


def _abandoned(record: JobRecord, abandoned: Callable[[str], bool] | None, say: Say | None) -> bool:
    """Whether ``record``'s owner was canceled; an owner that cannot be asked (the orchestrator's
    API is down) is not a cancel: the job is resynced, and the next run asks again."""
    if abandoned is None or record.owner is None:
        return False
    try:
        return abandoned(record.owner)
    except Exception as exc:  # noqa: BLE001 - only a cancel the orchestrator confirms cancels
        if say is not None:
            say(f"job {record.job_id}: could not ask whether its owner {record.owner} was canceled ({exc})")
        return False


def cancel(job_id: str, backend: Backend, store: RecordStore, *, reporter: str = "cli", reason: str | None = None,
           owner: str | None = None, run: Runner = direct) -> Canceled:
    """Stop the job and everything it started; the record says CANCELED (and ``reason``). Of a
    job that already ended, only what it left running is ended, and its record stays as it is.
    ``owner``: cancel only if that owner still watches the job (a cancellation hook's)."""
    was = run(read_record, store, job_id).state
    return Canceled(was, run(cancel_job, job_id, backend, store, reporter=reporter, reason=reason, owner=owner))
