"""A destination's state directory: where it is, making and opening it safely, and reading what
is found in it.

**Why.** What tao-data-io knows about a destination (its digest cache, its locks, markers,
reports) lives beside it, never inside it, in a directory another user may be able to reach (a
team directory, a sticky ``/tmp``). Each component is made and opened without following a link,
and checked on its descriptor as this process's own; a file found there is read only if it is
this process's own regular file. The locks kept there are :mod:`.locks`'.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
from pathlib import Path

from ..errors import UnsafePathError
from .confinement import OPEN_DIRECTORY, OPEN_DIRECTORY_NOFOLLOW, STATE_DIR_NAME


def state_dir_for(dest: Path) -> Path:
    """Where tao-data-io keeps what it knows about ``dest`` (digest cache, lock, markers, reports):
    ``<parent>/.tao-data-io/<name>/``, beside the tree and never inside it — a dataset loader that
    treats each sub-directory as a class must see exactly the data. Beside it (not in a cache
    directory) so a stage pod and a training pod that share the volume share it too. When the
    parent cannot hold it (a read-only parent of a mount point), a directory in the user's cache
    keyed by the destination's real path is used instead.

    Only the place: nothing is created or checked here. A writer reaches it through
    :func:`~tao_data_io.fs.locks.destination_lock`, which opens it without following links and refuses one that is not
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


#: Mode bits a state directory may not have: whoever else may write it could plant a lock, a
#: digest cache or a marker there, or rename ours away.
_WRITABLE_BY_OTHERS = stat.S_IWGRP | stat.S_IWOTH


def not_own(info: os.stat_result, *, directory: bool) -> str | None:
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


def state_refusal(dest: Path, path: Path, problem: str, fix: str = _REMOVE) -> UnsafePathError:
    """The refusal of ``dest`` because ``path`` (its state directory, a component of it, or its
    lock) has ``problem``: named, with ``fix`` and the way around it."""
    return UnsafePathError(f"refusing destination {str(dest)!r}: its state directory {state_dir_for(dest)} is not "
                           f"safe to use — {path} {problem}; {fix}, or choose a destination whose parent only you "
                           "can write")


def open_state_dir(dest: Path) -> tuple[Path, int]:
    """Make ``dest``'s state directory if it is missing (``0700``) and open it; return its path
    and a descriptor the caller closes.

    Why so careful: the parent may be a directory another user can write (a team directory, a
    sticky ``/tmp``). A ``.tao-data-io`` link planted there would send this process's lock and
    digest cache wherever it points, and a directory of theirs would hand them our lock and let
    them plant a digest cache that vouches for a stale file. So each component below the parent
    is made with ``mkdir(dir_fd=)`` and opened with ``O_NOFOLLOW`` from its parent's descriptor,
    and the descriptor — not the name — is checked (:func:`not_own`). A sticky parent then
    keeps it ours: no other user can rename or replace an entry of ours in it. (In a parent that
    others may write without the sticky bit, they can rename entries — the destination's as
    much as ours — so there this holds against what was planted before the run, not against a
    rename during it.) Once per run, never per file.
    """
    dest = Path(os.path.abspath(dest))
    base, parts = _state_location(dest)
    try:
        fd = os.open(base, OPEN_DIRECTORY)  # the user's own path, followed as the destination's root is
    except FileNotFoundError:
        os.makedirs(base, exist_ok=True)
        fd = os.open(base, OPEN_DIRECTORY)
    path = base
    try:
        for part in parts:
            path = path / part
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o700, dir_fd=fd)
            try:
                child = os.open(part, OPEN_DIRECTORY_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                link = stat.S_ISLNK(os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode)
                raise state_refusal(dest, path, "is a symlink; it is never followed" if link
                                     else "is not a directory") from None
            os.close(fd)
            fd = child
            info = os.fstat(fd)
            problem = not_own(info, directory=True)
            if problem is not None:
                raise state_refusal(dest, path, problem,
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
        problem: str | None = "is a symlink; it is never followed"
    else:
        problem = not_own(os.fstat(fd), directory=False)
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
