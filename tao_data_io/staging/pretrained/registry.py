"""What a model registry reports about a model, and the interface each registry client implements.

Why a seam: the Hub and NGC differ in every HTTP detail, but pulling, verifying and publishing
are the same for both, so :mod:`.pull` works against :class:`Registry` and each client
(:mod:`.hub`, :mod:`.ngc`) only lists and fetches.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

SHA256 = "sha256"
#: The Hub's id of a file kept directly in git: sha1 over ``b"blob <size>\\0"`` + the content.
GIT_BLOB_SHA1 = "git-blob-sha1"
HEX = {SHA256: re.compile(r"[0-9a-f]{64}"), GIT_BLOB_SHA1: re.compile(r"[0-9a-f]{40}")}


@dataclass(frozen=True)
class Digest:
    """A content digest as the registry reports it (``sha256`` or ``git-blob-sha1``, lowercase hex)."""

    algorithm: str
    value: str

    def __post_init__(self) -> None:
        pattern = HEX.get(self.algorithm)
        if pattern is None or not pattern.fullmatch(self.value):
            raise ValueError(f"not a {self.algorithm} digest: {self.value!r}")

    def __str__(self) -> str:
        return f"{self.algorithm}:{self.value}"

    @classmethod
    def parse(cls, text: str) -> Digest:
        algorithm, _, value = text.partition(":")
        return cls(algorithm, value)


@dataclass(frozen=True)
class RemoteFile:
    """One file of the model: its path below the destination, its size and digest (if reported)."""

    path: str
    size: int
    digest: Digest | None


@dataclass(frozen=True)
class Listing:
    """Every file of the model at ``revision`` (a Hub commit sha, or the NGC version)."""

    revision: str
    files: tuple[RemoteFile, ...]


class Registry(Protocol):
    def listing(self) -> Listing:
        """What the registry reports for the URI: the resolved revision and every file."""

    def fetch(self, files: Sequence[RemoteFile], revision: str, staging: Path,
              on_file: Callable[[RemoteFile], None]) -> None:
        """Write each file's bytes to ``staging / file.path`` (verification is the caller's),
        calling ``on_file`` after each one (progress)."""
