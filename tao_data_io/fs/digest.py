"""File digests: the hex digest of a scanned file, in the algorithms tao-data-io compares.

**Why.** A digest decides whether a file is already right (an upload's ETag, a Hub file's id, a
cached archive), so each one is taken of exactly the file that was scanned (:mod:`.reading`),
in bounded memory, and in one place so two callers never disagree on an algorithm.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable

from .reading import open_scanned, read_bounded


#: The algorithms :func:`file_digest` knows. ``git-blob-sha1`` is the Hub's id of a file kept in
#: git: sha1 over ``b"blob <size>\\0"`` followed by the content.
DIGEST_ALGORITHMS = ("md5", "sha256", "git-blob-sha1")


def file_digest(path: str | os.PathLike[str], algorithm: str, *, identity: tuple[int, int] | None = None,
                size: int | None = None, on_chunk: Callable[[], None] | None = None) -> str:
    """The hex digest of the regular file at ``path``, read in 1 MiB chunks (memory stays flat)
    through :func:`open_scanned` — given a scan's ``identity`` and ``size``, of exactly that file
    and that many bytes. ``on_chunk`` is told of each chunk read (a lock's renewal needs it: a
    50 GB checkpoint takes minutes to hash)."""
    fd = open_scanned(path, identity=identity, size=size, follow=identity is None)
    try:
        length = os.fstat(fd).st_size if size is None else size
        if algorithm == "md5":
            digest = hashlib.md5(usedforsecurity=False)
        elif algorithm == "sha256":
            digest = hashlib.sha256()
        elif algorithm == "git-blob-sha1":
            digest = hashlib.sha1(b"blob %d\0" % length, usedforsecurity=False)
        else:
            raise ValueError(f"unknown digest algorithm {algorithm!r}; use one of {DIGEST_ALGORITHMS}")
        for chunk in read_bounded(fd, length):
            digest.update(chunk)
            if on_chunk is not None:
                on_chunk()
    finally:
        os.close(fd)
    return digest.hexdigest()
