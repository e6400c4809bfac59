"""Job records in a bucket, for pods that never share a disk.

With Prefect on Kubernetes every flow run is a fresh pod: ``submit`` opens the record in one,
``collect`` and a scheduled ``resync`` read and update it in others. A prefix in a bucket is the
one place they all reach. Layout under ``s3://bucket/prefix/``::

    records/<job_id>.json          the record (the same JSON document as in a directory)
    by-state/<STATE>/<job_id>      an empty marker: the job was last written in STATE
    locks/<job_id>.upload          the upload lease, while an upload or resync runs (see .lease)

**Concurrency without locks.** A record is created with ``If-None-Match: *`` (two pods opening
one id cannot both create it) and replaced with ``If-Match: <the ETag read>`` (a writer that
read an older version is refused with 412 and starts over from a fresh read; the store retries
with jittered backoff). Nothing is ever written unconditionally.

**The state index, and how it heals.** ``list_records(state="RUNNING")`` lists one marker prefix
and reads only those records, not every job ever run. Markers are written *after* the record,
so the index can lag it (a writer killed in between, two writers moving one job in opposite
directions at once) but a marker never precedes its record. Reading by state therefore trusts
each record, never the marker:

* a marker whose record is in another state is skipped — and deleted when that state is final,
  since it can never be right again; a marker whose record is gone is deleted (records are
  written before their markers, so a missing record was removed by hand);
* every write of a record re-asserts the marker of the state it wrote and drops the previous
  one, so a job's next write (a mark, an uploads entry) heals a marker a crash left missing;
* a full listing (``list_records()`` without a state) reads every record anyway and makes the
  index agree with what it read: missing markers are added, wrong ones removed. Copying a
  directory of records to ``records/`` and listing once builds the index from scratch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from ..transfer.activity import Activity
from ..credentials import S3Credentials
from ..names import is_job_id
from ..transfer.client import explained, get_or_none, make_s3_client
from ..transfer.listing import RemoteObject, list_remote
from ..uris import S3Url
from .storage import RECORD_SUFFIX, Document, read_capped
from .conditional import put_if
from .lease import s3_lease

RECORDS = "records/"
BY_STATE = "by-state/"
LOCKS = "locks/"


class S3Storage:
    def __init__(self, url: S3Url, credentials: S3Credentials) -> None:
        self.url = url.as_prefix()
        self.bucket = url.bucket
        self.client: Any = make_s3_client(credentials)

    def describe(self) -> str:
        return str(self.url)

    def where(self, job_id: str) -> str:
        return f"s3://{self.bucket}/{self._record_key(job_id)}"

    def exists(self) -> bool:
        return True  # a prefix exists as soon as something is written under it

    def serialised(self, job_id: str, *, create: bool = False) -> AbstractContextManager[None]:
        return nullcontext()  # every write is conditional on the version read

    def read(self, job_id: str) -> Document | None:
        answer = get_or_none(self.client, self.bucket, self._record_key(job_id))
        if answer is None:
            return None
        with explained(self.bucket, self.client.meta.endpoint_url):
            try:
                data = read_capped(self.where(job_id), int(answer.get("ContentLength") or 0), answer["Body"].read)
            finally:
                answer["Body"].close()
        return Document(data, answer["ETag"])

    def create(self, job_id: str, data: bytes) -> bool:
        return put_if(self.client, self.bucket, self._record_key(job_id), data, IfNoneMatch="*") is not None

    def replace(self, job_id: str, data: bytes, version: str | None) -> bool:
        assert version is not None, "an S3 record is always read with its ETag"
        return put_if(self.client, self.bucket, self._record_key(job_id), data, IfMatch=version) is not None

    def job_ids(self, state: str | None = None) -> list[str]:
        if state is None:
            names = [item.relative[: -len(RECORD_SUFFIX)] for item in self._list(RECORDS)
                     if item.relative.endswith(RECORD_SUFFIX)]
        else:
            names = [item.relative for item in self._list(f"{BY_STATE}{state}/")]
        return sorted(name for name in names if is_job_id(name))  # anything else is not ours

    def index(self, job_id: str, state: str, *, previous: str | None) -> None:
        with explained(self.bucket, self.client.meta.endpoint_url):
            self.client.put_object(Bucket=self.bucket, Key=self._marker_key(state, job_id), Body=b"")
        if previous is not None and previous != state:
            self.unindex(job_id, previous)

    def unindex(self, job_id: str, state: str) -> None:
        with explained(self.bucket, self.client.meta.endpoint_url):
            self.client.delete_object(Bucket=self.bucket, Key=self._marker_key(state, job_id))

    def reconcile(self, states: Mapping[str, str | None]) -> None:
        filed: set[tuple[str, str]] = set()
        for item in self._list(BY_STATE):
            state, _, job_id = item.relative.partition("/")
            filed.add((job_id, state))
        wanted = {(job_id, state) for job_id, state in states.items() if state is not None}
        for job_id, state in sorted(wanted - filed):
            self.index(job_id, state, previous=None)
        for job_id, state in sorted(filed - wanted):
            # Only jobs read just now: a marker of an unreadable record says nothing we know to
            # be wrong, and one of a job created since the listing is its newest news.
            if states.get(job_id) is not None:
                self.unindex(job_id, state)

    def upload_lock(self, job_id: str, *, wait: bool, on_wait: Callable[[str], None] | None,
                    lease_seconds: float, activity: Activity | None) -> AbstractContextManager[bool]:
        return s3_lease(self.client, self.bucket, f"{self.url.key}{LOCKS}{job_id}.upload",
                        wait=wait, on_wait=on_wait, seconds=lease_seconds, job_id=job_id, activity=activity)

    # -- keys and calls --------------------------------------------------------------------

    def _record_key(self, job_id: str) -> str:
        return f"{self.url.key}{RECORDS}{job_id}{RECORD_SUFFIX}"

    def _marker_key(self, state: str, job_id: str) -> str:
        return f"{self.url.key}{BY_STATE}{state}/{job_id}"

    def _list(self, below: str) -> list[RemoteObject]:
        with explained(self.bucket, self.client.meta.endpoint_url):
            return list_remote(self.client, S3Url(self.bucket, f"{self.url.key}{below}")).objects
