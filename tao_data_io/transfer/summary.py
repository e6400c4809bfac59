"""What a transfer did, as plain data a CLI prints and a Prefect task shows.

The summary is the engine's one return value: counts and bytes of what moved, what was
already right, what was excluded or skipped by policy, and what failed — every one counted, the
first :data:`NAMES_KEPT` of each kept with its name and reason, so its size does not grow with
the object count. A partial failure is visible here (``ok`` is False) and every complete file
is kept.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..reporting import MAX_EXAMPLES, human_size

#: The most names a summary keeps of what it transferred, skipped and failed, each (callers that
#: undo a run's files, annotation-selective staging, keep one per reference; a dry run lists this many).
NAMES_KEPT = 10_000


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
    #: What was skipped and what failed, each with its reason: the first :attr:`names_kept` of
    #: each (:attr:`skipped_files` and :attr:`failed_files` count them all), so a run whose every
    #: GET of 1.28 M objects is refused holds 10,000 failures, not 1.28 M — add them with
    #: :meth:`skip` and :meth:`fail`.
    skipped: list[Skipped] = field(default_factory=list)
    failed: list[Failure] = field(default_factory=list)
    #: Names of what was (or, on a dry run, would be) transferred, in the order they landed: the
    #: first :data:`NAMES_KEPT` (``transferred_files`` counts them all), so a summary of 1.28 M
    #: files stays small.
    transferred: list[str] = field(default_factory=list)
    seconds: float = 0.0
    #: How many names :attr:`transferred`, :attr:`skipped` and :attr:`failed` each keep at most.
    names_kept: int = field(default_factory=lambda: NAMES_KEPT)
    #: Skips and failures past :attr:`names_kept`: counted, not kept.
    skipped_unkept: int = 0
    failed_unkept: int = 0

    def name_transferred(self, names: Iterable[str]) -> None:
        """Keep ``names`` among :attr:`transferred`, up to :attr:`names_kept` in all."""
        room = self.names_kept - len(self.transferred)
        if room > 0:
            self.transferred.extend(itertools.islice(names, room))

    def skip(self, *skipped: Skipped) -> None:
        """Count each of ``skipped``, keeping it among :attr:`skipped` while there is room."""
        for item in skipped:
            if len(self.skipped) < self.names_kept:
                self.skipped.append(item)
            else:
                self.skipped_unkept += 1

    def fail(self, failure: Failure) -> None:
        """Count ``failure``, keeping it among :attr:`failed` while there is room."""
        if len(self.failed) < self.names_kept:
            self.failed.append(failure)
        else:
            self.failed_unkept += 1

    @property
    def skipped_files(self) -> int:
        return len(self.skipped) + self.skipped_unkept

    @property
    def failed_files(self) -> int:
        return len(self.failed) + self.failed_unkept

    @property
    def ok(self) -> bool:
        return self.failed_files == 0

    def to_dict(self) -> dict[str, object]:
        """Counts and at most :data:`MAX_EXAMPLES` examples of each list, never every name: the
        result of a 20,000-file transfer stays a few hundred bytes wherever it is stored."""
        return {
            "source": self.source, "destination": self.destination, "dry_run": self.dry_run, "ok": self.ok,
            "transferred_files": self.transferred_files, "transferred_bytes": self.transferred_bytes,
            "unchanged_files": self.unchanged_files, "unchanged_bytes": self.unchanged_bytes,
            "excluded_files": self.excluded_files, "skipped_files": self.skipped_files,
            "failed_files": self.failed_files, "seconds": round(self.seconds, 3),
            "failed": [{"name": f.name, "reason": f.reason} for f in self.failed[:MAX_EXAMPLES]],
            "skipped": [{"name": s.name, "reason": s.reason} for s in self.skipped[:MAX_EXAMPLES]],
            "transferred": self.transferred[:MAX_EXAMPLES],
        }

    def describe(self) -> str:
        """One human line, e.g. for a log or a Prefect artifact title."""
        verb = "would transfer" if self.dry_run else "transferred"
        text = (
            f"{verb} {self.transferred_files} files ({human_size(self.transferred_bytes)}), "
            f"{self.unchanged_files} unchanged ({human_size(self.unchanged_bytes)}), "
            f"{self.excluded_files} excluded, {self.skipped_files} skipped, {self.failed_files} failed"
        )
        return text + (f" in {self.seconds:.2f}s" if self.seconds else "")
