"""What the local backend is built from: where its jobs run, whether a frame may have the host's
network, and which host user its jobs run as when the backend runs as root. Declared once:
:class:`~tao_data_io.backends.local.backend.LocalBackend` is built from it, the ``tao-local-target``
block embeds it, the CLI fills it from its flags, and a job record keeps its dump
(``backend_config``) so every later verb rebuilds the same backend.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar, Self

from pydantic import Field, field_validator

from ...launch.backend import RunRootSettings
from ...launch.users import JobId
from ...quantities import checked_quantity
from ...schema import AbsolutePath
from ...launch.joblog import DEFAULT_LOG_LIMIT, MAX_LOG_LIMIT, MIN_LOG_LIMIT

ROOT_VARIABLE = "TAO_DATA_IO_LOCAL_ROOT"
DEFAULT_ROOT = "~/.tao-data-io/local"


class LocalSettings(RunRootSettings):
    """How the local backend runs each job: where on the host, whether with its network, as whom."""

    name: ClassVar[str] = "local"

    run_root: AbsolutePath | None = Field(
        None, title="Run root",
        description="Where each job's run directory (its records and logs) and, unless results go to a mount, its "
                    f"results live on the host that runs it, one directory per job. Empty: ${ROOT_VARIABLE}, else "
                    f"{DEFAULT_ROOT}, decided when the backend is built; the job record keeps the path decided.")
    allow_network: bool = Field(
        False, title="Network allowed",
        description="Whether a job whose request asks for the network (network: true) may have the host's network "
                    "in its frames. Off by default: the host's network (its loopback services, its LAN) is reached "
                    "only where the operator allows it, and such a request is refused before anything starts. A "
                    "job that does not ask never has the network.")
    run_as_user: JobId = Field(
        None, title="Run as user (uid)",
        description="The host uid a job runs as when the backend runs as root (a job never holds host root: uid 0 "
                    "is refused). Empty: 65534 (nobody). When the backend runs as another user, jobs run as that "
                    "user, and this must be empty or that uid. Inputs must be readable, and read-write mounts "
                    "writable, by this uid; tao-data-io makes the results directory its.")
    run_as_group: JobId = Field(
        None, title="Run as group (gid)",
        description="The host gid a job runs as when the backend runs as root (gid 0 is refused), with no "
                    "supplementary group. Empty: 65534 (nogroup).")
    log_limit: str = Field(
        DEFAULT_LOG_LIMIT, title="Log limit",
        description="The most of each rank's output (stdout and stderr) kept on the host, a binary quantity (at most "
                    f"{MAX_LOG_LIMIT}): its first quarter and its newest three quarters, with a line saying how many "
                    "bytes were dropped between. What a job prints is written to the host's disk, outside every limit "
                    "of its frame.")

    @field_validator("log_limit", mode="before")
    @classmethod
    def _log_limit(cls, value: object) -> str:
        return checked_quantity(value, "log_limit", least=f"{MIN_LOG_LIMIT // 1024}Ki", most=MAX_LOG_LIMIT,
                                example=DEFAULT_LOG_LIMIT)

    def resolved(self, environ: Mapping[str, str] | None = None) -> Self:
        """These settings with ``run_root`` decided (given, else ``$TAO_DATA_IO_LOCAL_ROOT``, else
        the default) and absolute: bubblewrap binds host paths, the supervisor runs in another
        directory, and a later process with another environment must find the same jobs."""
        env = os.environ if environ is None else environ
        root = Path(self.run_root or env.get(ROOT_VARIABLE) or DEFAULT_ROOT).expanduser().absolute()
        return self.model_copy(update={"run_root": str(root)})
