"""A SLURM job's state on the shared filesystem: ``<run_root>/<job id>/run``.

Why on the shared filesystem and in our own records, not only in slurmctld: slurmctld forgets a
job ``MinJobAge`` after its end (300 s by default), ``sacct`` works only where the site keeps
accounting, and neither knows what submit checked or who canceled. So what submit decided, the
SLURM job id, the verdict, a cancel and how the job ended are kept here — owner-only files in a
directory the job's user may pass through (0711) but not list — beside the directories the job
reads (``agent``, ``control``) and writes (``report``), as :mod:`.script` lays them out.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from pydantic import Field

from ...launch.rundir import LaunchRecord, RunFiles, read_record
from ...schema import Strict
from .script import BATCH_LOG, PROBE_EXIT, PROBE_REPORT, RANK_EXIT, RANK_LOG, JobFiles


class Launch(LaunchRecord):
    """What submit decided: everything later calls need but the credential values."""

    #: Whom the job runs as (``sbatch --uid``/``--gid`` when the backend runs as root).
    uid: int
    gid: int
    #: The job's secret (:data:`.script.TOKEN_VARIABLE`): the persistence token the probe writes into
    #: the results directory, and the name of each file a rank reports in.
    token: str
    submitted_at: datetime
    #: SLURM's job id; None between writing this record and ``sbatch``'s answer.
    slurm_id: str | None = None
    #: What was restored into the results before the command started (a later attempt's).
    restored: str | None = None


class Ended(Strict):
    """How the job ended, kept once SLURM said so: slurmctld forgets it soon after."""

    #: SLURM's ``JobState`` (or sacct's State) at the end; "" when SLURM had already forgotten it.
    state: str
    #: SLURM's ``ExitCode`` of the batch script, ``code:signal``.
    exit_code: str = ""
    reason: str = ""
    #: Each rank's exit status as its frame wrote it (SLURM keeps none per task); a rank that was
    #: killed before it could write has none.
    ranks: dict[int, int] = Field(default_factory=dict)
    #: Ranks whose log has slurmstepd's word of an OOM kill in their step.
    oom_ranks: list[int] = Field(default_factory=list)
    #: What taking the results back from the job's user changed, a bounded list of lines.
    taken_back: list[str] = Field(default_factory=list)


class RunDir(RunFiles[Launch]):
    """Paths and records of ``<run_root>/<job id>/run``."""

    launch_model = Launch

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.ended_file = path / "ended.json"
        self.files = JobFiles(agent=str(path / "agent"), control=str(path / "control"), report=str(path / "report"))

    @property
    def agent(self) -> Path:
        return Path(self.files.agent)

    @property
    def control(self) -> Path:
        return Path(self.files.control)

    @property
    def report(self) -> Path:
        return Path(self.files.report)

    def probe_report(self, token: str, rank: int) -> str:
        return PROBE_REPORT.format(token, rank)

    def probe_exit(self, token: str, rank: int) -> str:
        return PROBE_EXIT.format(token, rank)

    def rank_exit(self, token: str, rank: int) -> str:
        return RANK_EXIT.format(token, rank)

    def rank_log(self, rank: int) -> Path:
        return self.report / RANK_LOG.format(rank)

    def batch_log(self) -> Path:
        return self.report / BATCH_LOG

    def ended(self) -> Ended | None:
        return read_record(self.ended_file, Ended)

    def over(self) -> bool:
        return self.ended() is not None
