"""The session's own SLURM cluster (tests/slurm_cluster.py), which the SLURM backend's tests run on:
jobs reach COMPLETED on its two emulated nodes, run as another user, run side by side, end
OUT_OF_MEMORY past their ``--mem``, and nothing of a cluster outlives it — stopped, or its session
killed. What SLURM reports here is what the backend will be held to."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from . import slurm_cluster as harness

#: The session's SLURM cluster (a pytest fixture of tests/slurm_cluster.py).
slurm_cluster = harness.slurm_cluster

REPO = Path(__file__).resolve().parents[1]
#: How long a test waits for a job to get where it goes (a trivial job ends in about a second).
JOB_S = 30.0
NOBODY = 65534
#: Node names of the private clusters below, none of the session cluster's: each node's slurmd has
#: a cgroup of that name (``slurm_<node>``), theirs apart from the session cluster's.
PRIVATE_NODES = ("p1", "p2")


def submit(cluster: harness.SlurmCluster, *options: str) -> str:
    submitted = cluster.run("sbatch", "--parsable", *options)
    assert submitted.returncode == 0, submitted.stderr
    return submitted.stdout.strip()


def job_field(cluster: harness.SlurmCluster, job: str, name: str) -> str:
    shown = cluster.run("scontrol", "show", "job", "--oneliner", job)
    assert shown.returncode == 0, shown.stderr
    found = re.search(rf"(?:^| ){name}=(\S*)", shown.stdout)
    assert found, shown.stdout
    return found.group(1)


def wait_state(cluster: harness.SlurmCluster, job: str, *states: str) -> str:
    """The job's state once it is one of ``states``."""
    deadline = time.monotonic() + JOB_S
    while (state := job_field(cluster, job, "JobState")) not in states:
        assert time.monotonic() < deadline, f"job {job} still {state} after {JOB_S:g}s\n{cluster.log_tail()}"
        time.sleep(0.1)
    return state


def nobody_dir(cluster: harness.SlurmCluster, name: str) -> Path:
    directory = cluster.shared_dir(name) / "nobody"
    directory.mkdir()
    os.chown(directory, NOBODY, NOBODY)
    return directory


def test_the_cluster_runs_on_its_own_conf_munge_and_pids(slurm_cluster: harness.SlurmCluster) -> None:
    root = slurm_cluster.root
    assert slurm_cluster.environ == {"SLURM_CONF": str(slurm_cluster.conf)}
    assert slurm_cluster.conf == root / "slurm.conf" and slurm_cluster.nodes == ("n1", "n2")
    assert root.stat().st_mode & 0o777 == 0o755
    conf = slurm_cluster.conf.read_text()
    assert f"AuthInfo=socket={root}/munge/munge.socket" in conf
    assert "ProctrackType=proctrack/cgroup" in conf and "AccountingStorageType=accounting_storage/none" in conf
    assert int((root / "run" / "slurmctld.pid").read_text()) == slurm_cluster.pids["slurmctld"]
    assert int((root / "munge" / "munged.pid").read_text()) == slurm_cluster.pids["munged"]
    for node in slurm_cluster.nodes:
        assert int((root / "run" / f"slurmd-{node}.pid").read_text()) == slurm_cluster.pids[f"slurmd-{node}"]
    assert slurm_cluster.node_states().keys() == {"n1", "n2"}


def test_a_batch_job_completes(slurm_cluster: harness.SlurmCluster) -> None:
    shared = slurm_cluster.shared_dir("batch")
    assert shared.stat().st_mode & 0o777 == 0o755
    job = submit(slurm_cluster, f"--chdir={shared}", f"--output={shared}/out.log", "--wrap", "echo done")
    assert wait_state(slurm_cluster, job, "COMPLETED", "FAILED", "CANCELLED", "OUT_OF_MEMORY") == "COMPLETED"
    assert job_field(slurm_cluster, job, "ExitCode") == "0:0"
    assert (shared / "out.log").read_text() == "done\n"


def test_srun_spans_both_nodes(slurm_cluster: harness.SlurmCluster) -> None:
    ran = slurm_cluster.run("srun", "--nodes=2", "--ntasks=2", "--chdir=/", "printenv", "SLURM_NODEID")
    assert ran.returncode == 0, ran.stderr
    assert sorted(ran.stdout.split()) == ["0", "1"]


def test_a_job_submitted_for_uid_65534_runs_as_65534(slurm_cluster: harness.SlurmCluster) -> None:
    directory = nobody_dir(slurm_cluster, "as-nobody")
    job = submit(slurm_cluster, f"--uid={NOBODY}", f"--gid={NOBODY}", f"--chdir={directory}",
                 "--output=out.log", "--wrap", "id -u; id -g; touch written")
    assert wait_state(slurm_cluster, job, "COMPLETED", "FAILED", "CANCELLED") == "COMPLETED"
    assert job_field(slurm_cluster, job, "UserId") == f"nobody({NOBODY})"
    assert (directory / "out.log").read_text().split() == [str(NOBODY), str(NOBODY)]
    assert (directory / "written").stat().st_uid == NOBODY


def test_one_cpu_jobs_run_side_by_side_past_the_cpu_count(slurm_cluster: harness.SlurmCluster) -> None:
    """More one-CPU jobs than the cluster has CPUs all run at once (the tests' jobs do)."""
    cpus = int(re.search(r"CPUs=(\d+)", slurm_cluster.conf.read_text()).group(1))  # type: ignore[union-attr]
    shared = slurm_cluster.shared_dir("side-by-side")
    jobs = [submit(slurm_cluster, "--cpus-per-task=1", f"--chdir={shared}", "--output=/dev/null",
                   "--wrap", "sleep 60") for _ in range(len(slurm_cluster.nodes) * cpus + 2)]
    try:
        for job in jobs:
            assert wait_state(slurm_cluster, job, "RUNNING", "COMPLETED", "FAILED", "CANCELLED") == "RUNNING"
    finally:
        slurm_cluster.run("scancel", *jobs)
    for job in jobs:
        assert wait_state(slurm_cluster, job, "CANCELLED", "COMPLETED", "FAILED") == "CANCELLED"


def test_a_job_past_its_memory_ends_out_of_memory(slurm_cluster: harness.SlurmCluster) -> None:
    shared = slurm_cluster.shared_dir("oom")
    job = submit(slurm_cluster, "--mem=64M", f"--chdir={shared}", "--output=out.log",
                 "--wrap", f"{sys.executable} -c 'b = b\"x\" * (256 << 20)'")
    assert wait_state(slurm_cluster, job, "OUT_OF_MEMORY", "COMPLETED", "FAILED", "CANCELLED") == "OUT_OF_MEMORY"
    assert job_field(slurm_cluster, job, "ExitCode") == "0:125"
    assert "oom-kill event" in (shared / "out.log").read_text()


def test_sacct_says_accounting_is_disabled(slurm_cluster: harness.SlurmCluster) -> None:
    found = slurm_cluster.run("sacct")
    assert found.returncode != 0
    assert "accounting storage is disabled" in found.stderr


def test_a_node_goes_down_and_comes_back(slurm_cluster: harness.SlurmCluster) -> None:
    slurm_cluster.down("n2")
    try:
        assert slurm_cluster.node_states()["n2"] == "down"
    finally:
        slurm_cluster.resume("n2")
    assert slurm_cluster.node_states()["n2"] == "idle"


def test_a_stopped_cluster_leaves_no_daemon_job_or_directory() -> None:
    cluster = harness.SlurmCluster.start(PRIVATE_NODES)
    try:
        assert all(harness.running(pid) for pid in cluster.pids.values())
        directory = nobody_dir(cluster, "left")
        job = submit(cluster, f"--uid={NOBODY}", f"--gid={NOBODY}", f"--chdir={directory}", "--output=/dev/null",
                     "--wrap", "echo $$ > pid; exec sleep 300")
        wait_state(cluster, job, "RUNNING")
        sleeper = _read_pid(directory / "pid")
        assert harness.running(sleeper)
    finally:
        cluster.stop()
    assert not any(harness.running(pid) for pid in cluster.pids.values())
    assert not harness.running(sleeper)
    assert not cluster.root.exists()


#: A session that starts a cluster, runs a job, and is killed.
KILLED_SESSION = """
import os, signal, time
from tests.slurm_cluster import SlurmCluster
cluster = SlurmCluster.start(("k1", "k2"))
shared = cluster.shared_dir("run")
cluster.run("sbatch", f"--chdir={shared}", "--output=/dev/null",
            "--wrap", "echo $$ > pid.new; mv pid.new pid; exec sleep 300")
deadline = time.monotonic() + 30
while not (shared / "pid").exists() and time.monotonic() < deadline:
    time.sleep(0.05)
print(cluster.root, *cluster.pids.values(), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_the_next_session_cleans_up_after_a_killed_one() -> None:
    """A killed session's daemons end with it (their parent-death signal); the job it ran goes on
    (slurmd leaves its jobs running), until the next cluster to start finds the leftovers."""
    killed = subprocess.run([sys.executable, "-c", KILLED_SESSION], cwd=REPO, capture_output=True, text=True,
                            timeout=60, check=False)
    assert killed.returncode == -9, killed.stderr
    directory, *pids = killed.stdout.split()
    root, daemons = Path(directory), [int(pid) for pid in pids]
    sleeper = _read_pid(root / "shared" / "run" / "pid")
    deadline = time.monotonic() + 10
    while any(harness.running(pid) for pid in daemons):
        assert time.monotonic() < deadline, f"daemons of the killed session still run: {daemons}"
        time.sleep(0.05)
    assert harness.running(sleeper)
    cluster = harness.SlurmCluster.start(PRIVATE_NODES)
    cluster.stop()
    assert not harness.running(sleeper)
    assert not root.exists()


def _read_pid(path: Path) -> int:
    deadline = time.monotonic() + JOB_S
    while not path.exists() or not path.read_text().strip():
        assert time.monotonic() < deadline, f"{path} not written"
        time.sleep(0.05)
    return int(path.read_text())
