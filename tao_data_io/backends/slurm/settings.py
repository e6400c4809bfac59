"""What the SLURM backend is built from: which cluster, where each job's state lives on the shared
filesystem, which directories the compute nodes share with this host, how ranks run (a pyxis
container, a bubblewrap frame, or the node's own environment), whom a job runs as, and the
scheduler options a site asks for. Declared once: the backend is built from it, the
``tao-slurm-target`` block embeds it, the CLI fills it from its flags, and a job record keeps
its dump (``backend_config``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar, Literal, Self

from pydantic import Field, ValidationInfo, field_validator

from ...launch.backend import RunRootSettings
from ...launch.users import JobId
from ...schema import AbsolutePath

ROOT_VARIABLE = "TAO_DATA_IO_SLURM_ROOT"
DEFAULT_ROOT = "~/.tao-data-io/slurm"
#: Where SLURM's commands find the cluster's configuration when nothing else names it.
CONF_VARIABLE = "SLURM_CONF"
#: A name SLURM takes for a partition, account, QOS or reservation (no space, comma or newline).
SLURM_NAME = r"^[A-Za-z0-9_.+-]{1,64}$"
#: An extra ``#SBATCH`` option's value: one token, never shell or a second line.
OPTION_VALUE = r"^[A-Za-z0-9_.,:=@%+/-]{0,200}$"
#: The sbatch options a target may add, by their whole names: where a site places and accounts a
#: job. Only these, exactly — sbatch takes any unambiguous abbreviation of an option (``--ui`` is
#: ``--uid``), so a list of refused names could never be whole; and none of them is one the
#: backend sets itself or one that would undo what it guarantees (whom the job runs as, its
#: environment, its logs, its requeue, its nodes).
SITE_OPTIONS = frozenset({
    "acctg-freq", "begin", "bb", "bbf", "cluster-constraint", "constraint", "contiguous", "core-spec",
    "cores-per-socket", "cpu-freq", "cpus-per-gpu", "deadline", "delay-boot", "distribution", "exclude",
    "extra-node-info", "gpu-bind", "gpu-freq", "gres-flags", "hint", "licenses", "mcs-label", "mem-bind",
    "mem-per-cpu", "mem-per-gpu", "mincpus", "network", "nice", "nodelist", "overcommit", "oversubscribe", "power",
    "priority", "profile", "reboot", "sockets-per-node", "spread-job", "switches", "thread-spec", "threads-per-core",
    "time-min", "tmp", "use-min-nodes", "wckey",
})
#: What a run root may not hold: it is written into ``#SBATCH --output``/``--chdir`` lines, where
#: SLURM reads a space as the option's end and ``%`` as a pattern (``%j``: the job id).
_RUN_ROOT_REFUSED = set(" \t\n%#\"'\\`$,")
Runtime = Literal["pyxis", "bubblewrap", "none"]


class SlurmSettings(RunRootSettings):
    """How the SLURM backend runs each job: on which cluster, on which shared directories, in what."""

    name: ClassVar[str] = "slurm"

    slurm_conf: AbsolutePath | None = Field(
        None, title="slurm.conf",
        description=f"The cluster's slurm.conf, for SLURM's commands run on this host (a login node). Empty: "
                    f"${CONF_VARIABLE}, else SLURM's own default; the job record keeps what was decided.")
    run_root: AbsolutePath | None = Field(
        None, title="Run root (shared)",
        description="A directory on the filesystem the compute nodes share with this host (Lustre, NFS): each "
                    "job's run directory (its batch script, logs, exit files) and, unless results go to a mount, "
                    f"its results, one directory per job. Empty: ${ROOT_VARIABLE}, else {DEFAULT_ROOT}.")
    shared_roots: list[AbsolutePath] = Field(
        default_factory=list, title="Shared directories",
        description="The other directories the compute nodes see at the same path as this host (the staging "
                    "root, datasets pre-positioned on Lustre). Every input and results directory must lie under "
                    "the run root or one of these: a path only this host has would be missing on the nodes.")
    container_runtime: Runtime = Field(
        "pyxis", title="Container runtime",
        description="How each rank runs: pyxis (srun's container-image option, NVIDIA's enroot, as on DGX "
                    "clusters: the "
                    "request's image, inputs bound read-only), bubblewrap (the nodes' own programs in a sandbox "
                    "that sees only the job's inputs and results, as the local backend's frame), or none (the "
                    "node's own environment, only for a request whose inputs are read where they lie).")
    partition: str | None = Field(
        None, title="Partition",
        description="The partition jobs are submitted to (sbatch's partition). Empty: the cluster's default.")
    account: str | None = Field(
        None, title="Account",
        description="The account jobs are charged to (sbatch's account). Empty: the user's default.")
    qos: str | None = Field(
        None, title="QOS", description="The quality of service (sbatch's qos). Empty: the account's default.")
    reservation: str | None = Field(
        None, title="Reservation", description="A reservation jobs run in (sbatch's reservation). Empty: none.")
    exclusive: bool = Field(
        False, title="Whole nodes",
        description="No other job shares the job's nodes (sbatch's exclusive): what multi-GPU training wants.")
    gres_name: str = Field(
        "gpu", title="GPU GRES name",
        description="The generic resource a GPU is in the cluster's gres.conf: each node asks for NAME:N of it for "
                    "compute_shape.gpus.")
    extra_options: dict[str, str] = Field(
        default_factory=dict, title="Other sbatch options",
        description="More #SBATCH options a site requires, option → value (constraint: ib, mem-per-gpu: 64G): "
                    "sbatch's scheduling options by their whole names, each value one word; the options the "
                    "backend sets itself (job-name, output, export, uid, nodes, time…) are refused.")
    allow_network: bool = Field(
        False, title="Network allowed",
        description="Whether a single-node job whose request asks for the network (network: true) gets it in its "
                    "bubblewrap frame. A multi-node job always has the nodes' network: its ranks meet over it.")
    run_as_user: JobId = Field(
        None, title="Run as user (uid)",
        description="The uid a job runs as when the backend runs as root (sbatch's uid); never 0. Empty: 65534 "
                    "(nobody). An unprivileged backend runs its jobs as itself.")
    run_as_group: JobId = Field(
        None, title="Run as group (gid)",
        description="The gid a job runs as when the backend runs as root (sbatch's gid); never 0. Empty: 65534.")
    pending_timeout: float | None = Field(
        None, gt=0, le=30 * 86400, title="Queue wait (seconds)",
        description="How long a job may wait in the queue (PENDING, held, requeued) before submit gives up on it "
                    "and cancels it, naming the scheduler's reason. Empty: as long as the cluster keeps it queued "
                    "(a busy cluster's wait is no failure; the submit step waits with it).")
    cancel_grace_seconds: int = Field(
        30, ge=1, le=3600, title="Cancel grace (seconds)",
        description="How long a cancel lets the command end after SIGTERM (it may save a checkpoint) before the "
                    "job is killed.")

    @field_validator("partition", "account", "qos", "reservation", "gres_name")
    @classmethod
    def _slurm_name(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value in (None, ""):
            return None if info.field_name != "gres_name" else "gpu"
        if not re.fullmatch(SLURM_NAME, value):
            raise ValueError(f"{info.field_name} {value!r} is not a SLURM name: letters, digits and _.+- only, at most "
                             "64 (as `sinfo` or `sacctmgr show` print them)")
        return value

    @field_validator("extra_options")
    @classmethod
    def _options(cls, value: dict[str, str]) -> dict[str, str]:
        for name, given in value.items():
            option = name.removeprefix("--")
            if option not in SITE_OPTIONS:
                raise ValueError(f"extra_options names {name!r}, which is not one of the sbatch options a target may "
                                 f"add (by its whole name: {', '.join(sorted(SITE_OPTIONS))}): the backend sets whom "
                                 "the job runs as, its environment, logs, nodes, time and requeue itself; use the "
                                 "target's own fields for partition, account, qos, reservation and exclusive")
            if not isinstance(given, str) or not re.fullmatch(OPTION_VALUE, given):
                raise ValueError(f"extra_options --{option} value {given!r} is not one word: letters, digits and "
                                 "_.,:=@%+/- only, no space or newline (it becomes one #SBATCH line)")
        return {name.removeprefix("--"): given for name, given in value.items()}

    @field_validator("run_root")
    @classmethod
    def _run_root(cls, value: str | None) -> str | None:
        if value and _RUN_ROOT_REFUSED & set(value):
            raise ValueError(f"run_root {value!r} holds {''.join(sorted(_RUN_ROOT_REFUSED & set(value)))!r}, which "
                             "SLURM reads in a batch script's #SBATCH lines as the end of a path or a pattern (%j): "
                             "choose a directory whose path has none of them")
        return value

    def resolved(self, environ: Mapping[str, str] | None = None) -> Self:
        """These settings with ``run_root`` and ``slurm_conf`` decided (given, else the environment,
        else the default): a later process with another environment must reach the same cluster
        and find the same jobs."""
        env = os.environ if environ is None else environ
        root = Path(self.run_root or env.get(ROOT_VARIABLE) or DEFAULT_ROOT).expanduser().absolute()
        conf = self.slurm_conf or env.get(CONF_VARIABLE) or None
        return self.model_copy(update={"run_root": str(root), "slurm_conf": conf})
