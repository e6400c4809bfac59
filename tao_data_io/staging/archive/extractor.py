"""The confined extractor: checks each member before a byte of it is written and writes it under
the fresh work directory through :func:`~tao_data_io.fs.confinement.confined_path` (which never follows a
symlink on the way), with ``O_EXCL``; symlinks are made only after every file, so nothing is ever
written through one."""

from __future__ import annotations

import os
import posixpath
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...errors import UnsafePathError, UsageError
from ...fs.confinement import check_relative, confined_path, is_within
from ...reporting import Progress, ProgressCallback
from .formats import CHUNK, DIRECTORY, HARDLINK, SPECIAL, SYMLINK, Member, reading
from .limits import ExtractionBudget

#: What a member may be, whatever its mode in the archive: readable by every user — the job reads
#: it as its own user, who is not the stager when the backend runs as root (the staging root keeps
#: out whoever must not reach it) — and never setuid, setgid or writable by others.
_READABLE_DIRECTORY = 0o755
_READABLE_FILE = 0o644


class Extractor:
    """Checks each member and writes it under ``root`` (the fresh work directory).

    Symlinks are only recorded while members stream by and created in :meth:`finish`, after
    every file: so no member is ever written through one, whatever the archive's order.
    """

    def __init__(self, root: Path, label: str, dest: Path, strip_components: int, budget: ExtractionBudget,
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

    def add(self, member: Member) -> None:
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
                raise self.refuse(member.name,
                                  f"it would be written through the symlink member {self.symlinks[parent][0]!r}",
                                  unsafe=True)
        path = self._path(target, member.name)
        path.parent.mkdir(parents=True, exist_ok=True)
        if member.kind == DIRECTORY:
            if path.is_dir():
                os.chmod(path, _READABLE_DIRECTORY)
            else:
                self._vacate(path, member.name)
                path.mkdir(mode=_READABLE_DIRECTORY)
        elif member.kind == HARDLINK:
            self._hard_link(member, target, path)
        else:
            self._write(member, target, path)

    def _write(self, member: Member, target: str, path: Path) -> None:
        assert member.open is not None
        self._vacate(path, member.name)
        with reading(self.label):
            source = member.open()
        written = 0
        with source, open(path, "xb") as out:
            while True:
                with reading(self.label):
                    chunk = source.read(CHUNK)
                if not chunk:
                    break
                self.budget.spend(len(chunk))  # before writing: a bomb never lands a byte past the limit
                out.write(chunk)
                written += len(chunk)
        if written != member.size:
            raise UsageError(f"archive {self.label!r} is truncated or corrupt: member {member.name!r} has {written} of "
                             f"its {member.size} bytes; re-create or re-upload it")
        os.chmod(path, (member.mode & 0o755) | _READABLE_FILE)
        self.entries[target] = {"path": target, "size": written}
        self.files_written += 1
        self.bytes_written += written
        if self.progress is not None:
            self.progress(Progress(0, 0, self.files_written, self.bytes_written, 0))

    def _hard_link(self, member: Member, target: str, path: Path) -> None:
        linked = _logical_name(member.link)
        self._check(linked, what=f"hard link {member.name!r} → target")
        stripped = self._strip(linked)
        if stripped is None or stripped == target or "size" not in self.entries.get(stripped, {}):
            raise self.refuse(member.name,
                              f"its target {member.link!r} is not a file extracted earlier from this archive",
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
            raise UnsafePathError(f"archive {self.label!r}: {exc}; "
                                  f"nothing was extracted to {str(self.dest)!r}") from None

    def _path(self, target: str, member: str) -> Path:
        try:
            return confined_path(self.root, target, what=f"member {member!r} at")
        except UnsafePathError as exc:
            raise UnsafePathError(f"archive {self.label!r}: {exc}; "
                                  f"nothing was extracted to {str(self.dest)!r}") from None

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
