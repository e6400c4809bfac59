"""Each rank's container, as the Engine API's create takes it: built by a pure function from the
plan and what the backend decided (who, which GPUs, which host directories), so what a job can
see and do is decided in one place and table-tested without a daemon.

What a rank's container is:

* the request's image, its command run by the frame scripts (:mod:`.frame`: this host's static
  busybox until the host's ``go``, then the image's ``/bin/sh``) under Docker's init as PID 1
  (``init``: signals reach the command, and its exit status and signal are real — a shell as
  PID 1 ignores SIGSEGV);
* every mount a ``Mount(type="bind")``: a missing source is refused by the daemon, never
  created (the ``volumes`` form makes an empty root-owned directory); inputs read-only as the
  plan says, the results directory writable; the frame's own directories (agent and control
  read-only, this rank's report writable, the credentials file read-only);
* a read-only root with ``/tmp`` a tmpfs of ``compute_shape.ephemeral_storage`` (``HOME`` too)
  and ``/dev/shm`` of ``shm_size``: a writable layer cannot be bounded on every storage
  driver, a tmpfs can; ``compute_shape.memory`` (no swap beyond it) and ``cpu`` as the
  container's limits, a pids limit;
* the target's unprivileged uid:gid (never root: without a user namespace a container's uids
  are the host's), every capability dropped, ``no-new-privileges``;
* no network but its own loopback unless the job asks and the target allows it; ranks above 0
  join rank 0's network namespace, meeting at 127.0.0.1 with the rendezvous variables every
  backend gives;
* GPUs only by device id, each rank its own (:func:`rank_gpus`), never "all";
* names and labels from the job id, the attempt and the rank, so a retried submit meets its own
  container (HTTP 409) instead of starting a second.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from docker.types import DeviceRequest, LogConfig, Mount

from ...errors import UsageError
from ...launch.plan import LaunchPlan
from ...launch.rendezvous import rendezvous_env
from ...launch.sources import Bind
from ...quantities import cpu_millicores, quantity_bytes
from .frame import (AGENT_DIR, CONTROL_DIR, CREDENTIALS_FILE, DEADLINE_VARIABLE, FRAME_FILE, GRACE_VARIABLE, REPORT_DIR,
                    SHELL_FILE, WAIT_VARIABLE)

#: Labels on every container of a job: what ``docker ps --filter label=…`` finds them by.
JOB_LABEL = "io.tao-data-io.job"
ATTEMPT_LABEL = "io.tao-data-io.attempt"
RANK_LABEL = "io.tao-data-io.rank"
RUN_LABEL = "io.tao-data-io.run-root"
#: Where ranks meet: rank 0's loopback, which every rank shares.
MASTER_ADDR = "127.0.0.1"
#: The frame's ``/tmp`` (and ``HOME``) when the request gives no ephemeral_storage.
DEFAULT_TMP = "4Gi"
FRAME_TMP = "/tmp"


def container_name(run_root: str, job_id: str, attempt: int, rank: int) -> str:
    """The container of ``rank`` in ``attempt`` of ``job_id`` under ``run_root``: deterministic, so
    a retried submit finds it; with the run root's digest, so two targets (two users) on one daemon
    that both run a ``train-1`` never meet each other's. A job id is a DNS label: Docker takes it."""
    digest = hashlib.sha256(run_root.encode()).hexdigest()[:10]
    return f"tao-{job_id}-{digest}-a{attempt}-r{rank}"


@dataclass(frozen=True)
class RankFrame:
    """What the backend decided for one rank's container besides the plan."""

    rank: int
    #: The run root the job's state is kept under (:func:`container_name`, :data:`RUN_LABEL`).
    run_root: str
    #: The plan's binds (its mounts and the results directory), host source → target.
    binds: Sequence[Bind]
    #: The host directories of the frame's own mounts.
    agent: str
    control: str
    report: str
    #: The host credentials file (a tmpfs), when the request forwards credentials.
    credentials: str | None
    user: str
    gpus: Sequence[str]
    network: bool
    pids_limit: int
    log_limit: str
    grace_seconds: int
    wait_seconds: int


def rank_gpus(plan: LaunchPlan, allowed: Sequence[str]) -> list[list[str]]:
    """Each rank's GPUs, disjoint, in the target's order: ``compute_shape.gpus`` of them per rank;
    a request for more than the target lets its jobs use is refused, naming both."""
    needed = plan.gpus * plan.nodes
    if needed > len(allowed):
        raise UsageError(f"job {plan.job_id} asks for {plan.gpus} GPU(s) on each of {plan.nodes} rank(s), {needed} in "
                         f"all, but this Docker target lets jobs use {len(allowed)} ({', '.join(allowed) or 'none'}): "
                         "lower compute_shape.gpus or nodes, or list more GPUs in the target's gpu_devices")
    return [list(allowed[rank * plan.gpus:(rank + 1) * plan.gpus]) for rank in range(plan.nodes)]


def frame_environment(plan: LaunchPlan, frame: RankFrame) -> dict[str, str]:
    """The container's environment: the plan's plain variables, ``HOME`` on the frame's ``/tmp``,
    the rendezvous variables of a multi-node job and what the frame script reads — never a
    credential (those come through the credentials file)."""
    # Every rank is in rank 0's network namespace, whose hostname no /etc/hosts names: gloo would
    # fail to resolve it and fall back to loopback with a warning; lo is where the ranks meet.
    meet = {"GLOO_SOCKET_IFNAME": "lo"} if plan.nodes > 1 else {}
    env = {"HOME": FRAME_TMP, **meet, **plan.env, WAIT_VARIABLE: str(frame.wait_seconds),
           GRACE_VARIABLE: str(frame.grace_seconds)}
    if plan.deadline_seconds is not None:
        env[DEADLINE_VARIABLE] = str(plan.deadline_seconds)
    else:  # the frame's, never the request's: a request's own value would end a job that has no deadline
        env.pop(DEADLINE_VARIABLE, None)
    if plan.nodes > 1:
        env.update({name: str(value) for name, value in rendezvous_env(
            nodes=plan.nodes, gpus_per_node=plan.gpus, rank=str(frame.rank), master_addr=MASTER_ADDR).items()})
    return env


def create_arguments(plan: LaunchPlan, frame: RankFrame) -> dict[str, Any]:
    """Keyword arguments of ``DockerClient.containers.create`` for ``frame``'s rank of ``plan``
    (see the module docstring)."""
    mounts = [Mount(target=bind.target, source=bind.source, type="bind", read_only=bind.read_only)
              for bind in frame.binds]
    mounts += [Mount(target=AGENT_DIR, source=frame.agent, type="bind", read_only=True),
               Mount(target=CONTROL_DIR, source=frame.control, type="bind", read_only=True),
               Mount(target=REPORT_DIR, source=frame.report, type="bind", read_only=False)]
    if frame.credentials is not None:
        mounts.append(Mount(target=CREDENTIALS_FILE, source=frame.credentials, type="bind", read_only=True))
    name = container_name(frame.run_root, plan.job_id, plan.attempt, frame.rank)
    if frame.rank > 0:
        network: str = f"container:{container_name(frame.run_root, plan.job_id, plan.attempt, 0)}"
    else:
        network = "default" if frame.network else "none"
    limits: dict[str, Any] = {}
    if plan.memory is not None:
        limits["mem_limit"] = limits["memswap_limit"] = quantity_bytes(plan.memory)
    if plan.cpu is not None:
        limits["nano_cpus"] = cpu_millicores(plan.cpu) * 1_000_000
    if frame.gpus:
        limits["device_requests"] = [DeviceRequest(device_ids=list(frame.gpus), capabilities=[["gpu"]])]
    half = max(quantity_bytes(frame.log_limit) // 2, 1)
    return {
        "image": plan.image, "name": name,
        "entrypoint": [f"{AGENT_DIR}/{SHELL_FILE}", "sh", f"{AGENT_DIR}/{FRAME_FILE}"],
        "command": list(plan.argv), "environment": frame_environment(plan, frame), "user": frame.user,
        "working_dir": FRAME_TMP, "labels": labels(plan, frame), "mounts": mounts,
        "tmpfs": {FRAME_TMP: f"size={quantity_bytes(plan.ephemeral_storage or DEFAULT_TMP)},mode=1777"},
        "shm_size": quantity_bytes(plan.shm_size), "read_only": True, "init": True,
        "cap_drop": ["ALL"], "security_opt": ["no-new-privileges"], "pids_limit": frame.pids_limit,
        "network_mode": network, "stop_signal": "SIGTERM", "detach": True,
        "log_config": LogConfig(type="json-file", config={"max-size": str(half), "max-file": "2"}),
        **limits,
    }


def labels(plan: LaunchPlan, frame: RankFrame) -> dict[str, str]:
    return {JOB_LABEL: plan.job_id, ATTEMPT_LABEL: str(plan.attempt), RANK_LABEL: str(frame.rank),
            RUN_LABEL: frame.run_root}
