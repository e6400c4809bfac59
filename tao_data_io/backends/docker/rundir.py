"""A Docker job's state on this host: ``<run_root>/<job id>/run``, the backend's alone (0700).

Why on the host and not only in the daemon: the daemon forgets a container once it is removed,
and labels are the job's to read (``docker inspect``), so what submit decided (the plan, the
objects it checked, whom the job runs as), the verdict, a cancel and how each rank ended are kept
here, out of every container's reach; the containers' frame directories (agent, control, each
rank's report) lie beside them, bound into the containers as :mod:`.frame` says.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from pydantic import Field

from ...launch.binding import BoundSource
from ...launch.rundir import LaunchRecord, RunFiles, read_record
from ...schema import Strict


class Launch(LaunchRecord):
    """What submit decided: everything later calls need but the credential values."""

    uid: int
    gid: int
    #: Each rank's GPUs (device ids).
    gpus: list[list[str]] = Field(default_factory=list)
    #: target → the object submit checked for each bind (the probe's ``bound`` checks).
    sources: dict[str, BoundSource] = Field(default_factory=dict)
    #: The persistence token the probe writes into the results directory.
    token: str
    submitted_at: datetime
    #: What was restored into the results before the command started (a later attempt's).
    restored: str | None = None


class RankEnd(Strict):
    """How one rank's container ended, as the daemon said before it was removed."""

    rank: int
    exit_code: int | None
    oom_killed: bool = False
    #: ``State.Error``: why the daemon could not start it (a device driver, a mount).
    error: str = ""
    #: Whether its command started (the host's ``go`` was given).
    started: bool = False
    #: Whether tao-data-io stopped it because the job was over (another rank failed, a verdict).
    stopped: bool = False
    #: How long the container ran, by the daemon's clock (None: unknown).
    ran_seconds: float | None = None


class Ended(Strict):
    """How the job ended: every rank's end, kept once its containers are removed."""

    ranks: list[RankEnd]
    #: What taking the results back from the job's user changed, a bounded list of lines.
    taken_back: list[str] = Field(default_factory=list)
    #: The daemon no longer had the containers (removed outside tao-data-io).
    vanished: bool = False


class RunDir(RunFiles[Launch]):
    """Paths and records of ``<run_root>/<job id>/run``."""

    launch_model = Launch

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.ended_file = path / "ended.json"
        self.agent = path / "agent"
        self.control = path / "control"

    def report(self, rank: int) -> Path:
        return self.path / f"rank-{rank}"

    def saved_log(self, rank: int) -> Path:
        return self.path / f"rank-{rank}.log"

    def ended(self) -> Ended | None:
        return read_record(self.ended_file, Ended)

    def over(self) -> bool:
        return self.ended() is not None
