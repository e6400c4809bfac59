"""The host results directory between the host and the job's user: handed to that user before the
command starts, and disarmed once every frame of the job has ended.

Why: a job started by root runs as another user (:mod:`.run_as`), so the directory it writes —
and what an earlier attempt left there and a retry restored — must be that user's. And what the
job leaves behind is the host's from then on: a setuid or setgid program in it runs with the
job's user for whoever executes it, and a device node is a door to a device. The job itself can
make neither of those harmful while it runs (it is never root, every mount is ``nosuid``, it has
no ``CAP_MKNOD``), so once its frames are gone their bits are cleared and device nodes removed,
before anything reports the job ended.

Both walk the tree from a descriptor, never following a symlink (``os.fwalk``), so nothing the
job planted leads them outside it.
"""

from __future__ import annotations

import os
import stat

#: What a job may not leave on a file: privileges for whoever runs it.
_PRIVILEGE_BITS = stat.S_ISUID | stat.S_ISGID


def hand_over(directory: int, uid: int, gid: int) -> None:
    """Give the tree under the directory descriptor ``directory`` (itself included) to ``uid:gid``."""
    for _, _, names, parent in os.fwalk(".", dir_fd=directory, follow_symlinks=False):
        os.fchown(parent, uid, gid)
        for name in names:
            os.chown(name, uid, gid, dir_fd=parent, follow_symlinks=False)


def disarm(directory: int) -> list[str]:
    """Clear the setuid and setgid bits and remove the device nodes in the tree under the
    directory descriptor ``directory``; what was done, one line each (paths relative to it).
    A directory the walk cannot enter is left as it is and said."""
    done: list[str] = []

    def unreadable(error: OSError) -> None:
        done.append(f"not walked: {error.filename} ({error.strerror})")

    for path, _, names, parent in os.fwalk(".", dir_fd=directory, follow_symlinks=False, onerror=unreadable):
        _clear_privileges(parent, os.path.normpath(path), done)
        for name in names:
            found = os.stat(name, dir_fd=parent, follow_symlinks=False)
            where = os.path.normpath(os.path.join(path, name))
            if stat.S_ISCHR(found.st_mode) or stat.S_ISBLK(found.st_mode):
                os.unlink(name, dir_fd=parent)
                done.append(f"removed the device node {where}")
            elif stat.S_ISREG(found.st_mode) and found.st_mode & _PRIVILEGE_BITS:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=parent)
                try:
                    _clear_privileges(fd, where, done)
                finally:
                    os.close(fd)
    return done


def _clear_privileges(fd: int, where: str, done: list[str]) -> None:
    mode = os.fstat(fd).st_mode
    if mode & _PRIVILEGE_BITS:
        os.fchmod(fd, stat.S_IMODE(mode) & ~_PRIVILEGE_BITS)
        done.append(f"cleared the setuid/setgid bits of {where}")
