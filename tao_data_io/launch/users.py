"""Who a job runs as on the host: an unprivileged uid and gid, never root's.

Why in the launch seam: every backend that runs a job on this host's kernel (the local frame,
a Docker container without user namespaces, a SLURM job) gives it a host uid, and a job never holds host
root — root in a frame with every capability dropped still owns root's files and wrote the
host-wide ``kernel.core_pattern`` through ``/proc/sys``. One rule for the ids a target may name.
"""

from __future__ import annotations

import os
from typing import Annotated

from pydantic import BeforeValidator, ValidationInfo

from ..errors import UsageError

#: nobody:nogroup on Debian and Red Hat alike: owns nothing, so a job running as it reaches
#: nothing of the host's that is not world-readable.
NOBODY = 65534
#: ``(uid_t)-1``: no id (``setresuid`` and ``setpriv`` read it as "unchanged"); every id is below it.
MAX_ID = 2**32 - 1


def unprivileged_id(value: object, field: str) -> int | None:
    """``value`` (a form's text, a number, or empty: None) as an id the kernel gives a process,
    other than root's; a ``ValueError`` naming ``field`` and the fix otherwise. 0 is root, and
    ``(uid_t)-1`` (4294967295) is no id at all — setpriv reads it as "leave the id as it is",
    which for a backend run by root is root."""
    if value is None or value == "":  # a form's empty field
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{field} {value!r} is not a numeric id: give a number (`id -u NAME` prints a user's), or "
                         "leave it empty for the default")
    if not 0 < value < MAX_ID:
        what = "root" if value == 0 else f"not an id (ids are 1 to {MAX_ID - 1})"
        raise ValueError(f"{field} {value} is {what}: a job never holds host root; give an unprivileged id, or leave "
                         "it empty for the default")
    return value


def _checked_id(value: object, info: ValidationInfo) -> int | None:
    return unprivileged_id(value, str(info.field_name))


#: A settings field naming whom a job runs as (``run_as_user``, ``run_as_group``): an unprivileged
#: id or empty, checked by :func:`unprivileged_id` under the field's own name.
JobId = Annotated[int | None, BeforeValidator(_checked_id)]


def default_ids() -> tuple[int, int]:
    """Whom a job runs as when its target names no one: the user that runs the backend, so its
    results are theirs — or, for a backend run by root, nobody."""
    if os.geteuid() == 0:
        return NOBODY, NOBODY
    return os.geteuid(), os.getegid()


def job_ids(run_as_user: int | None, run_as_group: int | None, backend: str) -> tuple[int, int]:
    """Whom a job of a backend that starts it as another user (Docker, SLURM) runs as: a backend
    run by root runs it as the target's ids, else nobody; an unprivileged backend can only run
    it as itself — so what the job writes stays its to take back and upload — and a target that
    names someone else is refused, naming the field."""
    me = os.geteuid()
    if me == 0:
        return run_as_user or NOBODY, run_as_group or NOBODY
    for field, asked, mine in (("run_as_user", run_as_user, me), ("run_as_group", run_as_group, os.getegid())):
        if asked is not None and asked != mine:
            raise UsageError(f"{field} is {asked}, but this {backend} backend runs as uid {me}: its jobs run as it, so "
                             f"their results stay its to take back and upload. Leave {field} empty, or run the "
                             "backend as root")
    return me, os.getegid()
