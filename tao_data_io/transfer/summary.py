"""What a transfer did, as plain data a CLI prints and a Prefect task shows.

The summary is the engine's one return value: counts and bytes of what moved, what was
already right, what was excluded or skipped by policy, and each failure with its reason. A
partial failure is visible here (``ok`` is False) and every complete file is kept.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class Failure:
    """One object that did not move: its name (key or relative path) and why."""

    name: str
    reason: str
    #: True when the object does not exist (404): callers such as selective staging treat a
    #: missing reference differently from a failed transfer.
    missing: bool = False


@dataclass(frozen=True)
class Skipped:
    """One item left alone by policy (a symlink leaving the tree, a special file, a folder marker)."""

    name: str
    reason: str


@dataclass
class TransferSummary:
    source: str
    destination: str
    dry_run: bool = False
    transferred_files: int = 0
    transferred_bytes: int = 0
    unchanged_files: int = 0
    unchanged_bytes: int = 0
    excluded_files: int = 0
    skipped: list[Skipped] = field(default_factory=list)
    failed: list[Failure] = field(default_factory=list)
    #: Names of what was (or, on a dry run, would be) transferred.
    transferred: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failed

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["ok"] = self.ok
        return data

    def describe(self) -> str:
        """One human line, e.g. for a log or a Prefect artifact title."""
        verb = "would transfer" if self.dry_run else "transferred"
        text = (
            f"{verb} {self.transferred_files} files ({human_size(self.transferred_bytes)}), "
            f"{self.unchanged_files} unchanged ({human_size(self.unchanged_bytes)}), "
            f"{self.excluded_files} excluded, {len(self.skipped)} skipped, {len(self.failed)} failed"
        )
        return text + (f" in {self.seconds:.2f}s" if self.seconds else "")


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
    """A snapshot passed to the progress callback: totals planned and done so far."""

    files_total: int
    bytes_total: int
    files_done: int
    bytes_done: int
    files_failed: int


ProgressCallback = Callable[[Progress], None]


class ProgressTracker:
    """Thread-safe counter that calls the user's callback on every change.

    Why a class: the executor reports completions from worker threads (or a reader thread of
    a child process); the callback must see consistent totals and never run concurrently
    with itself.
    """

    def __init__(self, files_total: int, bytes_total: int, callback: ProgressCallback | None) -> None:
        self._lock = threading.Lock()
        self._callback = callback
        self.files_total, self.bytes_total = files_total, bytes_total
        self.files_done = self.bytes_done = self.files_failed = 0

    def start(self) -> None:
        self._emit()

    def advance(self, nbytes: int, *, failed: bool = False) -> None:
        with self._lock:
            if failed:
                self.files_failed += 1
            else:
                self.files_done += 1
                self.bytes_done += nbytes
            self._emit_locked()

    def _emit(self) -> None:
        with self._lock:
            self._emit_locked()

    def _emit_locked(self) -> None:
        if self._callback is not None:
            self._callback(Progress(self.files_total, self.bytes_total, self.files_done, self.bytes_done, self.files_failed))
