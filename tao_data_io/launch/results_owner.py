"""The host results directory between the host and the job's user: handed to that user before the
command starts, and taken back once every frame of the job has ended.

Why: a job started by root runs as another user (the local backend's ``run_as``, a Docker
container's ``user``), so the directory it writes — and what an earlier attempt left there and a
retry restored — must be that user's. And what the
job leaves behind is the host's from then on: a setuid or setgid program in it runs with the
job's user for whoever executes it (a host user then read another job's credentials out of its
``/proc/<pid>/environ``), a device node is a door to a device, and what the job left writable —
by its user, its group or anyone (a mode, a POSIX ACL granting another uid) — others could change
after the job. So once its frames are gone, before anything reports the job ended: every mode is
made ``0755``/``0644`` at most (owner write kept, every setuid, setgid, sticky and group or other
write bit gone), POSIX ACLs and file capabilities are removed, special files (devices, FIFOs,
sockets: no result is one) are removed, and — when the backend runs as root — everything is
given back to the backend's user.

What this cannot reach: a descriptor another process of the job's user opened while the job ran
(through ``/proc/<pid>/root``) keeps working after; which is why the job's user should be a uid
of its own (``run_as_user``), not one a daemon shares.

Both walk the tree from a descriptor, never following a symlink, depth first with one open
directory per level and no recursion: a job's tree may be thousands of directories deep (Python's
``os.fwalk`` recursed, hit its limit and left setuid files behind). A directory deeper than
:data:`MAX_DEPTH` is not entered: it is closed instead (the backend's user's alone, mode 0700),
so nothing below it is reachable by anyone else.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ..console import shown
from ..errors import BackendError
from .binding import BoundSource, open_source

#: What a job may not leave on a file or directory: privileges for whoever runs it, and a way in
#: for anyone but the owner.
_KEPT_BITS = 0o755
_PRIVILEGE_BITS = stat.S_ISUID | stat.S_ISGID
#: Extended attributes that grant more than the mode says: POSIX ACLs and file capabilities.
_GRANTING_ATTRIBUTES = ("system.posix_acl_access", "system.posix_acl_default", "security.capability")
#: How deep a walk goes: results are a few levels deep; a job's deeper tree is closed, not entered.
MAX_DEPTH = 64
#: How many changes a walk names; the rest are counted.
NAMED_CHANGES = 20
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Changes:
    """What a walk did, said in a bounded number of lines."""

    def __init__(self) -> None:
        self.named: list[str] = []
        self.unnamed = 0

    def say(self, line: str) -> None:
        if len(self.named) < NAMED_CHANGES:
            self.named.append(line)
        else:
            self.unnamed += 1

    def lines(self) -> list[str]:
        return self.named + ([f"… and {self.unnamed} more changes like these"] if self.unnamed else [])


def hand_over(directory: int, uid: int, gid: int) -> list[str]:
    """Give the tree under the directory descriptor ``directory`` (itself included) to ``uid:gid``;
    what could not be (a directory too deep, not entered), one line each."""
    changes = Changes()

    def entry(parent: int, name: str, found: os.stat_result, where: str) -> None:
        os.chown(name, uid, gid, dir_fd=parent, follow_symlinks=False)

    def own(fd: int, where: str) -> None:
        for name in _granting_attributes(fd):  # a directory someone else made must not grant them a way in
            os.removexattr(fd, name)
        os.fchmod(fd, stat.S_IMODE(os.fstat(fd).st_mode) & _KEPT_BITS)
        os.fchown(fd, uid, gid)

    _walk(directory, on_directory=own, on_entry=entry,
          too_deep=lambda fd, where: changes.say(f"not handed over, deeper than {MAX_DEPTH} levels: {shown(where)}"),
          changes=changes)
    return changes.lines()


def hand_over_checked(results: BoundSource, uid: int, gid: int) -> list[str]:
    """Give the results directory — the very object submit checked (``results``), not whatever
    its name leads to now — and what a retry restored into it to ``uid:gid`` (:func:`hand_over`)."""
    changed = BackendError(f"the results directory {results.source} changed while the job was being submitted; "
                           "submit again", retryable=True)
    fd = open_source(results.source)
    if fd is None:
        raise changed
    try:
        found = os.fstat(fd)
        if (found.st_dev, found.st_ino) != (results.device, results.inode):
            raise changed
        return hand_over(fd, uid, gid)
    finally:
        os.close(fd)


def take_back(directory: int, owner: tuple[int, int] | None) -> list[str]:
    """Once the job has ended: make the tree under the directory descriptor ``directory`` grant
    nothing (see the module docstring) and give it all to ``owner`` (uid, gid; None: leave owners
    as they are — an unprivileged backend, whose job ran as itself). What was done, in a bounded
    number of lines (paths relative to the directory, escaped: a name is the job's). An entry
    that changes meanwhile is said and passed over; the rest is still taken back."""
    changes = Changes()

    def own(fd: int, where: str) -> None:
        mode = stat.S_IMODE(os.fstat(fd).st_mode)
        if mode & _PRIVILEGE_BITS:
            changes.say(f"cleared the setuid/setgid bits of {shown(where)}")
        if mode & ~_KEPT_BITS:
            os.fchmod(fd, mode & _KEPT_BITS)
        for name in _granting_attributes(fd):
            os.removexattr(fd, name)
            changes.say(f"removed {name} from {shown(where)}")
        if owner is not None:
            os.fchown(fd, *owner)

    def entry(parent: int, name: str, found: os.stat_result, where: str) -> None:
        if stat.S_ISREG(found.st_mode):
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=parent)
            try:
                own(fd, where)
            finally:
                os.close(fd)
        elif stat.S_ISLNK(found.st_mode):
            if owner is not None:
                os.chown(name, *owner, dir_fd=parent, follow_symlinks=False)
        else:  # a device, a FIFO, a socket: no result is one
            os.unlink(name, dir_fd=parent)
            changes.say(f"removed the special file {shown(where)}")

    def close(fd: int, where: str) -> None:
        own(fd, where)
        os.fchmod(fd, 0o700)
        changes.say(f"closed {shown(where)}: deeper than {MAX_DEPTH} levels, not walked, now the backend's user's "
                    "alone")

    _walk(directory, on_directory=own, on_entry=entry, too_deep=close, changes=changes)
    return changes.lines()


def _granting_attributes(fd: int) -> list[str]:
    """The extended attributes of ``fd`` that grant more than its mode (a filesystem without any
    has none)."""
    try:
        names = os.listxattr(fd)
    except OSError as exc:
        if exc.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
            return []
        raise
    return [name for name in names if name in _GRANTING_ATTRIBUTES]


def _walk(top: int, *, on_directory: Callable[[int, str], None],
          on_entry: Callable[[int, str, os.stat_result, str], None], too_deep: Callable[[int, str], None],
          changes: Changes) -> None:
    """Call ``on_directory`` for each directory under ``top`` (itself included) and ``on_entry``
    for everything else, never following a link; ``too_deep`` for a directory past
    :data:`MAX_DEPTH`, which is not entered. A directory that cannot be entered is said and left."""
    with _opened(".", top) as root:
        on_directory(root, ".")
        stack: list[tuple[int, str, Iterator[os.DirEntry[str]]]] = []
        try:
            stack.append((root, ".", _listing(root)))
            while stack:
                parent, path, entries = stack[-1]
                entry = next(entries, None)
                if entry is None:
                    stack.pop()
                    if parent != root:
                        os.close(parent)
                    continue
                where = entry.name if path == "." else f"{path}/{entry.name}"
                try:
                    found = entry.stat(follow_symlinks=False)
                    if not stat.S_ISDIR(found.st_mode):
                        on_entry(parent, entry.name, found, where)
                        continue
                    child = os.open(entry.name, _DIRECTORY, dir_fd=parent)
                except OSError as exc:  # gone or swapped meanwhile (another process of the job's user), unreadable
                    changes.say(f"not taken: {shown(where)} ({exc.strerror})")
                    continue
                try:
                    on_directory(child, where)
                    if len(stack) >= MAX_DEPTH:
                        too_deep(child, where)
                        os.close(child)
                        continue
                    stack.append((child, where, _listing(child)))
                except OSError as exc:
                    os.close(child)
                    changes.say(f"not walked: {shown(where)} ({exc.strerror})")
        finally:
            for parent, _, _ in stack:
                if parent != root:
                    os.close(parent)


def _listing(directory: int) -> Iterator[os.DirEntry[str]]:
    """The entries of the open directory ``directory``, read as they are needed (opened now: a
    directory that cannot be read fails here, not at the first entry)."""
    scanner = os.scandir(directory)

    def entries() -> Iterator[os.DirEntry[str]]:
        with scanner:
            yield from scanner

    return entries()


@contextmanager
def _opened(name: str, parent: int) -> Iterator[int]:
    fd = os.open(name, _DIRECTORY, dir_fd=parent)
    try:
        yield fd
    finally:
        os.close(fd)


def take_back_results(results: Path) -> list[str]:
    """The results directory at ``results`` (never through a link), the job's no more
    (:func:`take_back`), given to this backend's user when it runs as root."""
    try:
        fd = os.open(results, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        return [f"the results directory could not be taken back: {exc.strerror}"]
    try:
        return take_back(fd, (os.geteuid(), os.getegid()) if os.geteuid() == 0 else None)
    finally:
        os.close(fd)
