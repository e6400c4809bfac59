"""What the Docker backend adds over a bare ``docker run`` of the same image and command.

    .venv/bin/python bench/docker_job.py --docker-host unix:///PATH/docker.sock --image IMAGE [--reps 10]

The daemon is one you started (its socket here, or ``$DOCKER_HOST``) and the image one it has
(nothing is pulled; any image with ``sh``, ``echo`` and ``sleep``: docs/development.md says how the
tests make a busybox one with ``docker import``). Per repetition, the contenders interleaved (the
order rotates):

* **bare** — ``docker run -d IMAGE sh -c 'echo first; sleep 600'`` through the Engine API, as the
  TAO launcher runs a job (a shell as PID 1, no init): create to the first output line in its
  log; then ``docker stop`` (its default 10 s grace) until the container has exited — what a user
  waits for the GPUs to be free;
* **backend** — the same command as a Docker backend job (``submit``, the verify probe in the
  container, the host's go): submit to the first output line; then ``cancel`` until it returns
  (the container stopped, its end and log kept, the container removed).

Medians, with this process's CPU seconds (the daemon's own are not this process's) and its peak
RSS at the end.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import docker

from tao_data_io.backends.docker.backend import DockerBackend
from tao_data_io.backends.docker.settings import DockerSettings
from tao_data_io.launch.plan import LaunchPlan
from tao_data_io.records import OutputRoute

COMMAND = ["sh", "-c", "echo first; sleep 600"]
_POLL_S = 0.002


def until(predicate: Callable[[], bool], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("the benchmark's job did not get there in time")
        time.sleep(_POLL_S)


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def bare(client: docker.DockerClient, image: str, n: int) -> tuple[float, float, float]:
    """(create → first line, stop → exited, CPU) of a plain ``docker run``."""
    used = cpu()
    start = time.monotonic()
    container = client.containers.run(image, COMMAND, detach=True, name=f"bench-bare-{os.getpid()}-{n}")
    until(lambda: b"first" in container.logs())
    first = time.monotonic() - start
    start = time.monotonic()
    container.stop()
    container.reload()
    until(lambda: container.status == "exited")
    stopped = time.monotonic() - start
    container.remove(force=True)
    return first, stopped, cpu() - used


def job(backend: DockerBackend, image: str, work: Path, n: int) -> tuple[float, float, float]:
    """(submit → first line, cancel → returned, CPU) of a Docker backend job."""
    job_id = f"bench-{os.getpid()}-{n}"
    plan = LaunchPlan(job_id=job_id, image=image, argv=COMMAND, env={"TAO_JOB_ID": job_id,
                                                                    "TAO_RESULTS_DIR": "/results"},
                      mounts=[], staging_dir=str(work), results_dir="/results",
                      route=OutputRoute(route="ephemeral", destination="container-local"), tier="A", gpus=0,
                      nodes=1, shm_size="16Mi", ephemeral_storage="16Mi")
    used = cpu()
    start = time.monotonic()
    ref = backend.submit(plan).backend_ref
    assert backend.verify(ref, plan).ok
    until(lambda: "first" in backend.logs(ref))
    first = time.monotonic() - start
    start = time.monotonic()
    backend.cancel(ref)
    canceled = time.monotonic() - start
    return first, canceled, cpu() - used


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docker-host", default=os.environ.get("DOCKER_HOST"), help="the daemon's unix:// socket")
    parser.add_argument("--image", required=True, help="an image the daemon has, with sh, echo and sleep")
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    if not args.docker_host:
        parser.error("give --docker-host (or set DOCKER_HOST): the daemon to measure on")
    client = docker.DockerClient(base_url=args.docker_host)
    with tempfile.TemporaryDirectory(prefix="bench-docker-") as scratch:
        backend = DockerBackend(DockerSettings(docker_host=args.docker_host, run_root=f"{scratch}/runs",
                                               cancel_grace_seconds=10))
        results: dict[str, list[tuple[float, float, float]]] = {"bare": [], "backend": []}
        runs = {"bare": lambda n: bare(client, args.image, n),
                "backend": lambda n: job(backend, args.image, Path(scratch), n)}
        order = list(runs)
        for n in range(args.reps):
            for name in order:
                results[name].append(runs[name](n))
            order.append(order.pop(0))
    print(f"{'contender':<10} {'to first line':>14} {'to stopped':>11} {'CPU (this process)':>19}")
    for name, rows in results.items():
        first, stopped, used = (statistics.median(column) for column in zip(*rows))
        print(f"{name:<10} {first * 1000:>11.0f} ms {stopped * 1000:>8.0f} ms {used * 1000:>16.0f} ms")
    bare_first = statistics.median(row[0] for row in results["bare"])
    job_first = statistics.median(row[0] for row in results["backend"])
    print(f"backend / bare, to first line: {job_first / bare_first:.2f}×; peak RSS of this process: "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
