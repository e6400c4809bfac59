"""Atomic writes: a file published at its path whole or not at all.

**Why.** A reader must never see half a file (a job record, a staging map, a marker): every file
tao-data-io writes whole goes through :func:`atomic_write` — a temp file beside the path
(:mod:`.temp`), fsynced, then renamed over it or hard-linked to it.
"""

from __future__ import annotations

import os
from pathlib import Path

from .temp import UNLOCKED, remove_if_exists, temp_path_for


def atomic_write(path: Path, data: bytes, *, mode: int = 0o644, replace: bool = True, durable: bool = False,
                 tag: str = UNLOCKED) -> bool:
    """Publish ``data`` at ``path`` whole or not at all; return whether this call created it.

    A unique temp file beside ``path``, written and fsynced, then:

    * ``replace=True``: renamed over ``path`` (the last writer wins);
    * ``replace=False``: hard-linked to ``path``, which never replaces an existing file — the
      call returns False and leaves the existing file alone (content-addressed files: the
      caller checks the existing bytes).

    ``durable`` also fsyncs the directory, so the new name survives a power loss (job records).
    The temp file is removed on every path out, so an interrupted call leaves nothing behind
    but, at worst, one temp file that :func:`~tao_data_io.fs.temp.remove_stale_temps` recognises — for the ``tag``
    (:func:`~tao_data_io.fs.temp.lock_tag`) of the lock the caller holds while writing ``path``.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = temp_path_for(path, tag)
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
