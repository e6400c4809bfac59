"""What the local backend is built from: where its jobs run, and whether a frame may have the
host's network. Declared once: :class:`~tao_data_io.local.backend.LocalBackend` is built from
it, the ``tao-local-target`` block embeds it, the CLI fills it from its flags, and a job record
keeps its dump (``backend_config``) so every later verb rebuilds the same backend.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

from pydantic import Field

from ..launch.backend import BackendSettings
from ..schema import AbsolutePath

ROOT_VARIABLE = "TAO_DATA_IO_LOCAL_ROOT"
DEFAULT_ROOT = "~/.tao-data-io/local"


class LocalSettings(BackendSettings):
    """How the local backend runs each job: where on the host, and whether with its network."""

    platform: ClassVar[str] = "local"

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

    def resolved(self, environ: Mapping[str, str] | None = None) -> LocalSettings:
        """These settings with ``run_root`` decided (given, else ``$TAO_DATA_IO_LOCAL_ROOT``, else
        the default) and absolute: bubblewrap binds host paths, the supervisor runs in another
        directory, and a later process with another environment must find the same jobs."""
        env = os.environ if environ is None else environ
        root = Path(self.run_root or env.get(ROOT_VARIABLE) or DEFAULT_ROOT).expanduser().absolute()
        return self.model_copy(update={"run_root": str(root)})
