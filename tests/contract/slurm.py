"""The SLURM backend's adapter, against the session's own cluster (:mod:`tests.slurm_cluster`):
the scripted command (:mod:`.scripted`) as a batch job's rank, in a bubblewrap frame on an
emulated node, run as nobody under ``sbatch --uid`` — every outcome the job's own, as slurmctld
and the rank's exit file report it. The test's directories lie on the cluster's "shared
filesystem" (a directory every node sees), as a site's Lustre would hold them."""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tao_data_io.backends.slurm.backend import SlurmBackend
from tao_data_io.backends.slurm.commands import Slurm
from tao_data_io.backends.slurm.rundir import RunDir
from tao_data_io.backends.slurm.settings import SlurmSettings

from ..slurm_cluster import SlurmCluster
from .harness import Launched
from .scripted import ScriptedHarness

#: A rank's memory limit (SLURM's cgroup): what the OOM ending allocates past.
MEMORY = "64Mi"
#: SLURM's states of a job that still holds its allocation.
_HOLDING = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "STOPPED")


def slurm_backend(cluster: SlurmCluster, shared: Path, **settings: Any) -> SlurmBackend:
    """A backend whose run root and shared directory are ``shared`` (``settings`` on top)."""
    given = {"slurm_conf": str(cluster.conf), "run_root": str(shared / "slurm"), "shared_roots": [str(shared)],
             "container_runtime": "bubblewrap", "cancel_grace_seconds": 3, **settings}
    return SlurmBackend(SlurmSettings(**given))


def shared_dir(cluster: SlurmCluster, tmp_path: Path) -> Path:
    """A directory of the test's own on the cluster's shared filesystem."""
    return cluster.shared_dir(f"{tmp_path.name[:40]}-{secrets.token_hex(4)}")


class SlurmHarness(ScriptedHarness):
    name = "slurm"
    backend: SlurmBackend

    def __init__(self, cluster: SlurmCluster, tmp_path: Path, environ: Mapping[str, str]) -> None:
        shared = shared_dir(cluster, tmp_path)
        super().__init__(slurm_backend(cluster, shared), shared, environ)
        self.cluster = cluster

    def shape(self) -> dict[str, Any]:
        return {"gpus": 0, "memory": MEMORY, "shm_size": "16Mi", "ephemeral_storage": "16Mi"}

    def unknown_ref(self) -> str:
        return "slurm/never-submitted"

    def running(self, job: Launched) -> list[str]:
        """The job's SLURM job while slurmctld says it holds its allocation."""
        launch = RunDir(self.backend.run_root / job.job_id / "run").launch()
        if launch is None or launch.slurm_id is None:
            return []
        found = Slurm(str(self.cluster.conf)).job(launch.slurm_id)
        state = (found or {}).get("JobState", "")
        return [f"{launch.slurm_id} {state}"] if state in _HOLDING else []

    def close(self) -> None:
        """Cancel what a failed test left: the cluster is the session's, shared by every test."""
        for run in self.backend.run_root.glob("*/run"):
            self.backend.cancel(f"slurm/{run.parent.name}")
