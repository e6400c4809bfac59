"""Uploads: a local tree, or one file, up to a prefix.

Why a module of its own: an upload walks a tree it does not own (a job may still be writing it,
its source may be untrusted, a symlink may point out of it), admits what may be sent, keeps the
prefix within a results budget, and plans against a listing of the prefix held in a temporary
index (:class:`~tao_data_io.transfer.remote_index.RemoteIndex`) rather than against local files; it
publishes nothing locally, but refuses a file that changed while it was read. None of that is a
download's concern. :class:`Uploads` is the part of
:class:`~tao_data_io.transfer.engine.TransferEngine` that does it; what it plans runs through the
engine's shared ``_execute``.
"""

from __future__ import annotations

import heapq
import os
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import ExitStack
from pathlib import Path

from ..errors import UsageError
from .digests import DigestStore, stat_identity
from .work import Item, ItemFailed, Landed, UploadItem
from .listing import RemoteObject, clean_etag
from .local_walk import LocalFile, LocalWalk, local_file, walk_local
from ..fs.confinement import open_directory_nofollow
from .keys import unsendable_name
from .objects import ControlPlane
from .remote_index import RemoteIndex
from .options import TransferOptions, beat_of, plan_chunks
from .strategy import ContentStrategy
from ..reporting import ProgressTracker, human_size
from .summary import Failure, Skipped, TransferSummary
from ..uris import S3Url


class _ResultsBudget:
    """The results budget as the upload walk spends it, starting from what the prefix holds: each
    file sent changes that by its size less the object it replaces. The first walk counted the
    tree, but a job may write between the two walks, so a file that would take the prefix past the
    budget is not sent (a failure of its own, naming the budget) — what this upload leaves in the
    prefix never exceeds it."""

    def __init__(self, budget: tuple[int, str] | None, prefix: S3Url, listing: RemoteIndex) -> None:
        limit: tuple[int | None, str] = budget if budget is not None else (None, "")
        self._limit, self._what = limit
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
    from . import obstore_executor, s5cmd_executor  # noqa: F401 - imported for the import's time, not a name


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


class Uploads(ControlPlane):
    """The upload half of :class:`~tao_data_io.transfer.engine.TransferEngine`."""

    def upload_directory(self, source: Path, prefix: S3Url, options: TransferOptions,
                         listing: RemoteIndex | None = None) -> TransferSummary:
        """Sync ``source`` up to ``prefix``, streamed: the listing goes into a temporary index on
        disk (:class:`RemoteIndex`) while the tree is walked :data:`~.options.PLAN_CHUNK` files at a time,
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
            raise UsageError(f"SRC {str(source)!r} is not a directory; "
                             "sync uploads a directory — use `cp` for one file")
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
            budget = _ResultsBudget(options.budget, prefix, listing)
            walk = stack.enter_context(LocalWalk(skip=summary.skip))
            beat = None if options.activity is None else options.activity.beat

            def planned() -> Iterator[list[Item]]:
                for chunk in plan_chunks(walk_local(root_fd, source, walk, on_directory=beat), first_page=True):
                    remote = listing.among([prefix.key + local.relative for local in chunk])
                    items = [(local, prefix.key + local.relative) for local in chunk
                             if self._admitted(local, None, prefix, options, summary)
                             and budget.takes(local, remote.get(prefix.key + local.relative), summary)]
                    yield self._plan_upload(prefix.bucket, items, remote, store, strategy, summary, options, tracker)
                # What the walk held back, decided (the second walk it may take beats as the first did).
                for held in plan_chunks(walk.decided(source, on_directory=beat)):
                    files = [entry for entry in held if not isinstance(entry, Skipped)]
                    summary.skip(*(entry for entry in held if isinstance(entry, Skipped)))
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
            for chunk in plan_chunks(files):
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
            raise UsageError(f"{source} holds {human_size(total)} to upload (apparent sizes: a sparse file counts "
                             f"whole, as S3 stores it){earlier}, more than {what} allows ({human_size(limit)}); "
                             f"nothing was uploaded. The largest: {shown}. Raise {what}, or exclude what need not "
                             f"be kept{fix}")

    def upload_file(self, source: Path, url: S3Url, options: TransferOptions) -> TransferSummary:
        summary = TransferSummary(str(source), str(url), dry_run=options.dry_run)
        started = time.monotonic()
        local = local_file(source.name, source, os.stat(source))
        head = self._head(url)
        remote = {}
        if head is not None:
            remote[url.key] = RemoteObject(url.key, source.name, int(head["ContentLength"]),
                                           clean_etag(head.get("ETag")))
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
            beat_of(options)  # deciding a large file hashes it: a file decided is progress
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
            batch.append(UploadItem(local, bucket, key, options.activity,
                                    untrusted=options.untrusted_source is not None))
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
        after = before.now(st)
        if stat_identity(after) != stat_identity(before):
            store.forget(before.relative)
            return ItemFailed("changed while uploading; the next run uploads it again")
        if landed is not None and landed.etag:
            store.record(after, etag=landed.etag, keep=store.same_stat(after))
        return None
