"""Confinement: turning untrusted names (S3 keys, archive members, annotation references) into
paths that can only land inside their destination.

Why one module: "nothing is ever written outside the destination" is a property of the whole
package, so there is exactly one check, used by the transfer engine, the archive extractor and
the selective downloader alike.

A relative name is accepted only in canonical form — no empty, ``.`` or ``..`` components, no
leading ``/``, no backslash, NUL or control character — because anything else either escapes
the destination or lets two different keys map to one file. The destination's existing
directories are also checked: a symlink inside the destination is never followed.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import stat
from pathlib import Path

from .errors import UnsafePathError

#: Per-destination state (digest cache, markers) lives here; it is never a transfer target.
STATE_DIR_NAME = ".tao-data-io"
#: In-flight downloads are written under this prefix in the final file's directory and renamed
#: into place when complete, so an interrupted run never leaves a truncated file under a
#: final name. A rerun removes leftovers with this prefix.
TEMP_PREFIX = ".tao-data-io-partial."
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _problem(relative: str) -> str | None:
    """Say why ``relative`` is not a safe canonical relative POSIX path, or None if it is."""
    if relative == "":
        return "it is empty"
    if "\x00" in relative:
        return "it contains a NUL character"
    if _CONTROL.search(relative):
        return "it contains a control character"
    if "\\" in relative:
        return "it contains a backslash"
    if relative.startswith("/"):
        return "it is absolute"
    parts = relative.split("/")
    if ".." in parts:
        return "it contains a '..' component"
    if "" in parts or "." in parts:
        return "it is not in canonical form (empty or '.' component)"
    if STATE_DIR_NAME in parts:
        return f"{STATE_DIR_NAME}/ is reserved for tao-data-io's own state"
    if parts[-1].startswith(TEMP_PREFIX):
        return f"names starting with {TEMP_PREFIX!r} are reserved for in-flight downloads"
    return None


def check_relative(relative: str, *, what: str) -> str:
    """Return ``relative`` if it is a safe relative path; else raise naming ``what`` and why."""
    problem = _problem(relative)
    if problem:
        raise UnsafePathError(f"refusing {what} {relative!r}: {problem}, so it could land outside the destination")
    return relative


def confined_path(root: Path, relative: str, *, what: str) -> Path:
    """``root / relative`` after checking the name and that no existing directory on the way is
    a symlink or a non-directory (so the write cannot be redirected outside ``root``)."""
    check_relative(relative, what=what)
    current = root
    for part in relative.split("/")[:-1]:
        current = current / part
        try:
            mode = current.lstat().st_mode
        except FileNotFoundError:
            break  # the rest will be created fresh by us
        if stat.S_ISLNK(mode):
            raise UnsafePathError(f"refusing {what} {relative!r}: {current} is a symlink; it is never followed")
        if not stat.S_ISDIR(mode):
            raise UnsafePathError(f"refusing {what} {relative!r}: {current} exists and is not a directory")
    return root / relative


def temp_path_for(final: Path) -> Path:
    """A fresh, unpredictable temp name beside ``final`` (same directory → same filesystem)."""
    return final.with_name(f"{TEMP_PREFIX}{secrets.token_hex(6)}.{final.name}"[:255])


def is_temp_name(name: str) -> bool:
    return name.startswith(TEMP_PREFIX)


def atomic_write(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Publish ``data`` at ``path`` whole or not at all: a unique temp file beside it, fsync,
    rename. Concurrent writers never share a temp file; the last rename wins."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = temp_path_for(path)
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        remove_if_exists(temp)
        raise


def remove_stale_temp_dirs(dest: Path) -> None:
    """Remove the temp directories (named by :func:`temp_path_for`) that a killed extraction or
    model pull left beside ``dest``. Callers own ``dest``: one extraction or pull at a time."""
    try:
        entries = list(dest.parent.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return
    for entry in entries:
        token, _, name = entry.name[len(TEMP_PREFIX):].partition(".")
        if entry.name.startswith(TEMP_PREFIX) and name == dest.name and all(c in "0123456789abcdef" for c in token) \
                and entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)


def remove_if_exists(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
