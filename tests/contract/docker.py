"""The Docker backend's adapter, against the session's own dockerd (:mod:`tests.docker_daemon`):
the scripted command (:mod:`.scripted`) in a container of the busybox test image, under a memory
limit its OOM ending allocates past — every outcome the container's own, as the daemon reports it."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

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


def swap_before_start(monkeypatch: pytest.MonkeyPatch, source: Path, replacement: Path) -> list[int]:
    """Make the backend's create-and-start swap ``source`` for ``replacement`` (renamed into its
    place) first, once: the window between submit's check of the source and the daemon's bind of
    it by path. The ranks it swapped before, as a list."""
    original = DockerBackend._create_and_start
    swapped: list[int] = []

    def create_and_start(self: DockerBackend, run: Any, launch: Any, rank: int, credentials: Any) -> None:
        if not swapped:
            source.rename(source.with_name(source.name + ".checked"))
            replacement.rename(source)
        swapped.append(rank)
        original(self, run, launch, rank, credentials)

    monkeypatch.setattr(DockerBackend, "_create_and_start", create_and_start)
    return swapped


def dataset(tmp_path: Path, name: str, secret: str) -> Path:
    found = tmp_path / name
    found.mkdir()
    (found / "secret.txt").write_text(secret)
    found.chmod(0o755)
    (found / "secret.txt").chmod(0o644)
    return found


def derived_image(daemon: DockerDaemon, tag: str, files: Mapping[str, tuple[bytes, int]],
                  links: Mapping[str, str] = {}, directories: Sequence[str] = ()) -> str:
    """The test image with ``files`` (name → (data, mode)), ``links`` (name → target) and
    ``directories`` added (replacing what was there)."""
    client = daemon.client
    if client.images.list(name=tag):
        return tag
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name in directories:
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for name, (data, mode) in files.items():
            info = tarfile.TarInfo(name)
            info.mode, info.size = mode, len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in links.items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    container = client.containers.create(daemon.image, ["true"], network_mode="none")
    try:
        container.put_archive("/", buffer.getvalue())
        repository, _, name = tag.partition(":")
        container.commit(repository=repository, tag=name)
    finally:
        container.remove(force=True)
    return tag
