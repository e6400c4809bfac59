"""The remote side of the engine: the control plane (one bucket's listing, and one object's HEAD,
GET and PUT through boto3) and the index a listing fills.

Why a module of its own: a sync plans against what the prefix holds, but many callers want only
that — whether an object or a prefix exists, how large it is, its bytes into a stream they own,
the listing's sizes — and every one of those is a single request (or a listing) that neither
plans nor publishes. :class:`ControlPlane` is the part of
:class:`~tao_data_io.transfer.engine.TransferEngine` that makes them, with the boto3 client they
share; the download and upload halves (:mod:`.download`, :mod:`.upload`) build on it. What a key
may be (:func:`unsendable_name`) lives here too: the index skips what no listing can hold.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from functools import cached_property
from typing import TYPE_CHECKING, Any, BinaryIO

from ..credentials import S3Credentials
from .activity import Activity, beating
from ..errors import TaoDataIOError, TransferError, UsageError
from .client import explained, get_or_none, head_or_none, make_s3_client
from .digests import multipart_count
from .listing import RemoteObject, clean_etag, remote_objects
from ..fs.confinement import has_control_character
from .options import chunks
from .signed_list import list_pages
from ..uris import S3Url

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..reporting import ProgressTracker
    from .digests import DigestStore
    from .options import TransferOptions
    from .summary import TransferSummary
    from .work import Item, ItemFailed, Landed

#: How much of an object :meth:`ControlPlane.read_into` holds at once.
READ_CHUNK = 1 << 20


#: The longest key S3 stores (UTF-8 bytes).
MAX_KEY_BYTES = 1024


def unsendable_name(key: str) -> str | None:
    """Why a local file cannot become the S3 key ``key`` — a control character (object_store's
    paths refuse them, and they break listings and most tools), a name that is not UTF-8, more
    than S3's 1024 bytes — or None. Such a file is skipped once, with the fix, rather than failed
    on every rerun."""
    if has_control_character(key):
        problem = "holds a control character, which an S3 key here cannot carry"
    else:
        try:
            size = len(key.encode("utf-8"))
        except UnicodeEncodeError:
            return "its name is not UTF-8, which an S3 key must be; not uploaded — rename it to upload it"
        if size <= MAX_KEY_BYTES:
            return None
        problem = f"makes a key of {size} bytes, more than the {MAX_KEY_BYTES} S3 stores"
    return f"its name {problem}; not uploaded — rename it to upload it"


#: Rows of the listing index inserted by one statement: 5 columns, 995 variables, within the 999
#: a statement may bind in SQLite before 3.32 (Ubuntu 20.04 has 3.31, RHEL 8 3.26).
_ROWS_A_STATEMENT = 199


class RemoteIndex:
    """The objects listed under ``prefix`` by key, in a private temporary SQLite file (SQLite's
    empty name: deleted when closed), so memory holds its page cache, not the listing. Not merged
    with the walk in key order: S3 lists in UTF-8 binary order, but S3-compatible stores need not
    (SeaweedFS lists a prefix directory by directory), and a merge that met a key out of order
    would upload it again. Filled from the moment it is made, by one thread of its own that
    fetches the pages too (a read-ahead thread would add a hand-off a page and overlap nothing:
    inserting a page takes ~1 ms): while the first chunk is walked, or
    (:meth:`ControlPlane.list_into_index`) while a command still loads what it needs to decide
    the upload."""

    def __init__(self, prefix: S3Url, objects: Iterable[RemoteObject]) -> None:
        self.prefix = prefix
        self._db = sqlite3.connect("", check_same_thread=False)
        self._db.execute("CREATE TABLE remote (key TEXT PRIMARY KEY, relative TEXT, size INTEGER, etag TEXT, "
                         "modified TEXT) WITHOUT ROWID")
        self._stop = threading.Event()
        self._filled = ThreadPoolExecutor(max_workers=1)
        self._filling = self._filled.submit(self._fill, objects)

    def _fill(self, objects: Iterable[RemoteObject]) -> None:
        # One statement of many rows, not executemany: sqlite3 releases the GIL around every
        # step, and a thread taking it back from a busy one waits up to the switch interval
        # (5 ms). 2,000 rows inserted beside a CPU-bound thread took 0.03-0.9 s that way, run to
        # run, and 40-60 ms so; a 2,000-key listing beside one, ~2 s before and 0.2-0.26 s after.
        for chunk in chunks(objects, _ROWS_A_STATEMENT):
            if self._stop.is_set():  # the upload ended (failed, interrupted): list no further
                return
            self._db.execute("INSERT OR REPLACE INTO remote VALUES " + ",".join(("(?, ?, ?, ?, ?)",) * len(chunk)),
                             [value for obj in chunk
                              for value in (obj.key, obj.relative, obj.size, obj.etag, obj.last_modified)])
        self._db.commit()

    def total_bytes(self) -> int:
        """What every listed object takes (once the listing is in: its errors are raised here)."""
        self._filling.result()
        return int(self._db.execute("SELECT COALESCE(SUM(size), 0) FROM remote").fetchone()[0])

    def among(self, keys: Sequence[str]) -> dict[str, RemoteObject]:
        """The listed objects among ``keys`` (once the listing is in: its errors are raised here); a
        name that is not UTF-8 is no key S3 can list (such a file is skipped, never sent)."""
        self._filling.result()
        keys = [key for key in keys if unsendable_name(key) is None]
        found: dict[str, RemoteObject] = {}
        for start in range(0, len(keys), 500):
            part = keys[start:start + 500]
            rows = self._db.execute(f"SELECT key, relative, size, etag, modified FROM remote WHERE key IN "
                                    f"({','.join('?' * len(part))})", part)
            found.update((row[0], RemoteObject(*row)) for row in rows)
        return found

    def close(self) -> None:
        self._stop.set()
        self._filled.shutdown(wait=True)
        self._db.close()


class ControlPlane:
    """Single requests against a bucket — a listing, one object's HEAD, GET or PUT — with the
    boto3 client they share, built on first use. The base of
    :class:`~tao_data_io.transfer.engine.TransferEngine`, which sets ``credentials`` and
    ``concurrency`` and closes the client."""

    credentials: S3Credentials
    concurrency: int

    def _execute(self, batches: Iterable[list[Item]], summary: TransferSummary, options: TransferOptions,
                 store: DigestStore, tracker: ProgressTracker,
                 finalize: Callable[[Item, Landed | None], ItemFailed | None], *, attempts: int = 1) -> None:
        """Move planned batches: the engine's (:meth:`~tao_data_io.transfer.engine.TransferEngine._execute`),
        which the download and upload halves hand what they plan."""
        raise NotImplementedError

    @cached_property
    def client(self) -> Any:
        """The boto3 client of the control plane (HEAD, part sizes, the listing's fallback)."""
        return make_s3_client(self.credentials, max_pool_connections=min(max(self.concurrency, 10), 64))

    def _control_plane(self, bucket: str) -> AbstractContextManager[None]:
        """Re-raise configuration failures (bucket, keys, endpoint) as errors naming the fix."""
        return explained(bucket, self.credentials.endpoint_url)

    def pages(self, prefix: S3Url) -> Iterator[dict[str, Any]]:
        """The ListObjectsV2 pages of ``prefix`` (in folder form) as they come: one signed GET per
        page when that is plain (see :mod:`signed_list`), else — and from any page that fails —
        through boto3, whose errors name the fix."""
        prefix = prefix.as_prefix()

        def through_boto3(token: str | None) -> Iterator[dict[str, Any]]:
            while True:
                try:
                    with self._control_plane(prefix.bucket):
                        page = self.client.list_objects_v2(Bucket=prefix.bucket, Prefix=prefix.key,
                                                           **({"ContinuationToken": token} if token else {}))
                except TaoDataIOError:
                    raise
                except Exception as exc:  # botocore's, after its own retries: the first page's are raised as they are
                    if token is None:
                        raise
                    raise TransferError(f"listing {prefix} failed part-way ({type(exc).__name__}: {exc}); the files "
                                        "of the pages listed before were kept — rerun to continue") from exc
                yield page
                if not page.get("IsTruncated"):
                    return
                token = page["NextContinuationToken"]

        return list_pages(self.credentials, prefix.bucket, prefix.key, fallback=through_boto3)

    def list_into_index(self, prefix: S3Url, activity: Activity | None = None) -> RemoteIndex:
        """The listing of ``prefix`` (in folder form) filling a :class:`RemoteIndex` from now on,
        each page a beat of ``activity``: its round trips run while the caller does other work."""
        prefix = prefix.as_prefix()
        return RemoteIndex(prefix, remote_objects(beating(self.pages(prefix), activity), prefix.key))

    def list_sizes(self, prefix: S3Url) -> Iterator[tuple[str, int]]:
        """(key, size) of every object under ``prefix`` (in folder form), as the pages come
        (:meth:`pages`): none is kept, so a caller that stops early (or only sums) costs its LIST
        requests only."""
        for page in self.pages(prefix):
            for item in page.get("Contents", ()):
                yield item["Key"], int(item["Size"])

    def object_size(self, url: S3Url) -> int | None:
        """The size of the object ``url`` (one HEAD), None when there is none."""
        head = self._head(url)
        return None if head is None else int(head["ContentLength"])

    def exists(self, url: S3Url) -> bool:
        """Whether the object ``url`` exists (one HEAD)."""
        return self._head(url) is not None

    def has_prefix(self, prefix: S3Url) -> bool:
        """Whether anything lives under ``prefix`` (one LIST of at most one key)."""
        with self._control_plane(prefix.bucket):
            page = self.client.list_objects_v2(Bucket=prefix.bucket, Prefix=prefix.as_prefix().key, MaxKeys=1)
        return int(page.get("KeyCount", 0)) > 0

    def read_into(self, url: S3Url, into: BinaryIO) -> int:
        """Write the object ``url``'s bytes to the open file ``into`` and return how many; a
        missing object is a UsageError naming it. One GET, so one version of the object, streamed
        in bounded chunks. For streams a caller owns (a buffer, a socket): there is no path here to
        make atomic or to skip — :meth:`~tao_data_io.transfer.engine.TransferEngine.copy` to a path does
        both."""
        with self._control_plane(url.bucket):
            response = get_or_none(self.client, url.bucket, url.key)
            if response is None:
                raise UsageError(f"there is no object {url} (404): check the bucket and key")
            written = 0
            for chunk in response["Body"].iter_chunks(READ_CHUNK):
                into.write(chunk)
                written += len(chunk)
        return written

    def write_from(self, source: BinaryIO, url: S3Url) -> None:
        """Store the rest of the open file ``source`` as the object ``url`` (boto3's managed
        multipart upload: an object appears whole or not at all)."""
        if url.is_prefix:
            raise UsageError(f"{url} names a prefix, not an object: give the object's key")
        with self._control_plane(url.bucket):
            self.client.upload_fileobj(source, url.bucket, url.key)

    def _head(self, url: S3Url) -> dict[str, Any] | None:
        return head_or_none(self.client, url.bucket, url.key)

    def _part_size(self, bucket: str, key: str) -> int | None:
        try:
            head = self.client.head_object(Bucket=bucket, Key=key, PartNumber=1)
        except self.client.exceptions.ClientError:
            return None
        return int(head["ContentLength"]) if multipart_count(clean_etag(head.get("ETag"))) else None
