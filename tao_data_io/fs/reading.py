"""Reading files a job controls: what was scanned, no more bytes than were scanned, and a job's
own small files.

**Why.** A job can swap a file for a FIFO, a symlink or another file between the scan and the
read, or keep writing it while it is read. Each read here checks the descriptor, not the name, and
never reads past the scanned size, so a read of a job's file always ends and is of the file that
was scanned. Digests (:mod:`.digest`) and uploads read through it — but for a small file of the
user's own tree, which the upload opens here and obstore then reads whole by its descriptor's
link (:meth:`~tao_data_io.transfer.obstore_executor.ObstoreExecutor._upload`): a change meanwhile
is caught after the upload, which reports the file changed and leaves it for the next run.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from ..errors import UnsafePathError
from .confinement import open_directory_nofollow


_CHUNK = 1 << 20


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
