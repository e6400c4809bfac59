"""The storage interface under the record store, so the state machine exists once.

Why an interface: the rules of a record (identity, final states, no credential values) must be
the same whether records sit in a local directory or in a bucket that pods on many machines
share; only *how a write is made safe* differs. A directory serialises writers with a per-job
``flock`` and needs no version (:mod:`.directory`); S3 has no locks, so every write is
conditional on the version read — ``If-None-Match: *`` to create, ``If-Match: <etag>`` to
replace — and a writer that lost the race re-reads and tries again (:mod:`.s3`).

The store drives every storage the same way::

    with storage.serialised(job_id):          # a lock, or nothing
        document = storage.read(job_id)       # bytes + version token (None on a directory)
        ...decide...
        if storage.replace(job_id, new, document.version):   # False: someone else wrote first
            storage.index(job_id, new_state, previous=old_state)

Backends store bytes: parsing and validation belong to the store, so a damaged document is
judged by one rule everywhere.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import NamedTuple, Protocol

from ..errors import TaoDataIOError
from ..transfer.activity import Activity


class DamagedRecordError(TaoDataIOError):
    """A stored record does not parse as a record; it is reported, never overwritten. Here, not
    beside the model: a storage refuses a document from its size before anything parses it."""


#: Record documents are ``<job id>.json`` in a directory or under a prefix.
RECORD_SUFFIX = ".json"
#: How long an S3 upload lease outlives a holder that stopped renewing it (a killed pod).
DEFAULT_LEASE_SECONDS = 120.0


#: The most a stored record may be. A record names things and keeps their history (a long job's
#: is some KiB); a larger document under a record's name is not one, so it is refused from its
#: size before it is read — a 150 MB object read whole cost 212 MB of memory before its error.
RECORD_LIMIT_BYTES = 16 * 2**20


def read_capped(where: str, size: int, read: Callable[[int], bytes]) -> bytes:
    """The document of ``size`` bytes (as its store reports it) that ``read(n)`` gives at most
    ``n`` bytes of — refused from its size, or from what was read, past :data:`RECORD_LIMIT_BYTES`."""
    data = read(RECORD_LIMIT_BYTES + 1) if size <= RECORD_LIMIT_BYTES else b""
    if size > RECORD_LIMIT_BYTES or len(data) > RECORD_LIMIT_BYTES:
        raise DamagedRecordError(f"{where} is larger than a job record may be ({max(size, len(data))} bytes; at most "
                                 f"{RECORD_LIMIT_BYTES}): it is not one of ours, or it was damaged — move it away")
    return data


class Document(NamedTuple):
    """A stored record as read: its bytes and the version a conditional replace must match."""

    data: bytes
    version: str | None


class RecordStorage(Protocol):
    def describe(self) -> str:
        """Where the records live: a directory path or ``s3://bucket/prefix/``."""

    def where(self, job_id: str) -> str:
        """Where one job's record lives (for messages)."""

    def exists(self) -> bool:
        """Whether the location exists at all (a directory can be missing; a prefix cannot)."""

    def serialised(self, job_id: str, *, create: bool = False) -> AbstractContextManager[None]:
        """Hold whatever keeps two read-modify-writes of ``job_id`` apart (``create``: the
        location may be made). Conditional writes need nothing here."""

    def read(self, job_id: str) -> Document | None:
        """The stored document, or None when there is none."""

    def create(self, job_id: str, data: bytes) -> bool:
        """Store ``data`` if no record of ``job_id`` exists; False (nothing written) if one does."""

    def replace(self, job_id: str, data: bytes, version: str | None) -> bool:
        """Store ``data`` if the record is still at ``version``; False (nothing written) if not."""

    def job_ids(self, state: str | None = None) -> list[str]:
        """Ids of stored records, sorted; with ``state``, the ids the index files under it — a
        superset the store filters by each record's real state (an index may lag)."""

    def index(self, job_id: str, state: str, *, previous: str | None) -> None:
        """After a successful write: file ``job_id`` under ``state`` and out of ``previous``."""

    def unindex(self, job_id: str, state: str) -> None:
        """Take ``job_id`` out of ``state``: its record is final in another state."""

    def reconcile(self, states: Mapping[str, str | None]) -> None:
        """Make the index agree with ``states`` (job id → state read; None: unreadable, left as is)."""

    def upload_lock(self, job_id: str, *, wait: bool, on_wait: Callable[[str], None] | None,
                    lease_seconds: float, activity: Activity | None) -> AbstractContextManager[bool]:
        """Hold ``job_id``'s upload lock; yield False at once when it is taken and not ``wait``."""
