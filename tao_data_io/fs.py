"""Filesystem primitives the whole package shares: confinement, atomic publish, file locks,
file digests and "is this path inside that one".

Why one module: each of these is a property of the whole package ("nothing is ever written
outside the destination", "a reader never sees half a file", "two writers never interleave"),
and a second copy of any of them is a bug waiting to drift. Everything that writes, locks,
hashes or checks containment comes here.

**Confinement.** A relative name (an S3 key, an archive member, an annotation reference) is
accepted only in canonical form — no empty, ``.`` or ``..`` components, no leading ``/``, no
backslash, NUL or control character, no component longer than a file name may be — because
anything else either escapes the destination, lets two different names map to one file, or
cannot be written at all. Checking names when the plan is made is not enough: a directory
inside the destination can be replaced by a symlink while the bytes move, so downloads write
through a :class:`DestinationTree`, which resolves every write relative to directory
descriptors opened with ``O_NOFOLLOW`` — a symlink met at write time fails that one file and is
never followed.

**Temp names.** In-flight files and directories are named
``.tao-data-io-partial.<owner>-<12 hex>.<name>`` beside their final path (same directory, so
same filesystem, so the final ``rename`` is atomic). The random part means two writers —
threads or processes, even with the same PID in two containers — never share one; names are cut
by *bytes* so a 255-byte name still fits. The owner names the lock its writer held
(:func:`lock_owner`): a sweep run under a lock removes only temp names of that lock, the only
ones it can prove abandoned — a sync into ``/data`` never touches the in-flight files of a sync
into ``/data/sub``, which holds another lock.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import re
import shutil
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from .errors import UnsafePathError

#: Per-destination state (digest cache, lock, markers) lives in a directory of this name beside
#: the destination (:func:`state_dir_for`); the name is reserved, never a transfer target.
STATE_DIR_NAME = ".tao-data-io"
#: In-flight files and directories carry this prefix until they are renamed into place.
TEMP_PREFIX = ".tao-data-io-partial."
_OWNER_HEX = 8
_TOKEN_HEX = 12
#: Temp-name tokens read from the OS's random source at once.
_TOKENS_READ = 512
#: The owner of temp names no lock guards: no sweep ever removes them; their writer does.
UNOWNED = "0" * _OWNER_HEX
_TEMP_HEAD = re.compile(rf"{re.escape(TEMP_PREFIX)}([0-9a-f]{{{_OWNER_HEX}}})-[0-9a-f]{{{_TOKEN_HEX}}}\.")
#: The longest file name most filesystems accept, in bytes.
NAME_MAX_BYTES = 255
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_CHUNK = 1 << 20


# --------------------------------------------------------------------------- confinement
_ESCAPES = "so it could land outside the destination"


def _problem(relative: str) -> tuple[str, str] | None:
    """Say why ``relative`` is not a safe canonical relative POSIX path that a filesystem can hold
    (the problem, and what it would lead to), or None if it is."""
    if relative == "":
        return "it is empty", _ESCAPES
    if "\x00" in relative:
        return "it contains a NUL character", _ESCAPES
    if _CONTROL.search(relative):
        return "it contains a control character", _ESCAPES
    if "\\" in relative:
        return "it contains a backslash", _ESCAPES
    if relative.startswith("/"):
        return "it is absolute", _ESCAPES
    parts = relative.split("/")
    if ".." in parts:
        return "it contains a '..' component", _ESCAPES
    if "" in parts or "." in parts:
        return "it is not in canonical form (empty or '.' component)", _ESCAPES
    if STATE_DIR_NAME in parts:
        return f"{STATE_DIR_NAME}/ is reserved for tao-data-io's own state", _ESCAPES
    if parts[-1].startswith(TEMP_PREFIX):
        return f"names starting with {TEMP_PREFIX!r} are reserved for in-flight downloads", _ESCAPES
    for part in parts:
        size = len(part.encode("utf-8", "surrogateescape"))
        if size > NAME_MAX_BYTES:
            return (f"its component {part[:24]!r}… is {size} bytes long in UTF-8, more than the {NAME_MAX_BYTES} "
                    "bytes a file name may have", "so no filesystem here can hold it")
    return None


def has_control_character(text: str) -> bool:
    return bool(_CONTROL.search(text))


def check_relative(relative: str, *, what: str) -> str:
    """Return ``relative`` if it is a safe relative path; else raise naming ``what`` and why."""
    problem = _problem(relative)
    if problem:
        raise UnsafePathError(f"refusing {what} {relative!r}: {problem[0]}, {problem[1]}")
    return relative


def confined_path(root: Path, relative: str, *, what: str) -> Path:
    """``root / relative`` after checking the name and that no existing directory on the way is
    a symlink or a non-directory (so the write cannot be redirected outside ``root``)."""
    check_relative(relative, what=what)
    current = root
    for part in relative.split("/")[:-1]:
        current = current / part
        try:
            mode = current.lstat().st_mode
        except FileNotFoundError:
            break  # the rest will be created fresh by us
        if stat.S_ISLNK(mode):
            raise UnsafePathError(f"refusing {what} {relative!r}: {current} is a symlink; it is never followed")
        if not stat.S_ISDIR(mode):
            raise UnsafePathError(f"refusing {what} {relative!r}: {current} exists and is not a directory")
    return root / relative


# --------------------------------------------------------------------------- state directories
def state_dir_for(dest: Path) -> Path:
    """Where tao-data-io keeps what it knows about ``dest`` (digest cache, lock, markers, reports):
    ``<parent>/.tao-data-io/<name>/``, beside the tree and never inside it — a dataset loader that
    treats each sub-directory as a class must see exactly the data. Beside it (not in a cache
    directory) so a stage pod and a training pod that share the volume share it too. When the
    parent cannot hold it (a read-only parent of a mount point), a directory in the user's cache
    keyed by the destination's real path is used instead.

    Only the place: nothing is created or checked here. A writer reaches it through
    :func:`destination_lock`, which opens it without following links and refuses one that is not
    this process's own.
    """
    base, parts = _state_location(dest)
    return base.joinpath(*parts)


def _state_location(dest: Path) -> tuple[Path, tuple[str, ...]]:
    """The state directory of ``dest`` as a base the user chose (its parent, or the user's cache)
    and the components below it that tao-data-io makes — and that another user who can write
    the base could plant, so they are the ones opened without following links."""
    dest = Path(os.path.abspath(dest))
    parent = dest.parent
    if os.path.lexists(parent / STATE_DIR_NAME) or not parent.exists() or os.access(parent, os.W_OK):
        # Whatever is at .tao-data-io is judged when opened, never routed around.
        return parent, (STATE_DIR_NAME, dest.name) if dest.name else (STATE_DIR_NAME,)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tao-data-io" / "state"
    return cache, (hashlib.sha256(os.path.realpath(dest).encode()).hexdigest()[:32],)


def _lock_name(part: str | None) -> str:
    return "lock" if part is None else f"lock.{part}"


def destination_lock_path(dest: Path, part: str | None = None) -> Path:
    """The lock every writer of ``dest`` holds (a sync, a copy into it, an extraction, a model
    pull), or — with ``part`` — the lock of one part of it (a shard, whose writers touch only
    its own keys). Held through :func:`destination_lock`."""
    return state_dir_for(dest) / _lock_name(part)


#: Mode bits a state directory may not have: whoever else may write it could plant a lock, a
#: digest cache or a marker there, or rename ours away.
_WRITABLE_BY_OTHERS = stat.S_IWGRP | stat.S_IWOTH


def _not_own(info: os.stat_result, *, directory: bool) -> str | None:
    """Why a state directory (or a file in one) of this ``fstat`` is not this process's own, or
    None. A directory must be owned by the effective user and writable by nobody else (read,
    search and setgid bits are accepted: a directory an older version made ``0755``, one made in
    a setgid team directory); a file must be a regular file owned by the effective user (its
    mode is SQLite's and the umask's: the directory above it already keeps others out)."""
    if directory and not stat.S_ISDIR(info.st_mode):
        return "is not a directory"
    if not directory and not stat.S_ISREG(info.st_mode):
        return "is not a regular file"
    if info.st_uid != os.geteuid():
        return (f"is owned by uid {info.st_uid}, not by this process (uid {os.geteuid()}): another user made it, "
                "and nothing in it can be trusted")
    if directory and info.st_mode & _WRITABLE_BY_OTHERS:
        return (f"is writable by its group or others (mode {stat.S_IMODE(info.st_mode):04o}): they could plant "
                "a lock or a digest cache in it")
    return None


_REMOVE = "remove it (tao-data-io makes its own, private, on the next run)"


def _state_refusal(dest: Path, path: Path, problem: str, fix: str = _REMOVE) -> UnsafePathError:
    """The refusal of ``dest`` because ``path`` (its state directory, a component of it, or its
    lock) has ``problem``: named, with ``fix`` and the way around it."""
    return UnsafePathError(f"refusing destination {str(dest)!r}: its state directory {state_dir_for(dest)} is not "
                           f"safe to use — {path} {problem}; {fix}, or choose a destination whose parent only you "
                           "can write")


def _open_state_dir(dest: Path) -> tuple[Path, int]:
    """Make ``dest``'s state directory if it is missing (``0700``) and open it; return its path
    and a descriptor the caller closes.

    Why so careful: the parent may be a directory another user can write (a team directory, a
    sticky ``/tmp``). A ``.tao-data-io`` link planted there would send this process's lock and
    digest cache wherever it points, and a directory of theirs would hand them our lock and let
    them plant a digest cache that vouches for a stale file. So each component below the parent
    is made with ``mkdir(dir_fd=)`` and opened with ``O_NOFOLLOW`` from its parent's descriptor,
    and the descriptor — not the name — is checked (:func:`_not_own`). A sticky parent then
    keeps it ours: no other user can rename or replace an entry of ours in it. (In a parent that
    others may write without the sticky bit, they can rename entries — the destination's as
    much as ours — so there this holds against what was planted before the run, not against a
    rename during it.) Once per run, never per file.
    """
    dest = Path(os.path.abspath(dest))
    base, parts = _state_location(dest)
    try:
        fd = os.open(base, _DIRECTORY)  # the user's own path, followed as the destination's root is
    except FileNotFoundError:
        os.makedirs(base, exist_ok=True)
        fd = os.open(base, _DIRECTORY)
    path = base
    try:
        for part in parts:
            path = path / part
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o700, dir_fd=fd)
            try:
                child = os.open(part, _NO_LINK_DIRECTORY, dir_fd=fd)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                link = stat.S_ISLNK(os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode)
                raise _state_refusal(dest, path, "is a symlink; it is never followed" if link
                                     else "is not a directory") from None
            os.close(fd)
            fd = child
            info = os.fstat(fd)
            problem = _not_own(info, directory=True)
            if problem is not None:
                raise _state_refusal(dest, path, problem,
                                     f"run chmod go-w {str(path)!r}" if info.st_uid == os.geteuid() else _REMOVE)
    except BaseException:
        os.close(fd)
        raise
    return path, fd


def _open_own_file(path: Path) -> int:
    """A descriptor for reading ``path``, a file in a state directory, only if it is this process's
    own regular file (judged on the descriptor); else :class:`UnsafePathError` naming what is
    wrong. ``FileNotFoundError`` when it is absent.

    The state directory is checked as each run opens it; this checks what is found in it (a
    digest cache, a marker), which another user may have left before the directory was ours."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        problem = "is a symlink; it is never followed"
    else:
        problem = _not_own(os.fstat(fd), directory=False)
        if problem is None:
            return fd
        os.close(fd)
    raise UnsafePathError(f"refusing {path}: it {problem}; remove it (tao-data-io writes its own on the next run)")


def check_own_file(path: Path) -> None:
    """Raise :class:`UnsafePathError` unless ``path`` is absent or this process's own regular file."""
    with contextlib.suppress(FileNotFoundError):
        os.close(_open_own_file(path))


def read_state_file(path: Path) -> str:
    """The text of ``path``, a file in a state directory (a marker), only if it is this process's
    own regular file: a marker vouches for a tree, so one another user left is refused, naming it
    and the fix. ``FileNotFoundError`` when it is absent."""
    with os.fdopen(_open_own_file(path), "rb") as handle:
        return handle.read().decode("utf-8")


@contextmanager
def destination_lock(dest: Path, part: str | None = None) -> Iterator[Path]:
    """Hold the lock every writer of ``dest`` holds (:func:`destination_lock_path`) and yield its
    path; its state directory is made and checked first (:func:`_open_state_dir`), and the lock
    file is opened from that directory's descriptor without following a link and refused unless
    it is this process's own — a lock another user made is one they could hold for ever."""
    dest = Path(os.path.abspath(dest))
    directory, dir_fd = _open_state_dir(dest)
    lock = directory / _lock_name(part)
    try:
        fd = os.open(lock.name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise _state_refusal(dest, lock, "is a symlink; it is never followed") from None
    finally:
        os.close(dir_fd)
    try:
        problem = _not_own(os.fstat(fd), directory=False)
        if problem is not None:
            raise _state_refusal(dest, lock, problem)
    except BaseException:
        os.close(fd)
        raise
    with _holding(fd, lock, wait=True, on_wait=None):
        yield lock


_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_NO_LINK_DIRECTORY = _DIRECTORY | os.O_NOFOLLOW


def open_directory_nofollow(path: Path, *, what: str = "path") -> int:
    """Open the directory ``path`` without following a symlink at any component, from ``/`` down.

    Why: a path someone else controls (a job's results directory) must be what it says. A link
    there, or on any directory above it, could point the caller at any tree this process can read;
    a check followed by an ``open`` could be raced. This walk is the check: each component is
    opened relative to its parent with ``O_NOFOLLOW``. Raises :class:`UnsafePathError` naming
    ``what`` (the parameter that gave the path), the path and the link, or the ``OSError`` of a
    component that does not exist or is not a directory.
    """
    absolute = os.path.abspath(path)
    fd = os.open("/", _DIRECTORY)
    walked = ""
    try:
        for part in absolute.split("/")[1:]:
            walked += "/" + part
            try:
                child = os.open(part, _NO_LINK_DIRECTORY, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(walked):
                    where = "is a symlink" if walked == absolute else f"lies under the symlink {walked}"
                    raise UnsafePathError(f"{what} {absolute!r} {where}; such a path is refused because whoever controls "
                                          f"the link decides what is read — give the real path "
                                          f"{os.path.realpath(absolute)!r} if that is the directory meant") from None
                raise
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


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

    def __init__(self, root: Path, owner: str = UNOWNED, state_dir: Path | None = None) -> None:
        self.root = Path(os.path.abspath(root))
        #: The :func:`lock_owner` of the lock held while writing here; it names every temp file.
        self.owner = owner
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
            entry = self._open[""] = [os.open(self.root, _DIRECTORY), 1]  # pinned for the tree's life
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
            return os.open(name, _NO_LINK_DIRECTORY, dir_fd=parent_fd)
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
        temp = temp_name(name, self.owner)
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
        temp = temp_name(name, self.owner)
        try:
            os.rename(source_name, temp, src_dir_fd=source_dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            self._unpin(directory)
            raise
        return TempFile(self, relative, directory, dir_fd, temp)

    def remove_temps(self, relatives: Sequence[str]) -> None:
        """Remove the temp files among ``relatives`` (found by a scan) that belong to this tree's
        owner: killed writers under the lock the caller holds left them. Other owners' are left."""
        for relative in relatives:
            directory, _, name = relative.rpartition("/")
            if temp_owner(name) != self.owner:
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
        carry the owner's temp name, so the next holder of the lock sweeps them."""
        if not self.spool_fits():
            raise OSError(errno.EXDEV, "no directory on the destination's filesystem outside it", str(self.root))
        path = self.state_dir / temp_name(SPOOL_NAME, self.owner)
        os.mkdir(path, 0o700)
        try:
            fd = os.open(path, _NO_LINK_DIRECTORY)
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


def is_within(path: str | os.PathLike[str], root: str | os.PathLike[str], *, resolve: bool = True) -> bool:
    """Whether ``path`` is ``root`` or lies below it. With ``resolve`` (the default) symlinks are
    resolved on both sides first, so a link cannot make an outside path look inside."""
    real = os.path.realpath(path) if resolve else os.fspath(path)
    real_root = os.path.realpath(root) if resolve else os.fspath(root)
    return real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep)


# --------------------------------------------------------------------------- temp names
def lock_owner(lock: Path) -> str:
    """The owner part of the temp names written under ``lock`` (8 hex of its absolute path).

    Why: a temp name looks the same whether its writer was killed or is still writing. Only the
    holder of the lock every such writer holds can tell: while it holds the lock, a temp name of
    that lock's owner is provably abandoned; any other temp name may belong to a live writer of
    another destination (a sync into a sub-directory, an extraction beside it) and is left alone.
    """
    return hashlib.sha256(os.fsencode(os.path.abspath(lock))).hexdigest()[:_OWNER_HEX]


class _Tokens:
    """Unpredictable hex tokens from the OS's random source, read :data:`_TOKENS_READ` at a time:
    a download names a temp file for every object, and one ``getrandom`` call each was a tenth of
    what its loop thread spent outside the transfers (py-spy, 10,000 × 1 KiB). Unpredictable, so a
    job that can write the destination cannot plant a name a temp file will take."""

    def __init__(self) -> None:
        self._forget()
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        """Start with no token read (and a lock no other thread holds): a forked child must not
        reuse its parent's tokens."""
        self._lock = threading.Lock()
        self._hex, self._at = "", 0

    def next(self) -> str:
        with self._lock:
            if self._at >= len(self._hex):
                self._hex, self._at = os.urandom(_TOKENS_READ * _TOKEN_HEX // 2).hex(), 0
            token = self._hex[self._at:self._at + _TOKEN_HEX]
            self._at += _TOKEN_HEX
            return token


_tokens = _Tokens()


def temp_name(name: str, owner: str = UNOWNED) -> str:
    """A fresh, unpredictable temp name for ``name``, owned by ``owner``, cut to fit
    :data:`NAME_MAX_BYTES` by bytes."""
    return _fit(f"{TEMP_PREFIX}{owner}-{_tokens.next()}.", name)


def _fit(head: str, name: str) -> str:
    room = NAME_MAX_BYTES - len(head.encode())
    return head + name.encode("utf-8", "surrogateescape")[:room].decode("utf-8", "ignore")


def temp_path_for(final: Path, owner: str = UNOWNED) -> Path:
    """A fresh temp name beside ``final`` (same directory → same filesystem)."""
    return final.with_name(temp_name(final.name, owner))


def temp_owner(name: str) -> str | None:
    """The owner of a temp name of ours, or None for any other name."""
    match = _TEMP_HEAD.match(name)
    return match.group(1) if match else None


def is_temp_name(name: str) -> bool:
    return name.startswith(TEMP_PREFIX)


def remove_stale_temps(final: Path, owner: str) -> None:
    """Remove the temp files and directories for ``final`` that killed writers under the lock of
    ``owner`` left beside it.

    Only call this while holding that lock: a temp name of a live writer looks exactly like a
    stale one, and only the lock tells them apart.
    """
    try:
        entries = list(os.scandir(final.parent))
    except (FileNotFoundError, NotADirectoryError):
        return
    for entry in entries:
        match = _TEMP_HEAD.match(entry.name)
        if match is None or match.group(1) != owner or entry.name != _fit(match.group(0), final.name):
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            remove_if_exists(Path(entry.path))


def remove_if_exists(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


# --------------------------------------------------------------------------- atomic publish
def atomic_write(path: Path, data: bytes, *, mode: int = 0o644, replace: bool = True, durable: bool = False,
                 owner: str = UNOWNED) -> bool:
    """Publish ``data`` at ``path`` whole or not at all; return whether this call created it.

    A unique temp file beside ``path``, written and fsynced, then:

    * ``replace=True``: renamed over ``path`` (the last writer wins);
    * ``replace=False``: hard-linked to ``path``, which never replaces an existing file — the
      call returns False and leaves the existing file alone (content-addressed files: the
      caller checks the existing bytes).

    ``durable`` also fsyncs the directory, so the new name survives a power loss (job records).
    The temp file is removed on every path out, so an interrupted call leaves nothing behind
    but, at worst, one temp file that :func:`remove_stale_temps` recognises — for the ``owner``
    (:func:`lock_owner`) of the lock the caller holds while writing ``path``.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = temp_path_for(path, owner)
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp, mode)  # the umask may have narrowed it
        if replace:
            os.replace(temp, path)
            created = True
        else:
            try:
                os.link(temp, path)
                created = True
            except FileExistsError:
                created = False
            remove_if_exists(temp)
    except OSError as exc:
        remove_if_exists(temp)
        if exc.filename is None:  # ENOSPC from write or fsync names no file: name the one we were writing
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise
    except BaseException:
        remove_if_exists(temp)
        raise
    if durable:
        fsync_directory(path.parent)
    return created


def fsync_directory(directory: Path) -> None:
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


# --------------------------------------------------------------------------- locks
@contextmanager
def file_lock(path: Path, *, wait: bool = True, on_wait: Callable[[str], None] | None = None) -> Iterator[bool]:
    """Hold an exclusive ``flock`` on ``path`` (created 0600 if absent); yield True once held.

    With ``wait=False`` it yields False at once when another holder has it. ``on_wait`` is told
    (once) that this call is about to wait. The kernel drops the lock when its holder dies, so
    a killed process never wedges anyone. Lock files are never deleted: deleting one while
    another process waits on it would let two holders in at once. (A destination's lock is held
    through :func:`destination_lock`, which checks its directory first.)
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with _holding(fd, path, wait=wait, on_wait=on_wait) as held:
        yield held


@contextmanager
def _holding(fd: int, path: Path, *, wait: bool, on_wait: Callable[[str], None] | None) -> Iterator[bool]:
    """Lock the open lock file ``fd`` (``path``) as :func:`file_lock` says; close it after."""
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not wait:
                yield False
                return
            if on_wait is not None:
                on_wait(f"{path} is held by another process; waiting for it")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield True
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- digests
#: The algorithms :func:`file_digest` knows. ``git-blob-sha1`` is the Hub's id of a file kept in
#: git: sha1 over ``b"blob <size>\\0"`` followed by the content.
DIGEST_ALGORITHMS = ("md5", "sha256", "git-blob-sha1")


class ReplacedError(OSError):
    """A file read by name is not the one that was scanned under it (another inode, not a regular
    file any more, another size): nothing is read from it; the next run looks again."""


def open_scanned(path: str | os.PathLike[str], *, identity: tuple[int, int] | None = None,
                 size: int | None = None, follow: bool = False) -> int:
    """A descriptor for reading the regular file a scan found at ``path`` — in a tree a job
    controls, where the name may have been swapped since. Never blocks on what is there now:
    ``O_NONBLOCK`` makes the open of a FIFO (or a device) return at once, and the descriptor, not
    the name, is then checked: a regular file, of ``identity`` (device, inode) and ``size`` when
    given. ``O_NOFOLLOW`` refuses a symlink swapped in for the file itself (``follow``: a file of
    the user's own, which may be a symlink — an archive given by its link)."""
    nofollow = 0 if follow else os.O_NOFOLLOW
    fd = os.open(path, os.O_RDONLY | nofollow | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ReplacedError(errno.EINVAL, "is not a regular file any more (replaced since it was scanned); not "
                                              "read — the next run looks again", str(path))
        if identity is not None and (st.st_dev, st.st_ino) != identity:
            raise ReplacedError(errno.EINVAL, "was replaced since it was scanned; not read — the next run looks again",
                                str(path))
        if size is not None and st.st_size != size:
            raise ReplacedError(errno.EINVAL, f"changed size since it was scanned ({size} → {st.st_size} bytes); "
                                              "not read — the next run looks again", str(path))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_bounded(fd: int, size: int) -> Iterator[bytes]:
    """The ``size`` bytes of the file open at ``fd``, in chunks of at most 1 MiB — and no more: a
    file still growing is read to its scanned size, and one that shrank raises, so a read of a
    job's file always ends."""
    left = size
    while left > 0:
        chunk = os.read(fd, min(_CHUNK, left))
        if not chunk:
            raise ReplacedError(errno.EINVAL, f"ended after {size - left} of its {size} scanned bytes (it shrank "
                                              "while being read); the next run looks again")
        left -= len(chunk)
        yield chunk


def file_digest(path: str | os.PathLike[str], algorithm: str, *, identity: tuple[int, int] | None = None,
                size: int | None = None, on_chunk: Callable[[], None] | None = None) -> str:
    """The hex digest of the regular file at ``path``, read in 1 MiB chunks (memory stays flat)
    through :func:`open_scanned` — given a scan's ``identity`` and ``size``, of exactly that file
    and that many bytes. ``on_chunk`` is told of each chunk read (a lock's renewal needs it: a
    50 GB checkpoint takes minutes to hash)."""
    fd = open_scanned(path, identity=identity, size=size, follow=identity is None)
    try:
        length = os.fstat(fd).st_size if size is None else size
        if algorithm == "md5":
            digest = hashlib.md5(usedforsecurity=False)
        elif algorithm == "sha256":
            digest = hashlib.sha256()
        elif algorithm == "git-blob-sha1":
            digest = hashlib.sha1(b"blob %d\0" % length, usedforsecurity=False)
        else:
            raise ValueError(f"unknown digest algorithm {algorithm!r}; use one of {DIGEST_ALGORITHMS}")
        for chunk in read_bounded(fd, length):
            digest.update(chunk)
            if on_chunk is not None:
                on_chunk()
    finally:
        os.close(fd)
    return digest.hexdigest()


def read_job_file(directory: Path, name: str, *, limit: int) -> bytes | None:
    """The last ``limit`` bytes of the regular file ``name`` in ``directory``, a directory a job
    writes (its results); None when there is no such regular file.

    Why so careful: the job controls what is there. A symlink named ``name`` (to ``~/.aws/…``)
    would make this process read — and a flow show — whatever it can read; a FIFO would block it
    for good. So the directory is walked without following a link (:func:`open_directory_nofollow`),
    the file is opened ``O_NOFOLLOW | O_NONBLOCK`` and read only if ``fstat`` says it is regular,
    and never more than ``limit`` bytes."""
    try:
        directory_fd = open_directory_nofollow(directory, what="a job's results directory")
    except (OSError, UnsafePathError):
        return None
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=directory_fd)
    except OSError:  # absent, a link (ELOOP), a socket (ENXIO)
        return None
    finally:
        os.close(directory_fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        return os.pread(fd, limit, max(0, info.st_size - limit))
    finally:
        os.close(fd)
