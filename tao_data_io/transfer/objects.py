"""The remote side of the engine: the control plane (one bucket's listing, and one object's HEAD,
GET and PUT through boto3) and the index a listing fills.

Why a module of its own: a sync plans against what the prefix holds, but many callers want only
that — whether an object or a prefix exists, how large it is, its bytes into a stream they own,
the listing's sizes — and every one of those is a single request (or a listing) that neither
plans nor publishes. :class:`ControlPlane` is the part of
:class:`~tao_data_io.transfer.engine.TransferEngine` that makes them, with the boto3 client they
share; the download and upload halves (:mod:`.download`, :mod:`.upload`) build on it. The index
an upload plans against is :mod:`.remote_index`'s, filled through :meth:`ControlPlane.pages`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager
from functools import cached_property
from typing import TYPE_CHECKING, Any, BinaryIO

from ..credentials import S3Credentials
from .activity import Activity, beating
from ..errors import TaoDataIOError, TransferError, UsageError
from .client import explained, get_or_none, head_or_none, make_s3_client
from .digests import multipart_count
from .listing import clean_etag
from .remote_index import RemoteIndex
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

    def pages(self, prefix: S3Url, delimiter: str | None = None) -> Iterator[dict[str, Any]]:
        """The ListObjectsV2 pages of ``prefix`` (in folder form) as they come — grouped at
        ``delimiter`` when one is given — one signed GET per page when that is plain (see
        :mod:`signed_list`), else, and from any page that fails, through boto3, whose errors name
        the fix."""
        prefix = prefix.as_prefix()
        grouped = {} if delimiter is None else {"Delimiter": delimiter}

        def through_boto3(token: str | None) -> Iterator[dict[str, Any]]:
            while True:
                try:
                    with self._control_plane(prefix.bucket):
                        page = self.client.list_objects_v2(Bucket=prefix.bucket, Prefix=prefix.key,
                                                           **({"ContinuationToken": token} if token else {}),
                                                           **grouped)
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

        return list_pages(self.credentials, prefix.bucket, prefix.key, fallback=through_boto3, delimiter=delimiter)

    def list_into_index(self, prefix: S3Url, activity: Activity | None = None) -> RemoteIndex:
        """The listing of ``prefix`` (in folder form) filling a :class:`RemoteIndex` from now on,
        each page a beat of ``activity``: its round trips run while the caller does other work."""
        prefix = prefix.as_prefix()
        return RemoteIndex(prefix, lambda key, delimiter: beating(self.pages(S3Url(prefix.bucket, key), delimiter),
                                                                  activity))

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
