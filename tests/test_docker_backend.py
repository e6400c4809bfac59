"""The Docker backend's own promises (issue 42), beyond the conformance suite every backend passes:
what each rank's container is (read from the pure ``create_arguments``, and seen from inside a
real container), that no credential reaches the container's configuration or the daemon's disk,
that a mount source is bound as checked or the command never starts, which sources and settings
are refused before anything exists, GPUs by id, the states only Docker has (a kill by someone
else, a child's OOM kill, a start the daemon failed), who owns the results afterwards and what a
job may leave in them, two ranks on one host, and what a hostile or careless request does.

Every job runs on the session's own dockerd (tests/docker_daemon.py) in the busybox test image,
driven through the verbs' own steps (``launch_through_steps``)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import socket
import stat
import subprocess
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from docker.errors import APIError
from pydantic import ValidationError

from tao_data_io import steps, verbs
from tao_data_io.backends.docker.backend import DockerBackend
from tao_data_io.backends.docker.containers import (JOB_LABEL, RUN_LABEL, RankFrame, container_name, create_arguments,
                                                    rank_gpus)
from tao_data_io.backends.docker.frame import AGENT_DIR, CONTROL_DIR, CREDENTIALS_FILE, REPORT_DIR
from tao_data_io.backends.docker.settings import DockerSettings
from tao_data_io.credentials import s3_credentials_from_env
from tao_data_io.errors import UsageError
from tao_data_io.launch.backend import JobStatus, Submission
from tao_data_io.launch.plan import LaunchPlan, PlanMount
from tao_data_io.launch.probe import Verdict
from tao_data_io.launch.sources import Bind
from tao_data_io.records import OutputRoute, RecordStore
from tao_data_io.request import JobRequest
from tao_data_io.transfer.client import make_s3_client

from . import docker_daemon as dockerd
from .contract.docker import dataset, derived_image, swap_before_start
from .contract.harness import Launched, launch_through_steps
from .helpers import AWAIT, REPORT, holding, live_processes, wait_for

#: The session's own dockerd (a pytest fixture of tests/docker_daemon.py).
docker_daemon = dockerd.docker_daemon

#: The shape every job here asks for: no GPU, and small limits the test image fits in.
SHAPE: dict[str, Any] = {"gpus": 0, "memory": "64Mi", "shm_size": "16Mi", "ephemeral_storage": "16Mi"}
MiB = 1024 * 1024


# ----------------------------------------------------------------------------- helpers
@dataclass(frozen=True)
class Job(Launched):
    """A job as these tests hold it (the suite's :class:`Launched`), with its backend and record store."""

    backend: DockerBackend
    store: RecordStore

    def verify(self) -> Verdict:
        return self.backend.verify(self.ref, self.plan)

    def finished(self) -> JobStatus:
        status = wait_for(f"{self.ref} to end", lambda: found if (found := self.backend.status(self.ref)).terminal
                          else None)
        steps.record_end(self.store, self.job_id, status)
        return status

    def containers(self, daemon: dockerd.DockerDaemon) -> list[Any]:
        return daemon.client.containers.list(all=True, filters={"label": [
            f"{JOB_LABEL}={self.job_id}", f"{RUN_LABEL}={self.backend.run_root}"]})


def make_backend(daemon: dockerd.DockerDaemon, tmp_path: Path, **settings: Any) -> DockerBackend:
    return DockerBackend(DockerSettings(docker_host=daemon.host, run_root=str(tmp_path / "docker"),
                                        cancel_grace_seconds=5, **settings))


@pytest.fixture
def backend(docker_daemon: dockerd.DockerDaemon, tmp_path: Path) -> Iterator[DockerBackend]:
    """A backend with a run root of the test's own; what a failed test left running is canceled."""
    found = make_backend(docker_daemon, tmp_path)
    yield found
    cancel_everything(found)


def cancel_everything(backend: DockerBackend) -> None:
    for run in backend.run_root.glob("*/run"):
        if (run / "launch.json").exists():
            backend.cancel(f"docker/{run.parent.name}")


@pytest.fixture
def control(tmp_path: Path) -> Path:
    """A directory every job here mounts read-write at /control: how its command tells the test
    what it saw, and how the test tells it to go on (anyone may write it: the job runs as nobody)."""
    found = tmp_path / "control"
    found.mkdir()
    found.chmod(0o1777)
    return found


def job_request(daemon: dockerd.DockerDaemon, job_id: str, script: str, *, control: Path | None = None,
                mounts: Sequence[Mapping[str, Any]] = (), shape: Mapping[str, Any] | None = None,
                **fields: Any) -> JobRequest:
    """A request whose command is ``sh -c script`` in the test image (``control`` mounted at /control)."""
    all_mounts = [*([{"source": str(control), "target": "/control", "read_only": False}] if control else []),
                  *mounts]
    return JobRequest.model_validate({
        "schema_version": "1", "job_id": job_id, "image": fields.pop("image", daemon.image), "mode": "args",
        "command": ["/bin/sh", "-c"], "args": [script], "mounts": all_mounts,
        "compute_shape": {**SHAPE, **(shape or {})}, **fields})


def launch(backend: DockerBackend, request: JobRequest, tmp_path: Path,
           environ: Mapping[str, str] | None = None) -> Job:
    """Submit ``request`` through the verbs' steps (record, tier, stage, route, plan, preflight,
    submit), without waiting for the verdict."""
    store = RecordStore(tmp_path / "records")
    submission, plan, documents = launch_through_steps(request, backend, store, tmp_path / "work", environ or {})
    return Job(plan, documents, submission, backend, store)


def running(backend: DockerBackend, request: JobRequest, tmp_path: Path,
            environ: Mapping[str, str] | None = None) -> Job:
    """A job launched and verified: its command has been given the word to start."""
    job = launch(backend, request, tmp_path, environ)
    verdict = job.verify()
    assert verdict.ok, verdict.describe()
    return job


def seen(control: Path, name: str) -> str:
    """What the job wrote into /control/``name``, once it has (whole: written then renamed)."""
    return wait_for(f"/control/{name} from the job", lambda: (control / name).read_text()
                    if (control / name).exists() else None)


def say(control: Path, name: str) -> None:
    """Tell the job to go on (``/control/<name>`` appears)."""
    (control / name).write_text("")


def refused(backend: DockerBackend, request: JobRequest, tmp_path: Path, *expected: str) -> str:
    """Submit ``request``: it must be refused before anything exists (no container, no run
    directory) with a message naming each of ``expected``; the message."""
    with pytest.raises(UsageError) as caught:
        launch(backend, request, tmp_path)
    message = str(caught.value)
    for part in expected:
        assert part in message, message
    assert not (backend.run_root / str(request.job_id)).exists()
    assert not backend.client.containers.list(all=True, filters={"label": f"{JOB_LABEL}={request.job_id}"})
    return message


# ----------------------------------------------------------------------------- 1. the container, as configured
def pure_plan(*, nodes: int = 1, gpus: int = 0, network: bool = False, memory: str | None = "2Gi",
              cpu: str | None = "1500m", ephemeral_storage: str | None = "3Gi") -> LaunchPlan:
    return LaunchPlan(
        job_id="train-1", image="nvcr.io/nvidia/tao/tao-toolkit:6.0.0-pyt", argv=["train", "--epochs", "3"],
        env={"EPOCHS": "3", "TAO_JOB_ID": "train-1", "TAO_RESULTS_DIR": "/results"},
        mounts=[PlanMount(origin="staged", source="data/coco", target="/data/coco", expect="dir", input="s3://b/coco/"),
                PlanMount(origin="pre-positioned", source="/srv/models", target="/models", read_only=True,
                          input="/srv/models"),
                PlanMount(origin="pre-positioned", source="/srv/scratch", target="/scratch", read_only=False,
                          input="/srv/scratch")],
        staging_dir="/work/train-1", results_dir="/results",
        route=OutputRoute(route="ephemeral", destination="ephemeral"), tier="A", gpus=gpus, nodes=nodes,
        shm_size="1Gi", cpu=cpu, memory=memory, ephemeral_storage=ephemeral_storage, network=network)


def pure_frame(plan: LaunchPlan, rank: int = 0, *, gpus: Sequence[str] = (), network: bool = False,
               credentials: str | None = "/dev/shm/tao-data-io-docker-0/train-1-r0-x") -> RankFrame:
    binds = [Bind("/work/train-1/data/coco", "/data/coco", True), Bind("/srv/models", "/models", True),
             Bind("/srv/scratch", "/scratch", False), Bind("/runs/train-1/results", "/results", False)]
    return RankFrame(rank=rank, run_root="/runs", binds=binds, agent="/runs/train-1/run/agent",
                     control="/runs/train-1/run/control", report=f"/runs/train-1/run/rank-{rank}",
                     credentials=credentials, user="65534:65534", gpus=list(gpus), network=network, pids_limit=4096,
                     log_limit="64Mi", grace_seconds=30, wait_seconds=700)


def mounts_of(arguments: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {mount["Target"]: dict(mount) for mount in arguments["mounts"]}


def test_each_rank_container_is_locked_down_as_the_plan_says() -> None:
    plan = pure_plan()
    arguments = create_arguments(plan, pure_frame(plan))
    assert arguments["image"] == plan.image
    assert arguments["read_only"] is True
    assert arguments["init"] is True
    assert arguments["cap_drop"] == ["ALL"]
    assert "cap_add" not in arguments and "privileged" not in arguments
    assert arguments["security_opt"] == ["no-new-privileges"]
    assert arguments["pids_limit"] == 4096
    assert arguments["user"] == "65534:65534"
    assert arguments["tmpfs"] == {"/tmp": f"size={3 * 1024 * MiB},mode=1777"}
    assert arguments["environment"]["HOME"] == "/tmp"
    assert arguments["shm_size"] == 1024 * MiB
    assert arguments["mem_limit"] == arguments["memswap_limit"] == 2 * 1024 * MiB
    assert arguments["nano_cpus"] == 1_500_000_000
    assert arguments["network_mode"] == "none"
    assert "device_requests" not in arguments
    # Every mount a bind (a missing source refused, never created), inputs read-only as the plan says.
    mounts = mounts_of(arguments)
    assert {mount["Type"] for mount in mounts.values()} == {"bind"}
    assert {target: mount["ReadOnly"] for target, mount in mounts.items()} == {
        "/data/coco": True, "/models": True, "/scratch": False, "/results": False,
        AGENT_DIR: True, CONTROL_DIR: True, REPORT_DIR: False, CREDENTIALS_FILE: True}
    assert mounts["/data/coco"]["Source"] == "/work/train-1/data/coco"
    # The command is the plan's argv, after the frame script; nothing of it in the entrypoint.
    assert arguments["entrypoint"] == [f"{AGENT_DIR}/busybox", "sh", f"{AGENT_DIR}/frame.sh"]  # none of the image
    assert arguments["command"] == plan.argv


def test_a_container_without_limits_in_the_request_gets_the_default_tmp_and_no_memory_or_cpu_limit() -> None:
    plan = pure_plan(memory=None, cpu=None, ephemeral_storage=None)
    arguments = create_arguments(plan, pure_frame(plan, credentials=None))
    assert arguments["tmpfs"] == {"/tmp": f"size={4 * 1024 * MiB},mode=1777"}
    assert "mem_limit" not in arguments and "memswap_limit" not in arguments and "nano_cpus" not in arguments
    assert CREDENTIALS_FILE not in mounts_of(arguments)


def test_the_network_is_none_unless_allowed_and_rank_1_joins_rank_0s() -> None:
    plan = pure_plan(nodes=2, network=True)
    rank0 = create_arguments(plan, pure_frame(plan, 0, network=True))
    rank1 = create_arguments(plan, pure_frame(plan, 1, network=True))
    assert rank0["network_mode"] == "default"
    assert rank1["network_mode"] == f"container:{rank0['name']}"
    assert create_arguments(pure_plan(), pure_frame(pure_plan(), 0, network=False))["network_mode"] == "none"
    assert rank0["name"] != rank1["name"]
    assert rank0["name"] == container_name("/runs", "train-1", 1, 0)


def test_two_ranks_get_the_rendezvous_variables_of_their_own_rank() -> None:
    plan = pure_plan(nodes=2, gpus=2)
    for rank in (0, 1):
        env = create_arguments(plan, pure_frame(plan, rank, gpus=[str(2 * rank), str(2 * rank + 1)]))["environment"]
        assert {name: env[name] for name in ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR",
                                             "PET_MASTER_PORT", "WORLD_SIZE", "NODE_RANK", "MASTER_ADDR",
                                             "NUM_GPU_PER_NODE")} == {
            "PET_NNODES": "2", "PET_NPROC_PER_NODE": "2", "PET_NODE_RANK": str(rank), "PET_MASTER_ADDR": "127.0.0.1",
            "PET_MASTER_PORT": "29500", "WORLD_SIZE": "2", "NODE_RANK": str(rank), "MASTER_ADDR": "127.0.0.1",
            "NUM_GPU_PER_NODE": "2"}
    single = create_arguments(pure_plan(), pure_frame(pure_plan()))["environment"]
    assert "PET_NODE_RANK" not in single and "MASTER_ADDR" not in single


def test_gpus_go_by_device_id_disjoint_per_rank_and_never_more_than_the_target_lists() -> None:
    plan = pure_plan(nodes=2, gpus=2)
    allowed = ["GPU-aaaa", "GPU-bbbb", "3", "1", "GPU-cccc"]
    assigned = rank_gpus(plan, allowed)
    assert assigned == [["GPU-aaaa", "GPU-bbbb"], ["3", "1"]]
    for rank, gpus in enumerate(assigned):
        (request,) = create_arguments(plan, pure_frame(plan, rank, gpus=gpus))["device_requests"]
        assert request["DeviceIDs"] == gpus
        assert request["Capabilities"] == [["gpu"]]
        assert request.get("Count") in (None, 0)  # never "the first N" or all (-1)
    with pytest.raises(UsageError, match="gpu_devices"):
        rank_gpus(pure_plan(nodes=2, gpus=2), ["0", "1", "2"])
    with pytest.raises(UsageError, match="gpu_devices"):
        rank_gpus(pure_plan(gpus=1), [])
    assert rank_gpus(pure_plan(gpus=0), []) == [[]]


# ----------------------------------------------------------------------------- 2. no credential in the configuration
def credential_dirs() -> list[Path]:
    return sorted(Path("/dev/shm").glob("tao-data-io-docker-*"))


def test_a_forwarded_credential_reaches_the_command_and_nothing_of_the_container_or_the_host(
        docker_daemon: dockerd.DockerDaemon, backend: DockerBackend, control: Path, tmp_path: Path) -> None:
    """The value reaches the command (it compares a digest, never the value, and says yes or no),
    yet no ``docker inspect``, no file of the daemon's (data and exec roots), the run root, the
    records, the job's log or the credentials directory holds it; the credentials file is gone
    from the host once the container started."""
    value = f"tao-cred-{secrets.token_hex(12)}"
    digest = hashlib.sha256(value.encode()).hexdigest()
    script = REPORT + AWAIT + f"""
        if [ "$(printf %s "$TAO_TEST_TOKEN" | sha256sum | cut -c1-64)" = {digest} ]; then got=yes; else got=no; fi
        echo "received: $got"
        report received "$got"
        await finish
    """
    request = job_request(docker_daemon, "cred-1", script, control=control, forward_env=["TAO_TEST_TOKEN"])
    job = running(backend, request, tmp_path, {"TAO_TEST_TOKEN": value})
    assert seen(control, "received") == "yes\n"
    secret = value.encode()
    # The credentials file was unlinked once the container started: nothing of the job's is left there.
    assert not [path for directory in credential_dirs() for path in directory.glob(f"{job.job_id}-*")]
    (container,) = job.containers(docker_daemon)
    inspected = json.dumps(docker_daemon.client.api.inspect_container(container.id))
    assert value not in inspected
    assert CREDENTIALS_FILE in inspected  # the file is bound, by its name only
    assert value not in json.dumps(docker_daemon.client.api.inspect_image(docker_daemon.image))
    roots = [docker_daemon.directory, backend.run_root, tmp_path / "records", tmp_path / "work", *credential_dirs()]
    assert holding(roots, secret) == []
    # The grep reaches what the daemon stores of the container: the command's digest is there.
    assert any(path.endswith("config.v2.json") for path in holding([docker_daemon.data_root], digest.encode()))
    say(control, "finish")
    status = job.finished()
    assert status.state == "COMPLETE", status
    assert value not in backend.logs(job.ref) and "received: yes" in backend.logs(job.ref)
    assert holding(roots, secret) == []


# ----------------------------------------------------------------------------- 3. a source swapped after the check
#: The job's command: it says it started, then copies what its input holds to /control.
LEAK = 'echo started > /control/started; cat /data/secret.txt > /control/leaked 2>/dev/null; exit 0'


def test_a_mount_source_swapped_after_the_check_fails_the_verdict_naming_its_target_and_the_command_never_starts(
        docker_daemon: dockerd.DockerDaemon, backend: DockerBackend, control: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    source = dataset(tmp_path, "dataset", "checked")
    other = dataset(tmp_path, "other", "never checked")
    swapped = swap_before_start(monkeypatch, source, other)
    request = job_request(docker_daemon, "swap-1", LEAK, control=control,
                          mounts=[{"source": str(source), "target": "/data"}])
    job = launch(backend, request, tmp_path)
    assert swapped == [0]
    verdict = job.verify()
    assert not verdict.ok, verdict.describe()
    failed = {(check.kind, check.path) for check in verdict.failures}
    assert failed == {("bound", "/data")}, verdict.describe()
    assert "/data" in verdict.describe() and "source changed after the check" in verdict.describe()
    status = job.finished()
    assert status.state == "ERROR" and status.err_class == "ERR_INFRA", status
    assert not (control / "started").exists() and not (control / "leaked").exists()
    assert not job.containers(docker_daemon)


#: What a job's code does if it runs before its verdict: print every check passed (and write the
#: persistence token the host looks for), whatever the checklist says.
FORGED_PROBE = r"""tab=$(printf '\t')
while IFS="$tab" read -r check path argument; do
  [ "$check" = results-writable ] && printf '%s' "$argument" > "$path/.tao-data-io-verify"
  [ -n "$check" ] && printf 'TAO-VERIFY\tok\t%s\t%s\tforged\n' "$check" "$path"
done < "$2"
exit 0
"""
#: A ``stat`` that answers the ``bound`` check with what the checklist expects.
LYING_STAT = r"""#!/bin/sh
awk -F '\t' -v p="$4" '$1 == "bound" && $2 == p {print $3}' /tao-data-io/agent/checklist
"""


def dash_image(daemon: dockerd.DockerDaemon, *, lying_stat: bool) -> str:
    """The test image with /bin/sh this host's dash (and the libc it needs), as Ubuntu's — and so
    TAO's — images have it: unlike busybox's sh, which runs its own applets whatever PATH says,
    dash finds each command on PATH. ``lying_stat``: with a ``stat`` first on the probe's PATH
    that answers the ``bound`` check with what it expects. Made once per session."""
    tag = "tao-data-io-test:dash-lying-stat" if lying_stat else "tao-data-io-test:dash"
    if daemon.client.images.list(name=tag):
        return tag
    dash = Path(shutil.which("dash") or "/bin/dash")
    loaded = subprocess.run(["ldd", str(dash)], capture_output=True, text=True, check=True).stdout
    files = {"bin/dash": (dash.read_bytes(), 0o755)}
    files.update({library.lstrip("/"): (Path(library).read_bytes(), 0o755)
                  for library in re.findall(r"(/\S+) \(0x", loaded)})  # the loader and libc, where it looks
    if lying_stat:
        files["usr/local/bin/stat"] = (LYING_STAT.encode(), 0o755)
    return derived_image(daemon, tag, files, {"bin/sh": "dash"})


# A mount over the frame's own files (its credentials file, sourced before the probe) is refused by
# the request itself: test_the_frames_own_paths_are_no_mounts_target.
@pytest.mark.parametrize("route", ["path-in-environment", "image"])
def test_a_swapped_mount_source_is_refused_whatever_the_job_brings_to_its_own_verify(
        docker_daemon: dockerd.DockerDaemon, backend: DockerBackend, control: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, route: str) -> None:
    """The ``bound`` check guards the host (a source swapped to a directory the check refuses is
    bound by its path), so it must not be the job's to answer: not through the request's PATH (the
    frame script finds ``sh`` on it before the probe) or the request's image (its ``stat``)."""
    source = dataset(tmp_path, "dataset", "checked")
    private = dataset(tmp_path, "private", "refused at the check: tao-data-io's state")
    (private / ".tao-data-io-state").write_text("tao-data-io keeps state here\n")  # what preflight refuses
    fields: dict[str, Any] = {}
    mounts: list[dict[str, Any]] = [{"source": str(source), "target": "/data"}]
    tools = tmp_path / "tools"
    tools.mkdir(mode=0o755)
    if route == "path-in-environment":
        (tools / "sh").write_text("#!/bin/dash\n" + FORGED_PROBE)
        (tools / "sh").chmod(0o755)
        mounts.append({"source": str(tools), "target": "/tools"})
        fields["environment"] = {"PATH": "/tools:/usr/bin:/bin"}
        fields["image"] = dash_image(docker_daemon, lying_stat=False)
    else:
        fields["image"] = dash_image(docker_daemon, lying_stat=True)
    swap_before_start(monkeypatch, source, private)
    job_req = job_request(docker_daemon, "forge-1", LEAK, control=control, mounts=mounts, **fields)
    try:
        job = launch(backend, job_req, tmp_path)
    except UsageError as exc:  # refused before anything ran: the request's own way in was closed
        assert route != "image", exc
        assert "PATH" in str(exc), exc
        return
    verdict = job.verify()
    status = job.finished()
    assert not (control / "leaked").exists(), (
        f"the job read a source the check refuses: {(control / 'leaked').read_text()!r} ({verdict.describe()})")
    assert not verdict.ok and ("bound", "/data") in {(c.kind, c.path) for c in verdict.failures}, verdict.describe()
    assert status.state == "ERROR", status


# ----------------------------------------------------------------------------- 4. sources refused before all else
def listening_socket(path: Path) -> socket.socket:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    return server


@pytest.mark.parametrize("case", ["missing", "daemon-socket", "daemon-socket-directory", "any-socket",
                                  "symlink-to-system-directory", "var-run-docker-sock", "var-run", "home",
                                  "home-of-this-process"])
def test_a_source_the_job_may_not_have_is_refused_before_anything_exists(
        docker_daemon: dockerd.DockerDaemon, backend: DockerBackend, tmp_path: Path, case: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    daemon_socket = docker_daemon.host.removeprefix("unix://")
    held: list[socket.socket] = []
    if case == "missing":
        source, why = str(tmp_path / "never-made"), "not on this host"
    elif case == "daemon-socket":
        source, why = daemon_socket, "tao-data-io's own state"  # the backend's rules hold the daemon's socket private
    elif case == "daemon-socket-directory":
        source, why = str(Path(daemon_socket).parent), "refused"
    elif case == "any-socket":
        holder = tmp_path / "sockets"
        holder.mkdir()
        held.append(listening_socket(holder / "agent.sock"))
        source, why = str(holder / "agent.sock"), "is a socket"
    elif case == "symlink-to-system-directory":
        (tmp_path / "innocent").symlink_to("/etc")
        source, why = str(tmp_path / "innocent"), "system directory"
    elif case == "var-run-docker-sock":
        source, why = "/var/run/docker.sock", ""  # missing here, or a system directory's: refused either way
    elif case == "var-run":
        source, why = "/var/run", "system directory"
    elif case == "home":
        source, why = "/root", "home directory"
    else:
        home = tmp_path / "someone"
        home.mkdir()
        monkeypatch.setenv("HOME", str(home))
        source, why = str(home), "home directory"
    try:
        request = job_request(docker_daemon, "refused-1", "exit 0", mounts=[{"source": source, "target": "/data"}])
        refused(backend, request, tmp_path, source, why)
    finally:
        for server in held:
            server.close()


def test_a_source_inside_another_jobs_run_directory_is_refused(
        docker_daemon: dockerd.DockerDaemon, backend: DockerBackend, control: Path, tmp_path: Path) -> None:
    """Another job's run directory (its saved logs, its frame's control) and results, and the run
    root that holds them, are this backend's state: no job may mount them."""
    other = running(backend, job_request(docker_daemon, "other-1", "exit 0", control=control), tmp_path)
    other.finished()
    for source in (backend.run_root, backend.run_root / "other-1" / "run", backend.run_root / "other-1" / "results"):
        request = job_request(docker_daemon, "thief-1", "exit 0", mounts=[{"source": str(source), "target": "/data"}])
        refused(backend, request, tmp_path, str(source), "tao-data-io's own state")


# ----------------------------------------------------------------------------- 5. settings
REMOTE_HOSTS = ["tcp://10.0.0.5:2375", "ssh://user@gpu-box", "https://docker.example:2376", "tcp://127.0.0.1:2375"]


@pytest.mark.parametrize("host", REMOTE_HOSTS)
def test_a_remote_daemon_in_the_setting_is_refused_with_the_reason(host: str) -> None:
    with pytest.raises(ValidationError, match="remote daemon") as caught:
        DockerSettings(docker_host=host)
    assert "checks every mount source on this host" in str(caught.value)


@pytest.mark.parametrize("host", REMOTE_HOSTS)
def test_a_remote_daemon_in_docker_host_is_refused_as_bad_input_with_the_reason(
        host: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As the setting is: a usage error (the CLI's exit 2, a task that is not retried), never an
    unexpected ``ValueError`` (the CLI prints ``error: ValueError: …`` and exits 1)."""
    monkeypatch.setenv("DOCKER_HOST", host)
    with pytest.raises(UsageError, match=r"\$DOCKER_HOST .* is a remote daemon"):
        DockerBackend(DockerSettings(run_root=str(tmp_path / "docker")))


@pytest.mark.parametrize("host", ["", "unix:///var/run/docker.sock"])
def test_a_daemon_on_this_host_is_taken_from_the_setting_or_docker_host(
        host: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///tmp/elsewhere/docker.sock")
    found = DockerBackend(DockerSettings(docker_host=host or None, run_root=str(tmp_path / "docker")))
    assert found.settings.docker_host == (host or "unix:///tmp/elsewhere/docker.sock")
    assert found.config()["docker_host"] == found.settings.docker_host  # the record keeps the daemon decided


@pytest.mark.parametrize("field", ["run_as_user", "run_as_group"])
@pytest.mark.parametrize("value", [0, "0", 4294967295, -1, "root", True])
def test_a_job_never_runs_as_root_or_as_no_id(field: str, value: object) -> None:
    with pytest.raises(ValidationError, match=field):
        DockerSettings(**{field: value})


@pytest.mark.parametrize("gpus", [["all"], ["-1"], ["0,1"], ["0 1"], ["GPU-../x"], ["1000"], [""], ["0", "0"],
                                  ["GPU-abc", "GPU-abc"], ["nvidia.com/gpu=0"], ["0\n"]])
def test_gpu_devices_that_are_not_gpu_ids_are_refused(gpus: list[str]) -> None:
    with pytest.raises(ValidationError, match="gpu_devices"):
        DockerSettings(gpu_devices=gpus)


def test_gpu_ids_as_nvidia_smi_prints_them_are_taken() -> None:
    gpus = ["0", "7", "GPU-6f1c3a8e-1b2c-4d5e-8f90-123456789abc", "MIG-6f1c3a8e-1b2c-4d5e-8f90-123456789abc"]
    assert DockerSettings(gpu_devices=gpus).gpu_devices == gpus


# ----------------------------------------------------------------------------- 6. GPUs
def test_a_gpu_job_on_a_target_without_gpu_devices_is_refused_naming_gpu_devices(
        docker_daemon: dockerd.DockerDaemon, backend: DockerBackend, tmp_path: Path) -> None:
    request = job_request(docker_daemon, "gpu-1", "exit 0", shape={"gpus": 1})
    refused(backend, request, tmp_path, "gpu_devices", "1 GPU(s)")


def test_a_gpu_job_on_a_daemon_without_the_nvidia_runtime_is_refused_at_preflight_naming_the_toolkit(
        docker_daemon: dockerd.DockerDaemon, tmp_path: Path) -> None:
    if ("nvidia" in (docker_daemon.client.info().get("Runtimes") or {})
            or shutil.which("nvidia-container-runtime-hook", path="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin")):
        pytest.skip("the session's dockerd can give GPUs here (a GPU host): tests/test_docker_gpu.py runs")
    gpu_backend = make_backend(docker_daemon, tmp_path, gpu_devices=["0", "1"])
    request = job_request(docker_daemon, "gpu-2", "exit 0", shape={"gpus": 1})
    message = refused(gpu_backend, request, tmp_path, "NVIDIA Container Toolkit", "nvidia-ctk runtime configure")
    assert "no nvidia runtime" in message and "nvidia-container-runtime-hook" in message


# ----------------------------------------------------------------------------- 7. states only Docker has
def test_a_container_killed_by_someone_else_is_an_infrastructure_error_not_the_programs(
        docker_daemon: dockerd.DockerDaemon, backend: DockerBackend, control: Path, tmp_path: Path) -> None:
    script = REPORT + "report started yes; sleep 1000"
    job = running(backend, job_request(docker_daemon, "killed-1", script, control=control), tmp_path)
    seen(control, "started")
    (container,) = job.containers(docker_daemon)
    container.kill()  # docker kill: SIGKILL, exit 137, and no cancel of ours
    status = job.finished()
    assert status.state == "ERROR" and status.err_class == "ERR_INFRA", status
    assert status.exit_code == 137, status
    assert "did not cancel it" in str(status.message), status
    analysis = backend.failure_analysis(job.ref)
    assert analysis is not None and "docker stop or kill" in analysis.reason
    assert not job.containers(docker_daemon)


def test_a_child_killed_out_of_memory_while_the_command_succeeds_completes_with_a_warning(
        docker_daemon: dockerd.DockerDaemon, backend: DockerBackend, control: Path, tmp_path: Path) -> None:
    """The kernel's OOM killer takes the biggest process of the container (dd's 256 MiB buffer under
    a 64 MiB limit); the command goes on and exits 0: the job completed, and says a process of it
    was killed, so its results are looked at."""
    script = REPORT + 'dd if=/dev/zero of=/dev/null bs=256M count=1 2>/dev/null; report child "$?"; exit 0'
    job = running(backend, job_request(docker_daemon, "oom-child-1", script, control=control), tmp_path)
    assert seen(control, "child") == "137\n"  # the child was SIGKILLed
    status = job.finished()
    assert status.state == "COMPLETE" and status.exit_code == 0, status
    assert "OOMKilled" in str(status.message) and "though the command succeeded" in str(status.message), status
    assert backend.failure_analysis(job.ref) is None


class _WorkerKilled(BaseException):
    """Stands for the submitting process killed the moment the daemon refused the start."""


@pytest.mark.parametrize("seen_by", ["the-submit", "a-later-look"])
def test_a_container_the_daemon_created_but_could_not_start_is_an_infrastructure_error_quoting_the_daemon(
        docker_daemon: dockerd.DockerDaemon, control: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        seen_by: str) -> None:
    """A daemon with a runtime named ``nvidia`` but no NVIDIA driver behind it (runc under that name)
    passes preflight, takes the GPU request at create and fails it at start (``could not select
    device driver``), leaving the container created with ``State.Error``. The job is ERROR
    ERR_INFRA quoting the daemon, with the toolkit named as the fix, whether the submit saw the
    refusal or died at that moment and a later look reads ``State.Error``; nothing is left."""
    if seen_by == "a-later-look":
        original = DockerBackend._create_and_start

        def create_and_start(self: DockerBackend, run: Any, launch: Any, rank: int, credentials: Any) -> None:
            try:
                original(self, run, launch, rank, credentials)
            except APIError:
                raise _WorkerKilled() from None

        monkeypatch.setattr(DockerBackend, "_create_and_start", create_and_start)
    if "nvidia" in (docker_daemon.client.info().get("Runtimes") or {}):
        pytest.skip("the session's dockerd has the NVIDIA runtime here (a GPU host): a GPU request would start")
    runc = shutil.which("runc") or "/usr/sbin/runc"
    gpu_backend = make_backend(docker_daemon, tmp_path, gpu_devices=["0"])
    request = job_request(docker_daemon, "gpu-3", "echo started > /control/started", control=control,
                          shape={"gpus": 1})
    with docker_daemon.runtimes({"nvidia": runc}):
        try:
            if seen_by == "the-submit":
                job = launch(gpu_backend, request, tmp_path)
                assert not job.verify().ok
                ref = job.ref
            else:
                with pytest.raises(_WorkerKilled):
                    launch(gpu_backend, request, tmp_path)
                ref = "docker/gpu-3"
                (left,) = gpu_backend.client.containers.list(all=True, filters={"label": f"{JOB_LABEL}=gpu-3"})
                assert left.status == "created" and "could not select device driver" in left.attrs["State"]["Error"]
            status = wait_for(f"{ref} to end", lambda: found if (found := gpu_backend.status(ref)).terminal else None)
        finally:
            cancel_everything(gpu_backend)
    assert status.state == "ERROR" and status.err_class == "ERR_INFRA", status
    assert "could not select device driver" in str(status.message), status
    assert "rank 0's container could not start" in str(status.message), status
    analysis = gpu_backend.failure_analysis(ref)
    assert analysis is not None and "NVIDIA Container Toolkit" in analysis.suggestion
    assert not (control / "started").exists()
    assert not gpu_backend.client.containers.list(all=True, filters={"label": f"{JOB_LABEL}=gpu-3"})


# ----------------------------------------------------------------------------- 8. the results, after the job
@pytest.fixture
def results_environ(moto_credentials: Any) -> dict[str, str]:
    """Results uploaded by collect to a bucket of moto's S3 server."""
    environ = {"AWS_ACCESS_KEY_ID": str(moto_credentials.access_key_id),
               "AWS_SECRET_ACCESS_KEY": str(moto_credentials.secret_access_key),
               "AWS_ENDPOINT_URL": str(moto_credentials.endpoint_url), "AWS_DEFAULT_REGION": "us-east-1",
               "S3_BUCKET_NAME": f"docker-results-{secrets.token_hex(4)}"}
    make_s3_client(s3_credentials_from_env(environ)).create_bucket(Bucket=environ["S3_BUCKET_NAME"])
    return environ


def uploaded(environ: Mapping[str, str]) -> dict[str, bytes]:
    client = make_s3_client(s3_credentials_from_env(environ))
    bucket = environ["S3_BUCKET_NAME"]
    keys = [item["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
            for item in page.get("Contents", [])]
    return {key: client.get_object(Bucket=bucket, Key=key)["Body"].read() for key in keys}


def test_results_are_the_jobs_while_it_runs_and_the_backends_after_with_nothing_special_left_in_them(
        docker_daemon: dockerd.DockerDaemon, backend: DockerBackend, control: Path, tmp_path: Path,
        results_environ: dict[str, str]) -> None:
    """The job runs as nobody (the backend runs as root here) and what it writes is nobody's while
    it runs; once it ended, the results are root's again, a FIFO it left is gone, a setuid bit is
    cleared, and a symlink it left — one named status.json among them — is followed neither by
    the progress read, nor by taking the results back, nor by the upload."""
    host_secret = tmp_path / "host-secret.txt"
    host_secret.write_text("host-only: never uploaded\n")
    os.chown(host_secret, 4321, 4321)
    host_secret.chmod(0o600)
    host_status = tmp_path / "host-status.json"
    host_status.write_text(json.dumps({"status": "RUNNING", "kpi": {"forged": 1}}) + "\n")
    script = REPORT + AWAIT + f"""
        cd "$TAO_RESULTS_DIR"
        echo weights > model.bin
        mkdir -p sub && echo more > sub/log.txt
        cp /bin/busybox tool && chmod 4755 tool
        chmod 2775 sub
        mkfifo pipe
        ln -s {host_secret} link
        ln -s {host_status} status.json
        report who "$(id -u):$(id -g)"
        await finish
        exit 0
    """
    request = job_request(docker_daemon, "owned-1", script, control=control)
    job = running(backend, request, tmp_path, results_environ)
    assert seen(control, "who") == "65534:65534\n"
    results = Path(str(backend.results_path(job.ref)))
    assert os.stat(results / "model.bin").st_uid == 65534  # the job's while it runs
    assert stat.S_IMODE(os.stat(results / "tool").st_mode) & stat.S_ISUID
    assert backend.training_status(job.ref) is None  # status.json is a link: never followed
    say(control, "finish")
    status = job.finished()
    assert status.state == "COMPLETE", status
    for path in [results, *results.rglob("*")]:
        found = os.lstat(path)
        assert (found.st_uid, found.st_gid) == (0, 0), (path, found.st_uid)
        if not stat.S_ISLNK(found.st_mode):
            assert not stat.S_IMODE(found.st_mode) & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX), path
            assert not stat.S_IMODE(found.st_mode) & 0o022, path
    assert not (results / "pipe").exists() and not os.path.lexists(results / "pipe")
    assert os.path.islink(results / "link") and os.path.islink(results / "status.json")
    assert (os.stat(host_secret).st_uid, stat.S_IMODE(os.stat(host_secret).st_mode)) == (4321, 0o600)
    assert backend.training_status(job.ref) is None
    collected = verbs.collect(job.job_id, backend, job.store, environ=results_environ)
    assert collected.state == "COMPLETE", collected
    objects = uploaded(results_environ)
    assert any(key.endswith("/model.bin") for key in objects), sorted(objects)
    assert not [key for key, body in objects.items() if b"host-only" in body or b"forged" in body], sorted(objects)


# ----------------------------------------------------------------------------- 9. two ranks on one host
def test_two_ranks_run_as_two_containers_sharing_rank_0s_network_and_a_cancel_stops_both(
        docker_daemon: dockerd.DockerDaemon, backend: DockerBackend, control: Path, tmp_path: Path) -> None:
    script = REPORT + """
        rank=$PET_NODE_RANK
        net=$(ls /sys/class/net | tr '\\n' ' ')
        report "rank-$rank" "$PET_NODE_RANK $NODE_RANK $PET_NNODES $MASTER_ADDR $(id -u) $net"
        if [ "$rank" = 0 ]; then
          nc -l -p "$MASTER_PORT" > /control/got &
        else
          ( until echo "hello from rank 1" | nc "$MASTER_ADDR" "$MASTER_PORT"; do sleep 0.1; done ) &
        fi
        sleep 1000
    """
    request = job_request(docker_daemon, "ranks-1", script, control=control, shape={"nodes": 2})
    job = running(backend, request, tmp_path)
    assert seen(control, "rank-0") == "0 0 2 127.0.0.1 65534 lo \n"
    assert seen(control, "rank-1") == "1 1 2 127.0.0.1 65534 lo \n"
    wait_for("rank 0 to hear rank 1 at 127.0.0.1",
             lambda: "hello from rank 1" in (control / "got").read_text() if (control / "got").exists() else None)
    containers = {int(c.labels["io.tao-data-io.rank"]): c for c in job.containers(docker_daemon)}
    assert sorted(containers) == [0, 1]
    assert all(c.status == "running" for c in containers.values())
    assert containers[0].attrs["HostConfig"]["NetworkMode"] == "none"
    assert containers[1].attrs["HostConfig"]["NetworkMode"] in (f"container:{containers[0].id}",
                                                                f"container:{containers[0].name}")
    assert backend.status(job.ref).state == "RUNNING"
    assert backend.cancel(job.ref) is True
    status = job.finished()
    assert status.state == "CANCELED", status
    assert not job.containers(docker_daemon)


# ----------------------------------------------------------------------------- 10. what a job leaves running
def test_a_job_that_leaves_background_processes_completes_and_nothing_of_it_runs_after(
        docker_daemon: dockerd.DockerDaemon, backend: DockerBackend, control: Path, tmp_path: Path) -> None:
    script = REPORT + AWAIT + "sleep 1000 & report background $!; await finish; exit 0"
    job = running(backend, job_request(docker_daemon, "background-1", script, control=control), tmp_path)
    seen(control, "background")

    def left() -> list[int]:
        return [pid for pid, argv, environ in live_processes()
                if argv.startswith("sleep\0001000") and f"TAO_JOB_ID={job.job_id}\0" in environ]

    assert left(), "the job's background sleep is not seen on this host"  # what the check below looks for
    say(control, "finish")
    status = job.finished()
    assert status.state == "COMPLETE" and status.exit_code == 0, status
    assert not job.containers(docker_daemon)
    wait_for("the job's background sleep to be gone", lambda: not left())


# ----------------------------------------------------------------------------- 11. a hostile or careless request
@pytest.mark.parametrize("target", ["/tao-data-io", "/tao-data-io/credentials", "/tao-data-io/control",
                                    "/tao-data-io/report", "/tao-data-io/agent/tools"])
def test_the_frames_own_paths_are_no_mounts_target(
        docker_daemon: dockerd.DockerDaemon, backend: DockerBackend, control: Path, tmp_path: Path,
        target: str) -> None:
    """/tao-data-io is the frame's: a request's mount there would shadow its script, the host's
    word or this rank's report, or — at /tao-data-io/credentials, which the frame sources before
    the probe — run the job's own shell text before its verdict. Refused before anything exists,
    naming the target (the request itself, for every backend); never left for the daemon to refuse
    at create (which leaves the job id taken) or at start."""
    source = tmp_path / "mine"
    source.mkdir(mode=0o755)
    (source / "credentials").write_text("echo sourced > /control/sourced\n")
    (source / "credentials").chmod(0o644)
    mounted = source / "credentials" if target.endswith("credentials") else source
    with pytest.raises(ValidationError, match=f"target '{target}' shadows /tao-data-io, which the frame needs"):
        job_request(docker_daemon, "shadow-1", "exit 0", control=control,
                    mounts=[{"source": str(mounted), "target": target}])


@pytest.mark.parametrize("case", ["image-missing", "cpu-beyond-the-host", "memory-below-dockers-minimum"])
def test_a_request_the_daemon_refuses_leaves_the_job_id_free_for_the_fixed_request(
        docker_daemon: dockerd.DockerDaemon, backend: DockerBackend, control: Path, tmp_path: Path,
        case: str) -> None:
    """A careless request — an image the daemon does not have and cannot pull, more CPUs than the
    host has, less memory than Docker allows — is refused as bad input; nothing of it ran, so the
    same job id, with the request fixed, is then submitted and runs."""
    broken: dict[str, Any] = {"image-missing": {"image": "tao-data-io-test:no-such-tag"},
                              "cpu-beyond-the-host": {"shape": {"cpu": str(4 * (os.cpu_count() or 1))}},
                              "memory-below-dockers-minimum": {"shape": {"memory": "4Mi", "shm_size": "1Mi"}}}[case]
    script = "echo started >> /control/started"
    with pytest.raises(UsageError):
        launch(backend, job_request(docker_daemon, "careless-1", script, control=control, **broken), tmp_path)
    assert not backend.client.containers.list(all=True, filters={"label": f"{JOB_LABEL}=careless-1"})
    job = running(backend, job_request(docker_daemon, "careless-1", script, control=control), tmp_path)
    status = job.finished()
    assert status.state == "COMPLETE", status
    assert (control / "started").read_text() == "started\n"


def test_a_results_directory_that_is_a_symlink_is_refused_and_what_it_points_at_is_never_handed_to_the_job(
        docker_daemon: dockerd.DockerDaemon, backend: DockerBackend, control: Path, tmp_path: Path) -> None:
    """Results on a mount (``TAO_RESULTS_ROOT``): the job's directory there planted as a symlink —
    to a system directory, or to another directory of this host — is refused, and the directory
    it points at stays as it was (never given to the job's user)."""
    root = tmp_path / "results-root"
    root.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    environ = {"TAO_RESULTS_ROOT": str(root)}
    for job_id, points_at in (("linked-1", "/etc"), ("linked-2", str(elsewhere))):
        (root / job_id).symlink_to(points_at)
        request = job_request(docker_daemon, job_id, "echo started > /control/started", control=control)
        with pytest.raises(UsageError, match=job_id):
            launch(backend, request, tmp_path, environ)
        assert not backend.client.containers.list(all=True, filters={"label": f"{JOB_LABEL}={job_id}"})
    found = os.stat(elsewhere)
    assert (found.st_uid, stat.S_IMODE(found.st_mode)) == (0, 0o700)
    assert os.stat("/etc").st_uid == 0
    assert not (control / "started").exists()


def test_the_jobs_process_holds_nothing_of_the_host_and_its_writable_places_are_bounded(
        docker_daemon: dockerd.DockerDaemon, control: Path, tmp_path: Path) -> None:
    """Seen from inside: not root, no capability, no setuid gain, no network but loopback, no
    socket anywhere (the Docker socket above all), a read-only root and frame, /tmp and /dev/shm
    that fill at their size (16 MiB here) and never beyond, a pids limit that stops a fork loop."""
    small = make_backend(docker_daemon, tmp_path, pids_limit=64)
    script = REPORT + r"""
        report id "$(id -u):$(id -g)"
        report caps "$(awk '/^CapEff/ {c = $2} /^NoNewPrivs/ {n = $2} END {print c, n}' /proc/self/status)"
        report net "$(ls /sys/class/net | tr '\n' ' ')"
        report sockets "$(find / -type s 2>/dev/null | grep -v '^/proc/')"
        for place in /x /etc/x /tao-data-io/control/go /tao-data-io/agent/frame.sh; do
          sh -c 'echo forged > "$1"' - "$place" 2>/dev/null && echo "$place" >> /control/written
        done
        dd if=/dev/zero of=/tmp/fill bs=1M count=64 2>/dev/null
        dd if=/dev/zero of=/dev/shm/fill bs=1M count=64 2>/dev/null
        report filled "$(du -k /tmp/fill | cut -f1) $(du -k /dev/shm/fill | cut -f1) $HOME"
        rm -f /tmp/fill /dev/shm/fill
        # Last, and only builtins after it: once the pids limit binds, no process of the job can fork.
        ( n=0; while [ $n -lt 100 ]; do sleep 5 & n=$((n + 1)); echo $n > /control/spawned; done ) 2>/dev/null
        exit 0
    """
    try:
        job = running(small, job_request(docker_daemon, "inside-1", script, control=control), tmp_path)
        status = job.finished()
    finally:
        cancel_everything(small)
    assert status.state == "COMPLETE", (status, small.logs(job.ref, tail=20))
    assert seen(control, "id") == "65534:65534\n"
    assert seen(control, "caps") == "0000000000000000 1\n"
    assert seen(control, "net") == "lo \n"
    assert seen(control, "sockets") == "\n"
    assert not (control / "written").exists(), (control / "written").read_text()
    tmp_kib, shm_kib, home = seen(control, "filled").split()
    assert int(tmp_kib) <= 16 * 1024 and int(shm_kib) <= 16 * 1024 and home == "/tmp"
    assert int(tmp_kib) > 8 * 1024 and int(shm_kib) > 8 * 1024  # written until full
    assert 1 < int(seen(control, "spawned")) < 64


class _Planned(Exception):
    """Raised with the plan the submit verb's steps built, to stop them before they start it."""


def plan_only(backend: DockerBackend, request: JobRequest, tmp_path: Path) -> LaunchPlan:
    """The plan the submit verb would launch (record, tier, stage, route), nothing submitted."""

    def stop(plan: LaunchPlan) -> LaunchPlan:
        raise _Planned(plan)

    with pytest.raises(_Planned) as planned:
        launch_through_steps(request, backend, RecordStore(tmp_path / "records"), tmp_path / "work", {}, tune=stop)
    return planned.value.args[0]


def test_two_submits_of_one_job_at_once_start_its_command_once(
        docker_daemon: dockerd.DockerDaemon, backend: DockerBackend, control: Path, tmp_path: Path) -> None:
    """Two workers retrying one submit at the same moment: one container, one start."""
    request = job_request(docker_daemon, "twice-1", "echo started >> /control/started; sleep 1000", control=control)
    plan = plan_only(backend, request, tmp_path)
    backend.preflight(plan)
    barrier = threading.Barrier(2)
    said: list[Submission | BaseException] = []

    def submit() -> None:
        barrier.wait()
        try:
            said.append(backend.submit(plan, environ={}))
        except BaseException as exc:  # noqa: BLE001 - reported below
            said.append(exc)

    threads = [threading.Thread(target=submit) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(isinstance(found, Submission) for found in said), said
    assert sorted(found.started for found in said if isinstance(found, Submission)) == [False, True], said
    verdict = backend.verify(f"docker/{plan.job_id}", plan)
    assert verdict.ok, verdict.describe()
    wait_for("the command to start", lambda: (control / "started").exists())
    assert len(backend.client.containers.list(all=True, filters={"label": f"{JOB_LABEL}=twice-1"})) == 1
    assert backend.cancel(f"docker/{plan.job_id}") is True
    assert (control / "started").read_text() == "started\n"


def test_a_resubmit_while_the_first_submit_is_verifying_starts_nothing_and_the_next_attempt_waits(
        docker_daemon: dockerd.DockerDaemon, backend: DockerBackend, control: Path, tmp_path: Path) -> None:
    """Between submit and its verdict the frame waits for the host's word; a retried submit then
    meets its own container (nothing new), a next attempt is refused while this one is not over,
    and the verdict that follows starts the command once."""
    request = job_request(docker_daemon, "verifying-1", "echo started >> /control/started; sleep 1000",
                          control=control)
    job = launch(backend, request, tmp_path)
    probe = backend.run_root / "verifying-1" / "run" / "rank-0" / "probe"
    wait_for("rank 0's probe to report", probe.exists)
    assert backend.status(job.ref).state == "PENDING"
    again = backend.submit(job.plan, environ={})
    assert again.started is False and again.backend_ref == job.ref
    with pytest.raises(UsageError, match="still PENDING"):
        backend.submit(job.plan.model_copy(update={"attempt": 2}), environ={})
    assert not (control / "started").exists()
    verdict = job.verify()
    assert verdict.ok, verdict.describe()
    wait_for("the command to start", lambda: (control / "started").exists())
    assert len(job.containers(docker_daemon)) == 1
    assert backend.cancel(job.ref) is True
    assert (control / "started").read_text() == "started\n"


@pytest.mark.parametrize("value", ["it's \"quoted\" $(touch /control/ran) `touch /control/ran` $HOME \\",
                                   "line one\nline two\n", "-n", " leading and trailing ", "ünïcødé ☃",
                                   "x" * 65536])
def test_a_forwarded_value_reaches_the_command_byte_for_byte_and_is_never_read_as_shell_text(
        docker_daemon: dockerd.DockerDaemon, backend: DockerBackend, control: Path, tmp_path: Path,
        value: str) -> None:
    digest = hashlib.sha256(value.encode()).hexdigest()
    script = REPORT + 'report digest "$(printf %s "$ODD_VALUE" | sha256sum | cut -c1-64)"'
    request = job_request(docker_daemon, "odd-1", script, control=control, forward_env=["ODD_VALUE"])
    job = running(backend, request, tmp_path, {"ODD_VALUE": value})
    assert job.finished().state == "COMPLETE"
    assert seen(control, "digest") == f"{digest}\n"
    assert not (control / "ran").exists()


def test_long_lines_and_a_last_line_without_a_newline_read_whole_in_the_log_and_from_a_cursor(
        docker_daemon: dockerd.DockerDaemon, backend: DockerBackend, control: Path, tmp_path: Path) -> None:
    """The daemon keeps a line longer than 16 KiB as several pieces; the log reads it back whole,
    before and after the job's end, and a follower sees each line once."""
    script = ("head -c 40000 /dev/zero | tr '\\0' a; echo; echo short; head -c 20000 /dev/zero | tr '\\0' b; echo;"
              " printf 'no newline at the end'")
    job = running(backend, job_request(docker_daemon, "lines-1", script, control=control), tmp_path)
    expected = "a" * 40000 + "\nshort\n" + "b" * 20000 + "\nno newline at the end"
    wait_for("the job to end", lambda: backend.status(job.ref).terminal)
    assert backend.logs(job.ref).rstrip("\n") == expected
    followed, cursor = "", json.dumps({"0": [1, 0]})  # a cursor at the log's start (None: its last few lines)
    for _ in range(20):
        chunk = backend.follow_logs(job.ref, cursor)
        followed, cursor = followed + chunk.text, chunk.cursor
    assert followed.rstrip("\n") == expected


@pytest.mark.parametrize("how", ["the-frames-variable-in-environment", "a-signal-to-the-frame"])
def test_a_job_without_a_deadline_is_never_ended_or_reported_as_late(
        docker_daemon: dockerd.DockerDaemon, backend: DockerBackend, control: Path, tmp_path: Path, how: str) -> None:
    """The deadline is the plan's: a request's environment may not set the frame's own variable
    (TAO_DATA_IO_DEADLINE_SECONDS), and a command that signals its frame as the deadline timer
    does (SIGUSR1) is not a deadline that passed — the job fails as its program, never as
    "ran longer than its deadline (None s)"."""
    if how == "the-frames-variable-in-environment":
        request = job_request(docker_daemon, "late-1", "sleep 3; exit 7", control=control,
                              environment={"TAO_DATA_IO_DEADLINE_SECONDS": "1"})
    else:
        request = job_request(docker_daemon, "late-1", "kill -USR1 $PPID; sleep 3; exit 7", control=control)
    job = running(backend, request, tmp_path)
    assert job.plan.deadline_seconds is None
    status = job.finished()
    assert status.state == "ERROR" and status.err_class == "ERR_PROGRAM", status
    assert "deadline" not in str(status.message), status
    if how == "the-frames-variable-in-environment":
        assert status.exit_code == 7, status


def test_a_job_asking_for_the_network_is_refused_unless_the_target_allows_it(
        docker_daemon: dockerd.DockerDaemon, backend: DockerBackend, tmp_path: Path) -> None:
    request = job_request(docker_daemon, "net-1", "exit 0", network=True)
    refused(backend, request, tmp_path, "allow_network")


def test_a_job_id_of_the_longest_length_names_its_containers(
        docker_daemon: dockerd.DockerDaemon, backend: DockerBackend, control: Path, tmp_path: Path) -> None:
    job_id = "j" + "-0123456789" * 4 + "-abcdef"
    assert len(job_id) == 52
    job = running(backend, job_request(docker_daemon, job_id, "exit 0", control=control), tmp_path)
    assert job.finished().state == "COMPLETE"


@pytest.mark.parametrize("field", [{"privileged": True}, {"compute_shape": {**SHAPE, "privileged": True}},
                                   {"cap_add": ["SYS_ADMIN"]}, {"devices": ["/dev/kmsg"]},
                                   {"security_opt": ["seccomp=unconfined"]}, {"runtime": "nvidia"},
                                   {"pid_mode": "host"}, {"network_mode": "host"}, {"volumes": ["/:/host"]},
                                   {"mounts": [{"source": "/srv", "target": "/srv", "propagation": "rshared"}]},
                                   {"mounts": [{"source": "/srv", "target": "/srv", "type": "volume"}]}])
def test_a_request_that_asks_for_a_privilege_in_any_field_is_refused_as_written(field: dict[str, Any]) -> None:
    """The request's schema is closed: no field of Docker's own (privileged, capabilities, devices,
    security options, another runtime, the host's namespaces, volumes, mount propagation) can be
    asked for, in any part of it."""
    base = {"schema_version": "1", "job_id": "asks-1", "image": dockerd.IMAGE, "mode": "args",
            "command": ["/bin/sh", "-c"], "args": ["exit 0"], "compute_shape": SHAPE}
    with pytest.raises(ValidationError):
        JobRequest.model_validate({**base, **field})
