"""A destination tree: a directory written only through directory descriptors, and the temp
files and spools its writers use.

**Why.** Confinement checked when the plan is made (:mod:`.confinement`) says nothing about the
moment of the write; :class:`DestinationTree` is what makes the write itself confined. Every
download, extraction and model pull that writes into a destination goes through one.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UnsafePathError
from .confinement import OPEN_DIRECTORY, OPEN_DIRECTORY_NOFOLLOW
from .temp import UNLOCKED, temp_name, temp_tag
from .state import state_dir_for


#: Directory descriptors a :class:`DestinationTree` keeps open for reuse (an in-flight file's is
#: never closed under it): one open per directory, not one per file, for trees of any width.
KEPT_DIRECTORIES = 256


class DestinationTree:
    """A destination directory that is written only through directory descriptors.

    Why: confinement checked when the plan is made says nothing about the moment of the write. A
    directory inside the destination replaced by a symlink while the bytes move would send a
    path-based ``open`` or ``rename`` anywhere the link points. Here the root is opened once
    (following the user's own path), and each directory below it is opened from its parent's
    descriptor with ``O_NOFOLLOW`` — created with ``mkdir(dir_fd=)`` when missing — so a symlink
    met at write time fails that one file and is never followed. Temp files are created, renamed
    into place and removed relative to those descriptors (:class:`TempFile`); a child process
    that can only write to a path (s5cmd) writes into a private :meth:`spool` beside the tree,
    and each finished file is moved in the same way.

    Descriptors of recently used directories are kept, so 2,000 files in 20 directories cost 20
    opens. What a descriptor cannot do is stop someone from renaming the directory it refers to:
    a file being written then goes wherever that directory went (as with any ``openat`` walk);
    what never happens is a name resolved through a link.

    Thread-safe: the obstore executor writes from its event loop, s5cmd results arrive on another
    thread.
    """

    def __init__(self, root: Path, tag: str = UNLOCKED, state_dir: Path | None = None) -> None:
        self.root = Path(os.path.abspath(root))
        #: The :func:`~tao_data_io.fs.temp.lock_tag` of the lock held while writing here; it names every temp file.
        self.tag = tag
        self.state_dir = state_dir if state_dir is not None else state_dir_for(self.root)
        self._lock = threading.Lock()
        #: relative directory ("" is the root) → [descriptor, files in flight in it]
        self._open: OrderedDict[str, list[int]] = OrderedDict()
        self._spool_fits: bool | None = None
        self._closed = False

    # ------------------------------------------------------------------ lifetime
    def open(self) -> None:
        """Create the root if needed and open it. A run calls this before moving any bytes, so a
        destination that cannot be created fails the run with that path's error, not every file."""
        with self._lock:
            self._root_locked()

    def _root_locked(self) -> int:
        entry = self._open.get("")
        if entry is None:
            if self._closed:  # its run ended and its lock is released: nothing may write here now
                raise ValueError(f"the destination tree {self.root} was closed")
            os.makedirs(self.root, exist_ok=True)
            entry = self._open[""] = [os.open(self.root, OPEN_DIRECTORY), 1]  # pinned for the tree's life
        return entry[0]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for fd, _ in self._open.values():
                os.close(fd)
            self._open.clear()

    # ------------------------------------------------------------------ directories
    def _pin(self, directory: str, *, create: bool = True) -> int:
        """The descriptor of ``directory`` (relative; "" is the root), kept open until :meth:`_unpin`."""
        with self._lock:
            fd = self._pin_locked(directory, create)
            self._evict_locked()
            return fd

    def _pin_locked(self, directory: str, create: bool) -> int:
        entry = self._open.get(directory)
        if entry is None:
            if directory == "":
                self._root_locked()
                entry = self._open[""]
            else:
                parent, _, name = directory.rpartition("/")
                parent_fd = self._pin_locked(parent, create)
                try:
                    fd = self._open_child(parent_fd, name, directory, create)
                finally:
                    self._open[parent][1] -= 1
                entry = self._open[directory] = [fd, 0]
        entry[1] += 1
        self._open.move_to_end(directory)
        return entry[0]

    def _open_child(self, parent_fd: int, name: str, directory: str, create: bool) -> int:
        try:
            return os.open(name, OPEN_DIRECTORY_NOFOLLOW, dir_fd=parent_fd)
        except FileNotFoundError:
            if not create:
                raise
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            mode = os.stat(name, dir_fd=parent_fd, follow_symlinks=False).st_mode
            what = "is a symlink; it is never followed" if stat.S_ISLNK(mode) else "exists and is not a directory"
            raise UnsafePathError(f"{self.root / directory} {what}") from None
        try:
            os.mkdir(name, dir_fd=parent_fd)
        except FileExistsError:
            pass  # another writer made it meanwhile; open it as found
        return self._open_child(parent_fd, name, directory, create=False)

    def _unpin(self, directory: str) -> None:
        with self._lock:
            self._open[directory][1] -= 1
            self._evict_locked()

    def _evict_locked(self) -> None:
        if len(self._open) <= KEPT_DIRECTORIES:
            return
        for directory, (fd, users) in list(self._open.items()):
            if len(self._open) <= KEPT_DIRECTORIES:
                break
            if users == 0:
                os.close(fd)
                del self._open[directory]

    # ------------------------------------------------------------------ files
    def create_temp(self, relative: str) -> tuple[TempFile, int]:
        """A new temp file beside ``relative``'s final place and a descriptor open for writing it
        (the caller closes the descriptor, then publishes or discards the temp file). Raises
        :class:`UnsafePathError` when a directory on the way is a symlink or not a directory."""
        directory, _, name = relative.rpartition("/")
        dir_fd = self._pin(directory)
        temp = temp_name(name, self.tag)
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                         dir_fd=dir_fd)
        except BaseException:
            self._unpin(directory)
            raise
        return TempFile(self, relative, directory, dir_fd, temp), fd

    def adopt(self, source_dir_fd: int, source_name: str, relative: str) -> TempFile:
        """Move a finished file (one a child wrote into a :meth:`spool`) beside ``relative``'s
        final place under a temp name; publishing it is then the same as for any other."""
        directory, _, name = relative.rpartition("/")
        dir_fd = self._pin(directory)
        temp = temp_name(name, self.tag)
        try:
            os.rename(source_name, temp, src_dir_fd=source_dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            self._unpin(directory)
            raise
        return TempFile(self, relative, directory, dir_fd, temp)

    def remove_temps(self, relatives: Sequence[str]) -> None:
        """Remove the temp files among ``relatives`` (found by a scan) that belong to this tree's
        tag: killed writers under the lock the caller holds left them. Other tags' are left."""
        for relative in relatives:
            directory, _, name = relative.rpartition("/")
            if temp_tag(name) != self.tag:
                continue
            try:
                dir_fd = self._pin(directory, create=False)
            except (OSError, UnsafePathError):
                continue  # gone or replaced since the scan: nothing of ours to remove there
            try:
                os.unlink(name, dir_fd=dir_fd)
            except FileNotFoundError:
                pass
            finally:
                self._unpin(directory)

    @contextmanager
    def _existing(self, directory: str) -> Iterator[int | None]:
        """The descriptor of an existing ``directory`` of this tree, or None when it is gone or no
        longer a directory here (a symlink put in its place is never followed)."""
        try:
            fd = self._pin(directory, create=False)
        except (OSError, UnsafePathError):
            yield None
            return
        try:
            yield fd
        finally:
            self._unpin(directory)

    def existing_file(self, relative: str) -> os.stat_result | None:
        """The ``lstat`` of the regular file at ``relative`` as it is now, looked up through the
        descriptors (a directory on the way that is a symlink, or not a directory, means none);
        None for anything else (absent, a symlink, a directory, a FIFO), which a download
        replaces, never follows. What a download asks of each object it plans, instead of
        scanning the whole tree into memory first."""
        directory, _, name = relative.rpartition("/")
        with self._existing(directory) as dir_fd:
            if dir_fd is None:
                return None
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except (FileNotFoundError, NotADirectoryError):
                return None
        return st if stat.S_ISREG(st.st_mode) else None

    def remove(self, relative: str) -> bool:
        """Remove the file ``relative`` through the descriptors (never through a link); False when
        it, or a directory on the way, is gone or no longer a directory of this tree."""
        directory, _, name = relative.rpartition("/")
        with self._existing(directory) as dir_fd:
            if dir_fd is None:
                return False
            try:
                os.unlink(name, dir_fd=dir_fd)
                return True
            except (FileNotFoundError, IsADirectoryError):
                return False

    def remove_empty_directory(self, relative: str) -> bool:
        """Remove the directory ``relative`` if it is empty (through its parent's descriptor)."""
        parent, _, name = relative.rpartition("/")
        with self._existing(parent) as parent_fd:
            if parent_fd is None:
                return False
            with self._lock:  # its kept descriptor (if any) must not outlive it
                entry = self._open.pop(relative, None)
                if entry is not None:
                    os.close(entry[0])
            try:
                os.rmdir(name, dir_fd=parent_fd)
                return True
            except OSError:
                return False  # not empty, gone, or not a directory

    # ------------------------------------------------------------------ spool
    def spool_fits(self) -> bool:
        """Whether a :meth:`spool` can be made on the tree's filesystem (beside it, never inside):
        not when the destination is a mount point, or its state lives in the user's cache."""
        if self._spool_fits is None:
            self.open()
            self.state_dir.mkdir(parents=True, exist_ok=True)
            with self._lock:
                root_dev = os.fstat(self._root_locked()).st_dev
            self._spool_fits = os.stat(self.state_dir).st_dev == root_dev
        return self._spool_fits

    @contextmanager
    def spool(self) -> Iterator[Spool]:
        """A private directory (0700, this process's owner only) in the tree's state directory,
        for a child that writes by path; removed with whatever is left in it. Killed runs' spools
        carry the tag's temp name, so the next holder of the lock sweeps them."""
        if not self.spool_fits():
            raise OSError(errno.EXDEV, "no directory on the destination's filesystem outside it", str(self.root))
        path = self.state_dir / temp_name(SPOOL_NAME, self.tag)
        os.mkdir(path, 0o700)
        try:
            fd = os.open(path, OPEN_DIRECTORY_NOFOLLOW)
            try:
                yield Spool(path, fd)
            finally:
                os.close(fd)
        finally:
            shutil.rmtree(path, ignore_errors=True)


#: The name (inside the temp prefix) of the spool directories in a destination's state directory.
SPOOL_NAME = "spool"


@dataclass(frozen=True)
class Spool:
    """A private directory a child process writes into by path, and our descriptor of it."""

    path: Path
    fd: int


@dataclass
class TempFile:
    """A file written beside its final place in a :class:`DestinationTree`, not yet visible under
    its final name. Exactly one of :meth:`publish` or :meth:`discard` ends it (both are safe to
    call again, and :meth:`discard` after :meth:`publish` does nothing)."""

    tree: DestinationTree
    relative: str
    directory: str
    dir_fd: int
    name: str
    _ended: bool = field(default=False, repr=False)

    def size(self) -> int:
        return os.stat(self.name, dir_fd=self.dir_fd, follow_symlinks=False).st_size

    def publish(self, modified_ns: int | None = None) -> os.stat_result:
        """Give the file ``modified_ns`` as its mtime, rename it to its final name in the same
        directory (atomic: a reader sees the old file or the new one) and return the new file's
        stat. On any failure the temp file is removed and the error raised."""
        final = self.relative.rpartition("/")[2]
        try:
            if modified_ns is not None:
                os.utime(self.name, ns=(time.time_ns(), modified_ns), dir_fd=self.dir_fd, follow_symlinks=False)
            os.rename(self.name, final, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
        except BaseException:
            self.discard()
            raise
        try:
            return os.stat(final, dir_fd=self.dir_fd, follow_symlinks=False)
        finally:
            self._end()

    def discard(self) -> None:
        if self._ended:
            return
        try:
            os.unlink(self.name, dir_fd=self.dir_fd)
        except FileNotFoundError:
            pass
        finally:
            self._end()

    def _end(self) -> None:
        if not self._ended:
            self._ended = True
            self.tree._unpin(self.directory)
