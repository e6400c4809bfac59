"""Safe, atomic, idempotent extraction of tar (plain, gz, bz2, xz) and zip archives, local or ``s3://``.

Why each property, and how it is kept:

* **Safe.** Every member is checked before a byte of it is written, the same way for tar and
  zip, so an error names the member: its name must pass the package's one confinement check
  (:func:`~tao_data_io.transfer.paths.check_relative`), symlink and hard-link targets must
  stay inside the destination, devices, FIFOs, sockets and setuid/setgid bits are refused.
  We never call ``tarfile.extract``/``zipfile.extract``: we write every file ourselves, with
  ``O_EXCL`` and through :func:`~tao_data_io.transfer.paths.confined_path` (which never
  follows a symlink on the way), and create symlinks only after all files, so nothing can be
  written through one. Modes keep the execute bits but never group/other write.
* **Atomic.** Extraction happens in a fresh directory beside the destination (same parent, so
  same filesystem) which is renamed into place only when complete, marker included. An
  earlier tree is renamed aside, the new one renamed in, then the old one removed: the
  destination is never half-written, and a corrupt or hostile archive leaves it untouched.
* **Idempotent.** ``DEST/.extracted`` records the archive's identity (S3: bucket, key, size,
  ETag from one HEAD; local: size and SHA-256), ``--strip-components`` and every file with its
  size. A rerun with the same archive over a complete tree does nothing beyond the identity
  check; a changed archive, or a damaged tree (a file missing or of another size), is
  extracted again. Sizes, not contents, are checked: cheap enough to do on every run.
* **One read of S3.** Tar formats are decompressed and untarred straight from the GET body.
  Zip needs random access, so its body is copied to a temp file beside the destination
  (still one GET) and removed afterwards. We decompress ourselves rather than use tarfile's
  ``r|*``: tarfile's stream mode checks neither the gzip CRC nor a truncated end, and stops
  silently at a truncated or garbled header, so we also require tar's end-of-archive block.
"""

from __future__ import annotations

import bz2
import errno
import gzip
import io
import json
import lzma
import os
import posixpath
import shutil
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, closing, contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import IO, Any, Self

from ...credentials import s3_credentials_from_env
from ...errors import TransferError, UnsafePathError, UsageError
from ...reporting import Progress, ProgressCallback
from ...transfer.client import explained, head_or_none
from ...transfer.engine import TransferEngine
from ...fs import (atomic_write, check_relative, confined_path, destination_lock_path, file_digest, file_lock, is_within,
                  lock_owner, remove_if_exists, remove_stale_temps, state_dir_for, temp_path_for)
from ...uris import S3Url, is_s3_url, parse_s3_url
from ...vocabulary import ARCHIVE_FORMATS

#: The marker beside the destination (``fs.state_dir_for``), which says what was extracted there.
MARKER_NAME = "extracted.json"
#: Bumped when the marker's meaning changes, so old markers cause one re-extraction.
MARKER_FORMAT = 2

_CHUNK = 1 << 20
#: Enough for tar's "ustar" magic at offset 257 and every compression magic.
_PEEK = 512
#: A zip symlink's target is stored as the member's data; anything longer is not a path.
_MAX_LINK_TARGET = 4096
#: What reading a damaged archive can raise, from tarfile, zipfile or a decompressor (bz2
#: reports bad data as a plain OSError). Network failures of an S3 body are botocore errors,
#: not these, so they are not mistaken for a corrupt archive.
_UNREADABLE = (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error, lzma.LZMAError, OSError,
               NotImplementedError)

FILE, DIRECTORY, SYMLINK, HARDLINK, SPECIAL = "file", "directory", "symlink", "hard link", "special"


@dataclass(frozen=True)
class ExtractResult:
    """What an extraction did, as plain data a CLI prints and a Prefect task shows."""

    archive: str
    destination: Path
    #: False when the destination already held this archive, complete: nothing was written.
    extracted: bool
    #: Why it was (or was not) extracted, e.g. "archive changed" or "tree damaged: a.txt is missing".
    reason: str
    files: int
    bytes: int
    marker: Path

    def to_dict(self) -> dict[str, Any]:
        return {"archive": self.archive, "destination": str(self.destination), "extracted": self.extracted,
                "reason": self.reason, "files": self.files, "bytes": self.bytes, "marker": str(self.marker)}

    def describe(self) -> str:
        """One human line, e.g. for the CLI or a Prefect artifact title."""
        if self.extracted:
            return f"{self.archive} → {self.destination}: extracted {self.files} files ({self.bytes:,} bytes); {self.reason}"
        return f"{self.archive} → {self.destination}: already extracted ({self.files} files, {self.bytes:,} bytes); nothing to do"


def extract_archive(archive: str | S3Url, destination: str | os.PathLike[str], *, strip_components: int = 0,
                    engine: TransferEngine | None = None, environ: Mapping[str, str] | None = None,
                    progress: ProgressCallback | None = None, limits: ArchiveLimits | None = None) -> ExtractResult:
    """Extract ``archive`` (a local path, ``s3://bucket/key``, or that URL already parsed) so that
    ``destination`` holds exactly its members, or leave ``destination`` as it was.

    An ``s3://`` archive is read through ``engine`` (the caller's), or an engine built from
    ``environ``'s credentials and closed afterwards. ``progress`` sees files and bytes as they
    are written (the totals are unknown until the end: an archive is a stream). Raises
    :class:`UsageError` (or its subclass :class:`UnsafePathError`) for a bad, hostile, corrupt or
    unsupported archive, naming it and the offending member.
    """
    if isinstance(archive, str) and is_s3_url(archive):
        archive = parse_s3_url(archive, field="archive")
    if isinstance(archive, S3Url) and engine is None:
        with TransferEngine(s3_credentials_from_env(environ)) as own:
            return extract_archive(archive, destination, strip_components=strip_components, engine=own,
                                   progress=progress, limits=limits)
    if strip_components < 0:
        raise UsageError(f"strip_components {strip_components} must be 0 or more: it is how many leading path "
                         "components to drop from every member")
    dest = Path(os.path.abspath(destination))
    # Every writer of a destination holds its lock (the engine's syncs too): two extractions into
    # one place wait for each other, and the sweep below only ever meets abandoned temp names.
    lock = destination_lock_path(dest)
    with file_lock(lock):
        return _extract_locked(archive, dest, strip_components, engine, progress, limits or ArchiveLimits.from_env(),
                               lock_owner(lock))


def marker_path(dest: Path) -> Path:
    """Where the marker of the extraction at ``dest`` lives: beside the tree, never inside it."""
    return state_dir_for(Path(os.path.abspath(dest))) / MARKER_NAME


def _extract_locked(archive: str | S3Url, dest: Path, strip_components: int, engine: TransferEngine | None,
                    progress: ProgressCallback | None, limits: ArchiveLimits, owner: str) -> ExtractResult:
    """Extract under the destination's lock, whose :func:`~tao_data_io.fs.lock_owner` is ``owner``
    (it names this extraction's temp directories, so only this lock's holders ever sweep them)."""
    marker = marker_path(dest)
    remove_stale_temps(dest, owner)  # what a killed extraction (or zip spool) left beside dest
    previous = _read_destination(dest, marker)
    if isinstance(archive, S3Url):
        assert engine is not None
        source = _s3_source(archive, engine.client)
    else:
        source = _local_source(Path(archive), dest)
    reason = _reason_to_extract(previous, source.identity, strip_components, dest)
    if reason is None:
        assert previous is not None  # an up-to-date tree has a marker
        files = previous["files"]
        return ExtractResult(source.label, dest, False, "up to date", len(files), sum(e.get("size", 0) for e in files), marker)

    dest.parent.mkdir(parents=True, exist_ok=True)
    work = temp_path_for(dest, owner)
    work.mkdir()
    try:
        entries = _extract_into(source, work, dest, strip_components, progress,
                                limits.budget(int(source.identity["size"]), source.label), owner)
        total = sum(entry.get("size", 0) for entry in entries)
        record = {"format": MARKER_FORMAT, "tool": f"tao-data-io {_tool_version()}", "source": source.label,
                  "archive": source.identity, "strip_components": strip_components, "files": entries, "bytes": total}
        # "installing" first: a kill between the swap and the final marker is seen as interrupted
        # (re-extract), never mistaken for a finished tree of the same shape.
        atomic_write(marker, json.dumps({**record, "status": "installing"}, indent=1).encode())
        _install(work, dest, owner)
        atomic_write(marker, json.dumps({**record, "status": "complete"}, indent=1).encode())
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return ExtractResult(source.label, dest, True, reason, len(entries), total, marker)


# --------------------------------------------------------------------------- limits
MAX_BYTES_VARIABLE = "TAO_DATA_IO_ARCHIVE_MAX_BYTES"
MAX_RATIO_VARIABLE = "TAO_DATA_IO_ARCHIVE_MAX_RATIO"
MAX_MEMBERS_VARIABLE = "TAO_DATA_IO_ARCHIVE_MAX_MEMBERS"


@dataclass(frozen=True)
class ArchiveLimits:
    """What one archive may expand to, checked *while* extracting (a bomb is stopped at the first
    byte over, and the half-written tree is removed). Defaults are generous for real datasets —
    images and checkpoints barely compress — and fatal to a 700 KB file that inflates to 700 MiB.
    Each can be raised through its environment variable."""

    max_bytes: int = 256 * 1024**3
    #: Expanded bytes per archive byte; archives smaller than ``ratio_floor`` may always expand
    #: to that floor (a tiny archive of a few text files compresses well).
    max_ratio: int = 200
    ratio_floor: int = 64 * 1024**2
    max_members: int = 200_000

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ArchiveLimits:
        env = os.environ if environ is None else environ
        defaults = cls()
        values = {}
        for name, variable in (("max_bytes", MAX_BYTES_VARIABLE), ("max_ratio", MAX_RATIO_VARIABLE),
                               ("max_members", MAX_MEMBERS_VARIABLE)):
            raw = env.get(variable)
            if raw:
                if not raw.isdigit() or int(raw) <= 0:
                    raise UsageError(f"{variable} {raw!r} must be a positive whole number")
                values[name] = int(raw)
        return cls(**{**{n: getattr(defaults, n) for n in ("max_bytes", "max_ratio", "ratio_floor", "max_members")},
                      **values})

    def budget(self, archive_size: int, label: str) -> _Budget:
        by_ratio = max(self.max_ratio * archive_size, self.ratio_floor)
        if by_ratio < self.max_bytes:
            limit, why = by_ratio, (f"{self.max_ratio}× its {archive_size:,} bytes ({MAX_RATIO_VARIABLE} raises the "
                                     "ratio)")
        else:
            limit, why = self.max_bytes, f"the limit of {self.max_bytes:,} bytes ({MAX_BYTES_VARIABLE} raises it)"
        return _Budget(label, limit, why, self.max_members)


@dataclass
class _Budget:
    label: str
    max_bytes: int
    why: str
    max_members: int
    bytes: int = 0
    members: int = 0

    def member(self) -> None:
        self.members += 1
        if self.members > self.max_members:
            raise UsageError(f"archive {self.label!r} has more than {self.max_members:,} members "
                             f"({MAX_MEMBERS_VARIABLE} raises the limit); extraction stopped and nothing was kept")

    def spend(self, count: int) -> None:
        self.bytes += count
        if self.bytes > self.max_bytes:
            raise UsageError(f"archive {self.label!r} expands beyond {self.why}; extraction stopped at "
                             f"{self.bytes:,} bytes and nothing was kept")


# --------------------------------------------------------------------------- destination state
def _read_destination(dest: Path, marker: Path) -> dict[str, Any] | None:
    """The marker of an earlier extraction at ``dest`` (``{}`` if unreadable), or None when
    ``dest`` is absent or empty. Refuses a destination extraction must not replace."""
    try:
        mode = os.lstat(dest).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(mode):
        raise UsageError(f"destination {str(dest)!r} is a symlink: extraction replaces the directory by renaming, "
                         "so give the real directory path instead")
    if not stat.S_ISDIR(mode):
        raise UsageError(f"destination {str(dest)!r} exists and is not a directory; choose another path")
    if os.path.ismount(dest):
        raise UsageError(f"destination {str(dest)!r} is a mount point, which a finished tree cannot be renamed "
                         f"over; extract into a subdirectory such as {str(dest / 'data')!r}")
    try:
        text = marker.read_text(encoding="utf-8")
    except FileNotFoundError:
        with os.scandir(dest) as entries:
            if next(entries, None) is not None:
                raise UsageError(f"destination {str(dest)!r} is not empty and has no {MARKER_NAME} marker, so it was "
                                 "not made by extract and will not be replaced; choose a new or empty directory") from None
        return None
    try:
        marker = json.loads(text)
    except ValueError:
        return {}
    return marker if isinstance(marker, dict) else {}


def _reason_to_extract(previous: dict[str, Any] | None, identity: dict[str, Any], strip_components: int,
                       dest: Path) -> str | None:
    """Why ``dest`` must be (re)extracted, or None if it already holds this archive, complete."""
    if previous is None:
        return "first extraction"
    if previous.get("format") != MARKER_FORMAT or not isinstance(previous.get("files"), list):
        return f"the {MARKER_NAME} marker is unreadable or from another version"
    if previous.get("status") != "complete":
        return "an earlier extraction was interrupted while installing"
    if previous.get("archive") != identity:
        return "archive changed"
    if previous.get("strip_components") != strip_components:
        return "strip-components changed"
    for entry in previous["files"]:
        damage = _damage(dest, entry)
        if damage:
            return f"tree damaged: {damage}"
    return None


def _damage(dest: Path, entry: Any) -> str | None:
    """What is wrong with one marker entry's file in ``dest``, or None if it is intact."""
    try:
        path = confined_path(dest, entry["path"], what="marker entry")
        st = os.lstat(path)
    except FileNotFoundError:
        return f"{entry['path']} is missing"
    except (KeyError, TypeError, UnsafePathError):
        return f"the {MARKER_NAME} marker has an invalid entry {entry!r}"
    if "link" in entry:
        if not stat.S_ISLNK(st.st_mode) or os.readlink(path) != entry["link"]:
            return f"{entry['path']} is no longer the symlink to {entry['link']!r}"
    elif not stat.S_ISREG(st.st_mode) or st.st_size != entry.get("size"):
        return f"{entry['path']} is not the {entry.get('size')}-byte file that was extracted"
    return None


def _install(work: Path, dest: Path, owner: str) -> None:
    """Put the finished tree ``work`` at ``dest`` without ever exposing a half-written tree.

    An absent or empty ``dest`` is replaced by one rename. Otherwise the old tree is renamed
    aside, the new one in, and the old one removed; if the second rename fails the old tree
    is put back.
    """
    try:
        os.rename(work, dest)
        return
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
    aside = temp_path_for(dest, owner)
    os.rename(dest, aside)
    try:
        os.rename(work, dest)
    except BaseException:
        os.rename(aside, dest)
        raise
    shutil.rmtree(aside)


def _tool_version() -> str:
    try:
        return metadata.version("tao-data-io")
    except metadata.PackageNotFoundError:
        return "unknown"


# --------------------------------------------------------------------------- sources
@dataclass(frozen=True)
class _Source:
    #: How messages name the archive: the path or the s3:// URL.
    label: str
    #: What makes two archives the same (compared with the marker's).
    identity: dict[str, Any]
    #: Opens the archive's bytes for one sequential read.
    open: Callable[[], AbstractContextManager[IO[bytes]]]


def _local_source(path: Path, dest: Path) -> _Source:
    label = str(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise UsageError(f"archive {label!r} does not exist; check the path") from None
    if not stat.S_ISREG(mode):
        raise UsageError(f"archive {label!r} is not a regular file; give the path of a tar or zip file")
    if is_within(path, dest):
        raise UsageError(f"archive {label!r} is inside the destination {str(dest)!r}, which extraction replaces; "
                         "move the archive or choose another destination")
    identity = {"kind": "file", "size": os.stat(path).st_size, "sha256": file_digest(path, "sha256")}
    return _Source(label, identity, lambda: open(path, "rb"))


def _s3_source(url: S3Url, client: Any) -> _Source:
    if url.is_prefix:
        raise UsageError(f"archive {str(url)!r} names a prefix, not an object; write s3://BUCKET/path/to/archive.tar.gz")
    head = head_or_none(client, url.bucket, url.key)
    if head is None:
        raise UsageError(f"archive {str(url)!r} does not exist (404); check the bucket and key")
    identity = {"kind": "s3", "bucket": url.bucket, "key": url.key, "size": int(head["ContentLength"]),
                "etag": str(head.get("ETag", "")).strip('"')}

    @contextmanager
    def open_body() -> Iterator[IO[bytes]]:
        with explained(url.bucket, client.meta.endpoint_url):
            response = client.get_object(Bucket=url.bucket, Key=url.key)
        with closing(response["Body"]) as body:
            etag = str(response.get("ETag", "")).strip('"')
            if etag != identity["etag"] or int(response["ContentLength"]) != identity["size"]:
                raise TransferError(f"archive {str(url)!r} changed while being read (ETag {identity['etag']} → {etag}); "
                                    "rerun to extract the new version")
            yield body

    return _Source(str(url), identity, open_body)


# --------------------------------------------------------------------------- formats
_MAGIC = ((b"\x1f\x8b", "tar.gz"), (b"BZh", "tar.bz2"), (b"\xfd7zXZ\x00", "tar.xz"),
          (b"PK\x03\x04", "zip"), (b"PK\x05\x06", "zip"))


def _detect(head: bytes, label: str) -> str:
    """The format from the first bytes, else from the name (old tars lack the ustar magic; a
    self-extracting zip starts with a program)."""
    for magic, kind in _MAGIC:
        if head.startswith(magic):
            return kind
    if head[257:262] == b"ustar":
        return "tar"
    if not head:
        raise UsageError(f"archive {label!r} is empty (0 bytes); re-create or re-upload it")
    name = label.lower()
    if name.endswith(".tar"):
        return "tar"
    if name.endswith(".zip"):
        return "zip"
    raise UsageError(f"archive {label!r} is not a supported archive: its first bytes match none of "
                     f"{ARCHIVE_FORMATS}; convert it to one of those (a corrupt file is reported the same way)")


def _extract_into(source: _Source, work: Path, dest: Path, strip_components: int,
                  progress: ProgressCallback | None, budget: _Budget, owner: str) -> list[dict[str, Any]]:
    extractor = _Extractor(work, source.label, dest, strip_components, budget, progress)
    with source.open() as raw:
        with _reading(source.label):
            head = _read_up_to(raw, _PEEK)
        kind = _detect(head, source.label)
        stream: io.BufferedIOBase
        if raw.seekable():  # a local file: read it again from the start
            raw.seek(0)
            stream = raw  # type: ignore[assignment]
        else:
            stream = io.BufferedReader(_Prefixed(head, raw), _CHUNK)
        if kind == "zip":
            with _random_access(stream, dest, owner) as seekable:
                _extract_zip(seekable, extractor)
        else:
            with _decompressed(kind, stream) as tar_bytes:
                _extract_tar(tar_bytes, extractor)
    entries = extractor.finish()
    if extractor.progress is not None:
        extractor.progress(Progress(extractor.files_written, extractor.bytes_written, extractor.files_written,
                                    extractor.bytes_written, 0, final=True))
    return entries


def _decompressed(kind: str, stream: io.BufferedIOBase) -> io.BufferedIOBase:
    """The tar bytes of ``stream``. These readers (unlike tarfile's stream mode) verify the
    compressed stream's checksum and raise on a truncated end."""
    if kind == "tar.gz":
        return gzip.GzipFile(fileobj=stream, mode="rb")
    if kind == "tar.bz2":
        return bz2.BZ2File(stream)
    if kind == "tar.xz":
        return lzma.LZMAFile(stream)  # type: ignore[arg-type]
    return stream


def _read_up_to(raw: IO[bytes], size: int) -> bytes:
    parts, got = [], 0
    while got < size:
        chunk = raw.read(size - got)
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


class _Prefixed(io.RawIOBase):
    """The bytes already read to detect the format, followed by the rest of a stream that
    cannot seek back (the S3 body)."""

    def __init__(self, prefix: bytes, rest: IO[bytes]) -> None:
        super().__init__()
        self._prefix, self._rest = prefix, rest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        if self._prefix:
            count = min(len(view), len(self._prefix))
            view[:count], self._prefix = self._prefix[:count], self._prefix[count:]
            return count
        data = self._rest.read(len(view))
        view[:len(data)] = data
        return len(data)


@contextmanager
def _random_access(stream: io.BufferedIOBase, dest: Path, owner: str) -> Iterator[IO[bytes]]:
    """A seekable view for zip: the local file itself, or the S3 body copied to a temp file
    beside ``dest`` (same filesystem as the extraction) and removed afterwards."""
    if stream.seekable():
        yield stream  # type: ignore[misc]
        return
    spool = temp_path_for(dest, owner)
    try:
        with open(spool, "xb") as out:
            shutil.copyfileobj(stream, out, _CHUNK)
        with open(spool, "rb") as copy:
            yield copy
    finally:
        remove_if_exists(spool)


@contextmanager
def _reading(label: str) -> Iterator[None]:
    """Turn a failure to read the archive's bytes into an error naming the archive."""
    try:
        yield
    except UsageError:
        raise
    except _UNREADABLE as exc:
        raise UsageError(f"archive {label!r} cannot be read ({type(exc).__name__}: {exc}): it is corrupt, truncated or "
                         "uses a feature tao-data-io does not support; re-create or re-upload it") from exc


# --------------------------------------------------------------------------- tar and zip members
@dataclass(frozen=True)
class _Member:
    """One archive entry, the same shape for tar and zip."""

    name: str
    kind: str
    #: Permission bits plus setuid/setgid/sticky (no file-type bits).
    mode: int
    size: int
    #: The symlink target, or the hard link's target member name.
    link: str = ""
    #: For SPECIAL members: what it is, e.g. "a FIFO".
    what: str = ""
    open: Callable[[], IO[bytes]] | None = None


class _TarInfoNotingEnd(tarfile.TarInfo):
    @classmethod
    def fromtarfile(cls, tar: tarfile.TarFile) -> Self:
        try:
            return super().fromtarfile(tar)
        except tarfile.HeaderError as exc:
            tar.stopped_by = exc  # type: ignore[attr-defined]
            raise


class _TarFileNotingEnd(tarfile.TarFile):
    """tarfile ends iteration quietly on an end-of-archive block *and* on a missing, short or
    garbled header; this records which, so a truncated archive is not taken for a short one."""

    tarinfo = _TarInfoNotingEnd
    stopped_by: tarfile.HeaderError | None = None


_TAR_SPECIAL = {tarfile.CHRTYPE: "a character device", tarfile.BLKTYPE: "a block device", tarfile.FIFOTYPE: "a FIFO"}


def _extract_tar(stream: io.BufferedIOBase, extractor: _Extractor) -> None:
    label = extractor.label
    with _reading(label):
        tar = _TarFileNotingEnd.open(fileobj=stream, mode="r|", bufsize=_CHUNK)
    with tar:
        while True:
            with _reading(label):
                info = tar.next()
            if info is None:
                break
            extractor.add(_tar_member(tar, info))
        if not isinstance(tar.stopped_by, tarfile.EOFHeaderError):  # type: ignore[attr-defined]
            raise UsageError(f"archive {label!r} is truncated or corrupt: it ends without tar's end-of-archive block "
                             f"({tar.stopped_by}); re-create or re-upload it")
        with _reading(label):  # to the end: this is where gzip/bz2/xz verify their checksums
            while stream.read(_CHUNK):
                pass


def _tar_member(tar: tarfile.TarFile, info: tarfile.TarInfo) -> _Member:
    if info.issparse() or any(key.startswith("GNU.sparse.") for key in info.pax_headers):
        # tarfile fills a sparse member's holes with zeros: 10 KB of archive became 900 MiB on disk.
        return _Member(info.name, SPECIAL, info.mode, 0, what="a sparse file (its holes would be written out in full)")
    if info.isreg():  # its data must be read before the next member: the archive is a stream
        return _Member(info.name, FILE, info.mode, info.size, open=lambda: tar.extractfile(info))  # type: ignore[arg-type,return-value]
    if info.isdir():
        return _Member(info.name, DIRECTORY, info.mode, 0)
    if info.issym():
        return _Member(info.name, SYMLINK, info.mode, 0, link=info.linkname)
    if info.islnk():
        return _Member(info.name, HARDLINK, info.mode, 0, link=info.linkname)
    what = _TAR_SPECIAL.get(info.type, f"a tar entry of unsupported type {info.type!r}")
    return _Member(info.name, SPECIAL, info.mode, 0, what=what)


_ZIP_SPECIAL = {stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device", stat.S_IFIFO: "a FIFO",
                stat.S_IFSOCK: "a socket"}


def _extract_zip(handle: IO[bytes], extractor: _Extractor) -> None:
    with _reading(extractor.label):
        archive = zipfile.ZipFile(handle)
    with archive:
        for info in archive.infolist():
            extractor.add(_zip_member(archive, info, extractor.label))


def _zip_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, label: str) -> _Member:
    """Zip keeps Unix file types and modes in the high half of ``external_attr`` when it was
    made on Unix; that is where symlinks, devices and setuid bits hide."""
    unix = info.external_attr >> 16 if info.create_system == 3 else 0
    file_type, mode = stat.S_IFMT(unix), stat.S_IMODE(unix)
    if info.flag_bits & 0x1:
        return _Member(info.filename, SPECIAL, mode, 0, what="encrypted (password-protected)")
    if info.is_dir() or file_type == stat.S_IFDIR:
        return _Member(info.filename.removesuffix("/"), DIRECTORY, mode or 0o755, 0)
    if file_type == stat.S_IFLNK:
        if info.file_size > _MAX_LINK_TARGET:
            return _Member(info.filename, SPECIAL, mode, 0, what="a symlink whose target is not a path")
        with _reading(label):
            target = archive.read(info).decode("utf-8", "surrogateescape")
        return _Member(info.filename, SYMLINK, mode, 0, link=target)
    if file_type in (0, stat.S_IFREG):
        return _Member(info.filename, FILE, mode or 0o644, info.file_size, open=lambda: archive.open(info))
    return _Member(info.filename, SPECIAL, mode, 0, what=_ZIP_SPECIAL.get(file_type, f"of Unix file type {file_type:o}"))


# --------------------------------------------------------------------------- writing
class _Extractor:
    """Checks each member and writes it under ``root`` (the fresh work directory).

    Symlinks are only recorded while members stream by and created in :meth:`finish`, after
    every file: so no member is ever written through one, whatever the archive's order.
    """

    def __init__(self, root: Path, label: str, dest: Path, strip_components: int, budget: _Budget,
                 progress: ProgressCallback | None = None) -> None:
        self.root, self.label, self.dest, self.strip = root, label, dest, strip_components
        self.budget = budget
        self.progress = progress
        self.files_written = self.bytes_written = 0
        #: relative path → marker entry, for files and hard links as they are written.
        self.entries: dict[str, dict[str, Any]] = {}
        #: relative path → (member name, target), created by finish().
        self.symlinks: dict[str, tuple[str, str]] = {}

    def refuse(self, member: str, problem: str, *, unsafe: bool = False) -> UsageError:
        error = UnsafePathError if unsafe else UsageError
        return error(f"archive {self.label!r}: refusing member {member!r}: {problem}; nothing was extracted to "
                     f"{str(self.dest)!r} — rebuild the archive without it")

    def add(self, member: _Member) -> None:
        self.budget.member()
        name = _logical_name(member.name)
        if name == "" and member.kind == DIRECTORY:
            return  # the archive's root entry ("." or "./"): the destination itself
        self._check(name, what="member")
        if member.kind == SPECIAL:
            raise self.refuse(member.name, f"it is {member.what}; extract writes only files, directories and links")
        if member.mode & (stat.S_ISUID | stat.S_ISGID):
            raise self.refuse(member.name, f"it has the setuid/setgid bit (mode {member.mode:o})")
        target = self._strip(name)
        if target is None:
            return  # fewer components than --strip-components, like GNU tar
        if member.kind == SYMLINK:
            self._check(posixpath.normpath(posixpath.join(posixpath.dirname(target), member.link)),
                        what=f"symlink {member.name!r} → {member.link!r}, which resolves to")
            self.symlinks[target] = (member.name, member.link)
            return
        for parent in _parents(target):
            if parent in self.symlinks:
                raise self.refuse(member.name, f"it would be written through the symlink member {self.symlinks[parent][0]!r}",
                                  unsafe=True)
        path = self._path(target, member.name)
        path.parent.mkdir(parents=True, exist_ok=True)
        if member.kind == DIRECTORY:
            if path.is_dir():
                os.chmod(path, (member.mode & 0o755) | 0o700)
            else:
                self._vacate(path, member.name)
                path.mkdir(mode=(member.mode & 0o755) | 0o700)
        elif member.kind == HARDLINK:
            self._hard_link(member, target, path)
        else:
            self._write(member, target, path)

    def _write(self, member: _Member, target: str, path: Path) -> None:
        assert member.open is not None
        self._vacate(path, member.name)
        with _reading(self.label):
            source = member.open()
        written = 0
        with source, open(path, "xb") as out:
            while True:
                with _reading(self.label):
                    chunk = source.read(_CHUNK)
                if not chunk:
                    break
                self.budget.spend(len(chunk))  # before writing: a bomb never lands a byte past the limit
                out.write(chunk)
                written += len(chunk)
        if written != member.size:
            raise UsageError(f"archive {self.label!r} is truncated or corrupt: member {member.name!r} has {written} of "
                             f"its {member.size} bytes; re-create or re-upload it")
        os.chmod(path, (member.mode & 0o755) | 0o600)
        self.entries[target] = {"path": target, "size": written}
        self.files_written += 1
        self.bytes_written += written
        if self.progress is not None:
            self.progress(Progress(0, 0, self.files_written, self.bytes_written, 0))

    def _hard_link(self, member: _Member, target: str, path: Path) -> None:
        linked = _logical_name(member.link)
        self._check(linked, what=f"hard link {member.name!r} → target")
        stripped = self._strip(linked)
        if stripped is None or stripped == target or "size" not in self.entries.get(stripped, {}):
            raise self.refuse(member.name, f"its target {member.link!r} is not a file extracted earlier from this archive",
                              unsafe=True)
        self._vacate(path, member.name)
        os.link(self.root / stripped, path)
        self.entries[target] = {"path": target, "size": self.entries[stripped]["size"]}

    def finish(self) -> list[dict[str, Any]]:
        """Create the recorded symlinks, check that none resolves outside the tree (a chain of
        links can escape where each looks harmless alone), and return the marker entries."""
        for target, (name, link) in self.symlinks.items():
            path = self._path(target, name)
            path.parent.mkdir(parents=True, exist_ok=True)
            if os.path.lexists(path):
                raise self.refuse(name, "it is a symlink where another member made a file or directory", unsafe=True)
            os.symlink(link, path)
            self.entries[target] = {"path": target, "link": link}
        for target, (name, link) in self.symlinks.items():
            if not is_within(self.root / target, self.root):
                raise self.refuse(name, f"its target {link!r} leads outside the destination through other symlinks",
                                  unsafe=True)
        return [self.entries[path] for path in sorted(self.entries)]

    def _check(self, relative: str, *, what: str) -> None:
        try:
            check_relative(relative, what=what)
        except UnsafePathError as exc:
            raise UnsafePathError(f"archive {self.label!r}: {exc}; nothing was extracted to {str(self.dest)!r}") from None

    def _path(self, target: str, member: str) -> Path:
        try:
            return confined_path(self.root, target, what=f"member {member!r} at")
        except UnsafePathError as exc:
            raise UnsafePathError(f"archive {self.label!r}: {exc}; nothing was extracted to {str(self.dest)!r}") from None

    def _vacate(self, path: Path, member: str) -> None:
        """Remove an earlier member's file at ``path`` (a later member wins, as in tar); a
        directory there is a conflict, never silently replaced."""
        if path.is_dir() and not path.is_symlink():
            raise self.refuse(member, "another member already made a directory at that path", unsafe=True)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        self.entries.pop(path.relative_to(self.root).as_posix(), None)

    def _strip(self, name: str) -> str | None:
        parts = name.split("/")
        return "/".join(parts[self.strip:]) if len(parts) > self.strip else None


def _logical_name(raw: str) -> str:
    """``./a/b`` → ``a/b`` (a leading ``./`` is how ``tar -C dir .`` spells a relative name, not
    a component); ``.`` and ``./`` → ``""``, the archive's root."""
    name = raw
    while name.startswith("./"):
        name = name[2:]
    return "" if name == "." else name


def _parents(relative: str) -> Iterator[str]:
    parts = relative.split("/")
    for depth in range(1, len(parts)):
        yield "/".join(parts[:depth])
