"""When a transfer last made progress, for the lock held while it runs.

Why: an upload holds its job's upload lock for as long as it runs, and a lease renewed by a
timer while the process lives keeps that lock for a holder stuck in a read that never returns
(a hung NFS server, a FIFO swapped in for a file), a send that never ends — and every later
upload and ``collect --wait`` waits behind it forever. So the lock is renewed only while the
upload moves: each page listed, directory scanned, file planned, chunk read or sent and file
finished is a :meth:`Activity.beat`. Per chunk, not per file: one 50 GB checkpoint makes no
per-file progress for an hour.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


class Activity:
    """The last moment one transfer moved (monotonic clock); shared by the threads doing it."""

    def __init__(self) -> None:
        self._last = time.monotonic()

    def beat(self) -> None:
        self._last = time.monotonic()  # one float store: atomic, so no lock is needed

    def idle_seconds(self) -> float:
        return time.monotonic() - self._last


def beating(chunks: Iterable[T], activity: Activity | None) -> Iterator[T]:
    """``chunks`` as they are read (or taken by a sender; or pages as they are listed), each one a
    beat of ``activity``."""
    for chunk in chunks:
        if activity is not None:
            activity.beat()
        yield chunk
