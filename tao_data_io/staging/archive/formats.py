"""Reading tar (plain, gz, bz2, xz) and zip: the format told from the first bytes, the stream
decompressed by readers that verify checksums and a truncated end (tarfile's own stream mode
checks neither), and every entry turned into one :class:`Member` shape for tar and zip alike —
its kind, mode, size and link — so the extractor checks both the same way."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import shutil
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Self

from ...errors import UsageError
from ...fs.temp import remove_if_exists, temp_path_for
from ...vocabulary import ARCHIVE_FORMATS

CHUNK = 1 << 20
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


def read_members(raw: IO[bytes], label: str, dest: Path, tag: str, add: Callable[[Member], None]) -> None:
    """Hand ``add`` every member of the archive ``raw`` (its bytes, read once from the start),
    whatever its format; a zip read from a stream is spooled beside ``dest`` for random access."""
    with reading(label):
        head = _read_up_to(raw, _PEEK)
    kind = _detect(head, label)
    stream: io.BufferedIOBase
    if raw.seekable():  # a local file: read it again from the start
        raw.seek(0)
        stream = raw  # type: ignore[assignment]  # a local file: buffered, as the readers below take it; typeshed keeps IO[bytes] apart
    else:
        stream = io.BufferedReader(_Prefixed(head, raw), CHUNK)
    if kind == "zip":
        with _random_access(stream, dest, tag) as seekable:
            _read_zip(seekable, label, add)
    else:
        with _decompressed(kind, stream) as tar_bytes:
            _read_tar(tar_bytes, label, add)


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


def _decompressed(kind: str, stream: io.BufferedIOBase) -> io.BufferedIOBase:
    """The tar bytes of ``stream``. These readers (unlike tarfile's stream mode) verify the
    compressed stream's checksum and raise on a truncated end."""
    if kind == "tar.gz":
        return gzip.GzipFile(fileobj=stream, mode="rb")
    if kind == "tar.bz2":
        return bz2.BZ2File(stream)
    if kind == "tar.xz":
        return lzma.LZMAFile(stream)  # type: ignore[arg-type]  # it reads any binary stream; typeshed names IO[bytes] only
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
def _random_access(stream: io.BufferedIOBase, dest: Path, tag: str) -> Iterator[IO[bytes]]:
    """A seekable view for zip: the local file itself, or the S3 body copied to a temp file
    beside ``dest`` (same filesystem as the extraction) and removed afterwards."""
    if stream.seekable():
        yield stream  # type: ignore[misc]  # a seekable binary stream, all zipfile needs; typeshed keeps IO[bytes] apart
        return
    spool = temp_path_for(dest, tag)
    try:
        with open(spool, "xb") as out:
            shutil.copyfileobj(stream, out, CHUNK)
        with open(spool, "rb") as copy:
            yield copy
    finally:
        remove_if_exists(spool)


@contextmanager
def reading(label: str) -> Iterator[None]:
    """Turn a failure to read the archive's bytes into an error naming the archive."""
    try:
        yield
    except UsageError:
        raise
    except _UNREADABLE as exc:
        raise UsageError(f"archive {label!r} cannot be read ({type(exc).__name__}: {exc}): it is corrupt, truncated or "
                         "uses a feature tao-data-io does not support; re-create or re-upload it") from exc


@dataclass(frozen=True)
class Member:
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
            if isinstance(tar, _TarFileNotingEnd):  # always: it names this class as its tarinfo
                tar.stopped_by = exc
            raise


class _TarFileNotingEnd(tarfile.TarFile):
    """tarfile ends iteration quietly on an end-of-archive block *and* on a missing, short or
    garbled header; this records which, so a truncated archive is not taken for a short one."""

    tarinfo = _TarInfoNotingEnd
    stopped_by: tarfile.HeaderError | None = None


_TAR_SPECIAL = {tarfile.CHRTYPE: "a character device", tarfile.BLKTYPE: "a block device", tarfile.FIFOTYPE: "a FIFO"}


def _read_tar(stream: io.BufferedIOBase, label: str, add: Callable[[Member], None]) -> None:
    with reading(label):
        tar = _TarFileNotingEnd.open(fileobj=stream, mode="r|", bufsize=CHUNK)
    with tar:
        while True:
            with reading(label):
                info = tar.next()
            if info is None:
                break
            add(_tar_member(tar, info))
        if not isinstance(tar.stopped_by, tarfile.EOFHeaderError):  # type: ignore[attr-defined]  # tarfile's, undocumented: not in typeshed
            raise UsageError(f"archive {label!r} is truncated or corrupt: it ends without tar's end-of-archive block "
                             f"({tar.stopped_by}); re-create or re-upload it")
        with reading(label):  # to the end: this is where gzip/bz2/xz verify their checksums
            while stream.read(CHUNK):
                pass


def _tar_member(tar: tarfile.TarFile, info: tarfile.TarInfo) -> Member:
    if info.issparse() or any(key.startswith("GNU.sparse.") for key in info.pax_headers):
        # tarfile fills a sparse member's holes with zeros: 10 KB of archive became 900 MiB on disk.
        return Member(info.name, SPECIAL, info.mode, 0, what="a sparse file (its holes would be written out in full)")
    if info.isreg():  # its data must be read before the next member: the archive is a stream
        return Member(info.name, FILE, info.mode, info.size, open=lambda: tar.extractfile(info))  # type: ignore[arg-type,return-value]  # None only for a member that is no file
    if info.isdir():
        return Member(info.name, DIRECTORY, info.mode, 0)
    if info.issym():
        return Member(info.name, SYMLINK, info.mode, 0, link=info.linkname)
    if info.islnk():
        return Member(info.name, HARDLINK, info.mode, 0, link=info.linkname)
    what = _TAR_SPECIAL.get(info.type, f"a tar entry of unsupported type {info.type!r}")
    return Member(info.name, SPECIAL, info.mode, 0, what=what)


_ZIP_SPECIAL = {stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device", stat.S_IFIFO: "a FIFO",
                stat.S_IFSOCK: "a socket"}


def _read_zip(handle: IO[bytes], label: str, add: Callable[[Member], None]) -> None:
    with reading(label):
        archive = zipfile.ZipFile(handle)
    with archive:
        for info in archive.infolist():
            add(_zip_member(archive, info, label))


def _zip_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, label: str) -> Member:
    """Zip keeps Unix file types and modes in the high half of ``external_attr`` when it was
    made on Unix; that is where symlinks, devices and setuid bits hide."""
    unix = info.external_attr >> 16 if info.create_system == 3 else 0
    file_type, mode = stat.S_IFMT(unix), stat.S_IMODE(unix)
    if info.flag_bits & 0x1:
        return Member(info.filename, SPECIAL, mode, 0, what="encrypted (password-protected)")
    if info.is_dir() or file_type == stat.S_IFDIR:
        return Member(info.filename.removesuffix("/"), DIRECTORY, mode or 0o755, 0)
    if file_type == stat.S_IFLNK:
        if info.file_size > _MAX_LINK_TARGET:
            return Member(info.filename, SPECIAL, mode, 0, what="a symlink whose target is not a path")
        with reading(label):
            target = archive.read(info).decode("utf-8", "surrogateescape")
        return Member(info.filename, SYMLINK, mode, 0, link=target)
    if file_type in (0, stat.S_IFREG):
        return Member(info.filename, FILE, mode or 0o644, info.file_size, open=lambda: archive.open(info))
    return Member(info.filename, SPECIAL, mode, 0, what=_ZIP_SPECIAL.get(file_type, f"of Unix file type {file_type:o}"))
