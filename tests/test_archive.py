"""``extract``: every format round-trips; reruns do nothing; changed archives and damaged trees are
re-extracted; hostile, corrupt and unsupported archives leave nothing at the destination and
nothing outside it; S3 archives are read with one HEAD (+ one GET when extracting), over HTTP
against the embedded server."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import stat
import subprocess
import tarfile
import zipfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tao_data_io.fs.confinement import STATE_DIR_NAME
from tao_data_io.fs.locks import destination_lock_path
from tao_data_io.fs.temp import lock_tag, temp_path_for
from tao_data_io.staging.archive import ArchiveLimits, ExtractResult, extract_archive, marker_path
from tao_data_io.credentials import S3Credentials
from tao_data_io.embedded.s3 import EmbeddedS3
from tao_data_io.errors import UsageError
from tao_data_io.transfer.engine import TransferEngine

from .helpers import run_cli, temp_leftovers

FORMATS = ("tar", "tar.gz", "tgz", "tar.bz2", "tar.xz", "zip")
_TAR_MODES = {"tar": "w", "tar.gz": "w:gz", "tgz": "w:gz", "tar.bz2": "w:bz2", "tar.xz": "w:xz"}


# --------------------------------------------------------------------------- building archives
@dataclass(frozen=True)
class Entry:
    name: str
    kind: str = "file"  # file | dir | symlink | hardlink | fifo | chardev
    data: bytes = b""
    mode: int = 0o644
    target: str = ""


def file(name: str, data: bytes, mode: int = 0o644) -> Entry:
    return Entry(name, "file", data, mode)


def symlink(name: str, target: str) -> Entry:
    return Entry(name, "symlink", target=target, mode=0o777)


def hardlink(name: str, target: str) -> Entry:
    return Entry(name, "hardlink", target=target)


def tar_bytes(entries: list[Entry], mode: str = "w", tar_format: int = tarfile.PAX_FORMAT) -> bytes:
    types = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE, "hardlink": tarfile.LNKTYPE,
             "fifo": tarfile.FIFOTYPE, "chardev": tarfile.CHRTYPE}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode, format=tar_format) as tar:
        for entry in entries:
            info = tarfile.TarInfo(entry.name)
            info.type, info.mode, info.linkname = types[entry.kind], entry.mode, entry.target
            info.size = len(entry.data) if entry.kind == "file" else 0
            tar.addfile(info, io.BytesIO(entry.data) if entry.kind == "file" else None)
    return buffer.getvalue()


def v7_tar(ustar: bytes) -> bytes:
    """A one-member ustar archive with its magic erased (and the header checksum redone)."""
    header = bytearray(ustar[:512])
    header[257:265] = bytes(8)
    header[148:156] = b" " * 8
    header[148:155] = b"%06o\0" % sum(header)
    return bytes(header) + ustar[512:]


def zip_bytes(entries: list[Entry]) -> bytes:
    types = {"file": stat.S_IFREG, "dir": stat.S_IFDIR, "symlink": stat.S_IFLNK, "fifo": stat.S_IFIFO}
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for entry in entries:
            info = zipfile.ZipInfo(entry.name + ("/" if entry.kind == "dir" else ""))
            info.create_system = 3  # Unix: the mode and file type live in external_attr
            info.external_attr = (types[entry.kind] | entry.mode) << 16
            archive.writestr(info, entry.target.encode() if entry.kind == "symlink" else entry.data)
    return buffer.getvalue()


def build(path: Path, entries: list[Entry], fmt: str | None = None) -> Path:
    fmt = fmt or next(f for f in sorted(FORMATS, key=len, reverse=True) if path.name.endswith(f))
    path.write_bytes(zip_bytes(entries) if fmt == "zip" else tar_bytes(entries, _TAR_MODES[fmt]))
    return path


# --------------------------------------------------------------------------- looking at trees
def listing(root: Path) -> dict[str, Any]:
    """relative path → bytes (file), "-> target" (symlink) or "/" (directory): all of it (the marker
    lives beside the tree, never inside)."""
    result: dict[str, Any] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            relative = path.relative_to(root).as_posix()
            if path.is_symlink():
                result[relative] = "-> " + os.readlink(path)
            elif path.is_dir():
                result[relative] = "/"
            else:
                result[relative] = path.read_bytes()
    return result


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """relative path → (inode, mtime) of the root and everything below it, never following links."""
    result = {".": (root.stat().st_ino, root.stat().st_mtime_ns)}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            st = os.lstat(Path(dirpath) / name)
            result[(Path(dirpath) / name).relative_to(root).as_posix()] = (st.st_ino, st.st_mtime_ns)
    return result


def everything(root: Path) -> set[str]:
    """Every path below ``root`` but our state directories (lock, marker), which live beside trees."""
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if STATE_DIR_NAME not in p.relative_to(root).parts}


def counting_engine(credentials: S3Credentials) -> tuple[TransferEngine, list[str]]:
    """A real engine whose every control-plane HTTP request is recorded (method) through botocore's
    event hook."""
    engine = TransferEngine(credentials)
    methods: list[str] = []
    engine.client.meta.events.register("before-send.s3", lambda request, **_: methods.append(request.method))
    return engine, methods


TREE = [
    Entry("emptydir", "dir", mode=0o755),
    file("a.txt", b"alpha\n"),
    file("run.sh", b"#!/bin/sh\necho hi\n", mode=0o755),
    file("sub/b.bin", bytes(range(256)) * 50),
    file("sub/deep/empty.txt", b""),
    symlink("sub/link", "b.bin"),
    symlink("up", "sub/deep"),
]
EXPECTED = {
    "emptydir": "/", "a.txt": b"alpha\n", "run.sh": b"#!/bin/sh\necho hi\n", "sub": "/",
    "sub/b.bin": bytes(range(256)) * 50, "sub/deep": "/", "sub/deep/empty.txt": b"", "sub/link": "-> b.bin",
    "up": "-> sub/deep",
}


# --------------------------------------------------------------------------- round trips
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_round_trips_with_a_marker(tmp_path: Path, fmt: str) -> None:
    entries = TREE + ([hardlink("hard.txt", "a.txt")] if fmt != "zip" else [])
    archive = build(tmp_path / f"data.{fmt}", entries)
    dest = tmp_path / "out" / "d"

    result = extract_archive(str(archive), dest)

    expected = {**EXPECTED, **({"hard.txt": b"alpha\n"} if fmt != "zip" else {})}
    assert listing(dest) == expected
    assert os.access(dest / "run.sh", os.X_OK) and not os.access(dest / "a.txt", os.X_OK)
    if fmt != "zip":
        assert (dest / "hard.txt").stat().st_ino == (dest / "a.txt").stat().st_ino
    marker = json.loads((marker_path(dest)).read_text())
    assert marker["archive"] == {"kind": "file", "size": archive.stat().st_size,
                                 "sha256": hashlib.sha256(archive.read_bytes()).hexdigest()}
    assert marker["strip_components"] == 0 and marker["tool"].startswith("tao-data-io ")
    files = {entry["path"]: entry for entry in marker["files"]}
    assert files["sub/b.bin"] == {"path": "sub/b.bin", "size": 256 * 50}
    assert files["sub/link"] == {"path": "sub/link", "link": "b.bin"}
    assert set(files) == {k for k, v in expected.items() if v != "/"}
    assert result == ExtractResult(str(archive), dest, True, "first extraction", len(files), 6 + 18 + 256 * 50
                                   + (6 if fmt != "zip" else 0), marker_path(dest))
    assert temp_leftovers(tmp_path) == []


def test_format_is_detected_by_content_then_by_name(tmp_path: Path) -> None:
    gz_named_bin = tmp_path / "blob.bin"
    gz_named_bin.write_bytes(tar_bytes([file("g.txt", b"gz")], "w:gz"))
    zip_named_tar = tmp_path / "really-a-zip.tar"
    zip_named_tar.write_bytes(zip_bytes([file("z.txt", b"zip")]))
    # A V7 tar has no "ustar" magic: only its name says what it is.
    old_tar = tmp_path / "old.tar"
    old_tar.write_bytes(v7_tar(tar_bytes([file("v7.txt", b"v7")], tar_format=tarfile.USTAR_FORMAT)))

    assert listing(extract_archive(str(gz_named_bin), tmp_path / "g").destination) == {"g.txt": b"gz"}
    assert listing(extract_archive(str(zip_named_tar), tmp_path / "z").destination) == {"z.txt": b"zip"}
    assert listing(extract_archive(str(old_tar), tmp_path / "v").destination) == {"v7.txt": b"v7"}


@pytest.mark.parametrize("fmt", ["tar.gz", "zip"])
def test_strip_components_drops_leading_components_and_skips_short_members(tmp_path: Path, fmt: str) -> None:
    entries = [Entry("top", "dir", mode=0o755), file("top/a.txt", b"a"), file("./top/sub/b.txt", b"b"),
               file("loose.txt", b"skipped"), symlink("top/l", "a.txt")]
    entries += [hardlink("top/h", "top/a.txt")] if fmt != "zip" else []
    archive = build(tmp_path / f"nested.{fmt}", entries)

    result = extract_archive(str(archive), tmp_path / "d", strip_components=1)

    expected = {"a.txt": b"a", "sub": "/", "sub/b.txt": b"b", "l": "-> a.txt"}
    assert listing(tmp_path / "d") == {**expected, **({"h": b"a"} if fmt != "zip" else {})}
    assert json.loads((marker_path(tmp_path / "d")).read_text())["strip_components"] == 1
    # A different strip is a different extraction.
    again = extract_archive(str(archive), tmp_path / "d", strip_components=2)
    assert again.extracted and again.reason == "strip-components changed" and result.extracted
    assert listing(tmp_path / "d") == {"b.txt": b"b"}


# --------------------------------------------------------------------------- idempotence
def test_rerun_with_the_same_archive_touches_nothing(tmp_path: Path) -> None:
    archive = build(tmp_path / "data.tar.gz", TREE)
    dest = tmp_path / "d"
    extract_archive(str(archive), dest)
    before = snapshot(dest)

    # Same content under another name is the same archive: identity is size + SHA-256.
    copy = tmp_path / "copy.tar.gz"
    copy.write_bytes(archive.read_bytes())
    result = extract_archive(str(copy), dest)

    assert not result.extracted and result.reason == "up to date" and result.files == len(TREE) - 1
    assert snapshot(dest) == before


def test_changed_archive_is_swapped_in_whole(tmp_path: Path) -> None:
    archive = tmp_path / "data.zip"
    dest = tmp_path / "d"
    build(archive, [file("keep.txt", b"v1"), file("old-only.txt", b"old")])
    extract_archive(str(archive), dest)

    build(archive, [file("keep.txt", b"version 2"), file("new-only.txt", b"new")])
    result = extract_archive(str(archive), dest)

    assert result.extracted and result.reason == "archive changed"
    assert listing(dest) == {"keep.txt": b"version 2", "new-only.txt": b"new"}
    assert everything(tmp_path) == {"data.zip", "d", "d/keep.txt", "d/new-only.txt"}


@pytest.mark.parametrize("damage", ["file removed", "file resized", "symlink removed", "marker garbled"])
def test_damaged_tree_is_detected_and_repaired(tmp_path: Path, damage: str) -> None:
    archive = build(tmp_path / "data.tar", TREE)
    dest = tmp_path / "d"
    extract_archive(str(archive), dest)
    if damage == "file removed":
        (dest / "sub" / "b.bin").unlink()
    elif damage == "file resized":
        with open(dest / "a.txt", "ab") as f:
            f.write(b"!")
    elif damage == "symlink removed":
        (dest / "up").unlink()
    else:
        (marker_path(dest)).write_text("{not json")

    result = extract_archive(str(archive), dest)

    assert result.extracted
    assert result.reason.startswith("the extracted.json marker is unreadable" if damage == "marker garbled"
                                    else "tree damaged")
    assert listing(dest) == EXPECTED
    assert not extract_archive(str(archive), dest).extracted


# --------------------------------------------------------------------------- hostile archives
def _absolute(tmp: Path) -> Path:
    return build(tmp / "abs.tar", [file(str(tmp / "abs-evil.txt"), b"x")])


HOSTILE: dict[str, tuple[Callable[[Path], Path], str]] = {
    "tar ../ member": (lambda t: build(t / "h.tar", [file("ok.txt", b"ok"), file("../escaped.txt", b"x")]),
                       "'../escaped.txt'"),
    "tar absolute member": (_absolute, "abs-evil.txt'"),
    "tar symlink to /etc/passwd": (lambda t: build(t / "h.tar", [symlink("passwd", "/etc/passwd")]), "'passwd'"),
    "tar symlink out, file written through it": (
        lambda t: build(t / "h.tar", [symlink("escape", "../.."), file("escape/evil.txt", b"x")]), "'escape'"),
    "tar symlink in, file written through it": (
        lambda t: build(t / "h.tgz", [Entry("sub", "dir"), symlink("inner", "sub"), file("inner/evil.txt", b"x")]),
        "'inner/evil.txt'"),
    "tar symlink chain escaping": (
        lambda t: build(t / "h.tar", [Entry("d", "dir"), symlink("d/e", "../d"), symlink("x", "d/e/e/../..")]), "'x'"),
    "tar hard link to /etc/passwd": (lambda t: build(t / "h.tar", [hardlink("h", "/etc/passwd")]), "'h'"),
    "tar hard link to ../": (lambda t: build(t / "h.tar.xz", [hardlink("h", "../outside.txt")]), "'h'"),
    "tar hard link to nothing": (lambda t: build(t / "h.tar", [hardlink("h", "ghost.txt")]), "'h'"),
    "tar FIFO": (lambda t: build(t / "h.tar", [Entry("pipe", "fifo")]), "'pipe': it is a FIFO"),
    "tar device": (lambda t: build(t / "h.tar.bz2", [Entry("null", "chardev")]), "'null': it is a character device"),
    "tar setuid file": (lambda t: build(t / "h.tar", [file("su", b"x", mode=0o4755)]), "'su': it has the setuid"),
    "tar backslash": (lambda t: build(t / "h.tar", [file("..\\evil.txt", b"x")]), "backslash"),
    "tar control character": (lambda t: build(t / "h.tar", [file("bad\x1bname", b"x")]), "control character"),
    "zip slip": (lambda t: build(t / "h.zip", [file("ok.txt", b"ok"), file("../../evil.txt", b"x")]),
                 "'../../evil.txt'"),
    "zip symlink to /etc/passwd": (lambda t: build(t / "h.zip", [symlink("link", "/etc/passwd")]), "'link'"),
    "zip symlink out, file written through it": (
        lambda t: build(t / "h.zip", [symlink("link", "../../.."), file("link/evil.txt", b"x")]), "'link'"),
    "zip FIFO": (lambda t: build(t / "h.zip", [Entry("pipe", "fifo")]), "'pipe': it is a FIFO"),
    "zip setgid file": (lambda t: build(t / "h.zip", [file("sg", b"x", mode=0o2755)]),
                        "'sg': it has the setuid/setgid"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_archive_is_refused_naming_the_member_and_writes_nothing(tmp_path: Path, case: str) -> None:
    builder, expected = HOSTILE[case]
    archive = builder(tmp_path)
    dest = tmp_path / "out" / "d"

    with pytest.raises(UsageError) as raised:
        extract_archive(str(archive), dest)

    assert expected in str(raised.value) and str(archive) in str(raised.value)
    assert everything(tmp_path) == {archive.name, "out"}  # nothing at D, no temp dir, nothing outside
    assert not (tmp_path / "abs-evil.txt").exists()


def test_hostile_update_leaves_the_earlier_tree_untouched(tmp_path: Path) -> None:
    archive = build(tmp_path / "data.zip", [file("good.txt", b"good")])
    dest = tmp_path / "d"
    extract_archive(str(archive), dest)
    before, marker = snapshot(dest), (marker_path(dest)).read_bytes()

    build(archive, [file("new.txt", b"new"), file("../../evil.txt", b"x")])
    with pytest.raises(UsageError, match="evil.txt"):
        extract_archive(str(archive), dest)

    assert snapshot(dest) == before and (marker_path(dest)).read_bytes() == marker
    assert everything(tmp_path) == {"data.zip", "d", "d/good.txt"}


# --------------------------------------------------------------------------- corrupt and unsupported
def _bad_crc(path: Path) -> Path:
    data = bytearray(tar_bytes([file("a.txt", b"alpha" * 100)], "w:gz"))
    data[-8] ^= 0xFF  # the gzip trailer's CRC32
    path.write_bytes(bytes(data))
    return path


def _cut(path: Path, data: bytes, size: int) -> Path:
    path.write_bytes(data[:size])
    return path


BIG = bytes(os.urandom(200_000))
CORRUPT: dict[str, Callable[[Path], Path]] = {
    "truncated tar.gz": lambda t: _cut(t / "c.tar.gz", tar_bytes([file("a.bin", BIG), file("b.bin", BIG)], "w:gz"),
                                       150_000),
    "tar.gz with a bad CRC": lambda t: _bad_crc(t / "c.tar.gz"),
    # Cut right after the last member, before the end-of-archive blocks: tarfile alone takes
    # this for a complete archive.
    "tar cut at a member boundary": lambda t: _cut(t / "c.tar",
                                                   tar_bytes([file("a.txt", b"a" * 512), file("b.txt", b"b")]),
                                                   512 + 512 + 512 * 2),
    "truncated zip": lambda t: _cut(t / "c.zip", zip_bytes([file("a.bin", BIG)]), 100_000),
}


@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_corrupt_archive_leaves_nothing_at_the_destination(tmp_path: Path, case: str) -> None:
    archive = CORRUPT[case](tmp_path)
    with pytest.raises(UsageError) as raised:
        extract_archive(str(archive), tmp_path / "out" / "d")

    assert str(archive) in str(raised.value)
    assert everything(tmp_path) == {archive.name, "out"}


@pytest.mark.parametrize(("name", "content", "expected"), [
    ("notes.txt", b"just some text, long enough to have no magic at all" * 20, "is not a supported archive"),
    ("data.tar.zst", b"\x28\xb5\x2f\xfd" + b"\0" * 600, "is not a supported archive"),
    ("empty.tar", b"", "is empty"),
    ("table.csv.gz", gzip.compress(b"a,b\n1,2\n" * 200), "cannot be read"),
])
def test_unsupported_format_is_a_clear_error_naming_the_archive(tmp_path: Path, name: str, content: bytes,
                                                                expected: str) -> None:
    (tmp_path / name).write_bytes(content)
    with pytest.raises(UsageError) as raised:
        extract_archive(str(tmp_path / name), tmp_path / "d")
    assert expected in str(raised.value) and name in str(raised.value)
    assert everything(tmp_path) == {name}


def test_destination_not_made_by_extract_is_never_replaced(tmp_path: Path) -> None:
    archive = build(tmp_path / "data.tar", [file("a.txt", b"a")])
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "precious.txt").write_bytes(b"mine")
    with pytest.raises(UsageError, match="no extracted.json marker"):
        extract_archive(str(archive), tmp_path / "home")
    assert listing(tmp_path / "home") == {"precious.txt": b"mine"}
    # An existing *empty* directory is fine: it is replaced by the finished tree.
    (tmp_path / "empty").mkdir()
    assert listing(extract_archive(str(archive), tmp_path / "empty").destination) == {"a.txt": b"a"}


# --------------------------------------------------------------------------- S3
def test_s3_tar_gz_is_streamed_once_and_a_rerun_is_one_head(s3_credentials: S3Credentials, s3_client: Any,
                                                            bucket: str, tmp_path: Path) -> None:
    s3_client.put_object(Bucket=bucket, Key="ds/data.tar.gz", Body=tar_bytes(TREE, "w:gz"))
    engine, methods = counting_engine(s3_credentials)
    dest = tmp_path / "d"

    first = extract_archive(f"s3://{bucket}/ds/data.tar.gz", dest, engine=engine)
    assert methods == ["HEAD", "GET"] and first.extracted and listing(dest) == EXPECTED
    head = s3_client.head_object(Bucket=bucket, Key="ds/data.tar.gz")
    assert json.loads((marker_path(dest)).read_text())["archive"] == {
        "kind": "s3", "bucket": bucket, "key": "ds/data.tar.gz", "size": head["ContentLength"],
        "etag": head["ETag"].strip('"')}
    before = snapshot(dest)

    methods.clear()
    again = extract_archive(f"s3://{bucket}/ds/data.tar.gz", dest, engine=engine)
    assert methods == ["HEAD"] and not again.extracted and snapshot(dest) == before

    s3_client.put_object(Bucket=bucket, Key="ds/data.tar.gz", Body=tar_bytes([file("v2.txt", b"2")], "w:gz"))
    methods.clear()
    changed = extract_archive(f"s3://{bucket}/ds/data.tar.gz", dest, engine=engine)
    assert methods == ["HEAD", "GET"] and changed.reason == "archive changed" and listing(dest) == {"v2.txt": b"2"}
    assert temp_leftovers(tmp_path) == []


def test_s3_zip_is_read_with_one_get_and_its_temp_copy_removed(s3_credentials: S3Credentials, s3_client: Any,
                                                                bucket: str, tmp_path: Path) -> None:
    s3_client.put_object(Bucket=bucket, Key="data.zip", Body=zip_bytes(TREE))
    engine, methods = counting_engine(s3_credentials)

    extract_archive(f"s3://{bucket}/data.zip", tmp_path / "d", engine=engine)

    assert methods == ["HEAD", "GET"] and listing(tmp_path / "d") == EXPECTED
    assert everything(tmp_path) == {"d"} | {f"d/{p}" for p in EXPECTED}


def test_cli_extracts_an_s3_tar_gz_and_reruns_as_a_no_op(s3_server: EmbeddedS3, s3_client: Any, bucket: str,
                                                         tmp_path: Path) -> None:
    s3_client.put_object(Bucket=bucket, Key="data.tar.gz", Body=tar_bytes(TREE, "w:gz"))
    args = ("extract", "--archive", f"s3://{bucket}/data.tar.gz", "--dest", str(tmp_path / "d"))

    first = run_cli(*args, "--json", env=s3_server.env())
    assert first.returncode == 0, first.stderr
    summary = json.loads(first.stdout)
    assert summary["extracted"] and summary["files"] == len(TREE) - 1
    assert summary["marker"] == str(marker_path(tmp_path / "d"))
    assert listing(tmp_path / "d") == EXPECTED

    again = run_cli(*args, env=s3_server.env())
    assert again.returncode == 0 and "already extracted" in again.stdout and len(again.stdout.splitlines()) == 1


@pytest.mark.parametrize(("archive", "extra", "expected"), [
    ("hostile", [], "'../escaped.txt'"),
    ("missing", [], "does not exist"),
    ("hostile", ["--strip-components", "-1"], "--strip-components '-1'"),
])
def test_cli_bad_input_exits_2_naming_the_value(s3_server: EmbeddedS3, bucket: str, tmp_path: Path, archive: str,
                                                extra: list[str], expected: str) -> None:
    source = str(build(tmp_path / "h.tar", [file("../escaped.txt", b"x")])) if archive == "hostile" \
        else f"s3://{bucket}/no-such.tar.gz"
    result = run_cli("extract", "--archive", source, "--dest", str(tmp_path / "d"), *extra, env=s3_server.env())
    assert result.returncode == 2 and result.stderr.startswith("error:") and expected in result.stderr
    assert not (tmp_path / "d").exists()


def test_a_killed_extractions_leftovers_are_removed(tmp_path: Path) -> None:
    archive = tmp_path / "a.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        info = tarfile.TarInfo("f.txt")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    dest = tmp_path / "out"
    leftover = temp_path_for(dest, lock_tag(destination_lock_path(dest)))  # a killed extraction's, under dest's lock
    (leftover / "half").mkdir(parents=True)
    (leftover / "half" / "big.bin").write_bytes(b"partial")
    extract_archive(str(archive), dest)
    assert not leftover.exists() and (dest / "f.txt").read_bytes() == b"x"


# --------------------------------------------------------------------------- resource limits and races
def test_a_compression_bomb_stops_at_the_ratio_and_leaves_nothing(tmp_path: Path) -> None:
    archive = build(tmp_path / "bomb.tar.gz", [file("zeros.bin", bytes(64 * 1024 * 1024))])
    assert archive.stat().st_size < 200_000  # 64 MiB of zeros, gzip ~1000x
    limits = ArchiveLimits(max_ratio=100, ratio_floor=1024 * 1024)
    with pytest.raises(UsageError, match=r"expands beyond 100×.*TAO_DATA_IO_ARCHIVE_MAX_RATIO"):
        extract_archive(str(archive), tmp_path / "d", limits=limits)
    assert everything(tmp_path) == {"bomb.tar.gz"}


def test_the_byte_limit_and_its_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = build(tmp_path / "data.tar", [file("a.bin", b"a" * 5000), file("b.bin", b"b" * 5000)])
    monkeypatch.setenv("TAO_DATA_IO_ARCHIVE_MAX_BYTES", "6000")
    with pytest.raises(UsageError, match="TAO_DATA_IO_ARCHIVE_MAX_BYTES"):
        extract_archive(str(archive), tmp_path / "d")
    monkeypatch.setenv("TAO_DATA_IO_ARCHIVE_MAX_BYTES", "20000")
    assert extract_archive(str(archive), tmp_path / "d").files == 2


def test_too_many_members_is_refused_naming_the_override(tmp_path: Path) -> None:
    archive = build(tmp_path / "many.tar.gz", [file(f"f{i}", b"") for i in range(300)])
    with pytest.raises(UsageError, match="more than 100 members.*TAO_DATA_IO_ARCHIVE_MAX_MEMBERS"):
        extract_archive(str(archive), tmp_path / "d", limits=ArchiveLimits(max_members=100))
    assert everything(tmp_path) == {"many.tar.gz"}


def test_a_sparse_member_is_refused_not_written_dense(tmp_path: Path) -> None:
    """A 10 KB sparse tar used to write 900 MiB of zeros."""
    sparse = tmp_path / "sparse.bin"
    with open(sparse, "wb") as handle:
        handle.seek(100 * 1024 * 1024)
        handle.write(b"end")
    archive = tmp_path / "sparse.tar"
    done = subprocess.run(["tar", "--sparse", "-cf", str(archive), "-C", str(tmp_path), "sparse.bin"],
                          capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"GNU tar cannot make sparse archives here: {done.stderr!r}")
    assert archive.stat().st_size < 1024 * 1024
    with pytest.raises(UsageError, match="sparse"):
        extract_archive(str(archive), tmp_path / "d")
    assert not (tmp_path / "d").exists()


def test_two_extractions_into_one_destination_wait_for_each_other(tmp_path: Path) -> None:
    first = build(tmp_path / "one.tar", [file(f"one/{i}.txt", b"1" * 1000) for i in range(300)])
    second = build(tmp_path / "two.tar", [file(f"two/{i}.txt", b"2" * 1000) for i in range(300)])
    dest = tmp_path / "d"
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda a: extract_archive(str(a), dest), [first, second, first, second]))
    assert all(r.files == 300 for r in results)
    final = listing(dest)
    assert set(final) in ({"one", *(f"one/{i}.txt" for i in range(300))},
                          {"two", *(f"two/{i}.txt" for i in range(300))})
    assert [p for p in tmp_path.iterdir() if p.name.startswith(".tao-data-io-partial")] == []


def test_a_killed_s3_zip_extraction_leaves_no_spool_behind(s3_credentials: S3Credentials, s3_client: Any, bucket: str,
                                                           tmp_path: Path) -> None:
    s3_client.put_object(Bucket=bucket, Key="data.zip", Body=zip_bytes(TREE))
    dest = tmp_path / "d"
    spool = temp_path_for(dest, lock_tag(destination_lock_path(dest)))  # what a SIGKILL during the copy leaves
    spool.write_bytes(b"partial zip")
    engine, _ = counting_engine(s3_credentials)
    extract_archive(f"s3://{bucket}/data.zip", dest, engine=engine)
    assert not spool.exists() and listing(dest) == EXPECTED
