"""Temp names: what an in-flight file is called, who owns it, and removing those killed writers left.

**Why.** In-flight files and directories are named ``.tao-data-io-partial.<tag>-<12 hex>.<name>``
beside their final path (same directory, so same filesystem, so the final ``rename`` is atomic).
The random part means two writers — threads or processes, even with the same PID in two
containers — never share one; names are cut by *bytes* so a 255-byte name still fits. The tag
names the lock its writer held (:func:`lock_tag`): a sweep run under a lock removes only temp
names of that lock, the only ones it can prove abandoned — a sync into ``/data`` never touches the
in-flight files of a sync into ``/data/sub``, which holds another lock.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import threading
from pathlib import Path

from .confinement import NAME_MAX_BYTES, TEMP_PREFIX


_TAG_HEX = 8
_TOKEN_HEX = 12
#: Temp-name tokens read from the OS's random source at once.
_TOKENS_READ = 512
#: The tag of temp names no lock guards: no sweep ever removes them; their writer does.
UNLOCKED = "0" * _TAG_HEX
_TEMP_HEAD = re.compile(rf"{re.escape(TEMP_PREFIX)}([0-9a-f]{{{_TAG_HEX}}})-[0-9a-f]{{{_TOKEN_HEX}}}\.")


def lock_tag(lock: Path) -> str:
    """The tag part of the temp names written under ``lock`` (8 hex of its absolute path).

    Why: a temp name looks the same whether its writer was killed or is still writing. Only the
    holder of the lock every such writer holds can tell: while it holds the lock, a temp name of
    that lock's tag is provably abandoned; any other temp name may belong to a live writer of
    another destination (a sync into a sub-directory, an extraction beside it) and is left alone.
    """
    return hashlib.sha256(os.fsencode(os.path.abspath(lock))).hexdigest()[:_TAG_HEX]


class _Tokens:
    """Unpredictable hex tokens from the OS's random source, read :data:`_TOKENS_READ` at a time:
    a download names a temp file for every object, and one ``getrandom`` call each was a tenth of
    what its loop thread spent outside the transfers (py-spy, 10,000 × 1 KiB). Unpredictable, so a
    job that can write the destination cannot plant a name a temp file will take."""

    def __init__(self) -> None:
        self._forget()
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        """Start with no token read (and a lock no other thread holds): a forked child must not
        reuse its parent's tokens."""
        self._lock = threading.Lock()
        self._hex, self._at = "", 0

    def next(self) -> str:
        with self._lock:
            if self._at >= len(self._hex):
                self._hex, self._at = os.urandom(_TOKENS_READ * _TOKEN_HEX // 2).hex(), 0
            token = self._hex[self._at:self._at + _TOKEN_HEX]
            self._at += _TOKEN_HEX
            return token


_tokens = _Tokens()


def temp_name(name: str, tag: str = UNLOCKED) -> str:
    """A fresh, unpredictable temp name for ``name``, tagged ``tag``, cut to fit
    :data:`NAME_MAX_BYTES` by bytes."""
    return _fit(f"{TEMP_PREFIX}{tag}-{_tokens.next()}.", name)


def _fit(head: str, name: str) -> str:
    room = NAME_MAX_BYTES - len(head.encode())
    return head + name.encode("utf-8", "surrogateescape")[:room].decode("utf-8", "ignore")


def temp_path_for(final: Path, tag: str = UNLOCKED) -> Path:
    """A fresh temp name beside ``final`` (same directory → same filesystem)."""
    return final.with_name(temp_name(final.name, tag))


def temp_tag(name: str) -> str | None:
    """The tag of a temp name of ours, or None for any other name."""
    match = _TEMP_HEAD.match(name)
    return match.group(1) if match else None


def is_temp_name(name: str) -> bool:
    return name.startswith(TEMP_PREFIX)


def remove_stale_temps(final: Path, tag: str) -> None:
    """Remove the temp files and directories for ``final`` that killed writers under the lock of
    ``tag`` left beside it.

    Only call this while holding that lock: a temp name of a live writer looks exactly like a
    stale one, and only the lock tells them apart.
    """
    try:
        entries = list(os.scandir(final.parent))
    except (FileNotFoundError, NotADirectoryError):
        return
    for entry in entries:
        match = _TEMP_HEAD.match(entry.name)
        if match is None or match.group(1) != tag or entry.name != _fit(match.group(0), final.name):
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
