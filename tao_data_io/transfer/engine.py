"""The transfer engine: plan → decide (strategy) → move (executor) → finalize (atomic rename,
digest bookkeeping) → summary.

Every public method returns a :class:`TransferSummary` and raises only for bad input
(:class:`UsageError`). Partial failures are in the summary; complete files are always kept,
and a rerun converges because the strategy recognises what is already right.

The engine holds no process-global state: each instance owns its boto3 session and executor,
so engines can run in parallel threads (e.g. several Prefect tasks in one worker), and
:meth:`TransferEngine.close` releases both.

Both are built on first use, not in the constructor: a command is a fresh process, and a sync
whose listing goes through :mod:`signed_list` and finds nothing to move never needs botocore
(~180 ms to import and build), obstore or s5cmd.
"""

from __future__ import annotations

import heapq
import itertools
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from ..credentials import S3Credentials
from .activity import Activity, beating
from ..errors import TaoDataIOError, TransferError, UsageError
from .client import explained, get_or_none, head_or_none, make_s3_client
from .digests import DigestStore, multipart_count
from .filters import GlobFilter, PathFilter
from .shard import Shard
from .work import DownloadItem, Executor, Item, ItemFailed, Landed, UploadItem
from .listing import RemoteObject, clean_etag, read_ahead, remote_objects, s3_time_ns
from .local_walk import LocalFile, LocalWalk, local_file, temp_leftovers, walk_local
from ..fs import (SPOOL_NAME, DestinationTree, UnsafePathError, check_relative, confined_path,
                  destination_lock, destination_lock_path, has_control_character, lock_owner, open_directory_nofollow,
                  remove_stale_temps)
from .signed_list import list_pages
from .strategy import ContentStrategy
from ..reporting import ProgressCallback, ProgressTracker, human_size
from .summary import Failure, Skipped, TransferSummary
from ..uris import S3Url, is_s3_url, parse_s3_url
from ..vocabulary import DEFAULT_CONCURRENCY

#: Objects planned (listed, looked up locally, decided) before their transfers run: what a
#: download holds in memory at once, whatever the listing's length — 1.28 M objects are 256
#: chunks. Large enough that the transfers' tail at the end of a chunk (the executor's workers
#: waiting for its last few objects) is a small share of it.
PLAN_CHUNK = 5000
#: The first chunk is one listing page: the first transfers start once the first page is in,
#: not five pages later.
FIRST_CHUNK = 1000
#: Size of an object planned without a HEAD (``download_keys``); checked against nothing.
UNKNOWN_SIZE = -1
#: Download-side digests live beside the data (never inside it), so a rerun from another host (or
#: a stage pod) that sees the same volume needs no rehash.
DOWNLOAD_DIGESTS = "digests.sqlite3"
#: Reads of one object before giving up when it keeps changing under the download: the first is
#: bound to the listed ETag; a changed object is read again whole, in one GET (one version).
READ_ATTEMPTS = 3
READ_ATTEMPTS_VARIABLE = "TAO_DATA_IO_READ_ATTEMPTS"
#: How much of an object :meth:`TransferEngine.read_into` holds at once.
READ_CHUNK = 1 << 20
#: Why a listed key is not downloaded: it marks a folder (what the S3 console's "Create folder" writes).
FOLDER_MARKER_REASON = "folder marker (zero-byte key ending in '/'); nothing to download"
T = TypeVar("T")


@dataclass(frozen=True)
class TransferOptions:
    """Per-call choices. Concurrency belongs to the engine (it sizes the executor's pools)."""

    filter: PathFilter | GlobFilter = field(default_factory=PathFilter)
    dry_run: bool = False
    progress: ProgressCallback | None = None
    #: Uploads only: leave files modified less than this many seconds ago for a later run, so
    #: a file a running job is still writing is never uploaded half-done (scheduled resyncs).
    settle_seconds: float = 0.0
    #: Prefix downloads only: take just the keys this shard owns (several stagers fill one
    #: destination together). Its lock and digest cache are its own, so shards never wait for
    #: or overwrite each other, and it removes only its own killed downloads' temp files.
    shard: Shard | None = None
    #: Uploads only: the parameter that named the source, when someone else controls that path (a
    #: job's ``results_dir``). The source must then not be a symlink or lie under one, is read
    #: without following any, and the refusal names the parameter.
    untrusted_source: str | None = None
    #: Uploads only: (bytes, what sets it) — the most the destination prefix may hold once the
    #: upload ends, by apparent size (a sparse file counts whole, as S3 will store it): what earlier
    #: uploads left there, less what this one replaces, plus what it sends. Past it nothing is uploaded.
    budget: tuple[int, str] | None = None
    #: Beats as the transfer moves (the listing, the scan, each file planned, each chunk read or
    #: sent, each file finished): the upload lock held for it is renewed only while it does.
    activity: Activity | None = None


@contextmanager
def locked_destination(dest: Path, dry_run: bool = False, shard: Shard | None = None) -> Iterator[DestinationTree]:
    """Hold the lock every writer of ``dest`` holds and yield the tree all writes go through.

    Serialised: two stage pods on one volume, a retry beside a straggler, a ``cp`` into a synced
    directory — each waits for the other. A shard locks only against runs of the same shard (the
    others touch other keys). Under the lock, the spools of killed runs of this lock are removed;
    the caller removes killed temp files as its scan finds them (:meth:`DestinationTree.remove_temps`),
    and only ever this lock's: a destination inside this one has its own lock and its own writers.
    """
    part = None if shard is None else shard.label
    lock = destination_lock_path(dest, part)
    tree = DestinationTree(dest, lock_owner(lock), lock.parent)
    if dry_run:  # no lock, no write; its lookups still open directories, closed here
        try:
            yield tree
        finally:
            tree.close()
        return
    with destination_lock(dest, part):
        remove_stale_temps(tree.state_dir / SPOOL_NAME, tree.owner)
        try:
            yield tree
        finally:
            tree.close()


def _chunks(items: Iterable[T], size: int, first: int | None = None) -> Iterator[list[T]]:
    """``items`` in lists of at most ``size`` (the first of at most ``first``), read as each is
    needed (no list is empty)."""
    iterator = iter(items)
    length = size if first is None else min(first, size)
    while chunk := list(itertools.islice(iterator, length)):
        yield chunk
        length = size


class _Budget:
    """The results budget as the upload walk spends it, starting from what the prefix holds: each
    file sent changes that by its size less the object it replaces. The first walk counted the
    tree, but a job may write between the two walks, so a file that would take the prefix past the
    budget is not sent (a failure of its own, naming the budget) — what this upload leaves in the
    prefix never exceeds it."""

    def __init__(self, budget: tuple[int, str] | None, prefix: S3Url, listing: RemoteIndex) -> None:
        self._limit, self._what = budget if budget is not None else (None, "")
        self._prefix = prefix
        self._held = 0 if budget is None else listing.total_bytes()

    def takes(self, local: LocalFile, replaced: RemoteObject | None, summary: TransferSummary) -> bool:
        if self._limit is None:
            return True
        grows = local.size - (replaced.size if replaced is not None else 0)
        if grows > 0 and self._held + grows > self._limit:
            summary.fail(Failure(local.relative, f"{human_size(local.size)} would take {self._prefix} past "
                                 f"{self._what} ({human_size(self._limit)}) at this point of the upload (the "
                                 "results changed since they were counted); not uploaded — the next run counts "
                                 "again"))
            return False
        self._held += grows
        return True


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
    (:meth:`TransferEngine.list_into_index`) while a command still loads what it needs to decide
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
        for chunk in _chunks(objects, _ROWS_A_STATEMENT):
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
        found = {}
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


def _beat(options: TransferOptions) -> None:
    if options.activity is not None:
        options.activity.beat()


def read_attempts(environ: Mapping[str, str] | None = None) -> int:
    """How many times one object may be read before a download gives up on it because it changed
    each time: :data:`READ_ATTEMPTS`, or ``$TAO_DATA_IO_READ_ATTEMPTS``."""
    raw = (os.environ if environ is None else environ).get(READ_ATTEMPTS_VARIABLE, "")
    if not raw:
        return READ_ATTEMPTS
    if not raw.isdigit() or int(raw) < 1:
        raise UsageError(f"{READ_ATTEMPTS_VARIABLE} {raw!r} must be a whole number of reads, 1 or more "
                         f"(default {READ_ATTEMPTS})")
    return int(raw)


def upload_digest_path(source_root: Path) -> Path:
    """Upload-side digests live in the user's cache (the source may be read-only, and a
    results directory should not grow files of ours), keyed by the source's real path."""
    import hashlib

    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tao-data-io" / "upload-digests"
    key = hashlib.sha256(os.path.realpath(source_root).encode()).hexdigest()[:32]
    return cache / f"{key}.sqlite3"


def _upload_digests(source_root: Path, options: TransferOptions) -> DigestStore:
    """The digest cache of uploads from ``source_root`` (none kept for a dry run)."""
    return DigestStore(None if options.dry_run else upload_digest_path(source_root))


def _import_data_path() -> None:
    """Import the executors' modules (obstore's native library, asyncio): in a fresh process, the
    tens of milliseconds this takes can overlap a listing's round trips instead of following them."""
    from . import obstore_executor, s5cmd_executor  # noqa: F401


def _sizes(files: Iterable[LocalFile]) -> tuple[int, list[LocalFile]]:
    """The apparent size of ``files`` in all, and the three largest, holding no more of them."""
    total = 0

    def counted() -> Iterator[LocalFile]:
        nonlocal total
        for local in files:
            total += local.size
            yield local

    largest = heapq.nlargest(3, counted(), key=lambda local: local.size)  # one heap of three, one pass
    return total, largest


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


class TransferEngine:
    def __init__(self, credentials: S3Credentials, *, executor: Executor | None = None,
                 concurrency: int = DEFAULT_CONCURRENCY) -> None:
        self.credentials = credentials
        self.concurrency = concurrency
        if executor is not None:
            self.executor = executor

    @cached_property
    def client(self) -> Any:
        """The boto3 client of the control plane (HEAD, part sizes, the listing's fallback)."""
        return make_s3_client(self.credentials, max_pool_connections=min(max(self.concurrency, 10), 64))

    @cached_property
    def executor(self) -> Executor:
        """obstore in-process, handing objects of 32 MiB and more to s5cmd (``bench/README.md``)."""
        from .obstore_executor import ObstoreExecutor
        from .s5cmd_executor import S5cmdExecutor

        return ObstoreExecutor(self.credentials, concurrency=self.concurrency,
                               large=S5cmdExecutor(self.credentials, concurrency=min(self.concurrency, 16)))

    # ----------------------------------------------------------------- lifetime
    def close(self) -> None:
        """Stop the executor's event loop and close the control-plane client, if they were built.
        Whoever builds an engine closes it (or uses it as a context manager): a worker that runs
        resyncs for weeks must not grow a thread per run."""
        if "executor" in self.__dict__:
            self.executor.close()
        if "client" in self.__dict__:
            self.client.close()

    def __enter__(self) -> TransferEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- entry points
    def sync(self, source: str, destination: str, options: TransferOptions | None = None) -> TransferSummary:
        """``aws s3 sync`` in either direction: exactly one side must be ``s3://``."""
        options = options or TransferOptions()
        if is_s3_url(source) == is_s3_url(destination):
            raise UsageError(
                f"sync needs exactly one s3:// side, got {source!r} → {destination!r}; "
                "write `sync s3://BUCKET/PREFIX/ DIR` or `sync DIR s3://BUCKET/PREFIX/`"
            )
        if is_s3_url(source):
            return self.download_prefix(parse_s3_url(source, field="SRC"), Path(destination), options)
        if options.shard is not None:
            raise UsageError(f"shard {options.shard} splits downloads only; upload {source!r} in one run")
        return self.upload_directory(Path(source), parse_s3_url(destination, field="DST"), options)

    def copy(self, source: str, destination: str, options: TransferOptions | None = None) -> TransferSummary:
        """Copy one object to a file, or one file to an object (``aws s3 cp`` semantics)."""
        options = options or TransferOptions()
        if is_s3_url(source) == is_s3_url(destination):
            raise UsageError(f"cp needs exactly one s3:// side, got {source!r} → {destination!r}")
        if is_s3_url(source):
            url = parse_s3_url(source, field="SRC")
            if url.is_prefix:
                raise UsageError(f"SRC {source!r} names a prefix, not an object; cp copies one object — use `sync` for a prefix")
            target = Path(destination)
            if destination.endswith(("/", os.sep)) or target.is_dir():
                target = target / url.key.rsplit("/", 1)[-1]
            return self.download_object(url, target, options)
        path = Path(source)
        if not path.is_file():
            raise UsageError(f"SRC {source!r} is not a regular file; cp uploads one file — use `sync` for a directory")
        url = parse_s3_url(destination, field="DST")
        if url.is_prefix:
            url = S3Url(url.bucket, url.key + path.name)
        return self.upload_file(path, url, options)

    # ----------------------------------------------------------------- download
    def download_prefix(self, prefix: S3Url, dest: Path, options: TransferOptions, *,
                        pages: Iterable[dict[str, Any]] | None = None) -> TransferSummary:
        """Sync ``prefix`` down into ``dest``, streamed: the listing is read a few pages ahead (in
        a thread of its own) and planned :data:`PLAN_CHUNK` objects at a time (:meth:`_download`).
        ``pages``: its listing, when the caller has just read it (it is not listed again)."""
        prefix = prefix.as_prefix()
        summary = TransferSummary(str(prefix), str(dest), dry_run=options.dry_run)
        started = time.monotonic()
        if dest.exists() and not dest.is_dir():
            raise UsageError(f"DST {str(dest)!r} exists and is not a directory; give a directory path")
        # The first page is read before the lock is taken, so a bad bucket or key creates nothing locally.
        listed = read_ahead(self.pages(prefix) if pages is None else pages)
        first = next(listed, {})
        objects = remote_objects(itertools.chain([first], listed), prefix.key,
                                 lambda key: summary.skip(Skipped(key, FOLDER_MARKER_REASON)))
        shard = options.shard

        def selected() -> Iterator[RemoteObject]:
            for obj in objects:
                if options.filter(obj.relative) and (shard is None or shard.owns(obj.key)):
                    yield obj
                else:
                    summary.excluded_files += 1

        with locked_destination(dest, options.dry_run, shard) as tree:
            if not options.dry_run:
                tree.remove_temps(temp_leftovers(dest))  # this lock's killed downloads only
            # A destination made by this run holds only what this run writes (each key once): looked
            # up only if it was there before (a lookup would make it, in a dry run too).
            present = dest.is_dir()

            def lookup(relative: str) -> LocalFile | None:
                found = tree.existing_file(relative) if present else None
                return None if found is None else local_file(relative, tree.root / relative, found)

            digests = DOWNLOAD_DIGESTS if shard is None else f"digests.{shard.label}.sqlite3"
            self._download(prefix.bucket, selected(), tree, lookup, summary, options, digests)
        summary.seconds = time.monotonic() - started
        return summary

    def download_object(self, url: S3Url, target: Path, options: TransferOptions) -> TransferSummary:
        summary = TransferSummary(str(url), str(target), dry_run=options.dry_run)
        started = time.monotonic()
        head = self._head(url)
        if head is None:
            summary.fail(Failure(str(url), "no such object (404); check the bucket and key", missing=True))
            return summary
        obj = RemoteObject(url.key, target.name, int(head["ContentLength"]), clean_etag(head.get("ETag")),
                           head.get("LastModified"))
        with locked_destination(target.parent, options.dry_run) as tree:
            existing: dict[str, LocalFile] = {}
            try:
                st = os.stat(target, follow_symlinks=False)  # a symlink there is replaced, never followed
                if stat.S_ISREG(st.st_mode):
                    existing[target.name] = local_file(target.name, target, st)
            except OSError:
                pass  # absent, or a name no filesystem holds (refused by _download)
            self._download(url.bucket, [obj], tree, existing.get, summary, options)
        summary.seconds = time.monotonic() - started
        return summary

    def download_keys(self, bucket: str, items: Sequence[tuple[str, str]], dest: Path,
                      options: TransferOptions) -> TransferSummary:
        """Download explicit ``(key, relative path)`` pairs into ``dest`` without listing.

        For annotation-selective staging: the cost grows with the number of references, not the
        size of the bucket. A key whose local file does not exist yet goes straight to GET; only
        keys with a local candidate are HEADed (concurrently) to decide whether it is unchanged.
        A key that does not exist is a failure with ``missing=True``.
        """
        summary = TransferSummary(f"s3://{bucket}/ ({len(items)} keys)", str(dest), dry_run=options.dry_run,
                                  names_kept=len(items))  # every name: a failed selective stage undoes them
        started = time.monotonic()
        local: dict[str, LocalFile] = {}
        for _key, relative in items:
            try:
                path = confined_path(dest, relative, what="reference")
                st = os.stat(path, follow_symlinks=False)  # a symlink there is replaced, never followed
                if stat.S_ISREG(st.st_mode):
                    local[relative] = local_file(relative, path, st)
            except (UnsafePathError, OSError):
                pass  # unsafe or impossible names are reported by _download; absent files need no HEAD
        to_head = [(key, relative) for key, relative in items if relative in local]
        with ThreadPoolExecutor(max_workers=min(32, max(1, len(to_head)))) as pool:
            heads = dict(zip(to_head, pool.map(lambda pair: self._head(S3Url(bucket, pair[0])), to_head), strict=True))
        objects = []
        for key, relative in items:
            head = heads.get((key, relative))
            if head is None:
                objects.append(RemoteObject(key, relative, UNKNOWN_SIZE, ""))
            else:
                objects.append(RemoteObject(key, relative, int(head["ContentLength"]), clean_etag(head.get("ETag")),
                                            head.get("LastModified")))
        with locked_destination(dest, options.dry_run) as tree:
            self._download(bucket, objects, tree, local.get, summary, options)
        summary.seconds = time.monotonic() - started
        return summary

    def _download(self, bucket: str, objects: Iterable[RemoteObject], tree: DestinationTree,
                  local: Callable[[str], LocalFile | None], summary: TransferSummary, options: TransferOptions,
                  digests: str = DOWNLOAD_DIGESTS) -> None:
        """Plan and run downloads of ``objects`` into ``tree`` (keys mapped by ``relative``; ``local``
        finds what is there under a name), :data:`PLAN_CHUNK` objects at a time, so memory holds
        one chunk's plan whatever the listing's length.

        Names are checked here; directories on the way are checked when each file is written
        (the tree never follows a symlink), because that is when a swapped one would matter."""
        store = DigestStore(None if options.dry_run else tree.state_dir / digests)
        tracker = ProgressTracker(0, 0, options.progress, planning=True)
        strategy = ContentStrategy(store, lambda key: self._part_size(bucket, key))

        def planned() -> Iterator[list[Item]]:
            for chunk in _chunks(objects, PLAN_CHUNK, FIRST_CHUNK):
                store.prefetch([obj.relative for obj in chunk])
                batch: list[Item] = []
                for obj in chunk:
                    try:
                        check_relative(obj.relative, what="key")
                    except UnsafePathError as exc:
                        summary.fail(Failure(obj.key, str(exc)))
                        continue
                    try:
                        same = strategy.unchanged(local(obj.relative), obj.key, obj.size, obj.etag)
                    except OSError:  # swapped since the lookup (a symlink, a FIFO): replaced, never read
                        same = False
                    if same:
                        summary.unchanged_files += 1
                        summary.unchanged_bytes += obj.size
                        continue
                    batch.append(DownloadItem(bucket, obj.key, obj.size, obj.etag, obj.relative, tree,
                                              obj.last_modified))
                tracker.plan(len(batch), sum(max(item.size, 0) for item in batch))
                yield batch

        try:
            self._execute(planned(), summary, options, store, tracker,
                          lambda item, landed: self._finalize_download(item, landed, store),
                          attempts=read_attempts())
            tracker.planned_all()
        finally:
            store.close()

    @staticmethod
    def _finalize_download(item: Item, landed: Landed | None, store: DigestStore) -> ItemFailed | None:
        """Check, publish and remember one downloaded file.

        Never bytes that never existed: an item planned with an ETag is published only if the
        executor proved the file is that version (``Landed.etag``; obstore binds its GET to it,
        a ranged download is checked once its last part is in) — otherwise it is discarded and
        reported ``changed``. The size must be the one the server reported for those bytes (or
        the listing's). The file takes the object's LastModified as its mtime (as ``aws s3
        sync`` does), which keeps the digest entry from being "racy", and the entry records the
        ETag of the bytes that were actually read.
        """
        assert isinstance(item, DownloadItem)
        if landed is None or landed.temp is None:
            return ItemFailed("the executor reported success without a file")
        if item.etag and landed.etag != item.etag:
            landed.temp.discard()
            return ItemFailed(f"the bytes read are not proven to be the listed version (ETag {item.etag}, read "
                             f"{landed.etag or 'unknown'}); discarded", changed=True)
        size = landed.written if landed.written is not None else landed.temp.size()
        expected = landed.size if landed.size is not None else item.size
        if expected != UNKNOWN_SIZE and size != expected:
            landed.temp.discard()
            return ItemFailed(f"size mismatch after download: expected {expected} bytes, got {size}; the object "
                             "changed or the read was cut short")
        try:
            st = landed.temp.publish(landed.modified_ns or s3_time_ns(item.modified))
        except OSError as exc:
            return ItemFailed(f"could not move the downloaded file into place: {exc.strerror or exc}")
        store.record(local_file(item.relative, item.final, st), etag=landed.etag or item.etag or None)
        return None

    # ----------------------------------------------------------------- upload
    def upload_directory(self, source: Path, prefix: S3Url, options: TransferOptions,
                         listing: RemoteIndex | None = None) -> TransferSummary:
        """Sync ``source`` up to ``prefix``, streamed: the listing goes into a temporary index on
        disk (:class:`RemoteIndex`) while the tree is walked :data:`PLAN_CHUNK` files at a time,
        each chunk decided against its own objects and uploaded before the next is walked — memory
        holds a chunk and a directory's names, whatever the tree's size. The few files whose
        admission needs the whole tree (symlinks, files with several links) are decided once the
        walk is over.

        ``listing``: an index of ``prefix`` begun earlier (:meth:`list_into_index`), taken over
        and closed here; one of another prefix is closed and a new one begun."""
        prefix = prefix.as_prefix()
        summary = TransferSummary(str(source), str(prefix), dry_run=options.dry_run)
        started = time.monotonic()
        if not source.is_dir():
            raise UsageError(f"SRC {str(source)!r} is not a directory; sync uploads a directory — use `cp` for one file")
        root_fd = (os.open(source, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC) if options.untrusted_source is None
                   else open_directory_nofollow(source, what=options.untrusted_source))
        stack = ExitStack()
        try:
            if "executor" not in self.__dict__:
                threading.Thread(target=_import_data_path, daemon=True).start()  # ~40 ms of a fresh process, overlapped
            if listing is None or listing.prefix != prefix:
                if listing is not None:
                    listing.close()  # begun for another prefix: of no use here
                listing = self.list_into_index(prefix, options.activity)
            stack.callback(listing.close)
            if options.budget is not None:  # before a byte moves: a first walk, sizes only, beside the listing
                self._within_budget(source, root_fd, prefix, options, listing)
            store = _upload_digests(source, options)
            stack.callback(store.close)
            tracker = ProgressTracker(0, 0, options.progress, planning=True)
            strategy = self._upload_strategy(prefix.bucket, store, options)
            budget = _Budget(options.budget, prefix, listing)
            walk = stack.enter_context(LocalWalk(skip=summary.skip))
            beat = None if options.activity is None else options.activity.beat

            def planned() -> Iterator[list[Item]]:
                for chunk in _chunks(walk_local(root_fd, source, walk, on_directory=beat), PLAN_CHUNK, FIRST_CHUNK):
                    remote = listing.among([prefix.key + local.relative for local in chunk])
                    items = [(local, prefix.key + local.relative) for local in chunk
                             if self._admitted(local, None, prefix, options, summary)
                             and budget.takes(local, remote.get(prefix.key + local.relative), summary)]
                    yield self._plan_upload(prefix.bucket, items, remote, store, strategy, summary, options, tracker)
                # What the walk held back, decided (the second walk it may take beats as the first did).
                for chunk in _chunks(walk.decided(source, on_directory=beat), PLAN_CHUNK):
                    files = [entry for entry in chunk if not isinstance(entry, Skipped)]
                    summary.skip(*(entry for entry in chunk if isinstance(entry, Skipped)))
                    remote = listing.among([prefix.key + local.relative for local, _ in files])
                    items = [(local, prefix.key + local.relative) for local, outside in files
                             if self._admitted(local, outside, prefix, options, summary)
                             and budget.takes(local, remote.get(prefix.key + local.relative), summary)]
                    yield self._plan_upload(prefix.bucket, items, remote, store, strategy, summary, options, tracker)

            self._execute(planned(), summary, options, store, tracker,
                          lambda item, landed: self._finalize_upload(item, landed, store))
            tracker.planned_all()
        finally:
            stack.close()
            os.close(root_fd)
        summary.seconds = time.monotonic() - started
        return summary

    @staticmethod
    def _admitted(local: LocalFile, linked_outside: str | None, prefix: S3Url, options: TransferOptions,
                  summary: TransferSummary) -> bool:
        """Whether the walked file ``local`` is uploaded; if not, counted or reported in ``summary``."""
        settled_before = time.time_ns() - int(options.settle_seconds * 1e9)
        if not options.filter(local.relative) or (local.target_relative and not options.filter(local.target_relative)):
            summary.excluded_files += 1  # a symlink is admitted only if its target would be too
        elif linked_outside is not None:
            summary.skip(Skipped(local.relative, linked_outside + "; not uploaded"))
        elif (unsendable := unsendable_name(prefix.key + local.relative)) is not None:
            summary.skip(Skipped(local.relative.encode("utf-8", "backslashreplace").decode(), unsendable))
        elif options.settle_seconds and max(local.mtime_ns, local.ctime_ns) > settled_before:
            summary.skip(Skipped(local.relative, f"modified in the last {options.settle_seconds:g}s "
                                 "(still being written?); left for a later run"))
        else:
            return True
        return False

    def _within_budget(self, source: Path, root_fd: int, prefix: S3Url, options: TransferOptions,
                       listing: RemoteIndex) -> None:
        """Refuse, before a byte moves, an upload that would leave the prefix holding more than the
        budget by apparent size (a sparse file counts whole, as S3 stores it): what this upload
        would send, plus what ``listing`` holds under names it does not write — an upload never
        deletes, so a job that keeps only its newest checkpoint still adds one to the prefix a run.
        A prefix already past the budget (it was lowered) takes an upload that does not grow it."""
        limit, what = options.budget or (0, "")
        ignored = TransferSummary(str(source), str(prefix))
        replaced = 0

        def replacing(files: Iterable[LocalFile]) -> Iterator[LocalFile]:
            nonlocal replaced
            for chunk in _chunks(files, PLAN_CHUNK):
                replaced += sum(obj.size for obj in listing.among([prefix.key + local.relative for local in chunk])
                                .values())
                yield from chunk

        with LocalWalk() as walk:
            admitted = (local for local in walk_local(root_fd, source, walk)
                        if self._admitted(local, None, prefix, options, ignored))
            total, largest = _sizes(replacing(admitted))
            more, more_largest = _sizes(replacing(entry[0] for entry in walk.decided(source)
                                                  if not isinstance(entry, Skipped)
                                                  and self._admitted(entry[0], entry[1], prefix, options, ignored)))
        total += more
        held = listing.total_bytes()
        kept = held - replaced
        if total + kept > max(limit, held):  # a prefix already past it (a lowered limit) may still shrink
            shown = ", ".join(f"{local.relative} ({human_size(local.size)})"
                              for local in heapq.nlargest(3, [*largest, *more_largest], key=lambda local: local.size))
            earlier = (f" and {prefix} already holds {human_size(kept)} under names this upload does not write (an "
                       f"upload never deletes: what earlier uploads left stays), {human_size(total + kept)} in all"
                       if kept else "")
            fix = f", or delete from {prefix} what earlier uploads left that need not be kept" if kept else ""
            raise UsageError(f"{source} holds {human_size(total)} to upload (apparent sizes: a sparse file counts whole, "
                             f"as S3 stores it){earlier}, more than {what} allows ({human_size(limit)}); nothing was "
                             f"uploaded. The largest: {shown}. Raise {what}, or exclude what need not be kept{fix}")

    def upload_file(self, source: Path, url: S3Url, options: TransferOptions) -> TransferSummary:
        summary = TransferSummary(str(source), str(url), dry_run=options.dry_run)
        started = time.monotonic()
        local = local_file(source.name, source, os.stat(source))
        head = self._head(url)
        remote = {}
        if head is not None:
            remote[url.key] = RemoteObject(url.key, source.name, int(head["ContentLength"]), clean_etag(head.get("ETag")))
        store = _upload_digests(source.parent, options)
        try:
            tracker = ProgressTracker(0, 0, options.progress, planning=True)
            batch = self._plan_upload(url.bucket, [(local, url.key)], remote, store,
                                      self._upload_strategy(url.bucket, store, options), summary, options, tracker)
            self._execute([batch], summary, options, store, tracker,
                          lambda item, landed: self._finalize_upload(item, landed, store))
            tracker.planned_all()
        finally:
            store.close()
        summary.seconds = time.monotonic() - started
        return summary

    def _upload_strategy(self, bucket: str, store: DigestStore, options: TransferOptions) -> ContentStrategy:
        return ContentStrategy(store, lambda key: self._part_size(bucket, key),
                               None if options.activity is None else options.activity.beat)

    def _plan_upload(self, bucket: str, items: list[tuple[LocalFile, str]], remote: Mapping[str, RemoteObject],
                     store: DigestStore, strategy: ContentStrategy, summary: TransferSummary, options: TransferOptions,
                     tracker: ProgressTracker) -> list[Item]:
        """The uploads among ``(local file, key)`` pairs: what is already right is counted unchanged."""
        store.prefetch([local.relative for local, _ in items])
        batch: list[Item] = []
        for local, key in items:
            _beat(options)  # deciding a large file hashes it: a file decided is progress
            existing = remote.get(key)
            try:
                same = existing is not None and strategy.unchanged(local, key, existing.size, existing.etag)
            except OSError as exc:  # gone or swapped since the scan (a FIFO, a symlink): this file only
                summary.fail(Failure(key, f"{local.path}: {exc.strerror or type(exc).__name__}; the next run "
                                          "looks again"))
                continue
            if same:
                summary.unchanged_files += 1
                summary.unchanged_bytes += local.size
                continue
            batch.append(UploadItem(local, bucket, key, options.activity))
        tracker.plan(len(batch), sum(item.size for item in batch))
        return batch

    @staticmethod
    def _finalize_upload(item: Item, landed: Landed | None, store: DigestStore) -> ItemFailed | None:
        """A file that changed while it was uploading may have been read half-old, half-new:
        report it as failed (the next run uploads it again) instead of calling it uploaded.
        Otherwise remember the ETag the server gave these bytes, so the next run needs no hash."""
        assert isinstance(item, UploadItem)
        before = item.scanned
        try:
            st = os.stat(before.path)
        except FileNotFoundError:
            store.forget(before.relative)
            return ItemFailed("removed while uploading; the object may hold a partial read — the next run looks again")
        after = local_file(before.relative, before.path, st)
        if (after.size, after.mtime_ns, after.ctime_ns, after.ino) != (before.size, before.mtime_ns, before.ctime_ns,
                                                                     before.ino):
            store.forget(before.relative)
            return ItemFailed("changed while uploading; the next run uploads it again")
        if landed is not None and landed.etag:
            store.record(after, etag=landed.etag, keep=store.same_stat(after))
        return None

    # ----------------------------------------------------------------- execution
    def _execute(self, batches: Iterable[list[Item]], summary: TransferSummary, options: TransferOptions,
                 store: DigestStore, tracker: ProgressTracker,
                 finalize: Callable[[Item, Landed | None], ItemFailed | None], *, attempts: int = 1) -> None:
        """Run ``batches`` (planned as the executor takes them: the next while this one moves),
        finalize each item as it lands, and count what happened in ``summary``.

        A download reported ``changed`` (the object was overwritten while it was read) was
        discarded, never published; it is read again, whole and unbound to the stale ETag, up
        to ``attempts`` reads in all, then fails naming the limit."""
        if options.dry_run:
            for batch in batches:
                summary.name_transferred(item.relative for item in batch)
                summary.transferred_files += len(batch)
                summary.transferred_bytes += sum(max(item.size, 0) for item in batch)
            return
        lock = threading.Lock()  # the executor may report from several threads at once
        original: dict[int, Item] = {}
        retry: list[Item] = []
        attempt = 1

        def on_done(item: Item, failed: ItemFailed | None, landed: Landed | None) -> None:
            with lock:
                _done(item, failed, landed)

        def _done(item: Item, failed: ItemFailed | None, landed: Landed | None) -> None:
            _beat(options)
            first = original.pop(id(item), item)
            if failed is None:
                try:
                    failed = finalize(item, landed)
                except Exception as exc:  # noqa: BLE001 - one file's bookkeeping never stops the rest
                    failed = ItemFailed(f"could not finish the file: {type(exc).__name__}: {exc}")
            if landed is not None and landed.temp is not None:
                landed.temp.discard()  # a no-op once published
            if failed is None:
                size = landed.written if landed is not None and landed.written is not None else item.size
                summary.name_transferred([first.relative])
                summary.transferred_files += 1
                summary.transferred_bytes += size
                tracker.advance(size)
            elif failed.changed and isinstance(item, DownloadItem) and attempt < attempts:
                again = replace(item, etag="")
                original[id(again)] = first
                retry.append(again)
            else:
                reason = failed.reason
                if failed.changed:
                    reason += (f"; it was read {attempt} time(s), the limit ({READ_ATTEMPTS_VARIABLE} raises it), and "
                               "changed each time — nothing was published; rerun once nothing writes it")
                summary.fail(Failure(item.key, reason, missing=failed.missing))
                tracker.advance(max(item.size, 0), failed=True)

        def opened(batches: Iterable[list[Item]]) -> Iterator[list[Item]]:
            trees: set[DestinationTree] = set()
            for batch in batches:
                for tree in {item.tree for item in batch if isinstance(item, DownloadItem)} - trees:
                    tree.open()  # a destination that cannot be created fails the run here, naming its path
                    trees.add(tree)
                if batch:
                    yield batch

        tracker.start()
        try:
            moving = opened(batches)
            first = next(moving, None)  # a run with nothing to move never builds the executor (obstore, its loop)
            if first is not None:
                self.executor.run(itertools.chain([first], moving), on_done)
            while retry:
                pending, retry, attempt = retry, [], attempt + 1
                self.executor.run([pending], on_done)
        finally:
            store.save()

    # ----------------------------------------------------------------- control plane
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
        make atomic or to skip — :meth:`copy` to a path does both."""
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
