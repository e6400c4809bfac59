"""Processes named by identity — a pid *and* its start time — so a recycled pid is never ours.

Why: the local backend finds its processes again from files (the supervisor's record, the ranks'
record) written by another process, possibly days earlier. A bare pid in such a file may by now
belong to someone else; killing it would be a bug with victims. The kernel's start time (field
22 of ``/proc/<pid>/stat``, in clock ticks since boot) never repeats for one pid within a boot,
so ``(pid, start_time)`` names one process for good. Signals go through a pidfd opened *before*
the identity is checked, which closes the window between "it is ours" and "signal it".

This module is imported by the supervisor before it detaches, so it stays standard-library only.
"""

from __future__ import annotations

import os
import signal
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class ProcStat:
    """The fields of ``/proc/<pid>/stat`` we use."""

    state: str
    ppid: int
    start_time: int


def proc_stat(pid: int) -> ProcStat | None:
    """Read ``/proc/<pid>/stat``; None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            text = handle.read().decode("utf-8", "replace")
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) is in parentheses and may itself contain ") ": split after the last one.
    fields = text[text.rindex(")") + 2:].split()
    return ProcStat(state=fields[0], ppid=int(fields[1]), start_time=int(fields[19]))


@dataclass(frozen=True)
class ProcessId:
    pid: int
    start_time: int

    @classmethod
    def of(cls, pid: int, *, parent: int | None = None) -> ProcessId | None:
        """The identity of process ``pid`` (whose parent must be ``parent`` when given: a child of a
        process that has not been reaped cannot have had its pid reused)."""
        stat = proc_stat(pid)
        if stat is None or (parent is not None and stat.ppid != parent):
            return None
        return cls(pid, stat.start_time)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProcessId:
        return cls(pid=int(data["pid"]), start_time=int(data["start_time"]))

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    def alive(self) -> bool:
        """Whether this very process still runs (a zombie has finished: it only awaits its reaper)."""
        stat = proc_stat(self.pid)
        return stat is not None and stat.start_time == self.start_time and stat.state not in ("Z", "X")

    def signal(self, signum: int) -> bool:
        """Send ``signum`` if this very process still runs; return whether it was sent."""
        try:
            pidfd = os.pidfd_open(self.pid)
        except ProcessLookupError:
            return False
        try:
            if not self.alive():  # checked with the pidfd held: the pid cannot be reused meanwhile
                return False
            signal.pidfd_send_signal(pidfd, signum)
            return True
        except ProcessLookupError:
            return False
        finally:
            os.close(pidfd)
