"""Downloads: a prefix, one object or explicit keys into a local destination tree.

Why a module of its own: a download plans against what the destination already holds (looked up
through the tree, never following a symlink), under the lock every writer of that destination
holds, and publishes a file only once the executor proved its bytes are the version that was
listed — re-reading an object that changed under it. None of that is an upload's concern (which
walks a tree it does not own and plans against a listing), and the control plane's single
requests (:mod:`.objects`) neither plan nor publish. :class:`Downloads` is the part of
:class:`~tao_data_io.transfer.engine.TransferEngine` that does it; what it plans runs through the
engine's shared ``_execute``.
"""

from __future__ import annotations

import itertools
import os
import stat
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..errors import UnsafePathError, UsageError
from .digests import DigestStore
from .work import DownloadItem, Item, ItemFailed, Landed
from .listing import RemoteObject, clean_etag, read_ahead, remote_objects, s3_time_ns
from .local_walk import LocalFile, local_file, temp_leftovers
from ..fs.confinement import check_relative, confined_path
from ..fs.locks import destination_lock, destination_lock_path
from ..fs.temp import lock_tag, remove_stale_temps
from ..fs.tree import SPOOL_NAME, DestinationTree
from .objects import ControlPlane
from .options import TransferOptions, plan_chunks
from .shard import Shard
from .strategy import ContentStrategy
from ..reporting import ProgressTracker
from .summary import Failure, Skipped, TransferSummary
from ..uris import S3Url

#: Size of an object planned without a HEAD (``download_keys``); checked against nothing.
UNKNOWN_SIZE = -1
#: Download-side digests live beside the data (never inside it), so a rerun from another host (or
#: a stage pod) that sees the same volume needs no rehash.
DOWNLOAD_DIGESTS = "digests.sqlite3"
#: Reads of one object before giving up when it keeps changing under the download: the first is
#: bound to the listed ETag; a changed object is read again whole, in one GET (one version).
READ_ATTEMPTS = 3
READ_ATTEMPTS_VARIABLE = "TAO_DATA_IO_READ_ATTEMPTS"
#: Why a listed key is not downloaded: it marks a folder (what the S3 console's "Create folder" writes).
FOLDER_MARKER_REASON = "folder marker (zero-byte key ending in '/'); nothing to download"


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
    tree = DestinationTree(dest, lock_tag(lock), lock.parent)
    if dry_run:  # no lock, no write; its lookups still open directories, closed here
        try:
            yield tree
        finally:
            tree.close()
        return
    with destination_lock(dest, part):
        remove_stale_temps(tree.state_dir / SPOOL_NAME, tree.tag)
        try:
            yield tree
        finally:
            tree.close()


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


class Downloads(ControlPlane):
    """The download half of :class:`~tao_data_io.transfer.engine.TransferEngine`."""

    def download_prefix(self, prefix: S3Url, dest: Path, options: TransferOptions, *,
                        pages: Iterable[dict[str, Any]] | None = None) -> TransferSummary:
        """Sync ``prefix`` down into ``dest``, streamed: the listing is read a few pages ahead (in
        a thread of its own) and planned :data:`~.options.PLAN_CHUNK` objects at a time (:meth:`_download`).
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
        finds what is there under a name), :data:`~.options.PLAN_CHUNK` objects at a time, so memory holds
        one chunk's plan whatever the listing's length.

        Names are checked here; directories on the way are checked when each file is written
        (the tree never follows a symlink), because that is when a swapped one would matter."""
        store = DigestStore(None if options.dry_run else tree.state_dir / digests)
        tracker = ProgressTracker(0, 0, options.progress, planning=True)
        strategy = ContentStrategy(store, lambda key: self._part_size(bucket, key))

        def planned() -> Iterator[list[Item]]:
            for chunk in plan_chunks(objects, first_page=True):
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
        store.record_written(item.relative, st, landed.etag or item.etag or None)
        return None
