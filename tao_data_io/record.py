"""The durable job record: what we know about a TAO job, kept after Kubernetes forgets it.

Why this module exists: a Kubernetes Job object is TTL-deleted soon after it finishes, so the
record is the single source of truth about a job from then on — its inputs, storage tier,
state history, output route and uploads. It must never be lost or corrupted, hence:

* one JSON document per job (``<root>/<job_id>.json``, mode 0600), readable and diffable by
  hand, written atomically (temp file in the same directory, fsync, ``os.replace``, fsync of
  the directory) so a crash at any instant leaves either the old or the new document;
* every read-modify-write under an exclusive ``flock`` on a per-job lock file, so concurrent
  writers (the CLI, the in-pod agent, a Prefect flow) never lose each other's updates. The
  kernel drops the lock when its holder dies, so a killed writer never wedges the job;
* a state machine with the TAO vocabulary in which terminal states are final, so a late or
  retried report can never resurrect a finished job;
* names and paths only: a validator refuses any string that holds the value of a credential
  variable in the environment, naming the field but never echoing the value.

Job ids are DNS labels of at most 52 characters because a renderer uses them as Kubernetes
Job names; they also become file names, so that same check is the store's confinement.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, AwareDatetime, Field, JsonValue, ValidationError, model_validator

from .credentials import Redactor
from .errors import TaoDataIOError, UsageError
from .fs import atomic_write, file_lock, remove_stale_temps
from .names import check_backend_ref, check_job_id, is_job_id, mint_job_id
from .schema import Strict, describe_validation_error
from .vocabulary import STATES, TERMINAL_STATES, State, StorageTier

SCHEMA_VERSION = "1"
JOBS_DIR_VARIABLE = "TAO_DATA_IO_JOBS_DIR"
DEFAULT_ROOT = Path("~/.tao-data-io/jobs")


#: Fields that say *which* job this is. A retried ``open`` with the same values is the same
#: job (the existing record is returned); any difference means a different job.
IDENTITY_FIELDS = ("job_id", "platform", "image", "network_arch", "action", "storage_tier", "results_dir")
#: Fields only ``open`` and ``mark`` may change, so ``update`` cannot bypass the state machine.
_GUARDED_FIELDS = frozenset({*IDENTITY_FIELDS, "schema_version", "created_at", "state", "history",
                             "backend_ref", "message"})

_RECORD_SUFFIX = ".json"

log = logging.getLogger(__name__)


class DamagedRecordError(TaoDataIOError):
    """A record file exists but does not parse as a record; it is reported, never overwritten."""


def check_state(value: str) -> str:
    if value not in STATES:
        raise UsageError(f"state {value!r} is not a TAO job state: use one of {', '.join(STATES)}")
    return value


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _to_utc(value: datetime) -> datetime:
    return value.astimezone(timezone.utc)


UtcDatetime = Annotated[AwareDatetime, AfterValidator(_to_utc)]
NonEmpty = Annotated[str, Field(min_length=1)]


class Transition(Strict):
    """One entry of a record's history: who reported which state, when, and why."""

    at: UtcDatetime
    state: State
    #: Who reported it: ``cli``, ``agent``, ``flow``…
    source: NonEmpty
    message: str | None = None


class OutputRoute(Strict):
    """Where a job's results go and why (set at submit by the routing step)."""

    route: NonEmpty
    destination: NonEmpty
    reason: str | None = None


class JobRecord(Strict):
    schema_version: Literal["1"] = SCHEMA_VERSION
    job_id: Annotated[str, AfterValidator(check_job_id)]
    platform: NonEmpty
    image: NonEmpty
    network_arch: NonEmpty
    action: NonEmpty
    storage_tier: StorageTier
    storage_reason: str | None = None
    results_dir: NonEmpty
    #: The request's declared ``outputs.upload_excludes`` (aws-cli patterns), applied by every
    #: upload of this job's results on top of the ``.tao/*`` that is always excluded.
    upload_excludes: list[str] = Field(default_factory=list)
    state: State
    #: ``NAMESPACE/NAME`` of the backend object (the Kubernetes Job) once it exists.
    backend_ref: Annotated[str, AfterValidator(check_backend_ref)] | None = None
    #: The message of the latest transition.
    message: str | None = None
    created_at: UtcDatetime
    updated_at: UtcDatetime
    history: list[Transition] = Field(default_factory=list)
    output_route: OutputRoute | None = None
    #: Upload summaries, appended by the steps that upload results.
    uploads: list[dict[str, JsonValue]] = Field(default_factory=list)

    @model_validator(mode="after")
    def _no_credential_values(self) -> JobRecord:
        redact = Redactor()
        for where, text in _strings(self.model_dump(mode="json"), ""):
            masked = redact(text)
            if masked != text:
                # The path is masked too: a dict key can be the secret itself.
                raise ValueError(f"record field {redact(where)!r} holds the value of a credential variable "
                                 f"(masked: {masked!r}); a job record keeps names and paths only — "
                                 "refer to the variable by its name instead")
        return self

    def identity(self) -> dict[str, Any]:
        return self.model_dump(include=set(IDENTITY_FIELDS))


def _strings(value: Any, where: str) -> Iterator[tuple[str, str]]:
    """Yield (field path, string) for every string in a JSON-shaped value, dict keys included."""
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, dict):
        for key, item in value.items():
            path = f"{where}.{key}" if where else str(key)
            yield path, str(key)
            yield from _strings(item, path)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _strings(item, f"{where}[{index}]")


def _validated(data: dict[str, Any]) -> JobRecord:
    try:
        return JobRecord.model_validate(data)
    except ValidationError as exc:
        raise UsageError(describe_validation_error(exc, f"refusing to store job {data.get('job_id')!r}")) from None


class RecordStore:
    """Job records under ``root`` (default ``$TAO_DATA_IO_JOBS_DIR`` or ``~/.tao-data-io/jobs``)."""

    def __init__(self, root: Path | None = None) -> None:
        if root is None:
            root = Path(os.environ.get(JOBS_DIR_VARIABLE) or DEFAULT_ROOT)
        self.root = root.expanduser()

    def _path(self, job_id: str) -> Path:
        return self.root / f"{check_job_id(job_id)}{_RECORD_SUFFIX}"

    def open(self, *, platform: str, image: str, network_arch: str, action: str, storage_tier: str,
             results_dir: str, storage_reason: str | None = None, job_id: str | None = None,
             source: str = "cli", upload_excludes: Sequence[str] = ()) -> JobRecord:
        """Create a PENDING record and return it; ``job_id`` is minted when not given.

        Idempotent for a retried submit: if the id exists with the same identity fields, the
        existing record is returned unchanged. A different job under that id is refused.
        """
        now = _now()
        job_id = mint_job_id(now) if job_id is None else check_job_id(job_id, what="job_id")
        record = _validated(dict(
            job_id=job_id, platform=platform, image=image, network_arch=network_arch, action=action,
            storage_tier=storage_tier, storage_reason=storage_reason, results_dir=results_dir,
            upload_excludes=list(upload_excludes), state="PENDING",
            created_at=now, updated_at=now, history=[dict(at=now, state="PENDING", source=source)]))
        with self._locked(job_id, create=True):
            if self._path(job_id).exists():
                existing = self._read(job_id)
                if existing.identity() == record.identity():
                    return existing
                different = [f"{name} is {getattr(existing, name)!r} there, {getattr(record, name)!r} here"
                             for name in IDENTITY_FIELDS if getattr(existing, name) != getattr(record, name)]
                raise UsageError(f"--job-id {job_id!r} already names a different job ({'; '.join(different)}) "
                                 f"in {self.root}: pick another --job-id, or omit it to mint one")
            self._write(record)
        return record

    def mark(self, job_id: str, state: str, *, source: str, backend_ref: str | None = None,
             message: str | None = None) -> JobRecord:
        """Record a state report and return the record.

        Terminal states are final: re-marking the same terminal state changes nothing (a
        retried report is harmless); any other state is refused. A report that would change
        nothing (same state, no new message or backend ref) is a no-op too, so repeated
        "still RUNNING" reports do not flood the history.
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
                raise UsageError(f"job {job_id!r} already runs as {record.backend_ref!r}; refusing --backend-ref "
                                 f"{backend_ref!r}: one record tracks one backend object")
            if state == record.state and message in (None, record.message) and backend_ref in (None, record.backend_ref):
                return None
            now = _now()
            data = record.model_dump()
            data.update(state=state, message=message, backend_ref=backend_ref or record.backend_ref, updated_at=now)
            data["history"].append(dict(at=now, state=state, source=source, message=message))
            return data

        return self._modify(job_id, change)

    def update(self, job_id: str, fn: Callable[[JobRecord], JobRecord]) -> JobRecord:
        """Change a record atomically under its lock: ``fn`` gets the current record and returns
        the new one (``record.model_copy(update=...)``). For the steps that own ``output_route``,
        ``uploads`` and ``storage_reason``; identity, state and history belong to open and mark."""

        def change(record: JobRecord) -> dict[str, Any] | None:
            new = fn(record)
            # warnings=False: a serializer warning would print the unvalidated (maybe secret) value.
            data = new.model_dump(warnings=False)
            changed = {name for name in JobRecord.model_fields if getattr(new, name) != getattr(record, name)}
            if changed & _GUARDED_FIELDS:
                raise UsageError(f"update of job {job_id!r} may not change {', '.join(sorted(changed & _GUARDED_FIELDS))}: "
                                 "identity is fixed at open and state goes through mark")
            return {**data, "updated_at": _now()} if changed else None

        return self._modify(job_id, change)

    def get(self, job_id: str) -> JobRecord:
        return self._read(job_id)

    def list_records(self, on_damaged: Callable[[Path, str], None] | None = None) -> list[JobRecord]:
        """Every record, oldest first. A file that does not parse is skipped and passed to
        ``on_damaged(path, reason)`` (default: a logged warning) so one bad file never hides the rest."""
        report = on_damaged or (lambda path, reason: log.warning("skipping damaged job record %s: %s", path, reason))
        records = []
        paths = sorted(self.root.glob(f"*{_RECORD_SUFFIX}")) if self.root.is_dir() else []
        for path in paths:
            job_id = path.name[: -len(_RECORD_SUFFIX)]
            if not is_job_id(job_id):
                continue  # not ours: a record's file name is always a valid job id
            try:
                records.append(self._read(job_id))
            except DamagedRecordError as exc:
                report(path, str(exc))
        return sorted(records, key=lambda r: (r.created_at, r.job_id))

    # -- storage ---------------------------------------------------------------------------

    def _read(self, job_id: str) -> JobRecord:
        path = self._path(job_id)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise self._missing(job_id) from None
        try:
            record = JobRecord.model_validate_json(data)
        except ValidationError as exc:
            raise DamagedRecordError(describe_validation_error(exc, f"{path} is not a valid job record")) from None
        if record.job_id != job_id:
            raise DamagedRecordError(f"{path} holds job {record.job_id!r}, not {job_id!r}")
        return record

    def _modify(self, job_id: str, change: Callable[[JobRecord], dict[str, Any] | None]) -> JobRecord:
        """Read, let ``change`` return the new document (None: nothing to do), validate it and
        write it, all under the job's lock."""
        with self._locked(job_id):
            current = self._read(job_id)
            data = change(current)
            if data is None:
                return current
            record = _validated(data)
            self._write(record)
            return record

    def _missing(self, job_id: str) -> UsageError:
        return UsageError(f"no job record {job_id!r}: looked for {self._path(job_id)} (set --root or "
                          f"${JOBS_DIR_VARIABLE} if the records live elsewhere)")

    @contextmanager
    def _locked(self, job_id: str, *, create: bool = False) -> Iterator[None]:
        # A separate lock file, because a replace swaps the record's inode and a lock on the
        # old inode would protect nothing.
        if create:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        elif not self.root.is_dir():
            raise self._missing(job_id)  # and do not create a directory just to say so
        with file_lock(self.root / f".{check_job_id(job_id)}.lock"):
            yield

    def _write(self, record: JobRecord) -> None:
        """Replace the record's file atomically and durably. Called with the job's lock held, so
        any temp file of this job still present was left by a killed writer and is removed."""
        final = self._path(record.job_id)
        remove_stale_temps(final)
        atomic_write(final, record.model_dump_json(indent=2).encode() + b"\n", mode=0o600, durable=True)
