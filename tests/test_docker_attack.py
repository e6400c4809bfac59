"""A second attack pass on the Docker backend's fixes (commit 8306a1e and after): the host's
``bound`` check through ``/proc/<pid>/root`` (:func:`tao_data_io.launch.binding.open_source` with
a root), and what runs in the container before the host's word.

The pure tests of ``open_source(path, root)`` compare it with the kernel's own resolution of the
same path in a ``chroot`` to the same tree (a forked child's ``os.stat``): the host's walk must
find what the container's processes find, no more (no escape above the root) and no less (no
false failure of a layout the kernel resolves)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from tao_data_io.backends.docker.backend import DockerBackend, _identity
from tao_data_io.backends.docker.containers import JOB_LABEL, RUN_LABEL
from tao_data_io.backends.docker.settings import DockerSettings
from tao_data_io.records import RecordStore
from tao_data_io.request import JobRequest

from . import docker_daemon as dockerd
from .contract.docker import dataset, derived_image, swap_before_start
from .contract.harness import launch_through_steps
from .helpers import wait_for

docker_daemon = dockerd.docker_daemon

SHAPE: dict[str, Any] = {"gpus": 0, "memory": "64Mi", "shm_size": "16Mi", "ephemeral_storage": "16Mi"}
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="chroot and setuid need root")


# ----------------------------------------------------------------------------- open_source(path, root)
def in_child(setup: Callable[[], None], answer: Callable[[], object]) -> Any:
    """``answer()`` as a forked child computes it after ``setup()`` (a chroot, a setuid), as JSON."""
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        try:
            os.close(read)
            setup()
            os.write(write, json.dumps(answer()).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        text = pipe.read().decode()
    os.waitpid(child, 0)
    return json.loads(text)


def kernel_identity(root: Path, path: str) -> tuple[int, int] | None:
    """(device, inode) of ``path`` as the kernel resolves it inside a chroot to ``root``, or None
    when the lookup fails (as it would for the container's own processes)."""
    def setup() -> None:
        os.chroot(str(root))
        os.chdir("/")

    def answer() -> list[int] | None:
        try:
            found = os.stat(path)
        except OSError:
            return None
        return [found.st_dev, found.st_ino]

    found = in_child(setup, answer)
    return None if found is None else (found[0], found[1])


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A container-like root under a directory holding a decoy of every name it holds (what an
    escape above the root would find instead)."""
    outside = tmp_path / "host"
    root = outside / "root"
    for base in (outside, root):
        (base / "srv" / "data").mkdir(parents=True)
        (base / "etc").mkdir()
        (base / "etc" / "passwd").write_text("x\n")
        (base / "srv" / "data" / "f").write_text("data\n")
    (root / "abs").symlink_to("/srv/data")                 # absolute: starts again at the root
    (root / "rel").symlink_to("srv/data")
    (root / "up").symlink_to("../../../../srv/data")      # .. above the root: clamped
    (root / "escape").symlink_to("../../host/srv")          # names the host's directory from the root
    (root / "mnt").symlink_to("/srv")                      # a parent that is a symlink
    (root / "srv" / "back").symlink_to("../etc")            # .. out of a directory reached via a symlink
    (root / "srv" / "data" / "self").symlink_to(".")
    (root / "loop").symlink_to("loop")
    (root / "dangling").symlink_to("/nowhere")
    (root / "chain").symlink_to("mnt/data/self/self/../data")
    (root / "filedot").symlink_to("etc/passwd/../passwd")   # a file as a directory: ENOTDIR in the kernel
    (root / "linkdot").symlink_to("abs/..")                 # .. after a symlink: the link's parent's, not /
    return root


PATHS = ["/srv/data", "/abs", "/rel", "/up", "/up/f", "/escape", "/escape/data", "/mnt/data", "/mnt/data/f",
         "/srv/back/passwd", "/srv/data/self/self/f", "/loop", "/dangling", "/chain", "/filedot", "/linkdot",
         "/..", "/../../srv/data", "/srv/../srv/data", "/abs/../etc/passwd", "/mnt/../etc/passwd",
         "/etc/passwd/..", "/etc/passwd/../passwd"]


@ROOT_ONLY
@pytest.mark.parametrize("path", PATHS)
def test_open_source_in_a_root_finds_what_the_kernel_finds_in_a_chroot(tree: Path, path: str) -> None:
    expected = kernel_identity(tree, path)
    found = _identity(str(tree), path)  # an error reads as no object
    assert found == expected, (path, found, expected)


def test_open_source_never_leaves_its_root(tree: Path) -> None:
    """Whatever the path, the object found is the root or under it: never the decoy above."""
    decoys = {(s.st_dev, s.st_ino) for s in (os.stat(tree.parent / name) for name in
                                            ("srv", "srv/data", "srv/data/f", "etc", "etc/passwd", "."))}
    decoys.add((os.stat(tree.parent.parent).st_dev, os.stat(tree.parent.parent).st_ino))
    for path in PATHS:
        assert _identity(str(tree), path) not in decoys, path


# ----------------------------------------------------------------------------- the daemon
def make_backend(daemon: dockerd.DockerDaemon, tmp_path: Path) -> DockerBackend:
    return DockerBackend(DockerSettings(docker_host=daemon.host, run_root=str(tmp_path / "docker"),
                                        cancel_grace_seconds=5))


@pytest.fixture
def backend(docker_daemon: dockerd.DockerDaemon, tmp_path: Path) -> Iterator[DockerBackend]:
    found = make_backend(docker_daemon, tmp_path)
    yield found
    for run in found.run_root.glob("*/run"):
        if (run / "launch.json").exists():
            found.cancel(f"docker/{run.parent.name}")


@pytest.fixture
def control(tmp_path: Path) -> Path:
    found = tmp_path / "control"
    found.mkdir()
    found.chmod(0o1777)
    return found


def request(daemon: dockerd.DockerDaemon, job_id: str, script: str, *, control: Path,
            mounts: Sequence[Mapping[str, Any]] = (), image: str | None = None) -> JobRequest:
    return JobRequest.model_validate({
        "schema_version": "1", "job_id": job_id, "image": image or daemon.image, "mode": "args",
        "command": ["/bin/sh", "-c"], "args": [script],
        "mounts": [{"source": str(control), "target": "/control", "read_only": False}, *mounts],
        "compute_shape": SHAPE})


def launch(backend: DockerBackend, job: JobRequest, tmp_path: Path) -> Any:
    store = RecordStore(tmp_path / "records")
    submission, _, _ = launch_through_steps(job, backend, store, tmp_path / "work", {})
    return submission


#: An image's own /bin/sh that reads /data at once, then runs what it was given honestly: were it
#: the frame's interpreter before the host's word (as it first was), the image's code would read a
#: swapped source before the host's check refused it.
HOSTILE_SH = b"""#!/bin/busybox sh
/bin/busybox cat /data/secret.txt > /control/leaked 2>/dev/null
exec /bin/busybox sh "$@"
"""


@ROOT_ONLY
def test_an_image_whose_sh_reads_a_swapped_source_before_the_host_check_leaks_nothing(
        docker_daemon: dockerd.DockerDaemon, backend: DockerBackend, control: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The frame script is run by the image's /bin/sh: job-controlled code before ``go``. A source
    swapped (after submit's check) to a directory the check refuses is bound by its path; the
    host's ``bound`` check refuses it — but only after the image's code has read it."""
    image = derived_image(docker_daemon, "tao-data-io-test:hostile-sh", {"bin/sh": (HOSTILE_SH, 0o755)})
    source = dataset(tmp_path, "dataset", "checked")
    private = dataset(tmp_path, "private", "refused at the check: tao-data-io's state")
    (private / ".tao-data-io-state").write_text("tao-data-io keeps state here\n")
    swap_before_start(monkeypatch, source, private)
    job = request(docker_daemon, "hostile-sh-1", "exit 0", control=control,
                  mounts=[{"source": str(source), "target": "/data"}], image=image)
    submission = launch(backend, job, tmp_path)
    ref = submission.backend_ref
    plan = backend._launched(ref)[1].plan
    verdict = backend.verify(ref, plan)
    assert not verdict.ok, verdict.describe()
    leaked = (control / "leaked").read_text() if (control / "leaked").exists() else ""
    assert "refused" not in leaked, f"the image's /bin/sh read the swapped source before the verdict: {leaked!r}"


def container_pid(daemon: dockerd.DockerDaemon, backend: DockerBackend, job_id: str) -> int:
    def found() -> int | None:
        containers = daemon.client.containers.list(filters={"label": [f"{JOB_LABEL}={job_id}",
                                                                       f"{RUN_LABEL}={backend.run_root}"]})
        if not containers:
            return None
        pid = containers[0].attrs["State"].get("Pid")
        return pid or None
    return wait_for(f"{job_id}'s container to run", found)


def identity_as(uid: int, gid: int, root: str, target: str) -> Any:
    """[whether ``root`` opens, ``_identity(root, target)``] as a child running as ``uid``:``gid``
    computes them (an unprivileged backend: its jobs run as itself)."""
    def setup() -> None:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)

    def answer() -> list[Any]:
        try:
            os.close(os.open(root, os.O_PATH | os.O_DIRECTORY))
            opened = "opened"
        except OSError as exc:
            opened = f"{type(exc).__name__}: {exc.strerror}"
        return [opened, _identity(root, target)]

    return in_child(setup, answer)


@ROOT_ONLY
def test_a_backend_running_as_the_jobs_own_user_can_make_the_host_check(
        docker_daemon: dockerd.DockerDaemon, backend: DockerBackend, control: Path, tmp_path: Path) -> None:
    """An unprivileged backend runs its jobs as itself: it must be able to open the container's
    /proc/<pid>/root and walk it, or every job with a mount fails its ``bound`` check. Simulated
    here: a child of this (root) test, as the uid the container runs as, with no capability."""
    source = dataset(tmp_path, "dataset", "checked")
    job = request(docker_daemon, "nonroot-1", "exit 0", control=control,
                  mounts=[{"source": str(source), "target": "/data"}])
    submission = launch(backend, job, tmp_path)
    pid = container_pid(docker_daemon, backend, "nonroot-1")
    user = wait_for("the container's uid", lambda: next(
        (line.split()[1:3] for line in Path(f"/proc/{pid}/status").read_text().splitlines()
         if line.startswith("Uid:")), None))
    gid = next(line.split()[1] for line in Path(f"/proc/{pid}/status").read_text().splitlines()
               if line.startswith("Gid:"))
    expected = [os.stat(source).st_dev, os.stat(source).st_ino]
    as_root = _identity(f"/proc/{pid}/root", "/data")
    assert as_root is not None and list(as_root) == expected
    answer = identity_as(int(user[0]), int(gid), f"/proc/{pid}/root", "/data")
    assert answer == ["opened", expected], (
        f"as uid {user[0]} (the container's own): {answer}; as root: {as_root}")
    plan = backend._launched(submission.backend_ref)[1].plan
    assert backend.verify(submission.backend_ref, plan).ok


@ROOT_ONLY
@pytest.mark.parametrize("layout", ["target-is-absolute-symlink", "parent-is-relative-symlink-with-dotdot"])
def test_a_mount_target_through_an_image_symlink_is_not_a_false_failure(
        docker_daemon: dockerd.DockerDaemon, backend: DockerBackend, control: Path, tmp_path: Path,
        layout: str) -> None:
    """An image where the mount target (or its parent) is a symlink: Docker binds where the link
    leads, inside the container's root; the host's walk must find the bind there too (a legitimate
    job refused is a defect), and the job reads the checked data through the target."""
    if layout == "target-is-absolute-symlink":
        image = derived_image(docker_daemon, "tao-data-io-test:data-link", {}, links={"data": "/srv/data"},
                              directories=["srv", "srv/data"])
        target = "/data"
    else:
        image = derived_image(docker_daemon, "tao-data-io-test:parent-link", {},
                              links={"mnt": "../../srv"}, directories=["srv", "srv/data"])
        target = "/mnt/data"
    source = dataset(tmp_path, "dataset", "checked")
    job = request(docker_daemon, f"link-{layout[:6]}", f"cat {target}/secret.txt > /control/read", control=control,
                  mounts=[{"source": str(source), "target": target}], image=image)
    submission = launch(backend, job, tmp_path)
    plan = backend._launched(submission.backend_ref)[1].plan
    verdict = backend.verify(submission.backend_ref, plan)
    assert verdict.ok, verdict.describe()
    read = control / "read"
    assert wait_for("the job's read", lambda: read.read_text() if read.exists() else None) == "checked"


@ROOT_ONLY
def test_a_frame_that_ends_while_the_host_looks_through_it_never_passes_the_bound_check(
        docker_daemon: dockerd.DockerDaemon, backend: DockerBackend, control: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The host looks at a mount through ``/proc/<pid>/root``: if the container ended meanwhile, that
    pid may be another process's, so what was seen there proves nothing of the frame — the check
    fails, and the command never starts."""
    from tao_data_io.backends.docker import backend as docker_backend

    source = dataset(tmp_path, "dataset", "checked")
    job = request(docker_daemon, "ended-1", "exit 0", control=control,
                  mounts=[{"source": str(source), "target": "/data"}])
    submission = launch(backend, job, tmp_path)
    looked = docker_backend._identity

    def look_then_end(root: str, target: str) -> tuple[int, int] | None:
        found = looked(root, target)
        for container in docker_daemon.client.containers.list(filters={"label": f"{JOB_LABEL}=ended-1"}):
            container.kill()
        return found

    monkeypatch.setattr(docker_backend, "_identity", look_then_end)
    verdict = backend.verify(submission.backend_ref, backend._launched(submission.backend_ref)[1].plan)
    assert not verdict.ok, verdict.describe()
    assert any(check.kind == "bound" and "ended while it was looked at" in check.detail for check in verdict.failures)
    assert not (control / "started").exists()
