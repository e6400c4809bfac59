"""The bulk data path: obstore (Rust ``object_store``) in-process, for every upload and for
downloads under ``LARGE_OBJECT_BYTES``.

Why (measured, ``bench/CHANGELOG.md``, the bake-off): for 2,000 × 16 KiB on 2 cores, obstore moved the files in
about half the wall time and half the CPU of s5cmd driven with explicit per-object commands —
s5cmd sends a HEAD before every GET of a named key — and ~2× faster than s5cmd for uploads,
with no per-object HEAD, typed errors and ETags on every result. For downloads of
``LARGE_OBJECT_BYTES`` and more, s5cmd's parallel ranged parts won (≈ 2× obstore's ranged
reader), so those are delegated to the ``large`` executor. Uploads stay here because they must
read exactly the file the scan saw: it is opened with ``O_NOFOLLOW`` and its (device, inode)
checked before a byte is sent.

The executor owns one long-lived event loop in a daemon thread: callers may be plain threads or
already inside an event loop (a Prefect task), and a long-lived loop avoids tearing obstore's
runtime down after every batch. Downloads are written to a temp file created through the item's
:class:`~tao_data_io.fs.tree.DestinationTree` (directory descriptors, never a path that a symlink could
redirect); the engine publishes it. Credentials are handed to the store as arguments, never via
argv or the process environment.

**One version.** A file is published only if it is provably one version of its object. Here a
download is one GET, bound to the planned ETag with ``If-Match`` (object_store also refuses to
resume a broken body from another version), so an object overwritten since the listing is a 412,
reported ``changed``. A small object whose listed ETag is an MD5 is read instead in one ranged GET
of its listed size, kept only if its bytes' MD5 is that ETag (the same proof, in one call into
obstore instead of two; anything else is read again with the bound GET, which settles it). The
``large`` executor reads ranged parts in separate requests; for those
the object's ETag is checked once the last part is in (:meth:`ObstoreExecutor._same_version`),
before the engine may publish.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
from collections.abc import Iterable, Iterator, Sequence
from collections import deque
from concurrent.futures import Future
from concurrent.futures import wait as futures_wait
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import obstore
from obstore.exceptions import PreconditionError
from obstore.store import S3Store

from ..credentials import S3Credentials
from ..errors import UnsafePathError
from ..fs.reading import open_scanned, read_bounded
from .activity import beating
from .digests import is_md5_etag
from .feed import Feed
from .listing import s3_time_ns
from .memory_budget import MemoryBudget
from .work import DownloadItem, Item, ItemDone, ItemFailed, Landed, UploadItem

if TYPE_CHECKING:
    from obstore import GetOptions
    from obstore.store import ClientConfig, RetryConfig, S3Config

    from .s5cmd_executor import S5cmdExecutor

#: Objects at least this large go to the ``large`` executor (parallel ranged parts). At 8 MiB
#: and 24 MiB objects an s5cmd child moved them faster than obstore's stream, direct and at
#: +20 ms (40 × 24 MiB: 1.15 against 2.74 s direct, 1.76 against 2.55 s at +20 ms); at 2 MiB,
#: where it adds a HEAD or two an object, it did not (1.40 against 1.02 s at +20 ms). Measured
#: for issue 45 (``bench/README.md``).
LARGE_OBJECT_BYTES = 8 * 1024 * 1024
#: A body up to this size is read whole, in one buffer, and written in one call; a larger one is
#: streamed to its file in chunks of this size (1 MiB chunks cost 1.7× the CPU, issue 45).
_CHUNK = 4 * 1024 * 1024
#: What a streamed body holds at its peak, and never more than twice its size: obstore gathers
#: each chunk from smaller buffers and copies them into one (measured: ~16 MiB a 24 MiB download
#: in flight, ~8 MiB a 6 MiB one; issue 45's review).
_STREAM_HELD = 4 * _CHUNK
#: Objects up to this size with an MD5 ETag are read in one ranged GET whose bytes are proven by
#: their MD5 (:meth:`ObstoreExecutor._write_proven`): one call into obstore instead of two (a GET,
#: then its body). Above it, hashing the bytes on the loop costs more than the second call saves
#: (MD5 runs at ~600 MB/s: 64 KiB is ~100 µs).
PROVEN_BYTES = 64 * 1024
#: Where a descriptor of this process can be opened again by its number (Linux's procfs).
FD_LINKS = "/proc/self/fd"
#: Multipart part size for medium uploads; S3 refuses parts under 5 MiB (except the last).
_UPLOAD_PART = 8 * 1024 * 1024
#: Files up to this size are handed to obstore by their descriptor's link (:meth:`ObstoreExecutor._upload`).
_LINKED_BYTES = 1024 * 1024
#: Parts of one multipart upload in flight at once: as many as s5cmd's 50 MiB parts put in
#: flight for a 128 MiB file. More (object_store's default is 12) made 4 × 128 MiB slower here,
#: not faster: the server holds every part in flight (``bench/README.md``, large objects).
PART_CONCURRENCY = 3
#: What one multipart upload holds at most: its parts in flight, the part being filled, a chunk read.
_MULTIPART_HELD = (PART_CONCURRENCY + 1) * _UPLOAD_PART + _CHUNK
#: Multipart uploads moving at once when nothing else is held.
MULTIPART_UPLOADS = 4
#: The bytes the workers may hold at once (:mod:`.memory_budget`): four multipart uploads, or many
#: small files — never a whole tree of large ones.
MEMORY_BUDGET = MULTIPART_UPLOADS * _MULTIPART_HELD
#: Retries inside object_store for 5xx, throttling and connection resets, exponential backoff.
_RETRY: RetryConfig = {
    "max_retries": 10,
    "backoff": {"init_backoff": timedelta(milliseconds=100), "max_backoff": timedelta(seconds=15), "base": 2},
    "retry_timeout": timedelta(minutes=5),
}


def _pod_identity_provider() -> Any:
    """obstore's credentials from boto3's chain, for a process with a cloud identity and no keys:
    obstore's own chain would exchange an IRSA token at STS over HTTPS only (no STS endpoint of
    an S3-compatible store, no proxy that ends TLS), while boto3's reads every identity the
    control plane does, and refreshes it (obstore asks again before each credential's ttl)."""
    import boto3
    from obstore.auth.boto3 import Boto3CredentialProvider

    return Boto3CredentialProvider(boto3.Session())


def _retry(credentials: S3Credentials) -> RetryConfig:
    """:data:`_RETRY`, with ``AWS_MAX_ATTEMPTS`` (attempts, the first included) when it is set."""
    if credentials.max_attempts is None:
        return _RETRY
    return {**_RETRY, "max_retries": credentials.max_attempts - 1}


def _s3_config(creds: S3Credentials) -> S3Config:
    """The store's settings: what :meth:`~tao_data_io.credentials.S3Credentials.settings` gives
    obstore (one place decides what a client is given), path-style for an endpoint."""
    config: dict[str, Any] = creds.settings({
        "access_key_id": "access_key_id", "secret_access_key": "secret_access_key",
        "session_token": "session_token", "region": "region", "endpoint_url": "endpoint"})
    if creds.endpoint_url:
        config["virtual_hosted_style_request"] = False
    return config  # type: ignore[return-value]  # S3Config's keys, named through settings(): no TypedDict passes that


class _LoopThread:
    """One asyncio loop running forever in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="tao-data-io-obstore", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the loop and join its thread, so a long-lived worker that builds engines for
        weeks does not accumulate threads."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class ObstoreExecutor:
    def __init__(self, credentials: S3Credentials, *, concurrency: int = 64,
                 large: S5cmdExecutor | None = None) -> None:
        self.credentials = credentials
        self.concurrency = concurrency
        self.large = large
        self._stores: dict[str, S3Store] = {}
        #: Buckets whose ETags turned out not to be the MD5 of the bytes (SSE-KMS, a store of
        #: its own kind): their objects are read with the bound GET only.
        self._opaque_etags: set[str] = set()
        #: Whether obstore can open a file by its descriptor's link (:data:`FD_LINKS`); cleared
        #: the first time it cannot (no procfs, or one of another PID namespace).
        self._fd_links = True
        self._budget = MemoryBudget(MEMORY_BUDGET)
        self._loop: _LoopThread | None = None
        self._lock = threading.Lock()

    def _store(self, bucket: str) -> S3Store:
        with self._lock:
            store = self._stores.get(bucket)
            if store is None:
                creds = self.credentials
                client_options: ClientConfig = {"timeout": "600s", "connect_timeout": "10s",
                                  "allow_http": bool(creds.endpoint_url and creds.endpoint_url.startswith("http://")),
                                  "pool_max_idle_per_host": str(max(self.concurrency, 16))}
                provider = _pod_identity_provider() if creds.pod_identity else None
                store = S3Store(bucket, config=_s3_config(creds), client_options=client_options,
                                retry_config=_retry(creds), credential_provider=provider)
                self._stores[bucket] = store
            return store

    def close(self) -> None:
        """Stop the event loop thread and drop the stores; the executor is unusable afterwards."""
        with self._lock:
            loop, self._loop = self._loop, None
            self._stores.clear()
        if loop is not None:
            loop.stop()
        if self.large is not None:
            self.large.close()

    def run(self, batches: Iterable[Sequence[Item]], on_done: ItemDone) -> None:
        """Move each batch as it comes, through a :class:`~.feed.Feed` to the loop's workers: the
        caller plans the next batch while this one moves. Objects delegated to ``large`` go to it
        on the caller's thread once the rest of their batch is handed over (both move at once)."""
        loop = self._loop_thread()

        def handed() -> Iterator[list[Item]]:
            for batch in batches:
                small: list[Item] = []
                large: list[Item] = []
                for item in batch:
                    (large if self._delegated(item) else small).append(item)
                yield small
                if large and self.large is not None:
                    with _Checks(self, loop.loop, on_done) as checks:
                        self.large.run([large], checks.landed)
                        checks.finish()

        feed: Feed[Item] = Feed(loop.loop)
        feed.run(handed(), [self._worker(feed, on_done) for _ in range(self.concurrency)])

    def _delegated(self, item: Item) -> bool:
        """Only with a planned ETag and LastModified (the version to check against) and a spool on
        the destination's filesystem (where the child writes); otherwise one streamed GET here.
        And only what one s5cmd child may carry (handed keys expire: its largest_object)."""
        return (self.large is not None and isinstance(item, DownloadItem) and item.size >= LARGE_OBJECT_BYTES
                and (self.large.largest_object is None or item.size <= self.large.largest_object)
                and bool(item.etag) and item.modified is not None and item.tree.spool_fits())

    def _loop_thread(self) -> _LoopThread:
        with self._lock:
            if self._loop is None:
                self._loop = _LoopThread()
            return self._loop

    async def _same_version(self, item: DownloadItem, landed: Landed) -> tuple[ItemFailed | None, Landed | None]:
        """Prove a delegated download is one version: its parts were separate GETs, none bound to
        the planned ETag, and an object overwritten between two of them yields a file of both
        versions, of the right size. So the object must still be the planned version once the
        last part is in (one HEAD): the same ETag *and* the same LastModified, to the second S3
        counts — an object overwritten as the child read it and then written back with its old
        bytes has its old ETag but not its old time, and the child may have read the bytes in
        between. If not, the file is discarded and the item reported ``changed`` (the engine reads
        it again, bound). Written back within the listed version's own second, it passes here;
        the digest record of an object that new is "racy", so the next run checks the file's
        bytes against the ETag (:mod:`.digests`)."""
        failed: ItemFailed
        try:
            meta = await obstore.head_async(self._store(item.bucket), item.key)
        except Exception as exc:  # noqa: BLE001 - reported per object like any failure
            failed = ItemFailed(f"could not confirm which version was read: {type(exc).__name__}: {_first_line(exc)}",
                               changed=isinstance(exc, FileNotFoundError))  # deleted meanwhile
        else:
            current = str(meta.get("e_tag") or "").strip('"')
            listed, now = _second(s3_time_ns(item.modified)), _second(s3_time_ns(meta.get("last_modified")))
            if current == item.etag and listed == now:
                return None, replace(landed, etag=current)
            failed = ItemFailed(f"the object changed while it was downloaded (ETag {item.etag} → {current}, "
                               f"LastModified {item.modified} → {meta.get('last_modified')}); those bytes were "
                               "discarded", changed=True)
        if landed.temp is not None:
            landed.temp.discard()
        return failed, None

    async def _worker(self, feed: Feed[Item], on_done: ItemDone) -> None:
        """One of ``concurrency`` workers taking items from ``feed`` until it ends: memory stays
        O(concurrency) coroutines, not O(items) — 20,000 pending coroutines would cost more than
        the transfers themselves."""
        budget = self._budget
        while (item := await feed.take()) is not None:
            landed: Landed | None = None
            held = await budget.reserve(_held(item))
            try:
                landed = await (self._download(item) if isinstance(item, DownloadItem) else self._upload(item))
                error = None
            except _Refused as exc:
                error = exc.failed
            except UnsafePathError as exc:
                error = ItemFailed(str(exc))
            except OSError as exc:  # the local side: a name, a permission, a full disk
                where = item.final if isinstance(item, DownloadItem) else item.source
                error = ItemFailed(f"{where}: {exc.strerror or type(exc).__name__}")
            except Exception as exc:  # noqa: BLE001 - every failure is reported per object
                error = ItemFailed(f"{type(exc).__name__}: {_first_line(exc)}")
            finally:
                budget.release(held)
            try:
                on_done(item, error, landed)
            except BaseException as exc:  # noqa: BLE001 - the caller's: it ends the run, raised on the caller's thread
                feed.fail(exc)
                return

    async def _download(self, item: DownloadItem) -> Landed:
        unproven = False
        if (0 < item.size <= PROVEN_BYTES and item.modified is not None and is_md5_etag(item.etag)
                and item.bucket not in self._opaque_etags):
            try:
                data = await obstore.get_range_async(self._store(item.bucket), item.key, start=0, end=item.size)
            except FileNotFoundError as exc:  # how obstore reports a 404
                raise _Refused(ItemFailed(f"no such object (404): {_first_line(exc)}", missing=True)) from exc
            except Exception:  # noqa: BLE001 - the bound GET below reads it again and reports what it finds
                pass
            else:
                if len(data) == item.size and hashlib.md5(data, usedforsecurity=False).hexdigest() == item.etag.lower():
                    return self._write_proven(item, data)
                unproven = True
        landed = await self._download_bound(item)
        if unproven and landed.etag == item.etag:
            self._opaque_etags.add(item.bucket)  # the listed version, yet its ETag is not its bytes' MD5
        return landed

    @staticmethod
    def _write_proven(item: DownloadItem, data: Any) -> Landed:
        """Write a small object read whole in one ranged GET of its listed size (``get_range_async``:
        the bytes in one call into obstore, where ``get_async`` then its body are two — ~100 µs of
        CPU an object, issue 45), whose MD5 is the listed ETag: the bytes are then the listed
        version, whole — what the bound GET's ``If-Match`` proves. That call reports no metadata,
        so the file's mtime is the listing's LastModified.

        When the MD5 is not the ETag (the object changed, or the store's ETags are not MD5s) or
        the ranged GET fails other than with a 404, :meth:`_download` reads the object again with
        the bound GET, which settles it as before: ``changed`` (412), a failure, or the listed
        version — then that bucket's ETags are not MD5s, and its objects are read that way from
        then on."""
        temp, fd = item.tree.create_temp(item.relative)
        try:
            written = _write_all(fd, data)
        except BaseException:
            temp.discard()
            raise
        finally:
            os.close(fd)
        return Landed(etag=item.etag, size=item.size, written=written, temp=temp)

    async def _download_bound(self, item: DownloadItem) -> Landed:
        """One GET bound to the planned ETag (``If-Match``), its body written as it arrives."""
        options: GetOptions | None = {"if_match": f'"{item.etag}"'} if item.etag else None
        try:
            result = await obstore.get_async(self._store(item.bucket), item.key, options=options)
        except FileNotFoundError as exc:  # how obstore reports a 404 (a local FileNotFoundError is not one)
            raise _Refused(ItemFailed(f"no such object (404): {_first_line(exc)}", missing=True)) from exc
        except PreconditionError as exc:
            raise _Refused(ItemFailed("the object changed since it was listed (a read bound to the listed ETag was "
                                     "refused)", changed=True)) from exc
        temp, fd = item.tree.create_temp(item.relative)
        written = 0
        try:
            body = result.meta.get("size")  # the object read, not the one listed: it may have changed
            if body is not None and 0 <= body <= _CHUNK:  # small: one buffer, one write (the common case)
                written += _write_all(fd, await result.bytes_async())
            else:
                async for chunk in result.stream(min_chunk_size=_CHUNK):
                    written += _write_all(fd, chunk)
                    del chunk  # not held while the next is gathered
        except BaseException:
            temp.discard()
            raise
        finally:
            os.close(fd)
        meta = result.meta
        return Landed(etag=str(meta.get("e_tag") or "").strip('"') or None, size=meta.get("size"),
                      modified_ns=s3_time_ns(meta.get("last_modified")), written=written, temp=temp)

    async def _upload(self, item: UploadItem) -> Landed:
        """The scanned file, bound by its descriptor (open_scanned: never blocks on a FIFO swapped
        in under its name).

        A file of up to :data:`_LINKED_BYTES` from the user's own tree is handed to obstore by its
        descriptor's ``/proc/self/fd`` link, which opens that very file (not whatever its name
        holds now) and reads it in Rust: bytes handed over from Python are a buffer that obstore
        releases on one of its own threads, taking the GIL there once more — ~50 µs of CPU a
        file (13 % of a small upload's, issue 45). Not a larger one: obstore's own read holds a
        file about three times over, where reading it here holds it at most twice (chunks, then
        joined), and 50 µs is nothing beside sending a MiB. Any other file is read here to its scanned
        size and no further: a job that grows a file of its results once scanned (to a terabyte,
        sparse) gets its scanned bytes read, never the rest."""
        fd = open_scanned(item.source, identity=item.identity, size=item.size)
        try:
            store = self._store(item.bucket)
            linked = None
            if item.size <= _LINKED_BYTES and not item.untrusted and self._fd_links:
                try:  # obstore opens the file here, as it takes its arguments, before any request
                    linked = obstore.put_async(store, item.key, Path(FD_LINKS, str(fd)), chunk_size=_UPLOAD_PART)
                except OSError:
                    self._fd_links = False  # read here from now on
            if linked is not None:
                if item.activity is not None:
                    item.activity.beat()  # the file is read and sent in one step
                result = await linked
            else:
                chunks = beating(read_bounded(fd, item.size), item.activity)  # each chunk read (and sent) is progress
                if item.size <= _UPLOAD_PART:  # one PUT
                    result = await obstore.put_async(store, item.key, b"".join(chunks), chunk_size=_UPLOAD_PART)
                else:  # multipart, streamed from the file so memory stays bounded
                    result = await obstore.put_async(store, item.key, chunks, chunk_size=_UPLOAD_PART,
                                                     max_concurrency=PART_CONCURRENCY)
        finally:
            os.close(fd)
        return Landed(etag=str(result.get("e_tag") or "").strip('"') or None)


class _Checks:
    """The version checks of objects s5cmd delivered (:meth:`ObstoreExecutor._same_version`), each
    a HEAD started on the executor's loop as its object lands, so s5cmd goes on meanwhile: one
    after another they cost a round trip each (+20 ms an object at 20 ms latency, issue 45).

    Each item is reported on a thread of the s5cmd run, as it would be without the check — the
    one reading s5cmd's output, as later objects land and once the child is done — so a callback
    that raises ends that run there, and its child is killed. Whatever ends the run, no check is
    left behind: those still pending are cancelled and their files discarded before it ends."""

    def __init__(self, executor: ObstoreExecutor, loop: asyncio.AbstractEventLoop, on_done: ItemDone) -> None:
        self._executor, self._loop, self._on_done = executor, loop, on_done
        self._pending: deque[tuple[Item, Landed, Future[tuple[ItemFailed | None, Landed | None]]]] = deque()
        self._lock = threading.Lock()

    def landed(self, item: Item, failed: ItemFailed | None, landed: Landed | None) -> None:
        """s5cmd's report of one item: a failure is reported at once; a file is checked, and the
        checks already answered are reported, in the order their objects landed."""
        if failed is not None or landed is None or not isinstance(item, DownloadItem):
            self._on_done(item, failed, landed)
            return
        check = asyncio.run_coroutine_threadsafe(self._executor._same_version(item, landed), self._loop)
        with self._lock:
            self._pending.append((item, landed, check))
        self._report(wait=False)

    def finish(self) -> None:
        """Report every check still pending, waiting for each (the child is done)."""
        self._report(wait=True)

    def _report(self, *, wait: bool) -> None:
        while True:
            with self._lock:
                if not self._pending or not (wait or self._pending[0][2].done()):
                    return
                item, _, check = self._pending[0]
            outcome = check.result()  # an interrupt while waiting leaves it pending: __exit__ discards it
            with self._lock:
                self._pending.popleft()
            self._on_done(item, *outcome)

    def __enter__(self) -> _Checks:
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            pending, self._pending = list(self._pending), deque()
        for _, landed, check in pending:
            check.cancel()
            futures_wait([check])
            if landed.temp is not None:
                landed.temp.discard()


class _Refused(Exception):
    """The server's answer that settles one item (404, a failed precondition), as its failure."""

    def __init__(self, failed: ItemFailed) -> None:
        super().__init__(failed.reason)
        self.failed = failed


def _write_all(fd: int, data: Any) -> int:
    view = memoryview(data)
    total = len(view)
    while view:
        view = view[os.write(fd, view):]
    return total


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _second(ns: int | None) -> int | None:
    """A time to the whole second: what a HEAD's ``Last-Modified`` holds of a listing's ``LastModified``."""
    return None if ns is None else ns // 1_000_000_000


def _held(item: Item) -> int:
    """The bytes a worker holds while it moves ``item``, as measured (its reservation in the
    budget): a body up to a chunk is read whole, a larger one streamed; a file handed to obstore
    by its link is held about three times over, one read here for one PUT at most twice (chunks,
    then joined); a larger file is a multipart upload, holding no more parts than it has."""
    if isinstance(item, DownloadItem):
        if 0 <= item.size <= _CHUNK:
            return item.size
        return _STREAM_HELD if item.size < 0 else min(2 * item.size, _STREAM_HELD)  # < 0: not known
    if item.size <= _LINKED_BYTES:
        return 3 * item.size
    if item.size <= _UPLOAD_PART:
        return 2 * item.size
    return min(item.size + _CHUNK, _MULTIPART_HELD)
