"""Locks: an exclusive file lock, and the lock every writer of a destination holds.

**Why.** Two writers of one destination (two stage pods on one volume, a retry beside a
straggler, a ``cp`` into a synced directory) must never interleave, and a killed holder must never
wedge the rest: ``flock`` on a file that is never deleted gives both. A destination's lock lives in
its state directory (:mod:`.state`), which is checked before the lock file is opened.
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from .state import not_own, open_state_dir, state_dir_for, state_refusal


def _lock_name(part: str | None) -> str:
    return "lock" if part is None else f"lock.{part}"


def destination_lock_path(dest: Path, part: str | None = None) -> Path:
    """The lock every writer of ``dest`` holds (a sync, a copy into it, an extraction, a model
    pull), or — with ``part`` — the lock of one part of it (a shard, whose writers touch only
    its own keys). Held through :func:`destination_lock`."""
    return state_dir_for(dest) / _lock_name(part)


@contextmanager
def destination_lock(dest: Path, part: str | None = None) -> Iterator[Path]:
    """Hold the lock every writer of ``dest`` holds (:func:`destination_lock_path`) and yield its
    path; its state directory is made and checked first (:func:`open_state_dir`), and the lock
    file is opened from that directory's descriptor without following a link and refused unless
    it is this process's own — a lock another user made is one they could hold for ever."""
    dest = Path(os.path.abspath(dest))
    directory, dir_fd = open_state_dir(dest)
    lock = directory / _lock_name(part)
    try:
        fd = os.open(lock.name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise state_refusal(dest, lock, "is a symlink; it is never followed") from None
    finally:
        os.close(dir_fd)
    try:
        problem = not_own(os.fstat(fd), directory=False)
        if problem is not None:
            raise state_refusal(dest, lock, problem)
    except BaseException:
        os.close(fd)
        raise
    with _holding(fd, lock, wait=True, on_wait=None):
        yield lock


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
