"""The compute frame's own paths: where the config and the verify probe are mounted, which
directories the frame needs for itself, and what makes a path usable as a place the job sees.

Why a module of its own, below the request: the request's validator refuses a target over the
frame's own directories, staging places the config under the config mount, and the backends
mount the probe at its directory; each reads these rules here, so they exist once and no low
module reaches up into staging for them.
"""

from __future__ import annotations

import posixpath

#: Where the materialized config is mounted read-only inside the compute frame.
CONFIG_MOUNT_DIR = "/tao-action-config"
#: Where the verify probe's script and checklist are mounted read-only inside the frame.
PROBE_DIR = "/tao-data-io-verify"
#: The frame's own directories: an input or results directory there would hide the system the
#: command runs on (or our own mounts), so a target inside any of them is refused.
SHADOWED_DIRS = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/sbin", "/sys",
                 "/usr", CONFIG_MOUNT_DIR, PROBE_DIR)


def check_frame_target(value: str, *, what: str) -> str:
    """A path the frame sees an input or results at: usable, and not over the frame's own."""
    check_container_path(value, what=what)
    shadowed = next((d for d in SHADOWED_DIRS if value == d or value.startswith(d + "/")), None)
    if shadowed is not None:
        raise ValueError(f"{what} {value!r} shadows {shadowed}, which the frame needs for itself; put it under a "
                         "directory of its own such as /data")
    return value


def check_container_path(value: str, *, what: str) -> str:
    """An absolute, normalised POSIX path that is not ``/`` (mount targets, results dirs)."""
    problem = None
    if not value.startswith("/"):
        problem = "it is not absolute"
    elif value == "/":
        problem = "it is the root directory"
    elif posixpath.normpath(value) != value or "//" in value:
        problem = "it is not normalised (no '..', '.', '//' or trailing '/')"
    elif any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value):
        problem = "it contains a control character"
    if problem:
        raise ValueError(f"{what} {value!r} is not usable: {problem}; write an absolute path such as /data/coco")
    return value
