"""The steps of a job's life, each a plain function over the core's models: open the record,
decide the tier, route the outputs, start and confirm the launch, look at or wait for the job,
record its end, upload its results, report a failure, cancel it.

Why steps: :mod:`tao_data_io.verbs` composes them once per verb and runs each through a runner
(:mod:`tao_data_io.runner`) — called directly by the CLI, as its task by the Prefect layer — so
each step is small, idempotent (a retry writes nothing new) and returns a model the next step
takes as is. Nothing here moves bytes or talks to a cluster itself; the staging, routing, upload
and backend modules do.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .console import printable, shown
from .redaction import Redactor, StreamRedactor
from .errors import UsageError
from .backends import backend_for
from .launch.backend import Backend, FailureAnalysis, JobDocuments, JobStatus, LogChunk, Submission
from .launch.plan import LaunchPlan
from .names import mint_job_id
from .launch.probe import Verdict
from .launch.training import TrainingStatus, read_training_status
from .outputs import Kind, UploadOutcome, upload_results
from .records import TERMINAL_STATES, JobRecord, RecordStore, open_for
from .records.from_request import request_digest
from .reporting import ProgressCallback
from .request import JobRequest
from .routing import decide_route, record_route
from .staging.stage_map import STAGING_MAP_NAME, StagingMap
from .staging.stage_map import read_staging_map as read_map
from .tier import TierDecision, choose_tier, refuse_unsupported
from .vocabulary import (
    DEFAULT_POLL_SECONDS,
    DEFAULT_WORKDIR,
    FIRST_POLL_SECONDS,
    POLL_SECONDS_BOUNDS,
    WORKDIR_VARIABLE,
    seconds_within,
)

DEFAULT_LOG_TAIL = 100
#: The most lines of a job's log one look shows (a job printing faster is shown its newest).
MAX_LOG_LINES = 200
#: The most of one line a look shows: with :data:`MAX_LOG_LINES`, what a look says fits one record
#: of Prefect's run logs (a million characters by default).
MAX_LINE_CHARS = 4000

log = logging.getLogger(__name__)

Say = Callable[[str], None]


class VerifyFailed(UsageError):
    """The verify probe found an input unreadable or the results directory unusable, inside the
    frame; the job's command never started. Not retryable: the same inputs fail the same way."""

    def __init__(self, job_id: str, verdict: Verdict | None = None) -> None:
        # Without a verdict, ``job_id`` is the whole message: how a stored flow result is rebuilt.
        super().__init__(f"job {job_id}: {verdict.describe()}" if verdict is not None else job_id)
        self.verdict = verdict


# ----------------------------------------------------------------------------- the steps
def staging_root(root: str | Path | None = None, environ: Mapping[str, str] | None = None) -> Path:
    """Where jobs' inputs are staged and their configs written on this host: ``root``,
    ``$TAO_DATA_IO_WORKDIR`` or the default."""
    env = os.environ if environ is None else environ
    return Path(root or env.get(WORKDIR_VARIABLE) or DEFAULT_WORKDIR).expanduser().absolute()


def staging_dir(job_id: str, root: str | Path | None = None, environ: Mapping[str, str] | None = None) -> Path:
    """The job's staging directory on this host: its staged inputs and materialized config."""
    return staging_root(root, environ) / job_id


def state_roots(store: RecordStore, root: str | Path | None = None,
                environ: Mapping[str, str] | None = None) -> list[str]:
    """Where a submit keeps state on this host (:attr:`~tao_data_io.launch.plan.LaunchPlan.state_roots`):
    the root it stages every job under, and the records' directory when they are in one."""
    records = store.directory
    return [str(staging_root(root, environ)), *([str(records.expanduser().absolute())] if records else [])]


def identified(request: JobRequest) -> JobRequest:
    """``request`` with its job id: its own, or one minted now — once, before the first step, so
    every retry of every step opens the same record (and a flow can name its run after it)."""
    if request.job_id is not None:
        return request
    return request.model_copy(update={"job_id": mint_job_id()})


def fail_before_launch(store: RecordStore, job_id: str, request: JobRequest, error: BaseException, *,
                       environ: Mapping[str, str] | None = None, reporter: str = "cli") -> JobRecord:
    """Say in the record why the job's submit failed before it launched (ERROR with the reason,
    credential values masked), unless the record has moved on; the same request submitted again
    reopens it (:meth:`RecordStore.fail_before_launch`)."""
    reason = Redactor(environ, secret_names=request.forward_env)(f"submit failed before launch: {error}")
    return store.fail_before_launch(job_id, request_digest(request), reason, reporter=reporter)


def watch(store: RecordStore, job_id: str, owner: str) -> JobRecord:
    """Record ``owner`` as who watches the job from now on (a retry writes nothing new)."""
    return store.update(job_id, lambda record: record if record.owner == owner
                        else record.model_copy(update={"owner": owner}))


def read_staging_map(staging_dir: Path) -> StagingMap:
    """The staging map a submit published in the job's staging directory; a clear error when
    there is none there (another staging root, or a directory cleaned up)."""
    path = staging_dir / STAGING_MAP_NAME
    try:
        return read_map(path)
    except FileNotFoundError:
        raise UsageError(f"the staging map {path} is not there: give the staging root the job was submitted with "
                         "(staging_root)") from None


def read_record(store: RecordStore, job_id: str) -> JobRecord:
    """The job's record as it stands."""
    return store.get(job_id)


def open_record(request: JobRequest, backend: Backend, store: RecordStore, *, reporter: str = "cli") -> JobRecord:
    """Open (or re-open) the job's record; the request is pinned to the job id from here on. A
    request the backend cannot honour is refused first, so nothing is written for it."""
    refuse_unsupported(request, backend.name, backend.capabilities)
    return open_for(request, backend=backend.name, store=store, reporter=reporter)


def decide_tier(request: JobRequest, backend: Backend, store: RecordStore, job_id: str) -> TierDecision:
    """The tier from what the backend offers; stamped into the record before anything moves."""
    decision = choose_tier(request, backend.facts())
    store.set_tier(job_id, decision.tier, decision.reason)
    return decision


def route_outputs(store: RecordStore, job_id: str, environ: Mapping[str, str] | None = None) -> JobRecord:
    """Decide where results go and pin it in the record (a retry with the same decision is a no-op)."""
    return record_route(store, job_id, decide_route(job_id, os.environ if environ is None else environ))


def start(plan: LaunchPlan, backend: Backend, *, environ: Mapping[str, str] | None = None,
          documents: JobDocuments | None = None, store: RecordStore | None = None,
          reporter: str = "cli") -> Submission:
    """Preflight and submit (idempotent: a retry for a job already submitted starts nothing). The
    verify probe runs first inside the frame; :func:`confirm` waits for its verdict. ``documents``
    (the request and record the plan was built from) go to a backend whose pods stage for
    themselves.

    The record names the backend's object (``backend_ref``) the moment the backend has started
    it, before anything else can fail (a verdict that never comes, a timeout): a job that
    launched is always one cancel and collect can reach. A cancel that landed while the backend
    was starting it stops what started."""
    backend.preflight(plan, documents=documents)
    if store is None:
        return backend.submit(plan, environ=environ, documents=documents)
    _claim_launch(store, plan.job_id, backend, documents)
    try:
        submission = backend.submit(plan, environ=environ, documents=documents)
    except UsageError:
        # Refused as bad input (a forwarded variable not set here, an object someone else owns):
        # nothing of the job runs, so the claim goes and a fixed request may take the job over.
        _release_launch(store, plan.job_id)
        raise
    try:
        which = f"attempt {plan.attempt} " if plan.attempt > 1 else ""
        store.mark(plan.job_id, "PENDING", reporter=reporter, backend_ref=submission.backend_ref,
                   message=f"{which}launched as {submission.backend_ref}; "
                           "waiting for the verdict from inside its frame",
                   restored=submission.restored)
    except UsageError:
        if store.get(plan.job_id).state != "CANCELED":
            raise
        backend.cancel(submission.backend_ref)
        raise UsageError(f"job {plan.job_id} was CANCELED while it was being launched; what had started as "
                         f"{submission.backend_ref} was stopped") from None
    return submission


def _claim_launch(store: RecordStore, job_id: str, backend: Backend, documents: JobDocuments | None) -> None:
    """Pin where the job is launched (for every verb after this one: another process, another
    day) before the backend is asked — and, in the same atomic write, check that the record is
    still this request's: another submit may have replaced the request of a job that had not
    launched yet (:meth:`RecordStore.open`); then that submit launches it, not this one."""
    digest = request_digest(documents.request) if documents is not None else None

    def claim(record: JobRecord) -> JobRecord:
        if record.state != "PENDING":  # canceled (or ended) meanwhile: nothing may launch it now
            raise UsageError(f"job {job_id} is {record.state} ({record.message}); this submit started nothing")
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
            reporter: str = "cli") -> Verdict:
    """Wait for the verify verdict from inside the frame and store it in the record either way; a
    passed verdict marks the job RUNNING, a failed one marks it ERROR and raises :class:`VerifyFailed`
    (the command never started). A retry reads the same verdict and writes nothing new."""
    verdict = backend.verify(submission.backend_ref, plan)
    store.update(plan.job_id, lambda record: record.model_copy(update={"verify": verdict.to_dict()}))
    if not verdict.ok:
        store.mark(plan.job_id, "ERROR", reporter=reporter, backend_ref=submission.backend_ref,
                   message=f"verify failed: {verdict.describe()}")
        raise VerifyFailed(plan.job_id, verdict)
    store.mark(plan.job_id, "RUNNING", reporter=reporter, backend_ref=submission.backend_ref,
               message=f"{verdict.describe()}; the command started")
    return verdict


def backend_of(record: JobRecord, overrides: Mapping[str, Any] | None = None) -> Backend:
    """The backend a recorded job runs on: its name, built from the config recorded at
    launch (``overrides`` win, e.g. a work root given on the command line)."""
    return backend_for(record.backend, {**(record.backend_config or {}), **(overrides or {})})


def _known(record: JobRecord, status: JobStatus, backend: Backend) -> None:
    """A job the backend has no trace of, while the record says it is not over, is a wrong place
    to look (another work root, another cluster) — never a reason to record an end."""
    if status.state == "UNKNOWN" and record.state not in TERMINAL_STATES and record.backend_ref is not None:
        raise UsageError(f"job {record.job_id} is {record.state} in its record, but the {backend.name} backend "
                         f"here has no trace of {record.backend_ref} ({status.message}). Look where it was "
                         f"submitted (its record says {record.backend_config or 'nothing about where'}); if it "
                         "ended there before its end was recorded (a Kubernetes Job's TTL), its end is unknown: "
                         "marking its record ERROR closes it")


def _observed(record: JobRecord, backend: Backend) -> JobStatus:
    """The backend's view of the job, writing nothing; a job the backend has forgotten (UNKNOWN)
    defers to a final state in the record, and one it has no trace of while the record says it is
    not over is a wrong place to look (:func:`_known` raises)."""
    if record.backend_ref is None:  # never launched: the record says why (a failed submit) or nothing yet
        said = record.message if record.state != "PENDING" and record.message else "not launched yet"
        return JobStatus(state=record.state, message=said)
    status = backend.status(record.backend_ref)
    if status.state == "UNKNOWN" and record.state in TERMINAL_STATES:
        return JobStatus(state=record.state, message=f"{status.message}; the record says {record.state}")
    _known(record, status, backend)
    return status


def record_end(store: RecordStore, job_id: str, status: JobStatus, *, reporter: str = "cli") -> JobRecord:
    """Fold a terminal status into the record (marking it, once: terminal states are final);
    anything else changes nothing."""
    record = store.get(job_id)
    if status.terminal and record.state != status.state and record.state not in TERMINAL_STATES:
        return store.mark(job_id, status.state, reporter=reporter, message=status.message)
    return record


def observe_and_record(record: JobRecord, backend: Backend, store: RecordStore, *, reporter: str = "cli") -> JobStatus:
    """The job's status now (:func:`observe`), with a terminal state recorded (:func:`record_end`)."""
    status = _observed(record, backend)
    record_end(store, record.job_id, status, reporter=reporter)
    return status


def observe(job_id: str, backend: Backend, store: RecordStore) -> JobStatus:
    """The job's status now, as its backend sees it, writing nothing."""
    return _observed(store.get(job_id), backend)


def wait_for_end(job_id: str, backend: Backend, store: RecordStore, *, poll_seconds: float = DEFAULT_POLL_SECONDS,
                 timeout: float | None = None, say: Say | None = None, on_log: Say | None = None,
                 on_training: Callable[[TrainingStatus], None] | None = None,
                 mask: Redactor | None = None) -> JobStatus:
    """Poll until the job is terminal (long PENDING is normal: no timeout unless one is given),
    saying each change; records nothing of the end — :func:`record_end` does.

    At each look, ``on_log`` gets what the job printed since the last (its cursor kept in the
    record, so a restarted watcher goes on where this one stopped; after the end, until it has
    all) and ``on_training`` what TAO's ``status.json`` says when it changed (see
    :func:`watch_training`), both masked with ``mask`` (default: this process's credentials and
    the job's forwarded ones).

    ``poll_seconds`` is the longest pause between two looks: the pauses start at a second and
    double up to it, so a job that ends in seconds is seen in seconds and one that trains for
    hours costs a few calls a minute."""
    seconds_within(poll_seconds, POLL_SECONDS_BOUNDS, name="poll_seconds")
    if timeout is not None and not timeout >= 0:
        raise UsageError(f"the wait's timeout {timeout!r} must be 0 or more seconds, or none to wait for the end")
    started = time.monotonic()
    last = None
    pause = min(FIRST_POLL_SECONDS, poll_seconds)
    watched: Watched | None = None
    while True:
        record = store.get(job_id)  # one read a look, for the status and what the job says
        status = _observed(record, backend)
        if on_log is not None or on_training is not None:
            watched = watched or Watched(StreamRedactor(mask or Redactor(secret_names=record.forward_env)))
            watch_training(record, backend, store, watched, on_log=on_log, on_training=on_training,
                           to_the_end=status.terminal)
        over = status.terminal or (timeout is not None and time.monotonic() - started > timeout)
        if over and watched is not None and on_log is not None:
            _say_printed(job_id, watched.printed.end(), on_log)  # held back at the last look: nobody else shows it
        if status.terminal:
            return status
        if say is not None and status.describe() != last:
            say(f"job {job_id}: {shown(status.describe())}")
            last = status.describe()
        if over:
            return status
        time.sleep(pause)
        pause = min(pause * 2, poll_seconds)


@dataclass
class Watched:
    """What one watcher has shown of a job: the log masked across looks (a look may end inside a
    line longer than it takes: :class:`~tao_data_io.redaction.StreamRedactor`), and TAO's
    progress last shown."""

    printed: StreamRedactor
    training: TrainingStatus | None = None


def new_log(backend: Backend, ref: str, cursor: str | None, *, to_the_end: bool) -> Iterator[LogChunk]:
    """What the job printed since ``cursor``, chunk by chunk: one chunk for a job still running
    (the next look gets the rest; a chunk is bounded by :data:`~tao_data_io.launch.backend.FOLLOW_BYTES`),
    every chunk until nothing is new for one that has ended (``to_the_end``). The one loop over
    :meth:`Backend.follow_logs`: the watch keeps each chunk's cursor in the record, the logs
    verb's follow only in memory. A chunk that moved no cursor ends it (yielded first if it holds text)."""
    while True:
        chunk = backend.follow_logs(ref, cursor)
        if chunk.cursor == cursor:
            if chunk.text:
                yield chunk
            return
        yield chunk
        cursor = chunk.cursor
        if not (to_the_end and chunk.text):
            return


def watch_training(record: JobRecord, backend: Backend, store: RecordStore, watched: Watched, *,
                   on_log: Say | None = None, on_training: Callable[[TrainingStatus], None] | None = None,
                   to_the_end: bool = False) -> None:
    """One look at what the job of ``record`` is saying: the log since the record's cursor to
    ``on_log`` (at most :data:`MAX_LOG_LINES` lines a look, masked whole and made printable; the
    cursor then moves on in the record; ``to_the_end``, the job has ended: looks again until
    nothing is new), and TAO's progress to ``on_training`` when it differs from the one
    ``watched`` last showed. Never raises: a display must not fail the watch of the job it
    describes (the record and the end are the watch's)."""
    job_id, ref = record.job_id, record.backend_ref
    if ref is None:
        return
    try:
        if on_log is not None:
            for chunk in new_log(backend, ref, record.log_cursor, to_the_end=to_the_end):
                _say_printed(job_id, watched.printed.feed(chunk.text), on_log)

                def moved(current: JobRecord, to: str = chunk.cursor) -> JobRecord:
                    return current.model_copy(update={"log_cursor": to})

                store.update(job_id, moved)
        if on_training is not None:
            status = read_training_status(backend.training_status(ref), mask=watched.printed.redactor)
            if status is not None and status != watched.training:
                on_training(status)
                watched.training = status
    except Exception as exc:  # noqa: BLE001 - a pod not started yet, a log gone, a display that failed
        log.debug("job %s: nothing to show this time: %s", job_id, exc)  # the next look tries again


def _say_printed(job_id: str, text: str, on_log: Say) -> None:
    """Hand on what the job printed (masked already), as at most :data:`MAX_LOG_LINES` lines of at
    most :data:`MAX_LINE_CHARS` each, every control character but the tab escaped: a job's text
    moves no cursor and starts no line of its own but where it printed one."""
    if not text:
        return
    lines = printable(text).removesuffix("\n").split("\n")
    shown_lines = [line if len(line) <= MAX_LINE_CHARS else
                   f"{line[:MAX_LINE_CHARS]} [{len(line) - MAX_LINE_CHARS:,} more characters of this line not shown]"
                   for line in lines[-MAX_LOG_LINES:]]
    if len(lines) > MAX_LOG_LINES:
        shown_lines.insert(0, f"[{len(lines) - MAX_LOG_LINES:,} earlier lines of job {job_id} not shown here; "
                              "its whole log has them]")
    on_log("\n".join(shown_lines))


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


def resync_job(job_id: str, backend: Backend, store: RecordStore, *, settle_seconds: float | None = None,
               environ: Mapping[str, str] | None = None,
               progress: ProgressCallback | None = None) -> UploadOutcome | None:
    """Upload what is new in a RUNNING job's results (see :func:`upload_job_results`); it leaves at
    once when another upload of the job holds the lock."""
    return upload_job_results(job_id, backend, store, kind="resync", settle_seconds=settle_seconds, environ=environ,
                              progress=progress)


def running_jobs(store: RecordStore, backend: Backend, *,
                 say: Say | None = None) -> tuple[list[JobRecord], list[str]]:
    """The RUNNING jobs of this backend: those it can see (what a resync through it can
    reach), and those it has no trace of — submitted through another target (another work root,
    another namespace) or lost with their host. A store that does not exist yet holds no jobs
    (a schedule may start before the first submit); ``say`` hears of it, since a mistyped
    location would look the same."""
    if not store.exists():
        if say is not None:
            say(f"the records location {store.location} does not exist (yet): no job to resync")
        return [], []
    seen: list[JobRecord] = []
    elsewhere: list[str] = []
    for record in store.list_records(state="RUNNING"):
        if record.backend == backend.name and record.backend_ref is not None:
            if backend.status(record.backend_ref).state != "UNKNOWN":
                seen.append(record)
            else:
                elsewhere.append(record.job_id)
    return seen, elsewhere


def cancel_job(job_id: str, backend: Backend, store: RecordStore, *, reporter: str = "cli",
               reason: str | None = None, owner: str | None = None) -> JobRecord:
    """Stop the job and everything it started and mark the record CANCELED, saying ``reason`` —
    unless it already ended (terminal states are final: the backend ends only what it left
    running) or the backend cannot find it (see :func:`_known`). Returns the record as it now
    stands. With ``owner``, only a job that owner watches (or nobody does) is canceled: a run
    that lost its job to a newer watcher must not cancel it."""
    record = store.get(job_id)
    if owner is not None and record.owner not in (None, owner):
        log.info("job %s: not canceled for %s, which no longer watches it (%s does)", job_id, owner, record.owner)
        return record
    if record.state in TERMINAL_STATES:
        if record.backend_ref is not None:
            backend.cancel(record.backend_ref)
        return record
    if record.backend_ref is not None:
        _known(record, backend.status(record.backend_ref), backend)
        stopped = backend.cancel(record.backend_ref)
    else:
        stopped = False
    said = f"canceled: {reason}" if reason else "canceled"
    return store.mark(job_id, "CANCELED", reporter=reporter,
                      message=said + ("" if stopped else " (nothing was running)"))
