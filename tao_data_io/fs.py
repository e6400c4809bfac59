"""Filesystem primitives the whole package shares: confinement, atomic publish, file locks,
file digests and "is this path inside that one".

Why one module: each of these is a property of the whole package ("nothing is ever written
outside the destination", "a reader never sees half a file", "two writers never interleave"),
and a second copy of any of them is a bug waiting to drift. Everything that writes, locks,
hashes or checks containment comes here.

**Confinement.** A relative name (an S3 key, an archive member, an annotation reference) is
accepted only in canonical form — no empty, ``.`` or ``..`` components, no leading ``/``, no
backslash, NUL or control character — because anything else either escapes the destination or
lets two different names map to one file. Existing directories on the way are checked too: a
symlink inside the destination is never followed.

**Temp names.** In-flight files and directories are named ``.tao-data-io-partial.<12 hex>.<name>``
beside their final path (same directory, so same filesystem, so the final ``rename`` is
atomic). The random token means two writers — threads or processes, even with the same PID in
two containers — never share one; names are cut by *bytes* so a 255-byte name still fits.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import secrets
import shutil
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import UnsafePathError

#: Per-destination state (digest cache, lock, markers) lives in a directory of this name beside
#: the destination (:func:`state_dir_for`); the name is reserved, never a transfer target.
STATE_DIR_NAME = ".tao-data-io"
#: In-flight files and directories carry this prefix until they are renamed into place.
TEMP_PREFIX = ".tao-data-io-partial."
_TOKEN_HEX = 12
#: The longest file name most filesystems accept, in bytes.
NAME_MAX_BYTES = 255
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_CHUNK = 1 << 20


# --------------------------------------------------------------------------- confinement
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


def state_dir_for(dest: Path) -> Path:
    """Where tao-data-io keeps what it knows about ``dest`` (digest cache, lock, markers, reports):
    ``<parent>/.tao-data-io/<name>/``, beside the tree and never inside it — a dataset loader that
    treats each sub-directory as a class must see exactly the data. Beside it (not in a cache
    directory) so a stage pod and a training pod that share the volume share it too. When the
    parent cannot hold it (a read-only parent of a mount point), a directory in the user's cache
    keyed by the destination's real path is used instead.
    """
    dest = Path(os.path.abspath(dest))
    beside = dest.parent / STATE_DIR_NAME / dest.name
    parent = dest.parent
    if beside.is_dir() or not parent.exists() or os.access(parent, os.W_OK):
        return beside  # writers create it (atomic_write and file_lock make their parents)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tao-data-io" / "state"
    return cache / hashlib.sha256(os.path.realpath(dest).encode()).hexdigest()[:32]


def is_within(path: str | os.PathLike[str], root: str | os.PathLike[str], *, resolve: bool = True) -> bool:
    """Whether ``path`` is ``root`` or lies below it. With ``resolve`` (the default) symlinks are
    resolved on both sides first, so a link cannot make an outside path look inside."""
    real = os.path.realpath(path) if resolve else os.fspath(path)
    real_root = os.path.realpath(root) if resolve else os.fspath(root)
    return real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep)


# --------------------------------------------------------------------------- temp names
def _temp_name(token: str, name: str) -> str:
    head = f"{TEMP_PREFIX}{token}."
    room = NAME_MAX_BYTES - len(head.encode())
    return head + name.encode("utf-8", "surrogateescape")[:room].decode("utf-8", "ignore")


def temp_path_for(final: Path) -> Path:
    """A fresh, unpredictable temp name beside ``final`` (same directory → same filesystem)."""
    return final.with_name(_temp_name(secrets.token_hex(_TOKEN_HEX // 2), final.name))


def final_name(temp_name: str) -> str | None:
    """The final name a temp name stands for, or None when it is not one of ours or was cut to
    fit :data:`NAME_MAX_BYTES` (then the final name cannot be known)."""
    token = temp_name[len(TEMP_PREFIX):len(TEMP_PREFIX) + _TOKEN_HEX]
    rest = temp_name[len(TEMP_PREFIX) + _TOKEN_HEX + 1:]
    if (not temp_name.startswith(TEMP_PREFIX) or not rest or _temp_name(token, rest) != temp_name
            or len(temp_name.encode("utf-8", "surrogateescape")) >= NAME_MAX_BYTES):
        return None
    return rest


def is_temp_name(name: str) -> bool:
    return name.startswith(TEMP_PREFIX)


def remove_stale_temps(final: Path) -> None:
    """Remove the temp files and directories that killed writers of ``final`` left beside it.

    Only call this while holding the lock that every writer of ``final`` holds: a temp name
    of a live writer looks exactly like a stale one.
    """
    try:
        entries = list(os.scandir(final.parent))
    except (FileNotFoundError, NotADirectoryError):
        return
    for entry in entries:
        if not entry.name.startswith(TEMP_PREFIX):
            continue
        token = entry.name[len(TEMP_PREFIX):len(TEMP_PREFIX) + _TOKEN_HEX]
        if not all(c in "0123456789abcdef" for c in token) or entry.name != _temp_name(token, final.name):
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            remove_if_exists(Path(entry.path))


def remove_if_exists(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


# --------------------------------------------------------------------------- atomic publish
def atomic_write(path: Path, data: bytes, *, mode: int = 0o644, replace: bool = True, durable: bool = False) -> bool:
    """Publish ``data`` at ``path`` whole or not at all; return whether this call created it.

    A unique temp file beside ``path``, written and fsynced, then:

    * ``replace=True``: renamed over ``path`` (the last writer wins);
    * ``replace=False``: hard-linked to ``path``, which never replaces an existing file — the
      call returns False and leaves the existing file alone (content-addressed files: the
      caller checks the existing bytes).

    ``durable`` also fsyncs the directory, so the new name survives a power loss (job records).
    The temp file is removed on every path out, so an interrupted call leaves nothing behind
    but, at worst, one temp file that :func:`remove_stale_temps` recognises.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = temp_path_for(path)
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


# --------------------------------------------------------------------------- locks
@contextmanager
def file_lock(path: Path, *, wait: bool = True, on_wait: Callable[[str], None] | None = None) -> Iterator[bool]:
    """Hold an exclusive ``flock`` on ``path`` (created 0600 if absent); yield True once held.

    With ``wait=False`` it yields False at once when another holder has it. ``on_wait`` is told
    (once) that this call is about to wait. The kernel drops the lock when its holder dies, so
    a killed process never wedges anyone. Lock files are never deleted: deleting one while
    another process waits on it would let two holders in at once.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
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


# --------------------------------------------------------------------------- digests
#: The algorithms :func:`file_digest` knows. ``git-blob-sha1`` is the Hub's id of a file kept in
#: git: sha1 over ``b"blob <size>\\0"`` followed by the content.
DIGEST_ALGORITHMS = ("md5", "sha256", "git-blob-sha1")


def file_digest(path: str | os.PathLike[str], algorithm: str) -> str:
    """The hex digest of the file at ``path``, read in 1 MiB chunks (memory stays flat)."""
    with open(path, "rb") as handle:
        if algorithm == "md5":
            digest = hashlib.md5(usedforsecurity=False)
        elif algorithm == "sha256":
            digest = hashlib.sha256()
        elif algorithm == "git-blob-sha1":
            digest = hashlib.sha1(b"blob %d\0" % os.fstat(handle.fileno()).st_size, usedforsecurity=False)
        else:
            raise ValueError(f"unknown digest algorithm {algorithm!r}; use one of {DIGEST_ALGORITHMS}")
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
