"""The write probe: before a byte moves, a stage proves that whoever runs it can write where it
stages, and otherwise says which directory refuses it and what to change.

Why first: a tier B stage pod runs as the stager image's user (uid 1000) and the root of a freshly
provisioned volume is typically ``root:root 0755``. The pod's ``fsGroup`` makes the volume
group-writable — but only on volumes whose plugin applies it: in-tree NFS and hostPath volumes
never do ("do not support ownership management", core/v1 API), nor a CSI driver whose
``fsGroupPolicy`` is ``None``, nor one with the default ``ReadWriteOnceWithFSType`` for a claim
that is not ReadWriteOnce — exactly the ReadWriteMany claim a shared stage cache uses. Without
the probe that stage fails deep in a transfer with a bare EACCES, after its retries; with it the
stage refuses at once (an :class:`~tao_data_io.errors.UnwritableError`: exit 3, which the stage
Job's pod failure policy ends the Job on) naming the directory, its owner and mode, the identity, and
the fix.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path

from ..errors import UnwritableError

#: Group-writable, setgid (what a pod's fsGroup would have made it): files created below keep
#: the group, so every stage pod of any job can write them.
SHARED_MODE = 0o2775
_REFUSED = (errno.EACCES, errno.EPERM, errno.EROFS)


def prove_writable(directory: Path, *, what: str) -> None:
    """Create ``directory`` (and its parents) and a file in it, then remove the file; raise
    :class:`UnwritableError` naming the directory that refused and the fix when this identity
    cannot. The probe file has a unique name, so concurrent stages never meet."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        handle, probe = tempfile.mkstemp(prefix=".tao-data-io-write-probe-", dir=directory)
        os.close(handle)
        os.unlink(probe)
    except FileExistsError:  # a file, or a dangling symlink, where a directory belongs
        in_the_way = next((p for p in (directory, *directory.parents)
                           if p.is_symlink() or p.exists() and not p.is_dir()), directory)
        raise UnwritableError(f"{what} {directory} cannot be created: {in_the_way} is in the way (a file or a "
                              "symlink, not a directory); remove it or choose another path") from None
    except OSError as exc:
        if exc.errno not in _REFUSED:
            raise
        blocker, missing = _refusing(directory)
        info = os.stat(blocker)
        raise UnwritableError(unwritable_message(
            what=what, directory=str(directory), blocker=str(blocker),
            missing=None if missing is None else str(missing),
            owner=(info.st_uid, info.st_gid), mode=stat.S_IMODE(info.st_mode), uid=os.geteuid(), groups=_groups(),
            read_only=exc.errno == errno.EROFS)) from None


def unwritable_message(*, what: str, directory: str, blocker: str, missing: str | None, owner: tuple[int, int],
                       mode: int, uid: int, groups: Sequence[int], read_only: bool = False) -> str:
    """The refusal, from the facts: which directory refused (``blocker``, the deepest one there),
    the first one missing below it on the way (None: ``blocker`` is ``directory``), who owns the
    blocker with which mode, who asked — and the one directory to fix, so every job after is fixed
    too: the missing one to pre-create, or the blocker to open to the group."""
    if read_only:
        return (f"{what} {directory} cannot be written: {blocker} is on a read-only filesystem; mount the volume "
                "read-write for the stage")
    gid = groups[0] if groups else uid
    fix = (f"pre-create {missing} on the volume, group-owned by gid {gid} and group-writable (`mkdir {missing} && "
           f"chgrp {gid} {missing} && chmod {SHARED_MODE:o} {missing}`; the stage makes what lies below it)"
           if missing is not None else
           f"make {blocker} group-owned by gid {gid} and group-writable (`chgrp {gid} {blocker} && chmod "
           f"{SHARED_MODE:o} {blocker}`)")
    return (f"{what} {directory} cannot be written by this stage (uid {uid}, groups "
            f"{','.join(str(g) for g in groups)}): {blocker} is owned by {owner[0]}:{owner[1]} with mode {mode:04o}, "
            "so the volume did not apply the pod's fsGroup (NFS and hostPath volumes never do, nor a CSI driver whose "
            "fsGroupPolicy is None, or is the default ReadWriteOnceWithFSType for a claim that is not ReadWriteOnce). "
            f"Fix: {fix}, or use a storage class whose CSI driver applies fsGroup (fsGroupPolicy: File)")


def _refusing(directory: Path) -> tuple[Path, Path | None]:
    """(the deepest directory on the way to ``directory`` that exists, the first one below it that
    is missing — or that cannot be looked at, its parent not being searchable —, None when the
    blocker is ``directory`` itself)."""
    reached = Path(directory.anchor or "/")
    for part in directory.relative_to(reached).parts:
        below = reached / part
        try:
            os.lstat(below)
        except (FileNotFoundError, PermissionError):
            return reached, below
        reached = below
    return reached, None


def _groups() -> list[int]:
    """The effective gid first, then the supplementary groups (a pod's fsGroup is one)."""
    return list(dict.fromkeys([os.getegid(), *os.getgroups()]))
