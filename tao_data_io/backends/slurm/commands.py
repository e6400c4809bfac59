"""SLURM's own commands, run on this host (a login node) against the target's cluster: what the
backend asks of them and how it reads their answers.

Why the commands and not the REST API: every SLURM site has them, on the login node where users
already submit, with the site's authentication (munge) already set up; ``slurmrestd`` is an
extra daemon few sites run. Each command gets an environment of our own making — ``PATH``,
``SLURM_CONF`` and, for ``sbatch`` alone, the forwarded credentials it exports by name — never
the caller's whole environment (its cloud credentials would reach the job through ``sbatch``'s
default ``--export=ALL``), and never a value in its argv (which every user of the host can read).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ...errors import BackendError, UsageError

#: How long one command may take: slurmctld answers in milliseconds; a busy one in seconds.
COMMAND_TIMEOUT_S = 60
_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: ``scontrol show job -o``'s fields: ``Key=value`` separated by spaces; a value may hold spaces
#: (a Reason, a Command), so a field starts only where a word followed by ``=`` does.
_FIELD = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=")
#: What ``sacct`` says when the cluster keeps no accounting.
_NO_ACCOUNTING = "accounting storage is disabled"


@dataclass(frozen=True)
class Step:
    """One row of ``sacct``: a job's batch step, a numbered step, or the job itself."""

    id: str
    state: str
    exit_code: str
    derived: str = ""


class Slurm:
    """The cluster's commands, found on ``PATH`` and pointed at ``conf`` (None: SLURM's default)."""

    def __init__(self, conf: str | None) -> None:
        self.conf = conf

    def environment(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = {"PATH": os.environ.get("PATH") or _DEFAULT_PATH, "LANG": "C.UTF-8"}
        if self.conf:
            env["SLURM_CONF"] = self.conf
        return {**env, **(extra or {})}

    def run(self, argv: Sequence[str], *, extra_env: Mapping[str, str] | None = None,
            check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run one of SLURM's commands; a missing one is a usage error naming the package, one
        that cannot reach the cluster a retryable backend error with what it said."""
        try:
            done = subprocess.run(list(argv), env=self.environment(extra_env), capture_output=True, text=True,
                                  timeout=COMMAND_TIMEOUT_S, stdin=subprocess.DEVNULL, check=False)
        except FileNotFoundError:
            raise UsageError(f"{argv[0]} is not installed here, and the SLURM backend runs SLURM's own commands on "
                             "the host that submits (a login node): install the cluster's SLURM client "
                             "(apt-get install slurm-client, or your site's module)") from None
        except subprocess.TimeoutExpired:
            raise BackendError(f"{argv[0]} did not answer within {COMMAND_TIMEOUT_S}s: is slurmctld up? (scontrol "
                               "ping)", retryable=True) from None
        if check and done.returncode != 0:
            raise BackendError(f"{' '.join(argv[:2])} failed (exit {done.returncode}): {_said(done)}",
                               retryable=_unreachable(done))
        return done

    def test(self, script: str) -> None:
        """``sbatch --test-only SCRIPT``: whether the cluster could ever run the job, asked before
        anything is handed to the job's user. A cluster that does not enforce its partitions'
        limits (``EnforcePartLimits=NO``, the default) accepts a job no node can ever run — more
        nodes or memory than a partition has — and it would wait in the queue for good
        (``PartitionNodeLimit``); such a job is refused here with the scheduler's own words."""
        self._sbatch(["sbatch", "--test-only", script], None)

    def submit(self, script: str, environment: Mapping[str, str]) -> str:
        """``sbatch --parsable SCRIPT``; the SLURM job id. ``environment`` (the forwarded
        credentials, the job's token) goes into sbatch's own environment only, which the script's
        ``--export`` names take their values from."""
        return self._sbatch(["sbatch", "--parsable", script], environment).strip().split(";")[0]

    def _sbatch(self, argv: list[str], environment: Mapping[str, str] | None) -> str:
        done = self.run(argv, extra_env=environment, check=False)
        if done.returncode != 0:
            said = _said(done)
            if _unreachable(done):
                raise BackendError(f"sbatch could not reach the cluster: {said}", retryable=True)
            raise UsageError(f"the cluster refused the job (sbatch: {said}): fix what it names — the target's "
                             "partition, account, qos, reservation, extra_options or run_root, or the request's "
                             "compute_shape — and submit again")
        return done.stdout

    def job(self, job_id: str) -> dict[str, str] | None:
        """``scontrol show job -o ID`` as fields, or None once slurmctld has forgotten the job
        (``MinJobAge`` after its end)."""
        done = self.run(["scontrol", "show", "job", "-o", job_id], check=False)
        if done.returncode != 0:
            if "Invalid job id" in done.stderr or "Invalid job id" in done.stdout:
                return None
            raise BackendError(f"scontrol show job {job_id} failed: {_said(done)}", retryable=True)
        line = done.stdout.strip().splitlines()[0] if done.stdout.strip() else ""
        return fields(line) if line else None

    def named(self, name: str) -> list[str]:
        """The ids of the jobs slurmctld still has named ``name`` (a submit that died between
        ``sbatch`` and writing down the id finds its job again)."""
        done = self.run(["squeue", "--noheader", "--states=all", f"--name={name}", "--format=%i"])
        return [line.strip() for line in done.stdout.splitlines() if line.strip()]

    def steps(self, job_id: str) -> list[Step] | None:
        """``sacct``'s rows of the job (steps included), or None where the cluster keeps no
        accounting — never taken for a job that has not run."""
        done = self.run(["sacct", "--noheader", "--parsable2", "--jobs", job_id,
                         "--format=JobID,State,ExitCode,DerivedExitCode"], check=False)
        if done.returncode != 0:
            if _NO_ACCOUNTING in (done.stderr + done.stdout).lower():
                return None
            raise BackendError(f"sacct -j {job_id} failed: {_said(done)}", retryable=True)
        rows = [line.split("|") for line in done.stdout.splitlines() if line.strip()]
        return [Step(*(row + ["", "", "", ""])[:4]) for row in rows]

    def has_pyxis(self) -> bool:
        """Whether ``srun`` here takes pyxis's options: pyxis is a SPANK plugin, which adds
        ``--container-image`` to ``srun --help`` wherever the cluster's plugstack.conf loads it."""
        return "--container-image" in self.run(["srun", "--help"], check=False).stdout

    def cancel(self, job_id: str) -> None:
        """``scancel ID``: the job's steps and batch shell get SIGTERM, then SIGKILL after the
        cluster's ``KillWait``; a pending job is removed."""
        self.run(["scancel", job_id], check=False)


def fields(line: str) -> dict[str, str]:
    """One ``scontrol -o`` line as its fields (see :data:`_FIELD`)."""
    found = list(_FIELD.finditer(line))
    return {match.group(1): line[match.end():found[n + 1].start() if n + 1 < len(found) else len(line)].strip()
            for n, match in enumerate(found)}


def _said(done: subprocess.CompletedProcess[str]) -> str:
    return (done.stderr.strip() or done.stdout.strip() or "nothing said")[-2000:]


def _unreachable(done: subprocess.CompletedProcess[str]) -> bool:
    said = (done.stderr + done.stdout).lower()
    return any(word in said for word in ("unable to contact", "connection refused", "socket timed out",
                                         "slurm_load_jobs error: unable", "communication",
                                         "zero bytes were transmitted"))
