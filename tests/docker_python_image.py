"""An image with a Python that imports torch (CPU), for the Docker backend's multi-rank tests, built
for the session's own dockerd (:mod:`tests.docker_daemon`) from what this host already has: nothing
can be pulled, and nothing is kept between sessions (the image goes with the session's daemon).

What the image holds, each at the path it has on this host, so the interpreter finds its standard
library and its shared libraries (a RUNPATH such as pyenv's ``$prefix/lib`` included) without any
setting:

* the venv's interpreter (the real file its ``bin/python`` links to) and the standard library of
  that installation, less what nothing here imports (its own tests, IDLE, tkinter, the static
  ``libpython*.a`` of ``config-*``, the pip wheels of ``ensurepip``) and the optimized ``.pyc``;
* in that installation's site-packages (on ``sys.path`` with no venv around it), torch's wheel
  (``torch``, ``torchgen``, ``functorch``) less its C++ headers, CMake files, C++ test binaries
  and test libraries, and typing_extensions: what ``import torch``, torchrun and a gloo all-reduce
  import (traced here with ``PYTHONPROFILEIMPORTTIME``; numpy and tqdm are imported only when
  present, sympy, networkx, jinja2, filelock and fsspec not at all);
* every shared library ``ldd`` finds for the interpreter and for each extension module and
  library above (torch's own libraries are found through their ``$ORIGIN``), and the dynamic
  loader — a ``lib-dynload`` module whose libraries this host lacks is left out, as it could not
  be imported here either;
* the busybox rootfs of the session's test image (``sh`` and the tools the frame and its verify
  probe run, ``/etc/passwd`` and ``/etc/group`` with nobody, a 1777 ``/tmp``), and ``python`` and
  ``python3`` in ``/usr/local/bin``, on Docker's default ``PATH``.

The tarball is streamed to the daemon as it is written (``docker import`` of an uncompressed
tar: the daemon's extraction, not compression, is what takes the time). A module of its own, so
test modules share the fixture without importing each other (``from . import docker_python_image
as pyimage`` and ``python_image = pyimage.python_image`` in a test module). Built once a session
however many modules take it: a module's fixture finds the image already on the daemon.
"""

from __future__ import annotations

import io
import json
import os
import re
import stat
import struct
import subprocess
import sys
import sysconfig
import tarfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

import pytest

from .docker_daemon import DockerDaemon

#: The image's tag on the session's daemon.
IMAGE = "tao-data-io-test:python-torch"
#: The distributions of the venv the image carries (see the module's docstring for why these).
DISTRIBUTIONS = ("torch", "typing_extensions")
#: Where ``python`` is in the image: Docker's default PATH has /usr/local/bin.
PYTHON_LINKS = ("usr/local/bin/python", "usr/local/bin/python3")
#: Parts of the standard library nothing here imports (directories, at any depth).
_STDLIB_SKIPPED_DIRECTORIES = frozenset({"test", "tests", "idle_test", "idlelib", "tkinter", "turtledemo",
                                         "ensurepip", "lib2to3", "site-packages", "dist-packages", "__phello__"})
_STDLIB_SKIPPED = re.compile(r"(^config-[^/]*/|\.opt-[12]\.pyc$|^lib-dynload/_(tkinter|test[^/]*|xxtestfuzz)\.)")
#: Parts of torch's wheel nothing here runs: C++ headers, CMake files, stubs, C++ test binaries.
_WHEEL_SKIPPED = re.compile(r"(^torch/(include|share|test)/|^torch/bin/(?!torch_shm_manager$)"
                            r"|^torch/lib/lib(jitbackend_test|backend_with_compiler|torchbind_test|aoti_custom_ops)\.so$"
                            r"|\.(h|hpp|cuh|cpp|cu|cmake|pyi)$)")
_LDD_FOUND = re.compile(r"^\s*(?:\S+ => )?(/\S+) \(0x[0-9a-f]+\)$")
_LDD_MISSING = re.compile(r"^\s*(\S+) => not found$")
_CHUNK = 1 << 20
_ELF_HEADER = 64


@dataclass(frozen=True)
class PythonImage:
    """The image on the session's daemon: ``tag`` to run, ``python`` the interpreter's path in it
    (``python`` on its PATH links there), and what building it took: the tarball's ``size`` in
    bytes, its ``files``, and the seconds of the build and import together (the tarball is
    streamed to the daemon as it is made)."""

    tag: str
    python: str
    size: int
    files: int
    seconds: float


@pytest.fixture(scope="session")
def python_image(docker_daemon: DockerDaemon) -> PythonImage:
    """The image, built and imported on the session's daemon (see the module's docstring)."""
    built = _BUILT.get(docker_daemon.pid)
    if built is None:
        built = _BUILT[docker_daemon.pid] = build(docker_daemon)
    return built


#: The image built for each daemon of this session, by its pid (one, unless one was restarted).
_BUILT: dict[int, PythonImage] = {}


def build(daemon: DockerDaemon) -> PythonImage:
    """Make the image's tarball from this host's files and ``docker import`` it as :data:`IMAGE`."""
    started = time.monotonic()
    files = image_files()
    base = _base_rootfs(daemon)
    read, write = os.pipe()
    written: list[int] = []
    failed: list[BaseException] = []

    def produce() -> None:
        try:
            with os.fdopen(write, "wb", buffering=_CHUNK) as sink:
                written.append(_write_tar(sink, base, files))
        except BaseException as exc:  # noqa: BLE001 - handed to the importing thread, which fails with it
            failed.append(exc)

    producer = threading.Thread(target=produce, name="python-image-tar", daemon=True)
    producer.start()
    repository, _, tag = IMAGE.partition(":")
    with os.fdopen(read, "rb", buffering=0) as source:
        try:
            said = daemon.client.api.import_image(src=iter(lambda: source.read(_CHUNK), b""),
                                                  repository=repository, tag=tag, stream_src=True)
        finally:
            source.close()  # a producer still writing gets EPIPE instead of blocking
            producer.join()
    if failed:
        raise failed[0]
    if '"error' in said:  # the daemon answers 200 and says what went wrong in its progress stream
        raise RuntimeError(f"the daemon did not import {IMAGE}: {said[-2000:]}")
    daemon.client.images.get(IMAGE)
    return PythonImage(tag=IMAGE, python=str(_interpreter()), size=written[0], files=len(files),
                       seconds=time.monotonic() - started)


# ---------------------------------------------------------------- what goes in
def image_files() -> dict[str, Path]:
    """Path in the image (relative, no leading slash) → the file on this host whose contents it
    gets; symbolic links are followed (the image holds each file itself)."""
    files: dict[str, Path] = {}
    interpreter = _interpreter()
    files[_inside(interpreter)] = interpreter
    stdlib = Path(sysconfig.get_path("stdlib")).resolve()
    for path in _walk(stdlib):
        relative = path.relative_to(stdlib).as_posix()
        if not _STDLIB_SKIPPED.search(relative):
            files[_inside(stdlib / relative)] = path
    site = Path(sysconfig.get_path("purelib", vars={"base": sys.base_prefix, "platbase": sys.base_prefix}))
    for name in DISTRIBUTIONS:
        distribution = metadata.distribution(name)
        for entry in distribution.files or []:
            relative = PurePosixPath(entry)
            source = Path(str(distribution.locate_file(entry)))
            if relative.parts[0] == ".." or _WHEEL_SKIPPED.search(relative.as_posix()) or not source.is_file():
                continue  # outside site-packages (a script in bin/), unused, or listed but absent
            files[_inside(site / relative)] = source
    _add_libraries(files)
    return files


def _interpreter() -> Path:
    """The venv's interpreter: the real file its ``python`` links to."""
    return Path(sys.executable).resolve()


def _inside(path: Path) -> str:
    return path.as_posix().lstrip("/")


def _walk(root: Path) -> Iterator[Path]:
    """Every regular file under ``root``, less the directories :data:`_STDLIB_SKIPPED_DIRECTORIES` names."""
    for directory, subdirectories, names in os.walk(root):
        subdirectories[:] = sorted(name for name in subdirectories if name not in _STDLIB_SKIPPED_DIRECTORIES)
        for name in sorted(names):
            path = Path(directory, name)
            if path.is_file():
                yield path


def _add_libraries(files: dict[str, Path]) -> None:
    """Add the shared libraries (and the loader) the interpreter and every ELF object in ``files``
    need, at the path ``ldd`` names; leave out a ``lib-dynload`` module whose libraries are not on
    this host, and fail for anything else that needs a missing one."""
    interpreter = _inside(_interpreter())
    objects = {inside: path for inside, path in files.items()
               if inside == interpreter or re.search(r"\.so(\.[0-9.]+)?$", inside)}
    carried = {path.resolve() for path in objects.values()}
    for inside, needs in _ldd(objects).items():
        missing = [need for need in needs if need.startswith("!")]
        if missing:
            if "/lib-dynload/" in inside:
                del files[inside]
                continue
            raise RuntimeError(f"{objects[inside]} needs {', '.join(m[1:] for m in missing)}, which this host lacks")
        for need in needs:
            path = Path(need)
            if path.resolve() not in carried:
                files.setdefault(_inside(path), path.resolve())


def _ldd(objects: dict[str, Path]) -> dict[str, list[str]]:
    """image path → the libraries ``ldd`` finds for each object (``!name`` for one it does not)."""
    found: dict[str, list[str]] = {}
    names = sorted(objects)
    for start in range(0, len(names), 200):
        batch = names[start:start + 200]
        output = subprocess.run(["ldd", *(str(objects[name]) for name in batch)], capture_output=True, text=True,
                                timeout=120).stdout
        # With several files, ldd heads each one's list with "path:".
        sections = re.split(r"^(\S.*):\n", output, flags=re.MULTILINE)[1:]
        by_path = dict(zip(sections[0::2], sections[1::2]))
        for name in batch:
            listed = by_path.get(str(objects[name]), "") if len(batch) > 1 else output
            needs = []
            for line in listed.splitlines():
                if match := _LDD_FOUND.match(line):
                    needs.append(match.group(1))
                elif match := _LDD_MISSING.match(line):
                    needs.append("!" + match.group(1))
            found[name] = needs
    return found


def _base_rootfs(daemon: DockerDaemon) -> bytes:
    """The session's busybox test image's only layer, as ``docker save`` gives it."""
    saved = io.BytesIO(b"".join(daemon.client.images.get(daemon.image).save()))
    with tarfile.open(fileobj=saved) as archive:
        manifest = json.load(_member(archive, "manifest.json"))
        (layer,) = manifest[0]["Layers"]
        return _member(archive, layer).read()


def _member(archive: tarfile.TarFile, name: str) -> io.BufferedReader:
    extracted = archive.extractfile(name)
    if extracted is None:
        raise RuntimeError(f"docker save's archive has no file {name}")
    return extracted  # type: ignore[return-value]


# ---------------------------------------------------------------- the tarball
def _write_tar(sink: io.BufferedWriter, base: bytes, files: dict[str, Path]) -> int:
    """Write the image's rootfs to ``sink``: the busybox layer, then ``files`` (each with its
    directories, 0755: the image's ``/root`` included when the interpreter lives under it, or the
    job's unprivileged user could not reach it), then the ``python`` links; the bytes written."""
    directories = {str(parent) for inside in files for parent in PurePosixPath(inside).parents if str(parent) != "."}
    counted = _Counting(sink)
    with tarfile.open(fileobj=counted, mode="w|", format=tarfile.GNU_FORMAT) as tar:
        with tarfile.open(fileobj=io.BytesIO(base)) as layer:
            for member in layer:
                if member.isdir() and member.name.rstrip("/") in directories:
                    member.mode |= 0o555
                    directories.discard(member.name.rstrip("/"))
                tar.addfile(member, layer.extractfile(member) if member.isfile() else None)
        for directory in sorted(directories, key=lambda name: (name.count("/"), name)):
            tar.addfile(_info(directory, tarfile.DIRTYPE, 0o755))
        for inside in sorted(files):
            source = files[inside]
            found = source.stat()
            info = _info(inside, tarfile.REGTYPE, stat.S_IMODE(found.st_mode) & 0o755 | 0o444, found.st_mtime)
            with source.open("rb") as contents:
                head, info.size = _loaded_part(contents, found.st_size)
                tar.addfile(info, io.BufferedReader(_Joined(head, contents)))
        for link in PYTHON_LINKS:
            tar.addfile(_info(link, tarfile.SYMTYPE, 0o777, link=str(_interpreter())))
    return counted.count


def _loaded_part(contents: BinaryIO, size: int) -> tuple[bytes, int]:
    """What of a file goes into the image: its first bytes (as the image gets them) and its size
    there. An ELF object (64-bit, little-endian) loses what lies past the end of its last segment
    — the section headers and the sections nothing loads, such as the symbol table only a
    debugger reads (89 of libtorch_cpu's 434 MB, 17 of libpython's 23) — and its ELF header stops
    naming section headers; the dynamic loader reads only the program headers, all within the
    part kept (what ``sstrip`` does). Every other file is whole. ``contents`` is left just past
    the bytes returned."""
    head = contents.read(_ELF_HEADER)
    if len(head) < _ELF_HEADER or head[:6] != b"\x7fELF\x02\x01":
        return head, size
    table_offset, = struct.unpack_from("<Q", head, 32)
    entry_size, entries = struct.unpack_from("<HH", head, 54)
    contents.seek(table_offset)
    table = contents.read(entry_size * entries)
    contents.seek(len(head))
    # Each program header: p_type, p_flags, p_offset, p_vaddr, p_paddr, p_filesz.
    end = max((offset + length for _, _, offset, _, _, length in
               (struct.unpack_from("<IIQQQQ", table, index * entry_size) for index in range(entries))), default=0)
    section_offset, = struct.unpack_from("<Q", head, 40)
    if len(table) < entry_size * entries or not len(head) <= end < size or section_offset < end:
        return head, size
    trimmed = bytearray(head)
    struct.pack_into("<Q", trimmed, 40, 0)  # e_shoff
    struct.pack_into("<HHH", trimmed, 58, 0, 0, 0)  # e_shentsize, e_shnum, e_shstrndx
    return bytes(trimmed), end


class _Joined(io.RawIOBase):
    """``head``, then what ``rest`` holds from where it is (a file's kept part: see :func:`_loaded_part`)."""

    def __init__(self, head: bytes, rest: BinaryIO) -> None:
        super().__init__()
        self.head, self.rest = memoryview(head), rest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self.head:
            count = min(len(buffer), len(self.head))
            buffer[:count], self.head = self.head[:count], self.head[count:]
            return count
        return self.rest.readinto(buffer)  # type: ignore[attr-defined,no-any-return]


def _info(name: str, kind: bytes, mode: int, mtime: float = 0, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime, info.linkname = kind, mode, int(mtime), link
    return info


class _Counting(io.RawIOBase):
    """A writable stream that passes everything to ``sink`` and counts it."""

    def __init__(self, sink: io.BufferedWriter) -> None:
        super().__init__()
        self.sink, self.count = sink, 0

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.sink.write(data)
        self.count += len(data)
        return len(data)
