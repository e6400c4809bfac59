"""Two ranks of a Docker job bring up torch's gloo process group through torchrun, told nothing but
what the backend gives every rank (the ``PET_*`` rendezvous variables torchrun reads its defaults
from), and all-reduce across the two containers: rank 1's container shares rank 0's network
namespace, with no network but that loopback, and each runs as nobody on a read-only root with a
small ``/tmp`` and ``/dev/shm`` (issue 42). The image is the session's Python with torch
(:mod:`tests.docker_python_image`), on the session's own dockerd."""

from __future__ import annotations

from pathlib import Path

from tao_data_io.launch.users import NOBODY
from tao_data_io.records import RecordStore
from tao_data_io.request import JobRequest

from . import docker_daemon as dockerd
from . import docker_python_image as pyimage
from .contract.docker import docker_backend
from .contract.harness import launch_through_steps
from .helpers import wait_for

#: The session's dockerd, and the image of this host's Python with torch built on it.
docker_daemon = dockerd.docker_daemon
python_image = pyimage.python_image

#: Each worker's program: the sum over the group of every rank's rank + 1, and who and where it ran
#: (its uid, its network interfaces, whether the root is writable).
ALL_REDUCE = """
import os
import torch
import torch.distributed as dist

try:
    open("/written", "w").close()
    root = "root writable"
except OSError:
    root = "root read-only"
interfaces = ",".join(sorted(os.listdir("/sys/class/net")))
dist.init_process_group("gloo")
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
print(f"rank {dist.get_rank()} of {dist.get_world_size()} as uid {os.getuid()} on {interfaces}, {root}: "
      f"all-reduced {value.item():g}", flush=True)
dist.destroy_process_group()
"""


def test_two_containers_all_reduce_over_gloo_through_torchrun(docker_daemon: dockerd.DockerDaemon,
                                                               python_image: pyimage.PythonImage,
                                                               tmp_path: Path) -> None:
    backend = docker_backend(docker_daemon, tmp_path / "docker")
    request = JobRequest.model_validate({
        "schema_version": "1", "job_id": "torchrun-1", "image": python_image.tag, "mode": "args",
        # torchrun takes --nnodes, --nproc-per-node, --node-rank and rank 0's address from PET_*; with
        # --no-python each worker is `python -c ALL_REDUCE`, so the job needs no script file.
        "command": ["python", "-m", "torch.distributed.run"], "args": ["--no-python", "python", "-c", ALL_REDUCE],
        "compute_shape": {"nodes": 2, "gpus": 0, "memory": "1Gi", "shm_size": "16Mi",
                          "ephemeral_storage": "16Mi"}})
    submission, plan, _ = launch_through_steps(request, backend, RecordStore(tmp_path / "records"),
                                               tmp_path / "work", {})
    ref = submission.backend_ref
    try:
        verdict = backend.verify(ref, plan)
        assert verdict.ok, verdict
        status = wait_for("the torchrun job to end", lambda: found if (found := backend.status(ref)).terminal
                          else None, deadline_s=300)
        logs = backend.logs(ref)
        assert status.state == "COMPLETE", (status, logs)
    finally:
        backend.cancel(ref)  # nothing, once the job has ended; else what a failure left running
    for rank in range(plan.nodes):  # one worker per node: the sum of rank + 1 over both is 3
        assert f"[rank {rank}] rank {rank} of 2 as uid {NOBODY} on lo, root read-only: all-reduced 3" in logs, logs
