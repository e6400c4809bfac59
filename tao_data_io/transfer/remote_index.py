"""The index an upload plans against: its destination's listing, held by key in a private
temporary SQLite file, listed a folder at a time, several at once, where that pays.

Why by folder: S3 serves a listing's pages one after another (each page names where the next
begins), so a flat listing of 10,000 keys is ten round trips in a row and one of 1.28 M keys is
1,280, and an upload waited for all of them before it decided its first file. The index asks for
the flat listing's first page as before; a prefix that holds no more is done in that one request.
Where there is more, and that page's keys lie in few folders (at most :data:`LISTINGS`: folders of
~250 keys or more, ImageNet's 1,280), the prefix's folders are named by a listing with the
delimiter ``/`` (a chain of lone folders, ``results/run-7/…``, is followed down to the first level
that has several) and each folder is listed flat, :data:`LISTINGS` at once, in the order they
were named, which is the walk's: a chunk of the walk waits only for the folders its keys lie in.
Otherwise the flat listing goes on from its second page: a request a folder would cost more
round trips than a page a 1,000 keys.

The index holds exactly what one flat listing of the prefix holds: a key below the level either
has no ``/`` after it (listed with the level) or lies in exactly one folder, the common prefix
the level's listing names for it. That holds on any store that answers ``delimiter`` as S3 does.
A level whose listing names no folder (a store that ignores the delimiter), a folder that is not
a key's first folder, or more than :data:`MOST_FOLDERS`, is not split: the flat listing goes on.
The index is a set looked up by key, not merged with the walk in key order: S3 lists in UTF-8
binary order, but S3-compatible stores need not (SeaweedFS lists a prefix directory by
directory), and a merge that met a key out of order would upload it again.

A folder's listing that fails is raised where the walk needs it (or by :meth:`RemoteIndex.total_bytes`):
files of the chunks before it may have been sent, and the rerun the error asks for skips them.
One no file of the upload lies in is never waited for: nothing the upload decides depends on it.

Memory holds SQLite's page cache, a page of each listing, and the folders' names: not the
listing.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from .listing import RemoteObject, remote_objects
from .keys import unsendable_name
from .options import chunks
from ..uris import S3Url

#: Folders listed at once (one of them names the folders first). At +20 ms a request, 4 and 8 took
#: the same time to resync an upload of 10,000 files (``bench/scale.py --latency 20``); with the
#: server on the same two cores, 8 spent a third more CPU on the listing than 4. Also the most
#: folders the first page's keys may lie in for the prefix to be listed by folder.
LISTINGS = 4
#: The most folders one level is split into: each is a request of its own.
MOST_FOLDERS = 1000
#: How far down a chain of lone folders is followed to find the level to split.
MOST_LEVELS = 4

#: Rows of the index inserted by one statement: 5 columns, 995 variables, within the 999 a
#: statement may bind in SQLite before 3.32 (Ubuntu 20.04 has 3.31, RHEL 8 3.26).
_ROWS_A_STATEMENT = 199

#: The ListObjectsV2 pages of a key prefix, grouped at the delimiter when one is given.
Pages = Callable[[str, "str | None"], Iterable[Mapping[str, Any]]]


def folder_of(key: str, level: str) -> str | None:
    """The folder directly below ``level`` that ``key`` lies in (what a listing of ``level``
    with the delimiter ``/`` names as its common prefix), or None for a key with no ``/`` after
    ``level`` or not below it."""
    if not key.startswith(level):
        return None
    cut = key.find("/", len(level))
    return None if cut < 0 else key[:cut + 1]


def folders_of(keys: Iterable[str], level: str) -> set[str]:
    """The folders directly below ``level`` that ``keys`` lie in."""
    return {folder for key in keys if (folder := folder_of(key, level)) is not None}


class RemoteIndex:
    """The objects listed under ``prefix`` (in folder form), by key, filled from the moment it is
    made by threads of its own: while the first chunk is walked, or
    (:meth:`~tao_data_io.transfer.objects.ControlPlane.list_into_index`) while a command still
    loads what it needs to decide the upload."""

    def __init__(self, prefix: S3Url, pages: Pages) -> None:
        self.prefix = prefix
        self._pages = pages
        self._db = sqlite3.connect("", check_same_thread=False)
        self._db.execute("CREATE TABLE remote (key TEXT PRIMARY KEY, relative TEXT, size INTEGER, etag TEXT, "
                         "modified TEXT) WITHOUT ROWID")
        self._writing = threading.Lock()  # one connection: a transaction is begun by one thread at a time
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=LISTINGS, thread_name_prefix="listing")
        #: The level whose folders are listed apart, and their listings (set by the first listing).
        self._level = prefix.key
        self._folders: dict[str, Future[None]] = {}
        self._first = self._pool.submit(self._list)

    def _list(self) -> None:
        """The flat listing's first page; then the folders apart (:meth:`_split`) where that pays,
        else the flat listing on from its second page."""
        pages = iter(self._pages(self.prefix.key, None))
        first = next(pages, None)
        if first is None:
            return
        self._fill([first])
        if first.get("IsTruncated") and not self._stop.is_set():
            keys = [item["Key"] for item in first.get("Contents", ())]
            # The page's keys lie in as many folders or more at any level further down: judged here, unasked.
            split = self._split(keys) if 0 < len(folders_of(keys, self.prefix.key)) <= LISTINGS else None
            if split is not None:
                close = getattr(pages, "close", None)  # a generator: its connection goes now, not at collection
                if close is not None:
                    close()
                self._level, self._folders = split
                return
        self._fill(pages)

    def _split(self, keys: list[str]) -> tuple[str, dict[str, Future[None]]] | None:
        """The level to split and its folders' listings, begun; None where it does not pay (the
        first page's ``keys`` lie in more than :data:`LISTINGS` of its folders) or cannot be done."""
        level, depth = self.prefix.key, 1
        while (folders := self._folders_at(level)) is not None and len(folders) == 1 and depth < MOST_LEVELS:
            level, depth = folders[0], depth + 1
        if not folders or self._stop.is_set() or len(folders_of(keys, level)) > LISTINGS:
            return None
        return level, {folder: self._pool.submit(self._fill, self._pages(folder, None)) for folder in folders}

    def _folders_at(self, level: str) -> list[str] | None:
        """Index the objects directly at ``level`` and return its folders; None where they cannot
        be listed apart (see the module's docstring)."""
        folders: list[str] = []
        for page in self._pages(level, "/"):
            if self._stop.is_set():
                return None
            self._fill([page])
            for common in page.get("CommonPrefixes", ()):
                folder = common.get("Prefix")
                if not isinstance(folder, str) or folder_of(folder, level) != folder or len(folders) == MOST_FOLDERS:
                    return None
                folders.append(folder)
        return folders

    def _fill(self, pages: Iterable[Mapping[str, Any]]) -> None:
        for page in pages:
            if self._stop.is_set():  # the upload ended (failed, interrupted): list no further
                return
            # A statement of many rows, not executemany: sqlite3 releases the GIL around every
            # step, and a thread taking it back from a busy one waits up to the switch interval
            # (5 ms). 2,000 rows inserted beside a CPU-bound thread took 0.03-0.9 s that way, run
            # to run, and 40-60 ms so; a 2,000-key listing beside one, ~2 s before and 0.2-0.26 s after.
            for chunk in chunks(remote_objects([page], self.prefix.key), _ROWS_A_STATEMENT):
                with self._writing:
                    self._db.execute("INSERT OR REPLACE INTO remote VALUES "
                                     + ",".join(("(?, ?, ?, ?, ?)",) * len(chunk)),
                                     [value for obj in chunk
                                      for value in (obj.key, obj.relative, obj.size, obj.etag, obj.last_modified)])

    def _listed(self, keys: Iterable[str] | None = None) -> None:
        """Wait until the folders ``keys`` lie in (None: every folder) are listed; raise what
        their listings raised. The first level is waited for always: it names the folders."""
        self._first.result()
        if keys is None:
            needed: Iterable[str] = self._folders
        else:
            needed = sorted(folders_of(keys, self._level) & self._folders.keys())
        for folder in needed:
            self._folders[folder].result()

    def total_bytes(self) -> int:
        """What every listed object takes (once the listing is in: its errors are raised here)."""
        self._listed()
        return int(self._db.execute("SELECT COALESCE(SUM(size), 0) FROM remote").fetchone()[0])

    def among(self, keys: Sequence[str]) -> dict[str, RemoteObject]:
        """The listed objects among ``keys``, once the folders they lie in are listed (errors of
        those listings are raised here). Only keys a file may be uploaded to are looked up
        (:func:`~.keys.unsendable_name`: such a file is skipped, never sent)."""
        keys = [key for key in keys if unsendable_name(key) is None]
        self._listed(keys)
        found: dict[str, RemoteObject] = {}
        for start in range(0, len(keys), 500):
            part = keys[start:start + 500]
            with self._writing:
                rows = self._db.execute(f"SELECT key, relative, size, etag, modified FROM remote WHERE key IN "
                                        f"({','.join('?' * len(part))})", part).fetchall()
            found.update((row[0], RemoteObject(*row)) for row in rows)
        return found

    def close(self) -> None:
        """Stop listing (each listing once its page in flight is in) and drop the index."""
        self._stop.set()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._db.close()
