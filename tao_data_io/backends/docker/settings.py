"""What the Docker backend is built from: which daemon, where each job's state lives on this host,
whom a job runs as, which GPUs it may have, and the container limits the request does not set.
Declared once: the backend is built from it, the ``tao-docker-target`` block embeds it, the CLI
fills it from its flags, and a job record keeps its dump (``backend_config``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar, Self

from pydantic import Field, field_validator

from ...errors import UsageError
from ...launch.backend import RunRootSettings
from ...launch.users import JobId
from ...quantities import checked_quantity
from ...schema import AbsolutePath

ROOT_VARIABLE = "TAO_DATA_IO_DOCKER_ROOT"
DEFAULT_ROOT = "~/.tao-data-io/docker"
#: Where docker-py and the docker CLI find the daemon when nothing else names it.
HOST_VARIABLE = "DOCKER_HOST"
DEFAULT_HOST = "unix:///var/run/docker.sock"
DEFAULT_LOG_LIMIT = "64Mi"
MIN_LOG_LIMIT, MAX_LOG_LIMIT = "1Mi", "4Gi"
#: A GPU's id as the NVIDIA runtime takes it: an index (``0``) or a UUID (``GPU-…``, ``MIG-…``).
GPU_ID_PATTERN = r"^(?:[0-9]{1,3}|(?:GPU|MIG)-[0-9A-Za-z-]{1,80})$"


class DockerSettings(RunRootSettings):
    """How the Docker backend runs each job: on which daemon, as whom, with which GPUs and limits."""

    name: ClassVar[str] = "docker"

    docker_host: str | None = Field(
        None, title="Docker daemon",
        description=f"The daemon's socket, unix:///PATH. Empty: ${HOST_VARIABLE}, else {DEFAULT_HOST}. Only a daemon "
                    "on this host: inputs are staged and mount sources checked on this host, and a remote daemon "
                    "(tcp://, ssh://) would bind paths of its own host, which nothing here has checked.")
    run_root: AbsolutePath | None = Field(
        None, title="Run root",
        description="Where each job's run directory (its state, saved logs and verdicts) and, unless results go to a "
                    f"mount, its results live on this host, one directory per job. Empty: ${ROOT_VARIABLE}, else "
                    f"{DEFAULT_ROOT}, decided when the backend is built; the job record keeps the path decided.")
    allow_network: bool = Field(
        False, title="Network allowed",
        description="Whether a job whose request asks for the network (network: true) gets the daemon's default "
                    "network. Off by default: such a request is refused before anything starts, and every other "
                    "job's containers have no network but their own loopback (ranks share rank 0's).")
    run_as_user: JobId = Field(
        None, title="Run as user (uid)",
        description="The uid each container runs as (never 0: a container without a user namespace shares the "
                    "host's uids, and a job never holds host root). Empty: the uid that runs the backend, so "
                    "results are theirs — or 65534 (nobody) when the backend runs as root.")
    run_as_group: JobId = Field(
        None, title="Run as group (gid)",
        description="The gid each container runs as (never 0). Empty: the backend's gid, or 65534 when it runs as "
                    "root.")
    gpu_devices: list[str] = Field(
        default_factory=list, title="GPUs jobs may use",
        description="The GPUs (indexes such as 0, or UUIDs from `nvidia-smi -L`) this target's jobs may be given; "
                    "each rank gets compute_shape.gpus of them, disjoint, in this order. Empty: no GPU, and a "
                    "request for one is refused. Needs the NVIDIA Container Toolkit on the daemon's host.")
    pids_limit: int = Field(
        16384, ge=64, le=4_194_304, title="Process limit",
        description="The most processes and threads each container may hold (its pids cgroup): a fork bomb in a "
                    "job ends there, not in the host's process table. Data loaders count every thread.")
    log_limit: str = Field(
        DEFAULT_LOG_LIMIT, title="Log limit",
        description="The most of each rank's output the daemon keeps (json-file, two files of half this each), a "
                    f"binary quantity from {MIN_LOG_LIMIT} to {MAX_LOG_LIMIT}: the newest output is kept.")
    cancel_grace_seconds: int = Field(
        30, ge=1, le=3600, title="Cancel grace (seconds)",
        description="How long a cancel lets the command end after SIGTERM (it may save a checkpoint) before the "
                    "daemon kills it.")

    @field_validator("docker_host")
    @classmethod
    def _local_daemon(cls, value: str | None) -> str | None:
        if value in (None, ""):
            return None
        return local_daemon(value, "docker_host")

    @field_validator("gpu_devices")
    @classmethod
    def _gpu_ids(cls, value: list[str]) -> list[str]:
        bad = [gpu for gpu in value if not re.fullmatch(GPU_ID_PATTERN, gpu)]
        if bad:
            raise ValueError(f"gpu_devices {bad!r} are not GPU ids: give indexes (0, 1) or UUIDs as `nvidia-smi -L` "
                             "prints them (GPU-…, MIG-…)")
        if len(set(value)) != len(value):
            raise ValueError(f"gpu_devices {value!r} names a GPU twice: two ranks would share it")
        return value

    @field_validator("log_limit", mode="before")
    @classmethod
    def _log_limit(cls, value: object) -> str:
        return checked_quantity(value, "log_limit", least=MIN_LOG_LIMIT, most=MAX_LOG_LIMIT,
                                example=DEFAULT_LOG_LIMIT)

    def resolved(self, environ: Mapping[str, str] | None = None) -> Self:
        """These settings with ``run_root`` and ``docker_host`` decided (given, else the
        environment, else the default): a later process with another environment must reach the
        same daemon and find the same jobs."""
        env = os.environ if environ is None else environ
        root = Path(self.run_root or env.get(ROOT_VARIABLE) or DEFAULT_ROOT).expanduser().absolute()
        try:
            host = self.docker_host or local_daemon(env.get(HOST_VARIABLE) or DEFAULT_HOST, f"${HOST_VARIABLE}")
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        return self.model_copy(update={"run_root": str(root), "docker_host": host})


def local_daemon(value: str, field: str) -> str:
    """``value`` if it names a daemon on this host (``unix:///PATH``); a ``ValueError`` naming
    ``field`` and why otherwise (see :attr:`DockerSettings.docker_host`)."""
    if value.startswith("unix:///") and "\n" not in value and len(value) <= 4096:
        return value
    if value.startswith(("tcp://", "ssh://", "http://", "https://", "npipe://", "fd://")):
        raise ValueError(f"{field} {value!r} is a remote daemon, which the Docker backend refuses: it stages inputs "
                         "and checks every mount source on this host, and a remote daemon binds paths of its own "
                         "host. Run the backend on the daemon's host (a Prefect worker there), with "
                         "unix:///var/run/docker.sock")
    raise ValueError(f"{field} {value!r} is not a daemon socket: write unix:///PATH, such as {DEFAULT_HOST}")
