"""What the SLURM tests share (tests/test_slurm_backend.py, tests/test_slurm_attack.py): a job as
they hold it, the requests they submit (``sh -c SCRIPT`` with ``/control`` to talk through),
launching through the verbs' own steps, and the fixtures of a test's own shared directory and
backend — every job a backend made canceled at the end and required to have ended in SLURM with
no process left in its cgroup. A module of its own, so the test modules share it without
importing each other."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tao_data_io import steps
from tao_data_io.backends.slurm.backend import SlurmBackend
from tao_data_io.backends.slurm.commands import fields
from tao_data_io.backends.slurm.rundir import RunDir
from tao_data_io.launch.backend import JobStatus
from tao_data_io.launch.probe import Verdict
from tao_data_io.records import RecordStore
from tao_data_io.request import JobRequest

from . import slurm_cluster as harness
from .contract.harness import Launched, launch_through_steps
from .contract.slurm import shared_dir, slurm_backend
from .helpers import wait_for

SHAPE: dict[str, Any] = {"gpus": 0, "memory": "64Mi", "shm_size": "16Mi", "ephemeral_storage": "16Mi"}
IMAGE = "nvcr.io/nvidia/tao/tao-toolkit:6.0.0-pyt"
#: SLURM's states of a job that still holds (or waits for) its allocation.
HOLDING = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "STOPPED", "RESIZING")


@dataclass(frozen=True)
class Job(Launched):
    """A job as these tests hold it (the suite's :class:`Launched`), with its backend and record store."""

    backend: SlurmBackend
    store: RecordStore

    def verify(self) -> Verdict:
        return self.backend.verify(self.ref, self.plan)

    def finished(self) -> JobStatus:
        status = wait_for(f"{self.ref} to end", lambda: found if (found := self.backend.status(self.ref)).terminal
                          else None, deadline_s=150)
        steps.record_end(self.store, self.job_id, status)
        return status

    @property
    def run(self) -> RunDir:
        return RunDir(self.backend.run_root / self.job_id / "run")

    @property
    def slurm_id(self) -> str:
        launch = self.run.launch()
        assert launch is not None and launch.slurm_id is not None
        return launch.slurm_id

    @property
    def token(self) -> str:
        launch = self.run.launch()
        assert launch is not None
        return launch.token


@pytest.fixture
def shared(slurm_cluster: harness.SlurmCluster, tmp_path: Path) -> Path:
    """A directory of the test's own on the cluster's shared filesystem."""
    return shared_dir(slurm_cluster, tmp_path)


@pytest.fixture
def make(slurm_cluster: harness.SlurmCluster, shared: Path) -> Iterator[Callable[..., SlurmBackend]]:
    """Backends on the test's shared directory (``settings`` on top of the contract's); at the end
    every job they submitted is canceled, and must then have ended with no process left."""
    made: list[SlurmBackend] = []

    def build(**settings: Any) -> SlurmBackend:
        found = slurm_backend(slurm_cluster, shared, **settings)
        made.append(found)
        return found

    yield build
    tidy(slurm_cluster, made)


@pytest.fixture
def backend(make: Callable[..., SlurmBackend]) -> SlurmBackend:
    return make()


@pytest.fixture
def control(shared: Path) -> Path:
    """A directory every job here mounts read-write at /control (anyone may write it: the job runs as nobody)."""
    found = shared / "control"
    found.mkdir()
    found.chmod(0o1777)
    return found


def tidy(cluster: harness.SlurmCluster, backends: Sequence[SlurmBackend]) -> None:
    """Cancel every job the backends know, then insist each has ended in SLURM and left no process
    in its cgroup: a test must never leave anything running behind it."""
    ids: list[str] = []
    for found in backends:
        for run in sorted(found.run_root.glob("*/run")):
            if not (run / "launch.json").exists():
                continue
            found.cancel(f"slurm/{run.parent.name}")
            launch = RunDir(run).launch()
            if launch is not None and launch.slurm_id is not None:
                ids.append(launch.slurm_id)

    def over() -> bool:
        return all(job_state(cluster, slurm_id) not in HOLDING and not job_processes(slurm_id) for slurm_id in ids)

    wait_for(f"jobs {ids} to end with no process left", over, deadline_s=120)


def job_processes(slurm_id: str) -> list[int]:
    """The processes in SLURM job ``slurm_id``'s cgroups on any node (``proctrack/cgroup``:
    ``/slurm_<node>/uid_<uid>/job_<id>``)."""
    for _ in range(_WALKS - 1):
        try:
            return _in_cgroups(slurm_id)
        except FileNotFoundError:  # a cgroup went while the tree was walked: walk it again
            continue
    return _in_cgroups(slurm_id)


#: How many times :func:`job_processes` walks the cgroup tree while the job's cgroups are being removed.
_WALKS = 10


def _in_cgroups(slurm_id: str) -> list[int]:
    found: list[int] = []
    for procs in Path("/sys/fs/cgroup/freezer").glob(f"slurm_*/uid_*/job_{slurm_id}/**/cgroup.procs"):
        try:
            found += [int(pid) for pid in procs.read_text().split()]
        except OSError:  # the cgroup went while it was read
            continue
    return found


def job_request(job_id: str, script: str, *, control: Path | None = None, mounts: Sequence[Mapping[str, Any]] = (),
                shape: Mapping[str, Any] | None = None, **fields_: Any) -> JobRequest:
    """A request whose command is ``sh -c script`` (``control`` mounted at /control)."""
    all_mounts = [*([{"source": str(control), "target": "/control", "read_only": False}] if control else []),
                  *mounts]
    return JobRequest.model_validate({
        "schema_version": "1", "job_id": job_id, "image": IMAGE, "mode": "args", "command": ["/bin/sh", "-c"],
        "args": [script], "mounts": all_mounts, "compute_shape": {**SHAPE, **(shape or {})}, **fields_})


def launch(backend: SlurmBackend, request: JobRequest, shared: Path, environ: Mapping[str, str] | None = None) -> Job:
    """Submit ``request`` through the verbs' steps, without waiting for the verdict."""
    store = RecordStore(shared / "records")
    submission, plan, documents = launch_through_steps(request, backend, store, shared / "work", environ or {})
    return Job(plan, documents, submission, backend, store)


def running(backend: SlurmBackend, request: JobRequest, shared: Path,
            environ: Mapping[str, str] | None = None) -> Job:
    """A job launched and verified: its command has been given the word to start."""
    job = launch(backend, request, shared, environ)
    verdict = job.verify()
    assert verdict.ok, verdict.describe()
    return job


def seen(control: Path, name: str, deadline_s: float = 150) -> str:
    """What the job wrote into /control/``name``, once it has (whole: written then renamed)."""
    return wait_for(f"/control/{name} from the job", lambda: (control / name).read_text()
                    if (control / name).exists() else None, deadline_s=deadline_s)


def say(control: Path, name: str) -> None:
    """Tell the job to go on (``/control/<name>`` appears)."""
    (control / name).write_text("")


def job_fields(cluster: harness.SlurmCluster, slurm_id: str) -> dict[str, str]:
    done = cluster.run("scontrol", "show", "job", "-o", slurm_id)
    return fields(done.stdout.strip()) if done.returncode == 0 else {}


def job_state(cluster: harness.SlurmCluster, slurm_id: str) -> str:
    return job_fields(cluster, slurm_id).get("JobState", "").split(" ")[0]
