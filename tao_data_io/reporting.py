"""What every step reports: a small result with ``to_dict()`` and ``describe()``, and progress.

Why one module: the CLI prints results, a Prefect task returns them (they land in the API's
database) and artifacts show them, so every result must be small and JSON-able — counts, bytes,
seconds, destinations, a few examples of what failed — never a list of every file: a resync of
20,000 files reports a few hundred bytes. :class:`Report` is the contract; each step's result
type implements it.

Progress: executors report from worker threads, possibly thousands of times a second. A
consumer that talks to a server (a Prefect artifact) wants a few updates a second at most, so
:func:`throttled` wraps a callback to forward at most ``per_second`` snapshots and always the
last one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

#: How many failure examples a result carries; the count is always exact.
MAX_EXAMPLES = 20


@runtime_checkable
class Report(Protocol):
    """A step result: small JSON-able data and one human line."""

    def to_dict(self) -> dict[str, Any]: ...

    def describe(self) -> str: ...


def human_size(size: int) -> str:
    """1536 → '1.5 KiB': sizes for people."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"


@dataclass(frozen=True)
class Progress:
    """A snapshot passed to a progress callback: totals planned and done so far."""

    files_total: int
    bytes_total: int
    files_done: int
    bytes_done: int
    files_failed: int
    #: Set on the last snapshot of a run whose totals were unknown while it ran (an archive).
    final: bool = False
    #: More may still be planned (a listing streamed page by page): the totals so far are a floor.
    planning: bool = False

    @property
    def finished(self) -> bool:
        return self.final or (not self.planning and 0 < self.files_total <= self.files_done + self.files_failed)


ProgressCallback = Callable[[Progress], None]


class ProgressTracker:
    """Thread-safe counter that calls the user's callback on every change.

    Why a class: completions arrive from worker threads (or a reader thread of a child
    process); the callback must see consistent totals and never run concurrently with itself.
    """

    def __init__(self, files_total: int, bytes_total: int, callback: ProgressCallback | None, *,
                 planning: bool = False) -> None:
        self._lock = threading.Lock()
        self._callback = callback
        self.files_total, self.bytes_total = files_total, bytes_total
        self.files_done = self.bytes_done = self.files_failed = 0
        self.planning = planning

    def start(self) -> None:
        with self._lock:
            self._emit_locked()

    def plan(self, files: int, nbytes: int) -> None:
        """Add what the next part of a streamed plan moves."""
        with self._lock:
            self.files_total += files
            self.bytes_total += nbytes

    def planned_all(self) -> None:
        """Nothing more is planned, and all of it is done: the snapshot that finishes a streamed
        run (``final``: also when it moved nothing, which no count would say)."""
        with self._lock:
            self.planning = False
            self._emit_locked(final=True)

    def advance(self, nbytes: int, *, failed: bool = False) -> None:
        with self._lock:
            if failed:
                self.files_failed += 1
            else:
                self.files_done += 1
                self.bytes_done += nbytes
            self._emit_locked()

    def _emit_locked(self, *, final: bool = False) -> None:
        if self._callback is not None:
            self._callback(Progress(self.files_total, self.bytes_total, self.files_done, self.bytes_done,
                                    self.files_failed, final=final, planning=self.planning))


def throttled(callback: ProgressCallback, per_second: float = 1.0,
              clock: Callable[[], float] = time.monotonic) -> ProgressCallback:
    """``callback``, called at most ``per_second`` times a second; the first snapshot and every
    finished one always pass, so a consumer never misses the start or the end."""
    interval = 1.0 / per_second
    lock = threading.Lock()
    last = [float("-inf")]

    def forward(progress: Progress) -> None:
        with lock:
            now = clock()
            if not progress.finished and now - last[0] < interval:
                return
            last[0] = now
        callback(progress)

    return forward


def said_list(words: Sequence[str], conjunction: str = "or") -> str:
    """``a, b or c``: ``words`` as a sentence says them (``conjunction`` before the last)."""
    if len(words) < 2:
        return "".join(words)
    return f"{', '.join(words[:-1])} {conjunction} {words[-1]}"
