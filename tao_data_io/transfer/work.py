"""The unit of work handed to an executor, and the executor contract.

Planning (what to move) and strategy (is it already right) happen in Python; an executor only
moves bytes. Keeping the contract this small is what lets the bulk data path be swapped (s5cmd,
obstore, boto3) after measuring, without touching planning, confinement or bookkeeping.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..fs.tree import DestinationTree, TempFile
from .activity import Activity
from .local_walk import LocalFile


@dataclass(frozen=True)
class DownloadItem:
    bucket: str
    key: str
    size: int
    #: The ETag the plan saw; the executor proves the bytes it delivers are that version (or, when
    #: empty, reports the ETag of the one version it read).
    etag: str
    #: Where the file goes in ``tree``. The executor writes a temp file beside it through the
    #: tree (never by path); the engine publishes it once checked.
    relative: str
    tree: DestinationTree
    #: The listing's LastModified: the file's mtime when the executor does not report the object's.
    modified: str | None = None

    @property
    def final(self) -> Path:
        return self.tree.root / self.relative


@dataclass(frozen=True)
class UploadItem:
    #: The file as the scan saw it: the executor uploads only that very file (its (st_dev, st_ino)),
    #: so a file swapped for a symlink (or anything else) after the scan is refused, not followed;
    #: and the engine compares it with the file after the upload (a change meanwhile fails it).
    scanned: LocalFile
    bucket: str
    key: str
    #: Told of each chunk the executor reads and sends, or of the file when obstore reads it whole
    #: (the upload lock's renewal depends on it).
    activity: Activity | None = None
    #: The file is in a tree a job controls (its results): it is read to its scanned size and no
    #: further, whatever the job does to it once scanned (grow it to a terabyte, sparse).
    untrusted: bool = False

    @property
    def source(self) -> Path:
        return self.scanned.path

    @property
    def size(self) -> int:
        return self.scanned.size

    @property
    def relative(self) -> str:
        return self.scanned.relative

    @property
    def identity(self) -> tuple[int, int]:
        return self.scanned.identity


@dataclass(frozen=True)
class Landed:
    """What the server said about the bytes that moved (any field may be unknown)."""

    etag: str | None = None
    size: int | None = None
    #: The object's LastModified, nanoseconds since the epoch.
    modified_ns: int | None = None
    #: Bytes the executor wrote to the temp file (downloads), when it counted them.
    written: int | None = None
    #: Downloads: the file written, not yet under its final name.
    temp: TempFile | None = None


@dataclass(frozen=True)
class ItemFailed:
    """Why one item did not complete. ``missing`` is set by the executor when the object does not
    exist (404): selective staging treats a missing reference differently from a failed transfer,
    and that must not depend on how a message happens to be worded."""

    reason: str
    missing: bool = False
    #: The object was overwritten while it was read (its ETag is no longer the planned one): the
    #: bytes were discarded, and reading it again can succeed.
    changed: bool = False


Item = DownloadItem | UploadItem
#: Called once per item, from any thread, with None on success or why it failed, and what the
#: server reported about the object when the executor knows it.
ItemDone = Callable[[Item, "ItemFailed | None", "Landed | None"], None]


class Executor(Protocol):
    """Moves bytes for batches of items with bounded concurrency, reporting each outcome."""

    def run(self, batches: Iterable[Sequence[Item]], on_done: ItemDone) -> None:
        """Move the items of each batch ``batches`` yields, and return once all are reported.
        The batches are read on the calling thread as the executor has room for them: the engine
        plans the next while this one moves, so a long listing never waits on a planning gap."""

    def close(self) -> None:
        """Release threads, loops and connections; called once by the engine's owner."""
