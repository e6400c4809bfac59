"""The host programs a backend runs (bubblewrap, nsenter, setpriv), and how to install each when it is missing.

Why one place: submit, preflight, the supervisor's frame and the tests look each tool up the same
way, and a missing one is a usage error whose fix is one package away.
"""

from __future__ import annotations

import shutil

from ..errors import UsageError

_UTIL_LINUX = "install it: apt-get install util-linux (Debian, Ubuntu), dnf install util-linux (Fedora, RHEL)"
BWRAP_INSTALL = "install it: apt-get install bubblewrap (Debian, Ubuntu), dnf install bubblewrap (Fedora, RHEL)"
NSENTER_INSTALL = _UTIL_LINUX
SETPRIV_INSTALL = _UTIL_LINUX


def find_tool(name: str, install: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise UsageError(f"{name} is not installed here (not on PATH), and the backend needs it: {install}")
    return path
