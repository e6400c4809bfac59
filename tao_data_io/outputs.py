"""Getting a job's results to where its route says, and remembering that we did.

One function, :func:`upload_results`, serves both the final upload after a job ends and the
scheduled resync while it runs, because they must agree on everything that matters:

* **what** is uploaded: ``.tao/*`` (TAO's own bookkeeping, not results) never is.
  It is appended *last* to the rules, so with aws semantics (last match wins) no ``--include``
  can re-admit it. The job's declared excludes and the caller's rules go before it.
* **when**: also after a failed or cancelled job — its checkpoints and logs are exactly what the
  user needs to debug it.
* **how**: through the transfer engine, which already uploads only new or changed files, never
  follows a symlink out of the tree, refuses special files and skips a file hard-linked from
  outside the tree. The job controls its results path, so the directory itself must not be a
  symlink or lie under one (it could name any tree the uploader can read): refused, naming it.
* **half-written files**: files modified in the last ``settle_seconds`` wait for a later run.
  A resync, which overlaps the writer, defaults to :data:`DEFAULT_SETTLE_SECONDS`; the explicit
  upload defaults to 0 (it runs after the job, when every byte must go now).
* **whose**: the job's record's. The prefix is claimed for the record before a byte moves, and
  one claimed for another record (another store's job of the same id) is refused
  (:mod:`.results_claim`); a restore checks the same claim.
* **how much**: the job's ``results_limit`` bounds what the prefix holds once the upload ends —
  what earlier uploads left there counts too, since an upload never deletes.
* **one at a time per job**: the record store's upload lock for the job (a ``flock`` beside
  directory records, a lease object beside S3 records, so pods on different machines see
  it). A scheduled resync that finds it held leaves (the holder is doing the same work); a
  final upload waits for it, so an older resync can never finish after — and overwrite — the
  final upload.

Every upload that did something is appended to the record's ``uploads`` (names, counts and
bytes only — never a credential). An entry with ``final: true`` says the job was already
terminal when it started, it waited for nothing and nothing failed; once that exists for the
job's destination, a resync has nothing left to do and says so.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from .credentials import s3_credentials_from_env
from .redaction import Redactor
from .errors import TransferError, UnsafePathError, UsageError
from .fs.confinement import check_relative, is_within
from .records import JobRecord, OutputRoute, RecordStore
from .quantities import quantity_bytes
from .results_claim import Claim, ClaimedElsewhere, check_claim, claim, claimant_of
from .routing import decide_route, ephemeral_warning
from .transfer.activity import Activity
from .transfer.client import explained
from .transfer.engine import TransferEngine
from .transfer.options import TransferOptions
from .transfer.filters import FilterRule, PathFilter
from .reporting import MAX_EXAMPLES, ProgressCallback, human_size
from .transfer.summary import Skipped, TransferSummary
from .upload_head_start import HeadStart
from .uris import parse_s3_url
from .vocabulary import ALWAYS_EXCLUDED, DEFAULT_SETTLE_SECONDS, SETTLE_SECONDS_BOUNDS, TERMINAL_STATES, seconds_within

#: Failed names kept in one uploads entry; the count is always exact. A broken bucket can fail
#: every file of a large tree, and the record must stay a small, readable document.
MAX_FAILED_NAMES = 50

Kind = Literal["upload", "resync"]
Status = Literal["uploaded", "mount", "ephemeral", "busy", "done", "waiting"]


@dataclass(frozen=True)
class UploadOutcome:
    """What :func:`upload_results` did. ``summary`` and ``entry`` are set when it uploaded."""

    status: Status
    #: A human line saying what happened and why (the ephemeral warning for that route).
    message: str
    route: OutputRoute | None = None
    summary: TransferSummary | None = None
    #: The entry appended to the record's ``uploads`` (None when nothing was recorded).
    entry: dict[str, object] | None = None

    def to_dict(self) -> dict[str, object]:
        return {"status": self.status, "message": self.message,
                **({"destination": self.route.destination} if self.route else {}),
                **({"summary": self.summary.to_dict()} if self.summary else {})}

    def describe(self) -> str:
        if self.summary is None:
            return self.message
        summary = self.summary
        return (f"uploaded {summary.transferred_files} files ({human_size(summary.transferred_bytes)}) to "
                f"{self.route.destination if self.route else '?'}, {summary.unchanged_files} already there, "
                f"{summary.excluded_files} excluded"
                + (f", {summary.failed_files} FAILED" if summary.failed_files else ""))


def results_filter(rules: Sequence[FilterRule] = (), upload_excludes: Sequence[str] = ()) -> PathFilter:
    """The caller's rules in order, then the job's declared excludes, then TAO's state at any depth:
    with last-match-wins, nothing a caller includes can re-admit what the job declared or ``.tao/``."""
    final = [FilterRule("exclude", pattern) for pattern in upload_excludes]
    final += [FilterRule("exclude", ALWAYS_EXCLUDED), FilterRule("exclude", f"*/{ALWAYS_EXCLUDED}")]
    return PathFilter(tuple(rules)).plus(*final)


def resolve_route(record: JobRecord, environ: Mapping[str, str]) -> OutputRoute:
    """The route recorded at submit, or — for a job submitted without one — the decision now."""
    return record.output_route or decide_route(record.job_id, environ)


def final_upload(record: JobRecord, destination: str) -> Mapping[str, object] | None:
    """The entry of a successful final upload to ``destination``, if the job is terminal and has
    one — of its latest attempt (an earlier attempt's final upload is not this one's)."""
    if record.state not in TERMINAL_STATES:
        return None
    since = record.attempts[-1].started_at.isoformat() if record.attempts else ""
    return next((entry for entry in reversed(record.uploads)
                 if entry.get("final") is True and entry.get("destination") == destination
                 and str(entry.get("started_at", "")) >= since), None)


def upload_results(store: RecordStore, job_id: str, results_dir: Path, *, kind: Kind = "upload",
                   rules: Sequence[FilterRule] = (), upload_excludes: Sequence[str] = (),
                   settle_seconds: float | None = None, environ: Mapping[str, str] | None = None,
                   engine: TransferEngine | None = None, progress: ProgressCallback | None = None,
                   on_wait: Callable[[str], None] | None = None, begun: HeadStart | None = None) -> UploadOutcome:
    """Upload ``results_dir`` to the job's routed destination and record what happened.

    ``kind="upload"`` is the explicit (final) upload: it waits for a running resync and, unless
    told otherwise, uploads everything now (settle 0) — it runs when the writer is gone, and a
    record nobody marked terminal (a SLURM run) must not make it hold back the last files.
    ``kind="resync"`` is the scheduled unit: it leaves when another upload holds the lock, does
    nothing once a final upload succeeded, records an entry only when it moved or failed
    something, and waits :data:`DEFAULT_SETTLE_SECONDS` for files to settle unless told otherwise.

    ``begun``: the command's head start (:mod:`.upload_head_start`): the job's upload lock it
    holds stands for this upload's, and its engine and listing are taken over. Nothing else of it
    is believed: the record is read and validated here, as without one.

    Raises :class:`UsageError` for bad input (no record, a results dir that is not a directory
    or, on the mount route, not under the mount), for a prefix another job record claimed, and for
    results the prefix could not hold within the job's ``results_limit``: nothing is uploaded then.
    Failed files are in the summary, not raised.
    """
    env = os.environ if environ is None else environ
    if settle_seconds is not None:
        seconds_within(settle_seconds, SETTLE_SECONDS_BOUNDS, name="settle_seconds")
    record = store.get(job_id)
    route = resolve_route(record, env)
    if route.route == "mount":
        return _on_mount(route, results_dir)
    if route.route == "ephemeral":
        return UploadOutcome("ephemeral", ephemeral_warning(job_id), route)
    if route.route != "s3":
        raise UsageError(f"job {job_id!r} has output route {route.route!r} in its record, which this version "
                         "does not know (mount, s3 or ephemeral): record the route again, replacing it (force)")
    if kind == "resync" and not results_dir.exists():
        # A schedule usually starts before the job has created its results directory.
        return UploadOutcome("waiting", f"{results_dir} does not exist yet: nothing to resync for job {job_id}", route)
    if not results_dir.is_dir():
        raise UsageError(f"results_dir {str(results_dir)!r} is not a directory: give the directory the job "
                         "writes its results to")
    if begun is not None and engine is None:
        engine = begun.engine
    credentials = None if engine is not None else s3_credentials_from_env(env)  # fail before waiting
    # The upload's progress: the lock is renewed only while it moves.
    activity = Activity() if begun is None else begun.activity
    lock = (store.upload_lock(job_id, wait=kind == "upload", on_wait=on_wait, activity=activity) if begun is None
            else nullcontext(begun.held))
    with lock as held:
        if not held:
            return UploadOutcome("busy", f"another resync or upload of job {job_id} holds the lock; this run "
                                         "leaves the work to it", route)
        record = store.get(job_id)  # the state may have changed while we waited
        done = final_upload(record, route.destination) if kind == "resync" else None
        if done is not None:
            return UploadOutcome("done", f"job {job_id} is {record.state} and its final upload to "
                                         f"{route.destination} succeeded at {done.get('at')}: nothing left to resync",
                                 route)
        if settle_seconds is None:
            settle_seconds = DEFAULT_SETTLE_SECONDS if kind == "resync" else 0.0
        started = _now()
        declared = [*record.upload_excludes, *upload_excludes]
        budget = (None if record.results_limit is None
                  else (quantity_bytes(record.results_limit),
                        f"the job's outputs.results_limit {record.results_limit}"))
        options = TransferOptions(filter=results_filter(rules, declared), settle_seconds=settle_seconds,
                                  progress=progress, untrusted_source="results_dir", budget=budget,
                                  activity=activity)
        prefix = parse_s3_url(route.destination, field="output_route.destination")
        with ExitStack() as own:
            if engine is None:
                assert credentials is not None
                engine = own.enter_context(TransferEngine(credentials))
            claim(engine, prefix, Claim(claimant_of(record, route), store.location), refused="nothing was uploaded")
            summary = engine.upload_directory(results_dir, prefix, options, None if begun is None else begun.listing)
        entry = _entry(kind, route, results_dir, record, settle_seconds, started, summary,
                       Redactor(env, secret_names=record.forward_env))
        final = bool(entry["final"])
        recorded = kind == "upload" or final or bool(summary.transferred_files or summary.failed_files)
        if recorded:
            store.update(job_id, lambda current: current.model_copy(update={"uploads": [*current.uploads, entry]}))
    what = "final upload" if final else "upload"
    note = f"{what} recorded in job {job_id}'s uploads" if recorded else "nothing moved or failed; not recorded"
    return UploadOutcome("uploaded", note, route, summary, entry if recorded else None)


def restore_results(source: str, results_dir: Path, *, belongs_to: str | None = None,
                    environ: Mapping[str, str] | None = None) -> str:
    """Download what earlier attempts of a job uploaded (``source``: its route's prefix) into
    ``results_dir`` before its next attempt's command starts, so TAO resumes from its newest
    checkpoint instead of epoch 0 — and the upload at the end does not overwrite the earlier
    results with a restart's. A sync down: what is already there and the same is kept.

    ``belongs_to``: the job record the prefix must belong to (the route's ``belongs_to``); a
    prefix claimed for another record is refused (:class:`UsageError`) before a byte moves. None
    checks nothing: for a prefix named by hand, with no record behind it.

    A key no directory can hold as a result (``../x``, an absolute or over-long name: it would land
    outside ``results_dir`` or nowhere) is skipped, every time, and named with the fix in what this
    returns: it cannot come back, and a job that could never resume for one planted key would fail
    every retry. Any other file that fails fails the launch (retryable): a resumed job must not
    start from less than it had. Returns what was restored, for the attempt's record."""
    env = os.environ if environ is None else environ
    prefix = parse_s3_url(source, field="restore_from").as_prefix()
    unrestorable = TransferSummary(source, str(results_dir), names_kept=MAX_EXAMPLES)  # what the report names
    with TransferEngine(s3_credentials_from_env(env)) as engine:
        if belongs_to is not None:
            check_claim(engine, prefix, belongs_to, refused="nothing was restored")
        pages = _restorable(engine.pages(prefix), prefix.key, unrestorable)
        summary = engine.download_prefix(prefix, results_dir, TransferOptions(), pages=pages)
    redact = Redactor(env)
    if not summary.ok:
        first = summary.failed[0]
        raise TransferError(redact(
            f"restoring the results of earlier attempts from {source}: {summary.failed_files} file(s) failed, first "
            f"{first.name}: {first.reason}. A passing fault (the network, the store) is cleared by submitting again, "
            f"which restores the rest; a key that fails every time is one this results directory cannot hold: "
            f"rename or delete it under {source}"))
    restored = (f"{summary.transferred_files} file(s) ({human_size(summary.transferred_bytes)}) from {source}, "
                f"{summary.unchanged_files} already there")
    skipped = unrestorable.skipped_files
    if skipped:
        named = "; ".join(f"{item.name!r} ({item.reason})" for item in unrestorable.skipped)
        more = f" and {unrestorable.skipped_unkept} more" if unrestorable.skipped_unkept else ""
        restored += (f"; {skipped} key(s) skipped, which no results directory can hold: {named}{more}: rename or "
                     f"delete it under {source} (a plain relative name is restored)")
    return redact(restored)


def _restorable(pages: Iterable[dict[str, Any]], base: str, unrestorable: TransferSummary) -> Iterator[dict[str, Any]]:
    """``pages`` without the keys no directory can hold as a result (:func:`~tao_data_io.fs.confinement.check_relative`
    refuses their name under ``base``), each told to ``unrestorable`` as skipped; one page at a time."""
    for page in pages:
        contents = []
        for item in page.get("Contents", ()):
            key = item["Key"]
            if not key.endswith("/"):  # a folder marker is the engine's to skip
                try:
                    check_relative(key[len(base):], what="key")
                except UnsafePathError as exc:
                    unrestorable.skip(Skipped(key, str(exc)))
                    continue
            contents.append(item)
        yield {**page, "Contents": contents}


#: The object an upload check puts (and deletes) under a job's results prefix.
UPLOAD_CHECK_NAME = ".tao-data-io-upload-check"


@dataclass(frozen=True)
class UploadCheck:
    ok: bool
    detail: str


def check_upload(store: RecordStore, job_id: str, *, environ: Mapping[str, str] | None = None,
                 engine: TransferEngine | None = None) -> UploadCheck:
    """Prove, with *this* frame's credentials, that the job's results can reach their route: claim
    the results prefix for the job's record (:mod:`.results_claim`; a prefix another record holds
    fails the check), put a small object under it, then delete it.

    Why: where results persist only through an upload (a Kubernetes tier C pod), a token written
    into the results directory proves nothing — the directory dies with the pod. Run inside the
    frame before the job starts, this is the persistence check of the verify verdict. A mount
    route has nothing to prove here (the probe's token write on the volume is the check); an
    ephemeral route fails: nothing will persist.
    """
    env = os.environ if environ is None else environ
    record = store.get(job_id)
    route = resolve_route(record, env)
    if route.route == "mount":
        return UploadCheck(True, f"results persist on the mount {route.destination}; nothing to upload")
    if route.route != "s3":
        return UploadCheck(False, f"results are {route.route}: nothing persists once the frame ends")
    prefix = parse_s3_url(route.destination, field="output_route.destination").as_prefix()
    key = f"{prefix.key}{UPLOAD_CHECK_NAME}"
    redact = Redactor(env)
    try:
        own = engine or TransferEngine(s3_credentials_from_env(env))
        try:
            claim(own, prefix, Claim(claimant_of(record, route), store.location), refused="nothing was put")
            with explained(prefix.bucket, own.credentials.endpoint_url):
                own.client.put_object(Bucket=prefix.bucket, Key=key, Body=b"tao-data-io upload check\n")
                own.client.delete_object(Bucket=prefix.bucket, Key=key)
        finally:
            if engine is None:
                own.close()
    except ClaimedElsewhere as exc:  # another record's prefix: the refusal says whose, and the fix
        return UploadCheck(False, redact(str(exc)))
    except Exception as exc:  # noqa: BLE001 - any failure is the verdict, said without a secret
        return UploadCheck(False, redact(f"cannot put and delete s3://{prefix.bucket}/{key}: {exc}"))
    return UploadCheck(True, f"put and deleted s3://{prefix.bucket}/{key} with this frame's credentials")


def _on_mount(route: OutputRoute, results_dir: Path) -> UploadOutcome:
    # Copying would hide the real problem (the job wrote somewhere else) and double the bytes.
    if not is_within(results_dir, route.destination):
        raise UsageError(f"results_dir {str(results_dir)!r} is not under the job's mount destination "
                         f"{route.destination!r} ({route.reason}); nothing is uploaded on this route and nothing "
                         f"was copied: make the job write its results under {route.destination}")
    return UploadOutcome("mount", f"nothing to upload: results are already on the mount at {route.destination}",
                         route)


def _entry(kind: Kind, route: OutputRoute, results_dir: Path, record: JobRecord, settle_seconds: float,
           started: datetime, summary: TransferSummary, redact: Redactor) -> dict[str, object]:
    """The uploads entry: what moved, what was left and why, in counts and names only. Every
    string is redacted, so even a file named after a secret cannot put its value in the record."""
    failed = [redact(failure.name) for failure in summary.failed[:MAX_FAILED_NAMES]]
    return {
        "at": _now().isoformat(),
        "started_at": started.isoformat(),
        "by": kind,
        "route": route.route,
        "destination": redact(route.destination),
        "results_dir": redact(str(results_dir.absolute())),
        "job_state": record.state,
        "final": record.state in TERMINAL_STATES and settle_seconds == 0 and summary.ok,
        "settle_seconds": settle_seconds,
        "ok": summary.ok,
        "uploaded_files": summary.transferred_files,
        "uploaded_bytes": summary.transferred_bytes,
        "unchanged_files": summary.unchanged_files,
        "excluded_files": summary.excluded_files,
        "skipped_files": summary.skipped_files,
        "failed_files": summary.failed_files,
        "failed": failed,
    }


def _now() -> datetime:
    return datetime.now(timezone.utc)
