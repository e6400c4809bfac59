"""The index an upload plans against: its destination's listing, held by key in a private
temporary SQLite file, listed a folder at a time, several at once.

Why by folder: S3 serves a listing's pages one after another (each page names where the next
begins), so a flat listing of 10,000 keys is ten round trips in a row and one of 1.28 M keys is
1,280, and an upload waited for all of them before it decided its first file. Listed with the
delimiter ``/``, the prefix's first level names its folders in one request (ImageNet's
``train/n01440764/`` and its 999 siblings); each folder is then listed flat, :data:`LISTINGS` at
once, in the order they were named, which is the walk's order, and a chunk of the walk waits only
for the folders its keys are in. A chain of lone folders (``results/run-7/…``) is followed down
to the first level that has several.

The index holds exactly what one flat listing of the prefix holds: a key below the level either
has no ``/`` after it (listed with the level) or lies in exactly one folder, the common prefix
the level's listing names for it. That holds on any store that answers ``delimiter`` as S3 does.
A store that ignores it lists every key with the level (no folders: one listing, as before); a
level that names a folder that is not a key's first folder, or more than :data:`MOST_FOLDERS`,
is listed flat. The index is a set looked up by key, not merged with the walk in key order: S3
lists in UTF-8 binary order, but S3-compatible stores need not (SeaweedFS lists a prefix
directory by directory), and a merge that met a key out of order would upload it again.

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

#: Folders listed at once. At +20 ms a request, 4 and 8 took the same time to resync an upload of
#: 10,000 files (``bench/scale.py --latency 20``); with the server on the same two cores, 8 spent
#: a third more CPU on the listing than 4.
LISTINGS = 4
#: The most folders one level is split into. A tree of many small folders is listed flat: a
#: request a folder would cost more round trips than the flat listing's one per 1,000 keys.
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
        self._first = self._pool.submit(self._list_levels)

    def _list_levels(self) -> None:
        """List the prefix's levels down to the one to split, then submit each of its folders."""
        level, depth = self.prefix.key, 1
        while (folders := self._list_level(level)) is not None and len(folders) == 1 and depth < MOST_LEVELS:
            level, depth = folders[0], depth + 1
        if folders and not self._stop.is_set():
            self._level = level
            self._folders = {folder: self._pool.submit(self._fill, self._pages(folder, None)) for folder in folders}

    def _list_level(self, level: str) -> list[str] | None:
        """Index the objects directly at ``level`` and return its folders, or index all of it and
        return None where its folders cannot be listed apart (see the module's docstring)."""
        folders: list[str] = []
        for page in self._pages(level, "/"):
            if self._stop.is_set():
                return None
            self._insert(remote_objects([page], self.prefix.key))
            for common in page.get("CommonPrefixes", ()):
                folder = common.get("Prefix")
                if not isinstance(folder, str) or folder_of(folder, level) != folder or len(folders) == MOST_FOLDERS:
                    self._fill(self._pages(level, None))
                    return None
                folders.append(folder)
        return folders

    def _fill(self, pages: Iterable[Mapping[str, Any]]) -> None:
        self._insert(remote_objects(pages, self.prefix.key))

    def _insert(self, objects: Iterable[RemoteObject]) -> None:
        # A statement of many rows, not executemany: sqlite3 releases the GIL around every step,
        # and a thread taking it back from a busy one waits up to the switch interval (5 ms).
        # 2,000 rows inserted beside a CPU-bound thread took 0.03-0.9 s that way, run to run, and
        # 40-60 ms so; a 2,000-key listing beside one, ~2 s before and 0.2-0.26 s after.
        for chunk in chunks(objects, _ROWS_A_STATEMENT):
            if self._stop.is_set():  # the upload ended (failed, interrupted): list no further
                return
            with self._writing:
                self._db.execute("INSERT OR REPLACE INTO remote VALUES " + ",".join(("(?, ?, ?, ?, ?)",) * len(chunk)),
                                 [value for obj in chunk
                                  for value in (obj.key, obj.relative, obj.size, obj.etag, obj.last_modified)])

    def _listed(self, keys: Iterable[str] | None = None) -> None:
        """Wait until the folders ``keys`` lie in (None: every folder) are listed; raise what
        their listings raised. The first level is waited for always: it names the folders."""
        self._first.result()
        if keys is None:
            needed: Iterable[str] = self._folders
        else:
            needed = sorted({folder for key in keys if (folder := folder_of(key, self._level)) in self._folders})
        for folder in needed:
            self._folders[folder].result()

    def total_bytes(self) -> int:
        """What every listed object takes (once the listing is in: its errors are raised here)."""
        self._listed()
        return int(self._db.execute("SELECT COALESCE(SUM(size), 0) FROM remote").fetchone()[0])

    def among(self, keys: Sequence[str]) -> dict[str, RemoteObject]:
        """The listed objects among ``keys``, once the folders they lie in are listed (errors of
        those listings are raised here); a name that is not UTF-8 is no key S3 can list (such a
        file is skipped, never sent)."""
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
        """Stop listing (each listing at its next page) and drop the index."""
        self._stop.set()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._db.close()
