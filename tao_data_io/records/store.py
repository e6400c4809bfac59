"""The record store: the rules of a job's life, once, over any storage.

Why this module exists: a Kubernetes Job object is TTL-deleted soon after it finishes, so the
record is the single source of truth about a job from then on — its inputs, storage tier,
state history, output route and uploads. Its rules hold whichever storage keeps it:

* ``open`` is idempotent on the identity fields: a retried submit gets the same record back,
  a different job under a taken id is refused;
* ``mark`` follows the state machine: terminal states are final, so a late or retried report
  can never resurrect a finished job; a report that changes nothing writes nothing. The one way
  back is ``open`` of a job whose submit failed before anything of it launched
  (:meth:`RecordStore.fail_before_launch`): nothing ran, so a retried or fixed request may run it;
* ``set_tier`` decides the storage tier once (the record is opened before it is known);
* ``update`` lets the routing and upload steps change their own fields and nothing else;
* no field may hold a credential value (the model refuses it).

Every change is a read-modify-write that a storage makes safe: under a lock (a directory) or
conditional on the version read (S3). A conditional write that lost a race is retried from a
fresh read with jittered backoff, a bounded number of times, so concurrent writers — the CLI,
the in-pod agent, Prefect flows in other pods — never lose each other's updates.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..transfer.activity import Activity
from ..errors import TaoDataIOError, UsageError
from ..names import check_backend_ref, check_job_id, mint_job_id
from .storage import DEFAULT_LEASE_SECONDS, DamagedRecordError
from .directory import DirectoryStorage
from .location import locate
from .model import (GUARDED_FIELDS, IDENTITY_FIELDS, TERMINAL_STATES, JobRecord, check_state, check_tier, decoded, now,
                    validated)

log = logging.getLogger(__name__)


class RecordConflictError(TaoDataIOError):
    """Every attempt to write a record lost the race to another writer; nothing was written."""


@dataclass(frozen=True)
class Retry:
    """How often a write that lost a race is tried again, and how long to pause in between:
    exponential from ``first_pause`` up to ``max_pause``, each pause drawn from its upper half
    so writers that collided once do not collide again in lockstep."""

    attempts: int = 12
    first_pause: float = 0.05
    max_pause: float = 2.0

    def pause(self, attempt: int) -> float:
        ceiling = min(self.max_pause, self.first_pause * 2 ** (attempt - 1))
        return random.uniform(ceiling / 2, ceiling)


class RecordStore:
    """Job records in a directory or under an ``s3://bucket/prefix/``.

    ``root`` is a path or a string (a path or an ``s3://`` prefix); when None, the location is
    ``$TAO_DATA_IO_RECORDS``, else the legacy ``$TAO_DATA_IO_JOBS_DIR``, else
    ``~/.tao-data-io/jobs`` (see :mod:`.location`). ``environ`` (default ``os.environ``) is where
    those variables and the S3 credentials are read. ``retry`` bounds the retries of a write
    that lost a race.
    """

    def __init__(self, root: Path | str | None = None, *, environ: Mapping[str, str] | None = None,
                 retry: Retry = Retry()) -> None:
        where = locate(root, environ)
        #: The storage (a directory or a bucket); public for tools that inspect it.
        self.storage = where.storage
        #: Where the records live, as people write it: a directory path or ``s3://bucket/prefix/``.
        self.location = self.storage.describe()
        self._origin = where.origin
        self.retry = retry

    @property
    def directory(self) -> Path | None:
        """The directory on this host that holds the records, or None when they live in a bucket:
        a backend that binds host paths keeps it out of a job's reach."""
        return self.storage.root if isinstance(self.storage, DirectoryStorage) else None

    # -- the rules -------------------------------------------------------------------------

    def open(self, *, backend: str, image: str, network_arch: str, action: str, results_dir: str,
             storage_tier: str | None = None, storage_reason: str | None = None, job_id: str | None = None,
             reporter: str = "cli", upload_excludes: Sequence[str] = (), forward_env: Sequence[str] = (),
             request_digest: str | None = None, results_limit: str | None = None) -> JobRecord:
        """Create a PENDING record and return it; ``job_id`` is minted when not given.

        Idempotent for a retried submit: if the id exists with the same identity fields, the
        existing record is returned. A different job under that id is refused. A tier given
        here is :meth:`set_tier` on the record (usually the tier is decided later).
        """
        if storage_reason is not None and storage_tier is None:
            raise UsageError(f"storage_reason {storage_reason!r} comes without a storage_tier: a reason explains a "
                             "tier; give both, or set them together later with set_tier")
        stamp = now()
        job_id = mint_job_id(stamp) if job_id is None else check_job_id(job_id, what="job_id")
        record = validated(dict(
            job_id=job_id, backend=backend, image=image, network_arch=network_arch, action=action,
            storage_tier=storage_tier, storage_reason=storage_reason, results_dir=results_dir,
            upload_excludes=list(upload_excludes), forward_env=list(forward_env), request_digest=request_digest,
            results_limit=results_limit, state="PENDING",
            created_at=stamp, updated_at=stamp,
            history=[dict(at=stamp, state="PENDING", reporter=reporter, message="opened")]))
        existing = self._create(record)
        if existing is None:
            return record
        if existing.identity() != record.identity():
            if not (_unlaunched(existing) and existing.request_digest and record.request_digest):
                raise self._different(existing, record)
            existing = self._modify(job_id, lambda current: self._replaced(current, record, reporter))
        elif _failed_before_launch(existing):
            existing = self._modify(job_id, lambda current: _reopened(current, reporter))
        elif _ran_and_ended(existing):
            existing = self._modify(job_id, lambda current: _relaunched(current, reporter))
        if storage_tier is not None:
            return self.set_tier(job_id, storage_tier, storage_reason)
        return existing

    def _different(self, existing: JobRecord, record: JobRecord) -> UsageError:
        different = [("its request differs" if name == "request_digest" else
                      f"{name} is {getattr(existing, name)!r} there, {getattr(record, name)!r} here")
                     for name in IDENTITY_FIELDS if getattr(existing, name) != getattr(record, name)]
        launched = "" if _unlaunched(existing) else f", which is {existing.state} and was launched"
        return UsageError(f"job_id {record.job_id!r} already names a different job ({'; '.join(different)}) in "
                          f"{self.location}{launched}: pick another job id, or omit it to mint one")

    def _replaced(self, current: JobRecord, record: JobRecord, reporter: str) -> dict[str, Any] | None:
        """``current`` opened for ``record``'s request instead: a submit that failed before launch
        (an input missing, a gate refusing) left a PENDING record, and the request fixed under the
        same job id runs it. Everything decided for the old request goes; the history stays."""
        if current.identity() == record.identity():
            return None  # another open of the same request got here first
        if not _unlaunched(current):
            raise self._different(current, record)
        stamp = now()
        data = current.model_dump()
        data.update({name: getattr(record, name) for name in IDENTITY_FIELDS})
        data.update(upload_excludes=record.upload_excludes, forward_env=record.forward_env,
                    results_limit=record.results_limit, storage_tier=None,
                    storage_reason=None, output_route=None, verify=None, backend_config=None, updated_at=stamp,
                    state="PENDING", message="opened again for a changed request; the earlier one never launched")
        data["history"].append(dict(at=stamp, state="PENDING", reporter=reporter, message=data["message"]))
        return data

    def fail_before_launch(self, job_id: str, request_digest: str | None, reason: str, *,
                           reporter: str) -> JobRecord:
        """Mark ERROR, with ``reason``, a job whose submit failed before the backend was asked to
        launch it — so its record does not read as a job about to start; ``open`` of the same or a
        fixed request reopens it. Once a launch began (``backend_config`` pinned) the record stays
        PENDING with the reason, and a retried submit resumes the launch. A record that moved on
        (launched, ended, or opened by another submit for another request) is left alone."""

        def change(record: JobRecord) -> dict[str, Any] | None:
            ours = request_digest is None or record.request_digest in (None, request_digest)
            if record.state != "PENDING" or record.backend_ref is not None or not ours:
                return None
            # A launch that began (the backend was asked) may have left something behind: the
            # record stays PENDING, saying why, and a retry resumes the launch where it is.
            state = "PENDING" if record.backend_config is not None else "ERROR"
            stamp = now()
            data = record.model_dump()
            data.update(state=state, message=reason, updated_at=stamp)
            data["history"].append(dict(at=stamp, state=state, reporter=reporter, message=reason))
            return data

        return self._modify(job_id, change)

    def mark(self, job_id: str, state: str, *, reporter: str, backend_ref: str | None = None,
             message: str | None = None, restored: str | None = None) -> JobRecord:
        """Record a state report and return the record.

        Terminal states are final: re-marking the same terminal state changes nothing (a
        retried report is harmless); any other state is refused. A report that would change
        nothing (same state, no new message or backend ref) is a no-op too, so repeated
        "still RUNNING" reports do not flood the history.

        The first backend ref of a launch opens the job's next attempt (with ``restored``: what
        was restored into its results first); a terminal state ends it.
        """
        check_state(state)
        if backend_ref is not None:
            check_backend_ref(backend_ref)

        def change(record: JobRecord) -> dict[str, Any] | None:
            if record.state in TERMINAL_STATES:
                if state == record.state:
                    return None
                raise UsageError(f"job {job_id!r} is already {record.state}, a final state; refusing to mark it "
                                 f"{state}. Open a new job to run it again")
            if record.backend_ref and backend_ref and backend_ref != record.backend_ref:
                raise UsageError(f"job {job_id!r} already runs as {record.backend_ref!r}; refusing backend_ref "
                                 f"{backend_ref!r}: one record tracks one backend object")
            if (state == record.state and message in (None, record.message)
                    and backend_ref in (None, record.backend_ref)):
                return None
            stamp = now()
            data = record.model_dump()
            data.update(state=state, message=message, backend_ref=backend_ref or record.backend_ref, updated_at=stamp)
            data["history"].append(dict(at=stamp, state=state, reporter=reporter, message=message))
            attempts = data["attempts"]
            if backend_ref and not record.backend_ref:
                attempts.append(dict(number=len(attempts) + 1, started_at=stamp, backend_ref=backend_ref,
                                     restored=restored))
            if state in TERMINAL_STATES and attempts and attempts[-1]["ended_at"] is None:
                attempts[-1].update(ended_at=stamp, state=state)
            return data

        return self._modify(job_id, change)

    def set_tier(self, job_id: str, tier: str, reason: str | None) -> JobRecord:
        """Record the storage tier the job's inputs are staged for, and why.

        Decided once: the same tier again changes nothing (a retried step is harmless, and the
        first reason is kept); a different tier is refused, because the inputs were already
        staged for the first one. A finished job ran without a tier and refuses one.
        """
        check_tier(tier, what="tier")

        def change(record: JobRecord) -> dict[str, Any] | None:
            if record.storage_tier == tier:
                return None
            if record.state in TERMINAL_STATES:
                raise UsageError(f"job {job_id!r} is already {record.state}, a final state; refusing to set its "
                                 f"storage tier to {tier!r}: the tier describes how a job will run")
            if record.storage_tier is not None:
                why = f" ({record.storage_reason})" if record.storage_reason else ""
                raise UsageError(f"job {job_id!r} already has storage tier {record.storage_tier!r}{why}; refusing "
                                 f"tier {tier!r}: its inputs are placed for the first. Open a new job for another tier")
            return {**record.model_dump(), "storage_tier": tier, "storage_reason": reason, "updated_at": now()}

        return self._modify(job_id, change)

    def update(self, job_id: str, fn: Callable[[JobRecord], JobRecord]) -> JobRecord:
        """Change a record atomically: ``fn`` gets the current record and returns the new one
        (``record.model_copy(update=...)``). For the steps that own ``output_route`` and
        ``uploads``; identity, state, history and tier belong to open, mark and set_tier.

        ``fn`` may run more than once (each time on a fresher record) when another writer got
        in first, so it must derive its result from the record it is given, never from state
        it keeps itself.
        """

        def change(record: JobRecord) -> dict[str, Any] | None:
            new = fn(record)
            # warnings=False: a serializer warning would print the unvalidated (maybe secret) value.
            data = new.model_dump(warnings=False)
            changed = {name for name in JobRecord.model_fields if getattr(new, name) != getattr(record, name)}
            if changed & GUARDED_FIELDS:
                raise UsageError(f"update of job {job_id!r} may not change "
                                 f"{', '.join(sorted(changed & GUARDED_FIELDS))}: identity is fixed at open, "
                                 "state goes through mark and the tier through set_tier")
            return {**data, "updated_at": now()} if changed else None

        return self._modify(job_id, change)

    def get(self, job_id: str) -> JobRecord:
        check_job_id(job_id, what="job_id")
        loaded = self._load(job_id)
        if loaded is None:
            raise self._missing(job_id)
        return loaded[0]

    def exists(self) -> bool:
        """Whether the location exists (a directory made, a bucket there) — before the first
        record is written, it may not."""
        return self.storage.exists()

    def list_records(self, state: str | None = None,
                     on_damaged: Callable[[str, str], None] | None = None) -> list[JobRecord]:
        """Every record — or those in ``state`` — oldest first.

        A record that does not parse is skipped and passed to ``on_damaged(where, reason)``
        (default: a logged warning) so one bad document never hides the rest. A location that
        does not exist is an error, not an empty list: it is usually a mistyped path. With a
        state, only the records the storage's index files under it are read, and each is kept
        only if it really is in that state (an index may lag; see :mod:`.s3`). Without one,
        every record is read and the index is brought in line with them.
        """
        if state is not None:
            check_state(state)
        if not self.storage.exists():
            raise UsageError(f"{self._origin} {self.location!r} does not exist, so it holds no job records: check the "
                             "path, or open a record there first")
        report = on_damaged or (lambda where, reason: log.warning("skipping damaged job record %s: %s", where, reason))
        records: list[JobRecord] = []
        seen: dict[str, str | None] = {}
        for job_id in self.storage.job_ids(state):
            try:
                loaded = self._load(job_id)
            except DamagedRecordError as exc:
                report(self.storage.where(job_id), str(exc))
                seen[job_id] = None
                continue
            if loaded is None:
                if state is not None:
                    # Markers follow their record, so a marker without one outlived a removed record.
                    self.storage.unindex(job_id, state)
                continue
            record = loaded[0]
            seen[job_id] = record.state
            if state is None or record.state == state:
                records.append(record)
            elif record.state in TERMINAL_STATES:
                self.storage.unindex(job_id, state)  # final elsewhere: this entry can never be right again
        if state is None:
            self.storage.reconcile(seen)
        return sorted(records, key=lambda r: (r.created_at, r.job_id))

    def upload_lock(self, job_id: str, *, wait: bool, on_wait: Callable[[str], None] | None = None,
                    lease_seconds: float = DEFAULT_LEASE_SECONDS,
                    activity: Activity | None = None) -> AbstractContextManager[bool]:
        """Hold the job's upload lock: yields True once held, or False at once when another
        upload holds it and not ``wait`` (``on_wait`` is told once before waiting, and when a
        lapsed lock is broken).

        Separate from the record's own serialisation: an upload holds it for minutes, and the
        record must stay writable meanwhile (the job reports states, the upload appends its
        entry). A lease (:mod:`.lease`: a ``flock`` whose file the holder keeps fresh beside
        directory records, an object on S3), renewed only while ``activity`` — the upload's —
        moves (None: while the holder lives). A holder that died (its ``flock`` goes with it) or
        made no progress for ``lease_seconds`` loses it to the next upload.
        """
        check_job_id(job_id, what="job_id")
        if not lease_seconds > 0:
            raise UsageError(f"lease_seconds {lease_seconds!r} is not usable: give a positive number of seconds")
        return self.storage.upload_lock(job_id, wait=wait, on_wait=on_wait, lease_seconds=lease_seconds,
                                        activity=activity)

    # -- read-modify-write -----------------------------------------------------------------

    def _load(self, job_id: str) -> tuple[JobRecord, str | None] | None:
        document = self.storage.read(job_id)
        if document is None:
            return None
        return decoded(document.data, job_id=job_id, where=self.storage.where(job_id)), document.version

    def _create(self, record: JobRecord) -> JobRecord | None:
        """Store a new record: None once created, or the record already stored under its id."""
        job_id = record.job_id
        for _ in self._attempts():
            with self.storage.serialised(job_id, create=True):
                if self.storage.create(job_id, record.encode()):
                    self.storage.index(job_id, record.state, previous=None)
                    return None
                loaded = self._load(job_id)
            if loaded is not None:
                return loaded[0]
            # Refused, yet not there to read: it was removed, or its creation is still in flight.
        raise self._conflict(job_id)

    def _modify(self, job_id: str, change: Callable[[JobRecord], dict[str, Any] | None]) -> JobRecord:
        """Read, let ``change`` return the new document (None: nothing to do), validate and write
        it; when another writer got in first, start over from a fresh read."""
        check_job_id(job_id, what="job_id")
        if not self.storage.exists():
            raise self._missing(job_id)  # and do not create a directory just to say so
        attempted: tuple[JobRecord, str] | None = None
        for _ in self._attempts():
            with self.storage.serialised(job_id):
                loaded = self._load(job_id)
                if loaded is None:
                    raise self._missing(job_id)
                current, version = loaded
                if attempted is not None and current == attempted[0]:
                    # Our last write did land: its answer was lost and the client's retry of the
                    # same request was refused. Applying the change again would apply it twice.
                    self.storage.index(job_id, current.state, previous=attempted[1])
                    return current
                data = change(current)
                if data is None:
                    return current
                record = validated(data)
                if self.storage.replace(job_id, record.encode(), version):
                    self.storage.index(job_id, record.state, previous=current.state)
                    return record
                attempted = (record, current.state)
        raise self._conflict(job_id)

    def _attempts(self) -> Iterator[int]:
        """Count the attempts of one write, pausing before each retry."""
        for attempt in range(self.retry.attempts):
            if attempt:
                time.sleep(self.retry.pause(attempt))
            yield attempt

    def _conflict(self, job_id: str) -> RecordConflictError:
        return RecordConflictError(
            f"job {job_id!r}: {self.retry.attempts} attempts to write its record at {self.storage.where(job_id)} each "
            "found it changed by another writer since it was read; nothing was written. Retry the step: so many "
            "concurrent writers of one job usually means a runaway loop")

    def _missing(self, job_id: str) -> UsageError:
        return UsageError(f"no job record {job_id!r}: looked for {self.storage.where(job_id)} (records are read from "
                          f"{self._origin} {self.location!r}; if the job was opened elsewhere, read from there)")


def _unlaunched(record: JobRecord) -> bool:
    """Nothing of the job was launched: no backend object, no launch begun (``backend_config``
    is pinned just before a backend is asked to start it)."""
    return ((record.state == "PENDING" or _failed_before_launch(record)) and record.backend_ref is None
            and record.backend_config is None)


def _failed_before_launch(record: JobRecord) -> bool:
    """ERROR from :meth:`RecordStore.fail_before_launch`: no backend object, no verdict (a failed
    verify is an ERROR too, but of a job that was launched and refused inside its frame)."""
    return record.state == "ERROR" and record.backend_ref is None and record.verify is None


def _ran_and_ended(record: JobRecord) -> bool:
    """The job's command ran (it was launched and its verdict passed) and it ended ERROR or
    CANCELED: the same request submitted again — a retry of the run that owns it — runs it
    again, as its next attempt. A COMPLETE job is done; one whose verify failed never ran, and
    its submit fails the same way until the job id changes."""
    verified = record.verify is None or record.verify.get("ok") is True
    return record.state in ("ERROR", "CANCELED") and record.backend_ref is not None and verified


def _relaunched(current: JobRecord, reporter: str) -> dict[str, Any] | None:
    """``current``, which ran and ended, opened for its next attempt: PENDING, not launched, with
    its attempts, uploads and history kept (what earlier attempts uploaded is restored before
    the next command starts); the tier and the route are decided again, as for a new job."""
    if not _ran_and_ended(current):
        return None  # another open got here first
    stamp = now()
    ended = current.attempts[-1].number if current.attempts else 1
    why = current.message or "no reason recorded"
    message = (f"attempt {ended + 1}: attempt {ended} ended {current.state} ({why}); launched again with the "
               "results it uploaded restored first")
    data = current.model_dump()
    if not data["attempts"]:  # a record from before attempts were kept: its one launch
        data["attempts"] = [dict(number=1, started_at=current.created_at, backend_ref=current.backend_ref,
                                 ended_at=current.updated_at, state=current.state)]
    data.update(state="PENDING", message=message, backend_ref=None, verify=None, backend_config=None,
                log_cursor=None, storage_tier=None, storage_reason=None, output_route=None, updated_at=stamp)
    data["history"].append(dict(at=stamp, state="PENDING", reporter=reporter, message=message))
    return data


def _reopened(current: JobRecord, reporter: str) -> dict[str, Any] | None:
    """``current``, which failed before launch, opened again by the same request: PENDING, with
    what was decided before the failure decided again (the tier and the route may change with
    the cluster or the environment); where a launch began is kept, so it resumes there."""
    if not _failed_before_launch(current):
        return None  # another open got here first
    stamp = now()
    message = f"opened again after its submit failed before launch ({current.message or 'no reason recorded'})"
    data = current.model_dump()
    data.update(state="PENDING", message=message, storage_tier=None, storage_reason=None, output_route=None,
                updated_at=stamp)
    data["history"].append(dict(at=stamp, state="PENDING", reporter=reporter, message=message))
    return data
