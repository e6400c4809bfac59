"""The Docker backend's GPU suite: where this host has GPUs (``nvidia-smi``) and the session's daemon
the NVIDIA runtime (tests/docker_daemon.py registers it when ``nvidia-container-runtime`` is
installed), a one-GPU and a two-GPU job each see exactly the GPUs the target gave each of their
ranks — device ids, never "all". Skipped elsewhere, saying which of the two is missing; what the
suite proves without a GPU (a GPU request refused before anything starts) is in
tests/test_docker_backend.py."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tao_data_io.backends.docker.backend import DockerBackend
from tao_data_io.backends.docker.settings import DockerSettings
from tao_data_io.records import RecordStore
from tao_data_io.request import JobRequest

from . import docker_daemon as dockerd
from .contract.harness import launch_through_steps
from .docker_daemon import DockerDaemon
from .helpers import wait_for

docker_daemon = dockerd.docker_daemon


def host_gpus() -> list[str]:
    """The indexes of this host's GPUs, as ``nvidia-smi`` lists them (none without it)."""
    if shutil.which("nvidia-smi") is None:
        return []
    listed = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True,
                            text=True, timeout=60)
    return [line.strip() for line in listed.stdout.splitlines() if line.strip().isdigit()]


@pytest.fixture
def gpu_backend(docker_daemon: DockerDaemon, tmp_path: Path) -> DockerBackend:
    gpus = host_gpus()
    if not gpus:
        pytest.skip("no GPU on this host (nvidia-smi is missing or lists none): the GPU suite runs on a GPU host")
    if "nvidia" not in (docker_daemon.client.info().get("Runtimes") or {}):
        pytest.skip("the session's dockerd has no NVIDIA runtime: install the NVIDIA Container Toolkit "
                    "(nvidia-container-runtime) on this GPU host")
    return DockerBackend(DockerSettings(docker_host=docker_daemon.host, run_root=str(tmp_path / "docker"),
                                        gpu_devices=gpus, cancel_grace_seconds=5))


@pytest.mark.parametrize("nodes", [1, 2], ids=["one-gpu", "two-gpus"])
def test_each_rank_sees_exactly_the_gpus_the_target_gave_it(gpu_backend: DockerBackend, docker_daemon: DockerDaemon,
                                                             tmp_path: Path, nodes: int) -> None:
    allowed = gpu_backend.settings.gpu_devices
    if len(allowed) < nodes:
        pytest.skip(f"this host has {len(allowed)} GPU(s); the {nodes}-GPU job needs {nodes}")
    request = JobRequest.model_validate({
        "schema_version": "1", "job_id": f"gpu-{nodes}", "image": docker_daemon.image, "mode": "args",
        "command": ["/bin/sh", "-c", "ls /dev | grep -E '^nvidia[0-9]+$'"],
        "compute_shape": {"gpus": 1, "nodes": nodes, "shm_size": "16Mi", "ephemeral_storage": "16Mi"}})
    submission, plan, _ = launch_through_steps(request, gpu_backend, RecordStore(tmp_path / "records"),
                                               tmp_path / "work", {})
    assert gpu_backend.verify(submission.backend_ref, plan).ok
    status = wait_for("the GPU job to end", lambda: found if (found := gpu_backend.status(submission.backend_ref))
                      .terminal else None, deadline_s=300)
    assert status.state == "COMPLETE", status
    log = gpu_backend.logs(submission.backend_ref)
    for rank in range(nodes):
        seen = re.findall(r"nvidia\d+", log if nodes == 1 else "\n".join(
            line for line in log.splitlines() if line.startswith(f"[rank {rank}]")))
        assert seen == [f"nvidia{allowed[rank]}"], log
