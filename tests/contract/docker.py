"""The Docker backend's adapter, against the session's own dockerd (:mod:`tests.docker_daemon`):
the scripted command (:mod:`.scripted`) in a container of the busybox test image, under a memory
limit its OOM ending allocates past — every outcome the container's own, as the daemon reports it."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tao_data_io.backends.docker.backend import DockerBackend
from tao_data_io.backends.docker.containers import JOB_LABEL, RUN_LABEL
from tao_data_io.backends.docker.settings import DockerSettings

from ..docker_daemon import DockerDaemon
from .harness import Launched
from .scripted import ScriptedHarness

#: The container's memory limit: what the OOM ending allocates past.
MEMORY = "64Mi"


def docker_backend(daemon: DockerDaemon, run_root: Path) -> DockerBackend:
    return DockerBackend(DockerSettings(docker_host=daemon.host, run_root=str(run_root), cancel_grace_seconds=5))


class DockerHarness(ScriptedHarness):
    name = "docker"
    backend: DockerBackend

    def __init__(self, daemon: DockerDaemon, tmp_path: Path, environ: Mapping[str, str]) -> None:
        super().__init__(docker_backend(daemon, tmp_path / "docker"), tmp_path, environ)
        self.daemon = daemon
        self.image = daemon.image

    def shape(self) -> dict[str, Any]:
        return {"gpus": 0, "memory": MEMORY, "shm_size": "16Mi", "ephemeral_storage": "16Mi"}

    def unknown_ref(self) -> str:
        return "docker/never-submitted"

    def running(self, job: Launched) -> list[str]:
        found = self.daemon.client.containers.list(filters={"label": [f"{JOB_LABEL}={job.job_id}",
                                                                       f"{RUN_LABEL}={self.backend.run_root}"]})
        return sorted(container.name for container in found)

    def close(self) -> None:
        """Cancel what a failed test left running: the daemon is the session's, shared by every test."""
        for run in self.backend.run_root.glob("*/run"):
            self.backend.cancel(f"docker/{run.parent.name}")
