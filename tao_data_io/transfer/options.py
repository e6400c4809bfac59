"""What one transfer call asks for (:class:`TransferOptions`), and how much of it is planned at once.

Why a module of its own: the download and upload halves of the engine (:mod:`.download`,
:mod:`.upload`) both take these options and both plan in the same chunks, and the engine that
composes them (:mod:`.engine`) imports them both — so what they share sits below all three. The
chunk sizes are read when a plan starts (:func:`plan_chunks`), so a test (or a bench) may set
them on this module.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

from .activity import Activity
from .filters import GlobFilter, PathFilter
from .shard import Shard
from ..reporting import ProgressCallback

#: Objects planned (listed, looked up locally, decided) before their transfers run: what a
#: download holds in memory at once, whatever the listing's length — 1.28 M objects are 256
#: chunks. Large enough that the transfers' tail at the end of a chunk (the executor's workers
#: waiting for its last few objects) is a small share of it.
PLAN_CHUNK = 5000
#: The first chunk is one listing page: the first transfers start once the first page is in,
#: not five pages later.
FIRST_CHUNK = 1000
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


def beat_of(options: TransferOptions) -> None:
    """A beat of ``options``' activity, if it has one."""
    if options.activity is not None:
        options.activity.beat()


def chunks(items: Iterable[T], size: int, first: int | None = None) -> Iterator[list[T]]:
    """``items`` in lists of at most ``size`` (the first of at most ``first``), read as each is
    needed (no list is empty)."""
    iterator = iter(items)
    length = size if first is None else min(first, size)
    while chunk := list(itertools.islice(iterator, length)):
        yield chunk
        length = size


def plan_chunks(items: Iterable[T], *, first_page: bool = False) -> Iterator[list[T]]:
    """``items`` :data:`PLAN_CHUNK` at a time — the first :data:`FIRST_CHUNK` with ``first_page``
    (a stream whose first transfers should start once the first page is in). Both sizes are read
    now, not when this module was imported."""
    return chunks(items, PLAN_CHUNK, FIRST_CHUNK if first_page else None)
