"""The run directory of one local job: the files through which the submitter, the detached
supervisor and every later reader (status, logs, cancel — in other processes, days later) talk.

Why files, each written whole and once (:func:`~tao_data_io.fs.atomic.atomic_write`): the supervisor
outlives the process that started it, so there is no shared memory and no connection — only the
directory. A reader sees a record entirely or not at all, and each record has one writer:

==================  ==========================================================  ==================
file                what                                                         written by
==================  ==========================================================  ==================
``launch.json``     the plan, the host results directory, the tools' paths, the  submit (under lock)
                    identity of each source submit checked
``supervisor.json`` the supervisor's pid and start time                          the supervisor
``probe/``          the probe script and its checklist (bound into the frame)    the supervisor
``verdict.json``    the verify verdict, persistence check included               the supervisor
``ranks.json``      each rank's bubblewrap and sandbox pid-1 identities          the supervisor
``exit.json``       how the job ended                                            the supervisor
``cancel.json``     a cancel was asked for                                       cancel (under lock)
``*.log``           the probe's and each rank's output (capped: :mod:`.joblog`)   the supervisor
                    and the supervisor's own
==================  ==========================================================  ==================

No file holds a credential value: they reach the supervisor through its environment only.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from pydantic import Field

from ...launch.binding import BoundSource
from ...launch.rundir import LaunchRecord, RunFiles, read_record
from ...schema import Strict
from .process import ProcessId
from ...launch.run_as import RunAs
from .supervisor import RECORD_NAME


class Launch(LaunchRecord):
    """What submit decided: everything the supervisor needs but the credential values."""

    bwrap: str
    nsenter: str | None = None
    #: Who the command becomes (:mod:`.run_as`): set when the backend runs as root.
    run_as: RunAs | None = None
    #: The size of each segment of a frame's log (:mod:`.joblog`); None in a launch from before
    #: logs had a limit: one file each.
    log_segment: int | None = None
    submitted_at: datetime
    #: target → the object submit checked for each bind; the supervisor binds these and nothing
    #: else (:mod:`tao_data_io.launch.binding`). Empty in the launch of a version before binds were checked.
    sources: dict[str, BoundSource] = Field(default_factory=dict)
    #: What was restored into the results before the command started (a later attempt's).
    restored: str | None = None


class RankProcesses(Strict):
    rank: int
    #: The bubblewrap process the supervisor started (its child).
    bwrap: ProcessId
    #: The sandbox's pid 1: killing it ends every process of the rank (its pid namespace dies).
    sandbox: ProcessId | None


class Ranks(Strict):
    ranks: list[RankProcesses] = Field(default_factory=list)


class ExitRecord(Strict):
    """How the job ended: the first rank that failed (or rank 0), and why."""

    exit_code: int
    #: The signal that ended the command, when it was one (an exit code above 128 by convention).
    signal: int | None = None
    rank: int = 0
    canceled: bool = False
    #: bubblewrap could not set the frame up (its own message); the command never ran.
    setup_error: str | None = None
    #: The run passed its ``compute_shape.deadline_seconds`` and was ended for it.
    deadline_seconds: int | None = None

    @property
    def failed(self) -> bool:
        return self.exit_code != 0 or self.setup_error is not None


class RunDir(RunFiles[Launch]):
    """Paths and records of ``<run_root>/<job id>/run``."""

    launch_model = Launch

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.supervisor_file = path / RECORD_NAME
        self.ranks_file = path / "ranks.json"
        self.exit_file = path / "exit.json"
        self.probe_dir = path / "probe"
        self.probe_log = path / "probe.log"
        self.supervisor_log = path / "supervisor.log"

    def rank_log(self, rank: int) -> Path:
        return self.path / f"rank-{rank}.log"

    def ranks(self) -> Ranks | None:
        return read_record(self.ranks_file, Ranks)

    def exit(self) -> ExitRecord | None:
        return read_record(self.exit_file, ExitRecord)

    def supervisor(self) -> ProcessId | None:
        """Written with plain ``json`` by the supervisor before it imports anything heavy."""
        try:
            return ProcessId.from_dict(json.loads(self.supervisor_file.read_bytes()))
        except FileNotFoundError:
            return None
