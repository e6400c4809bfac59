"""The local side of a transfer: a walk of the tree that applies the symlink policy once, for
every caller, streamed (one directory's names in memory at a time, in the order S3 lists keys):

* the walk opens each directory from its parent's descriptor with ``O_NOFOLLOW``, so a directory
  swapped for a symlink while the scan runs is never entered (and one that vanishes or cannot be
  read is reported, not fatal);
* a symlink to a regular file the walk itself found inside the root is treated as that file —
  decided by (device, inode), not by resolving names that could change meanwhile;
* a symlink that leaves the root, dangles, or points at a directory is skipped and reported
  (never followed, so a tree cannot smuggle ``/etc`` into an upload or loop forever);
* sockets, FIFOs and devices are skipped and reported (reading a FIFO would hang);
* a regular file with more hard links than the walk found inside the root is also reachable from
  outside it (a link made to someone else's file): the scan names it, and uploads skip it;
* reserved names (``.tao-data-io/``, ``.tao-data-io-partial.*``) are never part of a transfer; the
  walk lists them so uploads report them, and :func:`temp_leftovers` finds a download's killed
  temp files.

The symlinks and multi-link files can be decided only once the whole tree has been seen. A
dataset assembled with ``ln -s`` holds a million of them; held in lists they took ~400 bytes
each until the walk's end (~500 MB at 1.28 M). :class:`LocalWalk` keeps them in a private
temporary SQLite file instead (SQLite's empty name: deleted when closed), written
:data:`ROWS_A_STATEMENT` rows a statement, and reads them back a row at a time once the walk is
over: memory holds SQLite's page cache, not the entries.
"""

from __future__ import annotations

import os
import sqlite3
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from ..fs.confinement import STATE_DIR_NAME
from ..fs.temp import is_temp_name
from .summary import Skipped


@dataclass(frozen=True)
class LocalFile:
    relative: str
    #: The regular file itself is ``root / name`` (:attr:`path`): for a symlink inside the tree,
    #: its resolved target. Joined when first asked for: a resync of unchanged files never opens
    #: one, and a walk that joined each file's path spent ~20 ms on 10,000 of them.
    root: Path
    name: str
    size: int
    mtime_ns: int
    ctime_ns: int
    ino: int
    dev: int = 0
    #: For a symlink, its target relative to the root (filters must admit both names).
    target_relative: str | None = None
    nlink: int = 1

    @cached_property
    def path(self) -> Path:
        return self.root / self.name

    @classmethod
    def of(cls, relative: str, root: Path, name: str, st: os.stat_result,
           target_relative: str | None = None) -> LocalFile:
        """The file ``root / name``, known in the tree as ``relative``, as ``st`` found it."""
        return cls(relative, root, name, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev,
                   target_relative, st.st_nlink)

    def now(self, st: os.stat_result) -> LocalFile:
        """This file as ``st`` finds it now: the same names, the stat's numbers."""
        return LocalFile.of(self.relative, self.root, self.name, st, self.target_relative)

    @property
    def identity(self) -> tuple[int, int]:
        """(device, inode): what a later open must find under the scanned name
        (:func:`~tao_data_io.fs.reading.open_scanned`)."""
        return self.dev, self.ino


def local_file(relative: str, path: Path, st: os.stat_result, target_relative: str | None = None) -> LocalFile:
    return LocalFile.of(relative, path.parent, path.name, st, target_relative)


_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def temp_leftovers(root: Path) -> list[str]:
    """Relative paths of the temp files (in-flight or killed downloads) below ``root``: a walk
    through descriptors opened with ``O_NOFOLLOW`` that reads directory entries only — no stat of
    any file, nothing kept of them — for a download that looks each file up as it plans it. One
    descriptor per level is open at a time (a directory's subdirectories are opened one by one)."""
    found: list[str] = []
    try:
        fd = os.open(root, _DIRECTORY)
    except (FileNotFoundError, NotADirectoryError):
        return found
    try:
        _temps_below(fd, "", 0, found)
    finally:
        os.close(fd)
    return found


def _temps_below(dir_fd: int, prefix: str, depth: int, found: list[str]) -> None:
    subdirectories = []
    try:
        with os.scandir(dir_fd) as entries:
            for entry in entries:
                if entry.name == STATE_DIR_NAME:
                    continue
                if is_temp_name(entry.name):
                    if entry.is_file(follow_symlinks=False):
                        found.append(prefix + entry.name)
                elif entry.is_dir(follow_symlinks=False) and depth + 1 < MAX_SCAN_DEPTH:
                    subdirectories.append(entry.name)
    except OSError:
        return  # unreadable: nothing of ours can be in it
    for name in subdirectories:
        try:
            child = os.open(name, _DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
        except OSError:
            continue  # gone, replaced by a link, unreadable: nothing of ours to find there
        try:
            _temps_below(child, prefix + name + "/", depth + 1, found)
        finally:
            os.close(child)


#: Why a name the scan found is not uploaded: it is one tao-data-io keeps for itself (the state
#: directory, a temp name).
RESERVED_REASON = "a name tao-data-io reserves for its own state and in-flight files; not uploaded"


#: The deepest a scanned tree is walked: each level holds one descriptor and one frame, so a
#: tree a job nests 1,100 levels deep would end the scan (RecursionError, EMFILE) — and with it
#: every upload of its results. Deeper directories are left out, each named with the reason.
MAX_SCAN_DEPTH = 128


def walk_local(root_fd: int, root: Path, walk: LocalWalk, *,
               on_directory: Callable[[], None] | None = None) -> Iterator[LocalFile]:
    """The regular files with one link below the open directory ``root_fd``, in the order S3
    lists their keys (each directory's entries by name, a directory as its name and ``/``), one
    directory's names in memory at a time; what needs the whole tree to decide (a symlink, a file
    with several links) goes to ``walk`` (:meth:`LocalWalk.decided`, once the walk is over)."""
    stack: list[tuple[int, str, int, Iterator[str]]] = []

    def enter(dir_fd: int, prefix: str, depth: int) -> None:
        # Names only, a directory's with its "/" (its place in S3's order): half the memory of the
        # DirEntry objects in a flat directory of a million files (~75 bytes a name, not ~150).
        with os.scandir(dir_fd) as entries:
            children = sorted(entry.name + "/" if entry.is_dir(follow_symlinks=False) else entry.name
                              for entry in entries)
        if on_directory is not None:
            on_directory()
        stack.append((dir_fd, prefix, depth, iter(children)))

    enter(os.dup(root_fd), "", 0)
    try:
        while stack:
            dir_fd, prefix, depth, children = stack[-1]
            name = next(children, None)
            if name is None:
                os.close(dir_fd)
                stack.pop()
                continue
            name = name.removesuffix("/")  # what it is now is what its lstat says
            relative = prefix + name
            if name == STATE_DIR_NAME or is_temp_name(name):
                walk.skip(Skipped(relative, RESERVED_REASON))
                continue
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed while we looked
            if stat.S_ISDIR(st.st_mode):
                if depth + 1 >= MAX_SCAN_DEPTH:
                    walk.skip(Skipped(relative, f"directory more than {MAX_SCAN_DEPTH} levels deep; left out"))
                    continue
                try:
                    child = os.open(name, _DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    walk.skip(Skipped(relative, f"directory cannot be read ({exc.strerror}); left out"))
                    continue
                try:
                    enter(child, relative + "/", depth + 1)
                except OSError as exc:
                    os.close(child)
                    walk.skip(Skipped(relative, f"directory cannot be read ({exc.strerror}); left out"))
            elif stat.S_ISREG(st.st_mode):
                local = LocalFile.of(relative, root, relative, st)
                if st.st_nlink > 1:
                    walk.hold_linked(local)
                else:
                    yield local
            elif stat.S_ISLNK(st.st_mode):
                try:
                    link = os.readlink(name, dir_fd=dir_fd)
                except OSError:
                    continue  # replaced while we looked
                try:
                    target: os.stat_result | OSError = os.stat(name, dir_fd=dir_fd)
                except OSError as exc:
                    target = exc
                walk.hold_link(relative, target, link)
            else:
                walk.skip(Skipped(relative, "special file (socket, FIFO or device); refused"))
    finally:
        for dir_fd, *_ in stack:
            os.close(dir_fd)


#: Rows one INSERT writes: ``links`` has 12 columns, 996 variables, within the 999 a statement
#: may bind in SQLite before 3.32. One statement of many rows, not ``executemany`` (which releases
#: the GIL around every row: a convoy beside the transfer loop's thread).
ROWS_A_STATEMENT = 83
#: Files a second-walk lookup asks about at once (two variables each; three each found).
_LOOKUP = 300
_SIGN = 1 << 63


def _signed(number: int) -> int:
    """``st_dev`` and ``st_ino`` are unsigned 64-bit (an overlayfs inode with its xino bits can
    pass 2**63); SQLite's integers are signed: stored shifted into its range, read back whole."""
    return number - 2 * _SIGN if number >= _SIGN else number


def _unsigned(number: int) -> int:
    return number + 2 * _SIGN if number < 0 else number


def _wanted_statement(files: int) -> str:
    """The held symlinks' targets among ``files`` (dev, ino) pairs, read through ``links_identity``:
    a row-value ``IN (VALUES …)`` is planned as a scan of ``links`` for every lookup, which made
    the second walk quadratic (N files and N symlinks to them: N²/:data:`_LOOKUP` row reads)."""
    return ("SELECT k.dev, k.ino FROM (VALUES " + ",".join(["(?, ?)"] * files) + ") v CROSS JOIN links k "
            "ON k.dev = v.column1 AND k.ino = v.column2 WHERE k.regular")


_SCHEMA = """
CREATE TABLE linked (seq INTEGER PRIMARY KEY, relative TEXT, dev INTEGER, ino INTEGER, size INTEGER,
                     mtime_ns INTEGER, ctime_ns INTEGER, nlink INTEGER);
CREATE INDEX linked_identity ON linked (dev, ino, seq);
CREATE TABLE links (seq INTEGER PRIMARY KEY, relative TEXT, link TEXT, missing INTEGER, error TEXT,
                    regular INTEGER, dev INTEGER, ino INTEGER, size INTEGER, mtime_ns INTEGER,
                    ctime_ns INTEGER, nlink INTEGER);
CREATE INDEX links_identity ON links (dev, ino);
CREATE TABLE found (dev INTEGER, ino INTEGER, relative TEXT, outside TEXT, PRIMARY KEY (dev, ino)) WITHOUT ROWID;
"""


class LocalWalk:
    """What a walk (:func:`walk_local`) reports besides the files it yields: what it skipped
    (handed on, :attr:`skip`), and the entries held back until it has seen the whole tree, on disk
    (:meth:`hold_linked`, :meth:`hold_link`; decided by :meth:`decided`). The file is made at the
    first held entry: most trees have none. ``holds=False``: a walk that only looks for files
    with one link (the second walk), dropping what it would hold. Close it (or use ``with``)."""

    def __init__(self, *, holds: bool = True, skip: Callable[..., None] | None = None) -> None:
        #: Where what the walk skips goes as it meets it (a summary's :meth:`~.summary.TransferSummary.skip`,
        #: which keeps the first names and counts the rest): a tree of a million FIFOs or leftover
        #: temp files held here would grow with the tree. None: dropped (a walk that only sizes).
        self.skip: Callable[..., None] = skip or (lambda *skipped: None)
        self._holds = holds
        self._db: sqlite3.Connection | None = None
        self._linked: list[tuple[object, ...]] = []
        self._links: list[tuple[object, ...]] = []
        self._seq = 0

    def __enter__(self) -> LocalWalk:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def hold_linked(self, local: LocalFile) -> None:
        """A regular file with more than one link, met under the name ``local.relative``."""
        if not self._holds:
            return
        self._seq += 1
        self._linked.append((self._seq, local.relative, _signed(local.dev), _signed(local.ino), local.size,
                             local.mtime_ns, local.ctime_ns, local.nlink))
        if len(self._linked) >= ROWS_A_STATEMENT:
            self._flush()

    def hold_link(self, relative: str, target: os.stat_result | OSError, link: str) -> None:
        """A symlink at ``relative`` reading ``link``: what it points at, or why it points at nothing."""
        if not self._holds:
            return
        self._seq += 1
        if isinstance(target, OSError):
            row: tuple[object, ...] = (self._seq, relative, link, int(isinstance(target, FileNotFoundError)),
                                       target.strerror or type(target).__name__, 0, None, None, None, None, None, None)
        else:
            row = (self._seq, relative, link, 0, None, int(stat.S_ISREG(target.st_mode)), _signed(target.st_dev),
                   _signed(target.st_ino), target.st_size, target.st_mtime_ns, target.st_ctime_ns, target.st_nlink)
        self._links.append(row)
        if len(self._links) >= ROWS_A_STATEMENT:
            self._flush()

    def _flush(self) -> None:
        if self._db is None:
            self._db = sqlite3.connect("")
            self._db.executescript(_SCHEMA)
        for table, rows, width in (("linked", self._linked, 8), ("links", self._links, 12)):
            if rows:
                marks = "(" + ",".join("?" * width) + ")"
                self._db.execute(f"INSERT INTO {table} VALUES " + ",".join([marks] * len(rows)),
                                 [value for row in rows for value in row])
                rows.clear()

    def decided(self, root: Path, *, on_directory: Callable[[], None] | None = None,
                ) -> Iterator[tuple[LocalFile, str | None] | Skipped]:
        """Each held-back entry, decided now that the walk is over: a file to upload with why it
        must not be (it is also reachable from outside the tree) or None, or what was skipped.
        A symlink's target is looked for among the multi-link files first, and otherwise by a
        second walk for just the inodes still wanted (``on_directory``: called at each directory it
        enters, as by the first walk — an upload's lease is renewed on it)."""
        if self._db is None and not self._linked and not self._links:
            return
        self._flush()
        db = self._db
        assert db is not None
        # Counting names against st_nlink holds only if no name moved while the tree was walked:
        # a name met, then renamed into a directory not yet walked, is met twice. A rename, a new
        # link or a write changes the inode's ctime (and a link its count), so names of one inode
        # met with different ones are refused: which of them are in the tree cannot be told.
        db.execute("INSERT INTO found SELECT dev, ino, (SELECT relative FROM linked first WHERE first.dev = l.dev "
                   "AND first.ino = l.ino ORDER BY seq LIMIT 1), CASE WHEN MIN(ctime_ns) != MAX(ctime_ns) OR "
                   "MIN(nlink) != MAX(nlink) THEN 'a hard link that changed while the tree was walked (renamed, "
                   "linked or written): which of its names are in this tree cannot be told' "
                   "WHEN MAX(nlink) > COUNT(*) THEN "
                   "'a hard link to a file with ' || MAX(nlink) || ' links, only ' || COUNT(*) || ' of them in "
                   "this tree: it is also reachable from outside it' END FROM linked l GROUP BY dev, ino")
        for relative, dev, ino, size, mtime_ns, ctime_ns, nlink, outside in db.execute(
                "SELECT l.relative, l.dev, l.ino, size, mtime_ns, ctime_ns, nlink, f.outside FROM linked l "
                "JOIN found f ON f.dev = l.dev AND f.ino = l.ino ORDER BY seq"):
            yield (LocalFile(relative, root, relative, size, mtime_ns, ctime_ns, _unsigned(ino), _unsigned(dev),
                             None, nlink), outside)
        if db.execute("SELECT 1 FROM links k WHERE regular AND NOT EXISTS (SELECT 1 FROM found f WHERE f.dev = k.dev "
                      "AND f.ino = k.ino) LIMIT 1").fetchone():
            self._find_targets(root, on_directory)
        for (relative, link, missing, error, regular, dev, ino, size, mtime_ns, ctime_ns, nlink, name,
             outside) in db.execute("SELECT k.relative, link, missing, error, regular, k.dev, k.ino, size, mtime_ns, "
                                    "ctime_ns, nlink, f.relative, f.outside FROM links k LEFT JOIN found f ON "
                                    "f.dev = k.dev AND f.ino = k.ino ORDER BY seq"):
            if missing:
                yield Skipped(relative, "symlink is dangling; not followed")
            elif error is not None:
                yield Skipped(relative, f"symlink cannot be followed ({error}); not followed")
            elif not regular:
                yield Skipped(relative, "symlink to a directory or special file; not followed")
            elif name is None:
                yield Skipped(relative, f"symlink points outside the tree ({link}); not followed")
            else:
                yield (LocalFile(relative, root, name, size, mtime_ns, ctime_ns, _unsigned(ino), _unsigned(dev),
                                 name, nlink), outside)

    def _find_targets(self, root: Path, on_directory: Callable[[], None] | None) -> None:
        """A second walk, made only for symlinks to files the first found no second link of: the
        first name the walk's policy finds for each target wanted, into ``found``."""
        assert self._db is not None
        try:
            fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return
        try:
            files = walk_local(fd, root, LocalWalk(holds=False), on_directory=on_directory)
            while chunk := [local for _, local in zip(range(_LOOKUP), files)]:
                identities = [value for local in chunk for value in (_signed(local.dev), _signed(local.ino))]
                wanted = set(self._db.execute(_wanted_statement(len(chunk)), identities))
                met = [(dev, ino, local.relative) for local in chunk
                       if (dev := _signed(local.dev), ino := _signed(local.ino)) in wanted]
                if met:  # the first name met is the one kept (the walk's order, as for a multi-link file)
                    self._db.execute("INSERT OR IGNORE INTO found VALUES " + ",".join(["(?, ?, ?, NULL)"] * len(met)),
                                     [value for row in met for value in row])
        finally:
            os.close(fd)

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
        self._linked.clear()
        self._links.clear()
