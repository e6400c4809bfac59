"""The session's own Docker daemon (tests/docker_daemon.py), which the Docker backend's tests run
on: it answers on its own socket with its own data root, and its test image runs the shell tools a
job's frame uses under the restrictions a job runs with. What Docker refuses or reports here is
what the backend will be held to."""

from __future__ import annotations

import re
from pathlib import Path

import docker
import pytest
from docker.types import Mount

from . import docker_daemon as harness

#: The session's dockerd and its test image (a pytest fixture of tests/docker_daemon.py).
docker_daemon = harness.docker_daemon

#: How a job's container is held down: no network, a read-only root, no capabilities, no setuid
#: gains, an init as PID 1, a user that is not root.
LOCKED_DOWN = {"user": "1000:1000", "network_mode": "none", "read_only": True, "cap_drop": ["ALL"],
               "security_opt": ["no-new-privileges"], "init": True}


def run(daemon: harness.DockerDaemon, script: str, **options: object) -> str:
    """What ``sh -c script`` printed in a container of the test image (removed after)."""
    output = daemon.client.containers.run(daemon.image, ["sh", "-c", script], remove=True, stderr=True, **options)
    assert isinstance(output, bytes)
    return output.decode()


@pytest.mark.parametrize("name", ["tao-dockerd-_1zo85ru", "tao-dockerd-ab__cd12", "tao-dockerd-abcd123_",
                                  "tao-dockerd-x"])
def test_the_containerd_namespace_is_one_containerd_takes_whatever_mkdtemp_named_the_directory(name: str) -> None:
    """containerd refuses a namespace with ``_`` at a segment's start or end (mkdtemp's suffix may
    give one): the daemon then starts, and every container's start fails."""
    namespace = harness.containerd_namespace(Path("/tmp") / name)
    assert re.fullmatch(r"[A-Za-z0-9]+(?:[._-][A-Za-z0-9]+)*", namespace), namespace
    assert re.fullmatch(r"[A-Za-z0-9]+(?:[._-][A-Za-z0-9]+)*", f"{namespace}-plugins")
    assert namespace != harness.containerd_namespace(Path("/tmp") / f"{name}0")


def test_the_daemon_answers_on_its_own_socket_with_its_own_data_root(docker_daemon: harness.DockerDaemon) -> None:
    assert docker_daemon.host == f"unix://{docker_daemon.directory / 'docker.sock'}"
    assert docker_daemon.environ() == {"DOCKER_HOST": docker_daemon.host}
    client = docker.DockerClient(base_url=docker_daemon.environ()["DOCKER_HOST"])
    try:
        info = client.info()
        assert client.ping()
    finally:
        client.close()
    assert info["DockerRootDir"] == str(docker_daemon.data_root)
    assert docker_daemon.data_root.is_relative_to(docker_daemon.directory)
    assert int((docker_daemon.directory / "dockerd.pid").read_text()) == docker_daemon.pid
    assert docker_daemon.client.images.get(docker_daemon.image).tags == [docker_daemon.image]


def test_the_image_has_the_tools_a_frame_uses(docker_daemon: harness.DockerDaemon) -> None:
    script = r"""
        set -e
        mkdir -p /tmp/a/b/c
        dd if=/dev/zero of=/tmp/a/b/c/f bs=1024 count=3 2>/dev/null
        printf 'one\ntwo\nthree\n' > /tmp/lines
        echo "size=$(stat -c '%s' /tmp/a/b/c/f) dev-ino=$(stat -c '%d %i' /tmp/a/b/c/f | awk '{print NF}')"
        echo "tail=$(tail -n 1 /tmp/lines) awk=$(awk 'END {print NR}' /tmp/lines)"
        ln -s /tmp/a/b /tmp/link
        echo "readlink=$(readlink -f /tmp/link/c)"
        sleep 30 & pid=$!
        kill -TERM "$pid"
        wait "$pid" 2>/dev/null || echo "killed=$?"
    """
    assert run(docker_daemon, script).split("\n") == [
        "size=3072 dev-ino=2", "tail=three awk=3", "readlink=/tmp/a/b/c", "killed=143", ""]


def test_a_locked_down_container_runs_as_user_1000_with_a_read_only_bind(
        docker_daemon: harness.DockerDaemon, tmp_path: Path) -> None:
    (tmp_path / "input.txt").write_text("staged\n")
    tmp_path.chmod(0o755)
    (tmp_path / "input.txt").chmod(0o644)
    script = """
        echo "id=$(id -u):$(id -g)"
        cat /data/input.txt
        echo "net=$(ls /sys/class/net | tr '\\n' ' ')"
        touch /data/new 2>/dev/null || echo "bind read-only"
        touch /new 2>/dev/null || echo "root read-only"
        echo "caps=$(awk '/^CapEff/ {print $2}' /proc/self/status)"
        echo "nnp=$(awk '/^NoNewPrivs/ {print $2}' /proc/self/status)"
        echo "pid1=$(cat /proc/1/comm)"
        echo hi
    """
    output = run(docker_daemon, script, **LOCKED_DOWN,
                 mounts=[Mount(target="/data", source=str(tmp_path), type="bind", read_only=True)])
    assert output.split("\n") == ["id=1000:1000", "staged", "net=lo ", "bind read-only", "root read-only",
                                  "caps=0000000000000000", "nnp=1", "pid1=docker-init", "hi", ""]
    assert not (tmp_path / "new").exists()


def test_a_bind_of_a_missing_source_is_refused(docker_daemon: harness.DockerDaemon, tmp_path: Path) -> None:
    """The ``mounts=`` form refuses; the ``volumes=`` form would create the source, root-owned."""
    with pytest.raises(docker.errors.APIError) as refused:
        docker_daemon.client.containers.create(
            docker_daemon.image, ["true"],
            mounts=[Mount(target="/data", source=str(tmp_path / "missing"), type="bind", read_only=True)])
    assert refused.value.status_code == 400
    assert "bind source path does not exist" in str(refused.value.explanation)
    assert not (tmp_path / "missing").exists()


def test_wait_gives_the_exit_status(docker_daemon: harness.DockerDaemon) -> None:
    container = docker_daemon.client.containers.create(docker_daemon.image, ["sh", "-c", "exit 3"], **LOCKED_DOWN)
    try:
        container.start()
        assert container.wait(timeout=60)["StatusCode"] == 3
    finally:
        container.remove(force=True)


def test_limits_a_job_asks_for_are_applied(docker_daemon: harness.DockerDaemon) -> None:
    """Memory, process and shared-memory limits and a sized /tmp reach the container (cgroup v1 or v2)."""
    script = """
        memory=$(cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes)
        pids=$(cat /sys/fs/cgroup/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids/pids.max)
        echo "memory=$memory pids=$pids"
        df -k /tmp /dev/shm | awk 'NR > 1 {print $6 "=" $2}'
    """
    output = run(docker_daemon, script, **LOCKED_DOWN, mem_limit="256m", pids_limit=64, shm_size="32m",
                 tmpfs={"/tmp": "size=64m"})
    assert output.split("\n") == [f"memory={256 * 2**20} pids=64", f"/tmp={64 * 1024}", f"/dev/shm={32 * 1024}", ""]
