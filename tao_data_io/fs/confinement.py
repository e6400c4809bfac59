"""Confinement: which relative names may be written, and paths no symlink can redirect.

**Why.** A relative name (an S3 key, an archive member, an annotation reference) is accepted only
in canonical form — no empty, ``.`` or ``..`` components, no leading ``/``, no backslash, NUL or
control character, no component longer than a file name may be — because anything else either
escapes the destination, lets two different names map to one file, or cannot be written at all.
Checking names when the plan is made is not enough: a directory inside the destination can be
replaced by a symlink while the bytes move, so downloads write through a
:class:`~tao_data_io.fs.tree.DestinationTree`, which opens every directory with the flags defined
here — a symlink met at write time fails that one file and is never followed. A path someone else
controls (a job's results directory) is opened by :func:`open_directory_nofollow`, link by link.

The names tao-data-io reserves for itself (:data:`STATE_DIR_NAME`, :data:`TEMP_PREFIX`) are
defined here, where the rule that refuses them as data is; the state directory
(:mod:`.state`) and the temp names (:mod:`.temp`) build on them.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path

from ..errors import UnsafePathError


#: Per-destination state (digest cache, lock, markers) lives in a directory of this name beside
#: the destination (:func:`~tao_data_io.fs.state.state_dir_for`); the name is reserved, never a transfer target.
STATE_DIR_NAME = ".tao-data-io"
#: In-flight files and directories carry this prefix until they are renamed into place.
TEMP_PREFIX = ".tao-data-io-partial."


#: The longest file name most filesystems accept, in bytes.
NAME_MAX_BYTES = 255
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


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


OPEN_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
OPEN_DIRECTORY_NOFOLLOW = OPEN_DIRECTORY | os.O_NOFOLLOW


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
    fd = os.open("/", OPEN_DIRECTORY)
    walked = ""
    try:
        for part in absolute.split("/")[1:]:
            walked += "/" + part
            try:
                child = os.open(part, OPEN_DIRECTORY_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(walked):
                    where = "is a symlink" if walked == absolute else f"lies under the symlink {walked}"
                    raise UnsafePathError(f"{what} {absolute!r} {where}; such a path is refused because whoever "
                                          f"controls the link decides what is read — give the real path "
                                          f"{os.path.realpath(absolute)!r} if that is the directory meant") from None
                raise
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def is_within(path: str | os.PathLike[str], root: str | os.PathLike[str], *, resolve: bool = True) -> bool:
    """Whether ``path`` is ``root`` or lies below it. With ``resolve`` (the default) symlinks are
    resolved on both sides first, so a link cannot make an outside path look inside."""
    real = os.path.realpath(path) if resolve else os.fspath(path)
    real_root = os.path.realpath(root) if resolve else os.fspath(root)
    return real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep)
