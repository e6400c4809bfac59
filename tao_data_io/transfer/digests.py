"""Exact "is this local file the same bytes as that object?" answers, cheaply on reruns.

S3 ``LastModified`` has one-second resolution and local mtimes are coarse too, so a size +
time comparison is a guess. We compare content: a single-part ETag is the MD5 of the object,
a multipart ETag is the MD5 of the parts' MD5s plus ``-N`` (computable locally once the part
size is known). Hashing every file on every rerun would be slow, so a :class:`DigestStore`
remembers, per relative path, the file's stat identity and what its content is known to be:

* ``md5`` — the MD5 of the content, when it was hashed;
* ``etag`` — the ETag of the object this content was transferred from or to (recorded by the
  engine after a successful transfer; exact even for ETags that are not MD5s, e.g. SSE-KMS);
* ``multipart`` — multipart ETags computed for given part sizes.

A remembered entry is trusted only while the file's (size, mtime, ctime, inode) are
unchanged *and* the entry is not "racy": if the file's mtime lies within
:data:`RACY_WINDOW_NS` of when the entry was recorded, a same-size rewrite in the same
timestamp tick would be invisible, so the file is hashed again (the approach git uses for its
index). Downloads set the file's mtime to the object's LastModified (as ``aws s3 sync`` does),
so a freshly downloaded file is not racy unless the object itself is seconds old, and any later
write moves the mtime to "now", which no entry matches. ``ctime`` cannot be set by ``touch``,
so restoring an mtime does not hide a change either.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .listing import LocalFile
from ..fs import atomic_write, open_scanned, read_bounded

RACY_WINDOW_NS = 2_000_000_000
#: 2: the stat identity is one list (an older cache is simply rebuilt: it only costs a rehash).
_SCHEMA = 2


def stat_identity(local: LocalFile) -> list[int]:
    """What must be unchanged for a remembered digest to still describe the file: size, mtime,
    ctime and inode (a list: it is stored as JSON)."""
    return [local.size, local.mtime_ns, local.ctime_ns, local.ino]


@dataclass
class DigestEntry:
    #: :func:`stat_identity` of the file when the entry was recorded.
    identity: list[int]
    recorded_ns: int
    md5: str | None = None
    etag: str | None = None
    multipart: dict[str, str] = field(default_factory=dict)

    def same_stat(self, local: LocalFile) -> bool:
        return self.identity == stat_identity(local)

    def matches(self, local: LocalFile) -> bool:
        return self.same_stat(local) and self.recorded_ns - local.mtime_ns >= RACY_WINDOW_NS


def multipart_etag(local: LocalFile, part_size: int) -> str:
    """The ETag S3 gives an object uploaded from the scanned file ``local`` in parts of
    ``part_size`` bytes — read through its descriptor, to its scanned size (:func:`open_scanned`)."""
    part_digests = []
    fd = open_scanned(local.path, identity=local.identity, size=local.size)
    try:
        for start in range(0, local.size, part_size):  # one bounded read per part, in order
            part = hashlib.md5(usedforsecurity=False)
            for chunk in read_bounded(fd, min(part_size, local.size - start)):
                part.update(chunk)
            part_digests.append(part.digest())
    finally:
        os.close(fd)
    return hashlib.md5(b"".join(part_digests), usedforsecurity=False).hexdigest() + f"-{len(part_digests)}"


def multipart_count(etag: str) -> int | None:
    """N for a multipart ETag ``<hex>-N``; None for a plain or opaque ETag."""
    head, sep, tail = etag.rpartition("-")
    if sep and tail.isdigit() and len(head) == 32:
        return int(tail)
    return None


def is_md5_etag(etag: str) -> bool:
    return len(etag) == 32 and all(c in "0123456789abcdef" for c in etag.lower())


class DigestStore:
    """A JSON file of :class:`DigestEntry` by relative path; thread-safe; saved atomically.

    Losing the file only costs a rehash, never a wrong answer, so concurrent writers simply
    race for the last write.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._entries: dict[str, DigestEntry] = {}
        self._dirty = False
        if path is not None:
            self._entries = _load(path)

    def trusted(self, local: LocalFile) -> DigestEntry | None:
        entry = self.same_stat(local)
        return entry if entry is not None and entry.matches(local) else None

    def same_stat(self, local: LocalFile) -> DigestEntry | None:
        """The entry if the file's stat identity is unchanged, racy or not."""
        with self._lock:
            entry = self._entries.get(local.relative)
        return entry if entry is not None and entry.same_stat(local) else None

    def record(self, local: LocalFile, *, md5: str | None = None, etag: str | None = None,
               multipart: dict[str, str] | None = None, keep: DigestEntry | None = None) -> DigestEntry:
        """Remember what ``local``'s content is known to be (merging a still-valid ``keep``)."""
        entry = DigestEntry(stat_identity(local), time.time_ns(),
                            md5=md5 or (keep.md5 if keep else None),
                            etag=etag or (keep.etag if keep else None),
                            multipart={**(keep.multipart if keep else {}), **(multipart or {})})
        with self._lock:
            self._entries[local.relative] = entry
            self._dirty = True
        return entry

    def forget(self, relative: str) -> None:
        with self._lock:
            self._dirty |= self._entries.pop(relative, None) is not None

    def save(self) -> None:
        if self.path is None:
            return
        with self._lock:
            if not self._dirty:
                return
            payload = {"schema_version": _SCHEMA, "entries": {k: vars(v) for k, v in self._entries.items()}}
            self._dirty = False
        atomic_write(self.path, json.dumps(payload, separators=(",", ":")).encode())


def _load(path: Path) -> dict[str, DigestEntry]:
    try:
        data: Any = json.loads(path.read_text(encoding="utf-8"))
        if data.get("schema_version") != _SCHEMA:
            return {}
        return {rel: DigestEntry(**fields) for rel, fields in data["entries"].items()}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return {}  # a missing or damaged cache only costs a rehash
