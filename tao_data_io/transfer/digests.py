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

**Where it lives: SQLite, one row per file.** A JSON file rewritten whole was 18.8 MB at 100,000
files and held every entry in memory (``bench/digests.py`` measures it against an append-only
log and SQLite). Here each lookup is one indexed read, each record one upsert — in WAL mode,
written :data:`COMMIT_EVERY` records at a time (and by :meth:`DigestStore.save`), so a run that
changes 20 files writes about 20 rows, memory stays SQLite's page cache, and a run killed
mid-way loses only the entries recorded since the last write (a rehash, never a wrong answer).
A cache left by a version before (``digests.json``) is imported once, then removed.

**Whose it is.** A store vouches for files, so one planted by another user (who could write the
state directory before it was ours) could keep a stale file in place: a store, WAL or legacy
cache that is not this process's own regular file (judged on its descriptor,
:func:`tao_data_io.fs.state.check_own_file`) is set aside unread, as a damaged one is — a rehash, never
a wrong answer, and never a failed run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .local_walk import LocalFile
from ..errors import UnsafePathError
from ..fs.reading import open_scanned, read_bounded
from ..fs.state import check_own_file, read_state_file

log = logging.getLogger(__name__)

RACY_WINDOW_NS = 2_000_000_000
#: 3: one SQLite row per file (2 was one JSON document; a cache of 2 is imported once).
_SCHEMA = 3
#: Records written at once, in one transaction: a commit in WAL mode costs a write of the pages it
#: changed, so one per file would cost more than the bookkeeping it saves; a killed run loses at
#: most these (a rehash).
COMMIT_EVERY = 256
#: How long a writer waits for another process's commit (two runs sharing an upload cache).
_BUSY_MS = 30_000


def stat_identity(local: LocalFile) -> list[int]:
    """What must be unchanged for a remembered digest to still describe the file: size, mtime,
    ctime and inode."""
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


def multipart_etag(local: LocalFile, part_size: int, on_chunk: Callable[[], None] | None = None) -> str:
    """The ETag S3 gives an object uploaded from the scanned file ``local`` in parts of
    ``part_size`` bytes — read through its descriptor, to its scanned size (:func:`open_scanned`);
    ``on_chunk`` is told of each chunk read."""
    part_digests = []
    fd = open_scanned(local.path, identity=local.identity, size=local.size)
    try:
        for start in range(0, local.size, part_size):  # one bounded read per part, in order
            part = hashlib.md5(usedforsecurity=False)
            for chunk in read_bounded(fd, min(part_size, local.size - start)):
                part.update(chunk)
                if on_chunk is not None:
                    on_chunk()
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


_MD5_HEX = re.compile(r"[0-9a-fA-F]{32}")


def is_md5_etag(etag: str) -> bool:
    """Whether ``etag`` has the form of an MD5 (32 hex digits, either case). A download asks it of
    every object it plans: one compiled match, ~0.2 µs, where a check of each character was ~1.6."""
    return _MD5_HEX.fullmatch(etag) is not None


_TABLE = ("CREATE TABLE IF NOT EXISTS entries (relative TEXT PRIMARY KEY, size INTEGER, mtime_ns INTEGER, "
          "ctime_ns INTEGER, ino INTEGER, recorded_ns INTEGER, md5 TEXT, etag TEXT, multipart TEXT) WITHOUT ROWID")
_UPSERT = "INSERT OR REPLACE INTO entries VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
_SELECT = "SELECT relative, size, mtime_ns, ctime_ns, ino, recorded_ns, md5, etag, multipart FROM entries"
#: Names per prefetch query: within the 999 parameters a statement may bind in SQLite before 3.32.
_PREFETCH = 500


class DigestStore:
    """:class:`DigestEntry` by relative path in one SQLite file (None: in memory, for this run
    only, as for a dry run); thread-safe. :meth:`close` it to release the file.

    Records are buffered and written :data:`COMMIT_EVERY` at a time in one short transaction, so
    another run sharing the file (two uploads of one source) waits for a flush, never for a
    transfer. The cache only ever saves a rehash, so it never fails a run: a file that is damaged
    (when opened or later) is set aside and started again, and a flush that cannot get the file
    (held by another writer past the busy timeout, read-only) drops its records, logged."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = threading.Lock()
        #: Recorded, not yet written: relative → its row (None: forgotten).
        self._buffer: dict[str, tuple[Any, ...] | None] = {}
        #: relative → its row (None: no entry) for the names of the last three :meth:`prefetch` calls
        #: (the newest first): a chunk is planned while the two before it wait and move.
        self._near: tuple[dict[str, tuple[Any, ...] | None], ...] = ()
        self._db: sqlite3.Connection | None = self._connect()

    def _connect(self) -> sqlite3.Connection:
        if self.path is not None:
            try:
                return _open(self.path)
            except (OSError, sqlite3.OperationalError) as exc:  # a read-only cache, a store locked past the timeout
                log.warning("the digest cache %s cannot be opened (%s): this run remembers in memory only, and a "
                            "later run hashes again", self.path, exc)
        db = sqlite3.connect(":memory:", check_same_thread=False)
        db.execute(_TABLE)
        return db

    def trusted(self, local: LocalFile) -> DigestEntry | None:
        entry = self.same_stat(local)
        return entry if entry is not None and entry.matches(local) else None

    def prefetch(self, relatives: Sequence[str]) -> None:
        """Read the entries of ``relatives`` (the names of a chunk of a run's plan) in a few queries,
        so the lookups of that chunk cost no query each (one indexed read is ~15 µs of Python and
        SQLite; a 500-name query ~1 µs a name). The last three chunks' are kept: the one planned,
        the one waiting and the one moving, whose files are looked up again as each is finished."""
        near: dict[str, tuple[Any, ...] | None] = dict.fromkeys(relatives)
        with self._lock:
            def read(db: sqlite3.Connection) -> None:
                for start in range(0, len(relatives), _PREFETCH):
                    part = relatives[start:start + _PREFETCH]
                    for row in db.execute(f"{_SELECT} WHERE relative IN ({','.join('?' * len(part))})", part):
                        near[row[0]] = row
            self._near = (near if self._guarded(read, "reading") else {}, *self._near[:2])

    def same_stat(self, local: LocalFile) -> DigestEntry | None:
        """The entry if the file's stat identity is unchanged, racy or not."""
        with self._lock:
            # What this run recorded wins over what was prefetched, the newest prefetch over older ones.
            known = next((rows for rows in (self._buffer, *self._near) if local.relative in rows), None)
            if known is not None:
                row = known[local.relative]
            else:
                found: list[tuple[Any, ...]] = []
                self._guarded(lambda db: found.extend(db.execute(f"{_SELECT} WHERE relative = ?", (local.relative,))),
                              "reading")
                row = found[0] if found else None
        if row is None:
            return None
        entry = DigestEntry(list(row[1:5]), row[5], md5=row[6], etag=row[7],
                            multipart=json.loads(row[8]) if row[8] else {})  # most have none: no parse
        return entry if entry.same_stat(local) else None

    def record(self, local: LocalFile, *, md5: str | None = None, etag: str | None = None,
               multipart: dict[str, str] | None = None, keep: DigestEntry | None = None) -> DigestEntry:
        """Remember what ``local``'s content is known to be (merging a still-valid ``keep``)."""
        entry = DigestEntry(stat_identity(local), time.time_ns(),
                            md5=md5 or (keep.md5 if keep else None),
                            etag=etag or (keep.etag if keep else None),
                            multipart={**(keep.multipart if keep else {}), **(multipart or {})})
        with self._lock:
            self._buffer[local.relative] = (local.relative, *entry.identity, entry.recorded_ns, entry.md5, entry.etag,
                                            json.dumps(entry.multipart) if entry.multipart else None)
            if len(self._buffer) >= COMMIT_EVERY:
                self._flush_locked()
        return entry

    def record_written(self, relative: str, st: os.stat_result, etag: str | None) -> None:
        """:meth:`record` for a file this run has just written whole (a download): its ``st`` and
        the ETag of its bytes, with nothing kept from an entry before. The row is built from the
        stat as it is, without the :class:`LocalFile` (and its path) a download has no other use
        for."""
        row = (relative, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, time.time_ns(), None, etag, None)
        with self._lock:
            self._buffer[relative] = row
            if len(self._buffer) >= COMMIT_EVERY:
                self._flush_locked()

    def forget(self, relative: str) -> None:
        with self._lock:
            self._buffer[relative] = None

    def save(self) -> None:
        """Write what was recorded since the last write."""
        with self._lock:
            self._flush_locked()

    def close(self) -> None:
        with self._lock:
            self._flush_locked()
            if self._db is not None:
                self._db.close()
                self._db = None

    def _flush_locked(self) -> None:
        if not self._buffer:
            return
        rows, self._buffer = self._buffer, {}

        def write(db: sqlite3.Connection) -> None:
            with db:  # one transaction, committed (or rolled back) at once
                db.executemany(_UPSERT, [row for row in rows.values() if row is not None])
                db.executemany("DELETE FROM entries WHERE relative = ?",
                               [(name,) for name, row in rows.items() if row is None])
        if self._guarded(write, f"writing {len(rows)} entries to"):
            for name in rows:
                for near in self._near:
                    near.pop(name, None)

    def _guarded(self, work: Callable[[sqlite3.Connection], None], what: str) -> bool:
        """Run ``work`` on the database; False when it could not, the run going on without it."""
        if self._db is None:
            raise ValueError("the digest store was closed")
        try:
            work(self._db)
            return True
        except sqlite3.OperationalError as exc:  # locked past the busy timeout, read-only, full disk
            log.warning("the digest cache %s could not be used (%s) %s it: a later run hashes again", self.path, exc,
                        what)
            return False
        except sqlite3.DatabaseError as exc:  # damaged: set aside, started again
            log.warning("the digest cache %s is damaged (%s): set aside, started again", self.path, exc)
            self._db.close()
            if self.path is not None:
                _set_aside(self.path)
            self._db = self._connect()
            return False


def _open(path: Path) -> sqlite3.Connection:
    """The store at ``path``, made if absent; a cache of the JSON schema beside it is imported
    once; a file that is not one of ours is set aside (``.damaged``) and a new one made."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _set_aside_unless_own(path)
    for attempt in range(2):
        db = sqlite3.connect(path, timeout=_BUSY_MS / 1000, check_same_thread=False, isolation_level="DEFERRED")
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")  # WAL: a crash keeps every commit but the last
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version not in (0, _SCHEMA):
                raise sqlite3.DatabaseError(f"schema {version}")
            db.execute(_TABLE)
            if version == 0:
                db.execute(f"PRAGMA user_version={_SCHEMA}")
                _import_json(db, path.with_suffix(".json"))
            db.commit()
            return db
        except sqlite3.OperationalError:
            db.close()
            raise  # locked or unreadable, not damaged: never set aside a file another run is using
        except sqlite3.DatabaseError:
            db.close()
            if attempt:
                raise
            _set_aside(path)
    raise AssertionError("unreachable")


def _set_aside_unless_own(path: Path) -> None:
    """Set the store at ``path`` aside unread when it, or the WAL SQLite would replay into it, is
    not this process's own file: another user's rows must never vouch for a file."""
    for name in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        try:
            check_own_file(name)
        except UnsafePathError as exc:
            log.warning("the digest cache %s is not trusted (%s): set aside unread, started again", path, exc)
            _set_aside(path)
            return


def _set_aside(path: Path) -> None:
    """Move a damaged or untrusted store out of the way (``.damaged``), with its WAL and shared memory."""
    with contextlib.suppress(FileNotFoundError):  # a WAL alone can be what is set aside
        os.replace(path, path.with_name(path.name + ".damaged"))
    for suffix in ("-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)


def _import_json(db: sqlite3.Connection, legacy: Path) -> None:
    """Entries of a schema-2 JSON cache, once; the file is removed after (its rows are here)."""
    try:
        data: Any = json.loads(read_state_file(legacy))
        entries = data["entries"] if data.get("schema_version") == 2 else {}
        rows = [(relative, *fields["identity"], fields["recorded_ns"], fields.get("md5"), fields.get("etag"),
                 json.dumps(fields["multipart"]) if fields.get("multipart") else None)
                for relative, fields in entries.items()]
    except FileNotFoundError:
        return
    except (OSError, ValueError, TypeError, KeyError, AttributeError):  # UnsafePathError is a ValueError
        rows = []  # a damaged or untrusted cache only costs a rehash
    db.executemany(_UPSERT, rows)
    legacy.unlink(missing_ok=True)
