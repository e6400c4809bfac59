"""Bind what was checked: every source a frame binds is opened once, checked on its descriptor,
and handed to bubblewrap as that descriptor (``--bind-fd`` / ``--ro-bind-fd``).

Why descriptors: a path is a name, and a name can change between the check and the bind. A
mount source that is a symlink flipped between a data directory and ``~/.aws`` passed a
``realpath`` check at preflight and was bound as the credentials moments later; a job that
leaves such a flipper in its results (another job's input, as a pipeline's next step mounts it)
needs no help from anyone. So:

* :func:`open_source` walks the path from ``/`` one component at a time with
  ``O_PATH | O_NOFOLLOW``, resolving each symlink itself (at most :data:`MAX_LINKS`), and ends
  with a descriptor of one object — whatever names point where afterwards;
* submit checks each source on its descriptor (the object's own path, read back from
  ``/proc/self/fd``) and records the object's identity (device and inode) in the run
  directory (:class:`BoundSource`);
* the supervisor opens each source again (it is another process, started later), refuses any
  whose object is not the recorded one (:class:`SourceChanged`), and gives bubblewrap its
  descriptor — so the frame binds the very object that was checked, or nothing.

A source missing at submit is not recorded and not bound: its target stays absent and the
verify probe, inside the frame, says so (preflight refused it earlier if it was missing then).
"""

from __future__ import annotations

import errno
import os
import stat
from collections import deque
from collections.abc import Iterable, Mapping

from ..schema import Strict

#: As the kernel's own limit on symlinks followed in one lookup (``ELOOP`` past it).
MAX_LINKS = 40
_OPEN_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


class SourceChanged(Exception):
    """A source is not the object submit checked (it was swapped in between)."""


class BoundSource(Strict):
    """The object submit checked for one bind: where it was and which it is."""

    source: str
    #: The object's own path when it was checked (symlinks resolved by the walk).
    resolved: str
    device: int
    inode: int


def open_source(path: str, root: str = "/") -> int | None:
    """An ``O_PATH`` descriptor of the object ``path`` names now, or None when nothing is there
    (see the module docstring). The caller closes it.

    ``root``: the directory ``path`` is resolved in, ``/`` unless given — a container's own root
    (``/proc/<pid>/root``), where an absolute symlink starts again at that root and ``..`` never
    climbs above it, as the container itself resolves them."""
    top = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)  # a container's root is /proc's link to it
    fd = os.dup(top)
    parts = deque(_parts(path))
    walked: list[str] = []  # the components below root that ``fd`` is: ``..`` steps back along them
    links = 0
    try:
        while parts:
            part = parts.popleft()
            if part == "..":
                walked = walked[:-1]
                os.close(fd)
                fd = _descend(top, walked)
                continue
            if part == ".":  # "x/." and "x/": x must be a directory, as the kernel requires
                if not stat.S_ISDIR(os.fstat(fd).st_mode):
                    os.close(fd)
                    return None
                continue
            try:
                step = os.open(part, _OPEN_FLAGS, dir_fd=fd)
            except (FileNotFoundError, NotADirectoryError):
                os.close(fd)
                return None
            if stat.S_ISLNK(os.fstat(step).st_mode):
                links += 1
                try:
                    target = os.readlink(part, dir_fd=fd)
                finally:
                    os.close(step)
                if links > MAX_LINKS:
                    raise OSError(errno.ELOOP, f"more than {MAX_LINKS} symlinks", path)
                parts.extendleft(reversed(_parts(target)))
                if target.startswith("/"):
                    os.close(fd)
                    fd, walked = os.dup(top), []
                continue
            os.close(fd)
            fd = step
            walked.append(part)
            if parts and not stat.S_ISDIR(os.fstat(fd).st_mode):  # "file/.." or "file/x": nothing there
                os.close(fd)
                return None
    except BaseException:
        os.close(fd)
        raise
    finally:
        os.close(top)
    return fd


def _parts(path: str) -> list[str]:
    """The components of ``path`` to walk: repeated slashes are one, and a trailing slash is a
    ``.`` (what it names must be a directory), as the kernel reads a path."""
    found = [part for part in path.split("/")[1 if path.startswith("/") else 0:]]
    return [part or "." for n, part in enumerate(found) if part or n == len(found) - 1]


def _descend(top: int, parts: list[str]) -> int:
    """A descriptor of ``top``/``parts``, directories already walked (no symlink among them)."""
    fd = os.dup(top)
    for part in parts:
        step = os.open(part, _OPEN_FLAGS | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = step
    return fd


def resolved_path(fd: int) -> str:
    """The path of the object ``fd`` holds, as the kernel names it now."""
    return os.readlink(f"/proc/self/fd/{fd}")


def identify(source: str, fd: int) -> BoundSource:
    found = os.fstat(fd)
    return BoundSource(source=source, resolved=resolved_path(fd), device=found.st_dev, inode=found.st_ino)


def open_checked(sources: Iterable[tuple[str, str]], checked: Mapping[str, BoundSource]) -> dict[str, int]:
    """target → descriptor of each ``(source, target)`` that submit checked, each the very object
    it checked; raises :class:`SourceChanged` (closing what it opened) when one is not."""
    opened: dict[str, int] = {}
    try:
        for source, target in sources:
            recorded = checked.get(target)
            if recorded is None or recorded.source != source:
                continue
            fd = open_source(source)
            if fd is None:
                continue  # gone since: the probe reports the target absent
            opened[target] = fd
            found = os.fstat(fd)
            if (found.st_dev, found.st_ino) != (recorded.device, recorded.inode):
                raise SourceChanged(f"mount source {source!r} (target {target}) is no longer the object checked at "
                                    f"submit ({recorded.resolved}); it now leads to {resolved_path(fd)}. Nothing was "
                                    "bound: make the source a directory nothing swaps, and submit again")
    except BaseException:
        for fd in opened.values():
            os.close(fd)
        raise
    return opened
