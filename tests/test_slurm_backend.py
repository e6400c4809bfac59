"""The SLURM backend's own promises (issue 43), beyond the conformance suite every backend passes:
the batch script and pyxis's flags as generated (pure, golden), no credential value anywhere but
the job's own environment, what is refused before anything is submitted, the states only SLURM
has (held in the queue, canceled or requeued from outside, a lost node, its time limit), ranks
one task per node with their rendezvous, and what a hostile or careless job or target does.

Every job runs on the session's own cluster (tests/slurm_cluster.py: munged, slurmctld and two
slurmd emulating nodes n1 and n2), in a bubblewrap frame, as nobody (``sbatch --uid``), its
directories on the cluster's "shared filesystem", driven through the verbs' own steps."""

from __future__ import annotations

import hashlib
import os
import secrets
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from tao_data_io.backends.slurm.backend import SlurmBackend
from tao_data_io.backends.slurm.commands import fields
from tao_data_io.backends.slurm.script import (FRAME_AGENT, FRAME_CONTROL, FRAME_REPORT, JobFiles, batch_script,
                                               pyxis_flags, rank_script, sbatch_options)
from tao_data_io.backends.slurm.settings import SlurmSettings
from tao_data_io.errors import UsageError
from tao_data_io.launch.plan import LaunchPlan, PlanMount
from tao_data_io.launch.sources import Bind
from tao_data_io.records import OutputRoute
from tao_data_io.request import JobRequest

from . import slurm_cluster as harness
from . import slurm_jobs as jobs
from .slurm_jobs import IMAGE, SHAPE, Job, job_request, job_state, launch, running, say, seen
from .contract.slurm import slurm_backend
from .helpers import AWAIT, REPORT, STAND_IN, holding, run_cli, wait_for, write_request

#: The session's own SLURM cluster (a pytest fixture of tests/slurm_cluster.py), and the fixtures of
#: a test's own shared directory and backend (tests/slurm_jobs.py).
slurm_cluster = harness.slurm_cluster
shared, make, backend, control = jobs.shared, jobs.make, jobs.backend, jobs.control


# ----------------------------------------------------------------------------- 1. the script, as generated
def pure_plan(*, nodes: int = 1, gpus: int = 0, env: Mapping[str, str] | None = None,
              forward_env: Sequence[str] = (), deadline_seconds: int | None = 3600) -> LaunchPlan:
    return LaunchPlan(
        job_id="train-1", image=IMAGE, argv=["train", "--epochs", "3"],
        env={"EPOCHS": "3", "TAO_JOB_ID": "train-1", "TAO_RESULTS_DIR": "/results", **(env or {})},
        forward_env=list(forward_env),
        mounts=[PlanMount(origin="staged", source="data/coco", target="/data/coco", expect="dir", input="s3://b/coco/"),
                PlanMount(origin="pre-positioned", source="/lustre/models", target="/models", input="/lustre/models")],
        staging_dir="/lustre/work/train-1", results_dir="/results",
        route=OutputRoute(route="ephemeral", destination="ephemeral"), tier="A", gpus=gpus, nodes=nodes,
        shm_size="1Gi", cpu="8", memory="32Gi", deadline_seconds=deadline_seconds)


FILES = JobFiles(agent="/lustre/runs/train-1/run/agent", control="/lustre/runs/train-1/run/control",
                 report="/lustre/runs/train-1/run/report")
BINDS = [Bind("/lustre/work/train-1/data/coco", "/data/coco", True), Bind("/lustre/models", "/models", True),
         Bind("/lustre/runs/train-1/results", "/results", False)]


def headers(script: str) -> list[str]:
    """The ``#SBATCH`` options sbatch reads: those of the comment lines before the first command."""
    found = []
    for line in script.splitlines()[1:]:
        if not line.startswith("#"):
            break
        if line.startswith("#SBATCH "):
            found.append(line.removeprefix("#SBATCH "))
    return found


def test_the_batch_options_come_from_the_request_and_the_target_and_say_each_thing_once() -> None:
    settings = SlurmSettings(partition="gpu", account="vision", qos="high", reservation="tao", exclusive=True,
                             extra_options={"constraint": "ib", "mem-per-gpu": "64G"})
    options = sbatch_options(pure_plan(nodes=2, gpus=8, forward_env=["AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID"]),
                             settings, FILES, uid=65534, gid=65534)
    assert options == [
        "--job-name=train-1", "--output=/lustre/runs/train-1/run/report/batch.log", "--nodes=2",
        "--ntasks-per-node=1", "--chdir=/lustre/runs/train-1/run/report",
        "--export=AWS_ACCESS_KEY_ID,AWS_SECRET_ACCESS_KEY,TAO_DATA_IO_TOKEN", "--uid=65534", "--gid=65534",
        "--no-requeue",
        "--gres=gpu:8", "--time=60", "--mem=32768M", "--cpus-per-task=8", "--partition=gpu", "--account=vision",
        "--qos=high", "--reservation=tao", "--exclusive", "--constraint=ib", "--mem-per-gpu=64G"]


def test_a_single_node_job_is_requeued_after_a_node_failure_and_exports_nothing_when_it_forwards_nothing() -> None:
    options = sbatch_options(pure_plan(deadline_seconds=None), SlurmSettings(), FILES, uid=None, gid=None)
    assert "--requeue" in options and "--export=TAO_DATA_IO_TOKEN" in options  # the job's token, and nothing else
    assert not [option for option in options if option.startswith(("--uid", "--gid", "--time", "--partition"))]


def test_pyxis_flags_are_the_ones_pyxis_documents_for_the_image_mounts_workdir_and_forwarded_names() -> None:
    """pyxis's documented flags (its README's srun options): ``--container-image``,
    ``--container-name`` (one container for the probe's and the command's steps),
    ``--container-mounts=SRC:DST[:ro],…``, ``--container-workdir``, ``--no-container-mount-home``,
    ``--container-env=NAMES`` — the inputs read-only, the results writable, the agent read-only."""
    flags = pyxis_flags(pure_plan(), BINDS, FILES, ["AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID"])
    assert flags == [
        f"--container-image={IMAGE}", "--container-name=tao-train-1-a1",
        "--container-mounts=/lustre/work/train-1/data/coco:/data/coco:ro,/lustre/models:/models:ro,"
        "/lustre/runs/train-1/results:/results,/lustre/runs/train-1/run/agent:/tao-data-io/agent:ro,"
        "/lustre/runs/train-1/run/control:/tao-data-io/control:ro,/lustre/runs/train-1/run/report:/tao-data-io/report",
        "--container-workdir=/tmp", "--no-container-mount-home",
        "--container-env=AWS_ACCESS_KEY_ID,AWS_SECRET_ACCESS_KEY,TAO_DATA_IO_TOKEN"]
    script = batch_script(pure_plan(), SlurmSettings(container_runtime="pyxis"), FILES, BINDS, None, uid=None,
                          gid=None, wait_seconds=600)
    steps_ = [line for line in script.splitlines() if line.lstrip().startswith("srun")]
    assert len(steps_) == 2 and all("--container-name=tao-train-1-a1" in step for step in steps_)  # the probe's too
    assert all(f"/bin/sh {FRAME_AGENT}/rank.sh" in step for step in steps_)


@pytest.mark.parametrize("value", ["a\n#SBATCH --uid=0", "$(id)", "x'; rm -rf /; '", "`id`"])
def test_a_plain_variable_never_becomes_an_sbatch_line_or_shell_text(value: str) -> None:
    plan = pure_plan(env={"TAG": value})
    script = batch_script(plan, SlurmSettings(container_runtime="pyxis"), FILES, BINDS, None, uid=None, gid=None,
                          wait_seconds=600)
    assert headers(script) == sbatch_options(plan, SlurmSettings(container_runtime="pyxis"), FILES, uid=None, gid=None)
    assert value not in script  # the variable lives in the rank's script only
    rank = rank_script(plan, agent=FRAME_AGENT, control=FRAME_CONTROL, report=FRAME_REPORT)
    exports = rank.split('say "the host did not say go: the command never started"; exit 125\nfi\n')[1]
    exports = exports.split('cd "$HOME"')[0]  # the frame's environment, as the rank script sets it
    done = subprocess.run(["sh", "-c", exports + 'printf %s "$TAG"'], capture_output=True, text=True, check=True)
    assert done.stdout == value


@pytest.mark.parametrize(("field", "value", "named"), [
    ("extra_options", {"constraint": "ib\n#SBATCH --uid=0"}, "one word"),
    ("extra_options", {"constraint": "ib gpu"}, "one word"),
    ("extra_options", {"uid": "0"}, "not one of the sbatch options"),
    ("extra_options", {"ui": "0"}, "not one of the sbatch options"),  # sbatch reads an abbreviation as --uid
    ("extra_options", {"--export": "ALL"}, "not one of the sbatch options"),
    ("extra_options", {"wrap": "id"}, "not one of the sbatch options"),
    ("extra_options", {"Bad_Name": "x"}, "not one of the sbatch options"),
    ("run_root", "/lustre/my runs", "SBATCH lines"),
    ("run_root", "/lustre/runs-%j", "SBATCH lines"),
    ("partition", "gpu\n#SBATCH --uid=0", "not a SLURM name"),
    ("account", "a b", "not a SLURM name"),
    ("run_as_user", 0, "root"),
])
def test_a_target_field_that_could_add_an_sbatch_line_or_undo_a_guarantee_is_refused(
        field: str, value: Any, named: str) -> None:
    with pytest.raises(ValidationError, match=named):
        SlurmSettings(**{field: value})


def test_no_forwarded_value_is_ever_in_a_script_only_its_name() -> None:
    plan = pure_plan(forward_env=["TAO_TEST_TOKEN"])
    script = batch_script(plan, SlurmSettings(container_runtime="pyxis"), FILES, BINDS, None, uid=None, gid=None,
                          wait_seconds=600)
    assert "--export=TAO_DATA_IO_TOKEN,TAO_TEST_TOKEN" in script
    assert "--container-env=TAO_DATA_IO_TOKEN,TAO_TEST_TOKEN" in script
    assert "TAO_TEST_TOKEN" not in rank_script(plan, agent=FRAME_AGENT, control=FRAME_CONTROL, report=FRAME_REPORT)


# ----------------------------------------------------------------------------- 2. credentials
def test_a_forwarded_credential_reaches_the_command_and_no_file_argv_log_or_record(
        slurm_cluster: harness.SlurmCluster, backend: SlurmBackend, control: Path, shared: Path) -> None:
    """The value reaches the command (compared by digest, never printed), yet neither the batch
    script as slurmctld keeps it (``scontrol write batch_script``), the slurmd spools, the run
    root, the records, the job's logs, nor any process's argv while it runs holds it. slurmctld
    keeps the job's environment in its state directory (SLURM's own design), root's alone."""
    value = f"tao-cred-{secrets.token_hex(12)}"
    digest = hashlib.sha256(value.encode()).hexdigest()
    script = REPORT + AWAIT + f"""
        if [ "$(printf %s "$TAO_TEST_TOKEN" | sha256sum | cut -c1-64)" = {digest} ]; then got=yes; else got=no; fi
        echo "received: $got"
        report received "$got"
        await finish
    """
    job = running(backend, job_request("cred-1", script, control=control, forward_env=["TAO_TEST_TOKEN"]), shared,
                  {"TAO_TEST_TOKEN": value})
    assert seen(control, "received") == "yes\n"
    secret = value.encode()
    argv = [path for path in Path("/proc").glob("[0-9]*/cmdline") if _holds(path, secret)]
    assert argv == []
    written = slurm_cluster.run("scontrol", "write", "batch_script", job.slurm_id, "-")
    assert written.returncode == 0 and "#SBATCH --export=TAO_DATA_IO_TOKEN,TAO_TEST_TOKEN" in written.stdout
    assert value not in written.stdout
    # The job's own token (what names its reports) is in no file another process of its user reads either.
    launched = job.run.launch()
    assert launched is not None and launched.token not in written.stdout
    assert holding([job.run.agent, job.run.control, job.run.report, shared / "work"], launched.token.encode()) == []
    spools = slurm_cluster.root / "spool"
    roots = [backend.run_root, shared / "records", shared / "work", spools, slurm_cluster.root / "log"]
    assert holding(roots, secret) == []
    kept = holding([slurm_cluster.root / "state"], secret)
    assert all(Path(path).name == "environment" and os.stat(path).st_mode & 0o077 == 0 for path in kept), kept
    say(control, "finish")
    assert job.finished().state == "COMPLETE"
    assert value not in backend.logs(job.ref) and "received: yes" in backend.logs(job.ref)
    assert holding(roots, secret) == []


def _holds(path: Path, value: bytes) -> bool:
    try:
        return value in path.read_bytes()
    except OSError:
        return False


def test_the_submitting_hosts_own_environment_never_reaches_the_job(
        slurm_cluster: harness.SlurmCluster, backend: SlurmBackend, control: Path, shared: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """sbatch's default ``--export=ALL`` would hand the job this host's whole environment (its cloud
    credentials): only SLURM's own variables and the frame's reach it."""
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "host-secret-value")
    job = running(backend, job_request("env-1", REPORT + "report env \"$(env | cut -d= -f1 | sort | tr '\\n' ' ')\"",
                                       control=control), shared)
    names = seen(control, "env").split()
    assert "AWS_SECRET_ACCESS_KEY" not in names and "PATH" in names and "TAO_JOB_ID" in names
    plain = ("PATH", "HOME", "LANG", "PWD", "SHLVL", "_", "OLDPWD", "HOSTNAME")
    assert not [name for name in names if name not in plain
                and not name.startswith(("SLURM", "SRUN_", "TAO_", "ENVIRONMENT", "USER", "LOGNAME", "TMPDIR"))], names
    assert job.finished().state == "COMPLETE"


# ----------------------------------------------------------------------------- 3. refused before anything exists
def test_a_staging_root_not_on_the_shared_filesystem_is_refused_before_anything_is_submitted(
        slurm_cluster: harness.SlurmCluster, shared: Path, tmp_path: Path) -> None:
    backend = SlurmBackend(SlurmSettings(slurm_conf=str(slurm_cluster.conf), run_root=str(shared / "slurm"),
                                         container_runtime="bubblewrap"))
    data = shared / "data"
    data.mkdir()
    (data / "a.txt").write_text("a")
    request = job_request("unshared-1", "true", mounts=[{"source": str(data), "target": "/data"}])
    with pytest.raises(UsageError, match="shared_roots") as caught:
        launch(backend, request, shared)
    assert str(data) in str(caught.value) and "compute nodes" in str(caught.value)
    assert not (backend.run_root / "unshared-1" / "run" / "launch.json").exists()


def test_a_job_asking_for_more_nodes_than_the_cluster_has_is_refused_naming_what_sbatch_said(
        backend: SlurmBackend, shared: Path) -> None:
    with pytest.raises(UsageError, match="the cluster refused the job") as caught:
        launch(backend, job_request("big-1", "true", shape={"nodes": 3}), shared)
    assert "node" in str(caught.value).lower()
    assert not (backend.run_root / "big-1" / "run" / "launch.json").exists()  # the job id stays free


# ----------------------------------------------------------------------------- 4. ranks across nodes
def test_two_ranks_run_one_per_node_with_their_rendezvous_and_a_failing_rank_names_its_own_code(
        slurm_cluster: harness.SlurmCluster, backend: SlurmBackend, control: Path, shared: Path) -> None:
    script = REPORT + """
        echo "hello from rank $NODE_RANK"
        report "rank-$NODE_RANK" "$PET_NODE_RANK $NODE_RANK $PET_NNODES $MASTER_ADDR $(id -u) $SLURMD_NODENAME"
        if [ "$NODE_RANK" = 1 ]; then while [ ! -e /control/fail ]; do sleep 0.05; done; echo "rank 1 fails"; exit 7; fi
        sleep 1000
    """
    job = running(backend, job_request("ranks-1", script, control=control, shape={"nodes": 2}), shared)
    rank0, rank1 = seen(control, "rank-0").split(), seen(control, "rank-1").split()
    assert rank0[:5] == ["0", "0", "2", "127.0.0.1", "65534"] and rank1[:5] == ["1", "1", "2", "127.0.0.1", "65534"]
    assert {rank0[5], rank1[5]} == {"n1", "n2"}  # one task per node
    first = backend.follow_logs(job.ref, None)  # each rank's own log, followed from one cursor
    assert backend.follow_logs(job.ref, first.cursor).text == ""
    say(control, "fail")
    status = job.finished()
    assert (status.state, status.err_class, status.exit_code) == ("ERROR", "ERR_PROGRAM", 7), status
    assert "rank 1" in status.message
    assert job_state(slurm_cluster, job.slurm_id) == "FAILED"
    shown = first.text + backend.follow_logs(job.ref, first.cursor).text
    assert "[rank 0] hello from rank 0\n" in shown and "[rank 1] hello from rank 1\n" in shown, shown
    assert shown.count("hello from rank 1") == 1 and "[rank 1] rank 1 fails\n" in shown, shown


# ----------------------------------------------------------------------------- 5. the states only SLURM has
def test_a_held_job_reads_pending_with_the_schedulers_reason_and_a_cancel_while_pending_is_canceled(
        slurm_cluster: harness.SlurmCluster, backend: SlurmBackend, control: Path, shared: Path) -> None:
    job = launch(backend, job_request("held-1", REPORT + "report started yes", control=control), shared)
    slurm_cluster.run("scontrol", "hold", job.slurm_id)
    status = wait_for("the hold to show", lambda: found if "held" in (found := backend.status(job.ref)).message.lower()
                      else None)
    assert status.state == "PENDING", status
    assert backend.cancel(job.ref) is True
    assert job.finished().state == "CANCELED"
    assert not (control / "started").exists()
    assert job_state(slurm_cluster, job.slurm_id) == "CANCELLED"


def test_a_job_canceled_outside_tao_data_io_is_an_infrastructure_error(
        slurm_cluster: harness.SlurmCluster, backend: SlurmBackend, control: Path, shared: Path) -> None:
    job = running(backend, job_request("scancel-1", REPORT + "report started yes; sleep 1000", control=control), shared)
    seen(control, "started")
    slurm_cluster.run("scancel", job.slurm_id)
    status = job.finished()
    assert (status.state, status.err_class) == ("ERROR", "ERR_INFRA"), status
    assert "canceled outside tao-data-io" in status.message


def test_a_lost_node_ends_a_multi_node_job_as_node_fail_and_requeues_a_single_node_one(
        slurm_cluster: harness.SlurmCluster, backend: SlurmBackend, control: Path, shared: Path) -> None:
    many = running(backend, job_request("lost-2", REPORT + 'report "up-$NODE_RANK" yes; sleep 1000',
                                        control=control, shape={"nodes": 2}), shared)
    seen(control, "up-0"), seen(control, "up-1")
    one = running(backend, job_request("lost-1", REPORT + 'report "one-$SLURM_RESTART_COUNT" yes; sleep 1000',
                                       control=control), shared)
    seen(control, "one-")
    node = fields(slurm_cluster.run("scontrol", "show", "job", "-o", one.slurm_id).stdout).get("NodeList", "n1")
    slurm_cluster.down(node)
    try:
        status = many.finished()
        assert (status.state, status.err_class) == ("ERROR", "ERR_INFRA"), status
        assert "NODE_FAIL" in status.message
        requeued = wait_for("the single-node job to be requeued", lambda: found if (
            found := backend.status(one.ref)).state == "PENDING" else None, deadline_s=60)
        assert requeued.state == "PENDING" and backend.status(one.ref).state not in ("CANCELED", "ERROR")
    finally:
        slurm_cluster.resume(node)


def test_a_job_past_its_time_limit_reads_its_deadline_passed(
        slurm_cluster: harness.SlurmCluster, backend: SlurmBackend, control: Path, shared: Path) -> None:
    """A command that ignores SIGTERM outlives the frame's deadline; SLURM's ``--time`` ends it
    (TIMEOUT, checked about once a minute): the status says the deadline passed."""
    script = REPORT + "trap '' TERM; report started yes; while :; do sleep 1; done"
    job = running(backend, job_request("late-1", script, control=control, shape={"deadline_seconds": 60}), shared)
    seen(control, "started")
    status = job.finished()
    assert (status.state, status.err_class) == ("ERROR", "ERR_PROGRAM"), status
    assert "deadline_seconds" in status.message
    assert job_state(slurm_cluster, job.slurm_id) == "TIMEOUT"


# ----------------------------------------------------------------------------- 6. what a job may do
def test_a_job_that_requeues_itself_runs_again_and_once_ended_a_requeue_runs_nothing(
        slurm_cluster: harness.SlurmCluster, backend: SlurmBackend, control: Path, shared: Path) -> None:
    """A requeue is SLURM's (a node failure) or the job's own user's (``scontrol requeue``): the job waits,
    reads PENDING (never an end), and runs again; once tao-data-io has recorded its end, a run
    SLURM starts after that (a requeue of the finished job) runs nothing and changes no status."""
    script = """
        echo run >> /control/runs
        if [ ! -e /control/again ]; then echo yes > /control/again; sleep 1000; fi
        exit 0
    """
    job = running(backend, job_request("requeue-1", script, control=control), shared)
    seen(control, "again")
    # The job's own user asks (a bubblewrap frame cannot reach SLURM; a pyxis container or the
    # node's own environment can).
    as_the_job = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
    done = subprocess.run([*as_the_job, "scontrol", "requeue", job.slurm_id], env={**os.environ,
                          **slurm_cluster.environ}, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    release_requeued(slurm_cluster, backend, job)
    assert job.finished().state == "COMPLETE"
    assert (control / "runs").read_text() == "run\nrun\n"
    assert slurm_cluster.run("scontrol", "requeue", job.slurm_id).returncode == 0
    release_requeued(slurm_cluster, backend, job)
    wait_for("the run after the end to be over", lambda: job_state(slurm_cluster, job.slurm_id) in (
        "COMPLETED", "FAILED") or None, deadline_s=60)
    assert (control / "runs").read_text() == "run\nrun\n"  # nothing ran after the end
    assert backend.status(job.ref).state == "COMPLETE"


def release_requeued(cluster: harness.SlurmCluster, backend: SlurmBackend, job: Job) -> None:
    """Once the job waits requeued, let it start now: SLURM holds a requeued job for a while
    (its BeginTime), which a test does not wait out."""
    def waiting() -> bool:
        state = job_state(cluster, job.slurm_id)
        if state in ("PENDING", "REQUEUED"):
            status = backend.status(job.ref)
            assert status.state in ("PENDING", "COMPLETE"), status  # never an end while it waits to run again
            return True
        return False
    wait_for("the job to wait requeued", waiting, deadline_s=60)
    cluster.run("scontrol", "update", f"jobid={job.slurm_id}", "starttime=now")


def test_the_jobs_user_passes_through_its_run_directory_but_owns_only_its_report_and_results(
        backend: SlurmBackend, control: Path, shared: Path) -> None:
    """The job runs as nobody; the directories on the way to its files are the backend's (0711:
    passed through, never listed, nothing renamed or replaced there), its records owner-only;
    it owns its report directory and its results while it runs, and the results are taken back
    at its end."""
    job = running(backend, job_request("owned-1", REPORT + AWAIT + "report started yes; await finish",
                                       control=control), shared)
    seen(control, "started")
    run = job.run
    for directory in (run.path.parent, run.path):
        found = os.stat(directory)
        assert (found.st_uid, found.st_mode & 0o777) == (0, 0o711), directory
    assert os.stat(run.launch_file).st_mode & 0o077 == 0
    assert (os.stat(run.report).st_uid, os.stat(run.report).st_mode & 0o777) == (65534, 0o700)
    results = Path(str(backend.results_path(job.ref)))
    assert os.stat(results).st_uid == 65534
    say(control, "finish")
    assert job.finished().state == "COMPLETE"
    assert os.stat(results).st_uid == 0


def test_the_run_root_is_no_jobs_to_mount(backend: SlurmBackend, shared: Path) -> None:
    (backend.run_root / "x").mkdir(parents=True)
    with pytest.raises(UsageError, match="refused"):
        launch(backend, job_request("mount-runs-1", "true", mounts=[{"source": str(backend.run_root / "x"),
                                                                      "target": "/runs"}]), shared)


# ----------------------------------------------------------------------------- 7. torchrun across two nodes
ALL_REDUCE = """
import os
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
print(f"rank {dist.get_rank()} of {dist.get_world_size()} as uid {os.getuid()} on {os.environ['SLURMD_NODENAME']}: "
      f"all-reduced {value.item():g}", flush=True)
dist.destroy_process_group()
"""


def test_two_nodes_all_reduce_over_gloo_through_torchrun(slurm_cluster: harness.SlurmCluster, shared: Path) -> None:
    """torchrun on each of two nodes, told nothing but what the backend gives every rank (the
    ``PET_*`` variables: the node count, its rank from ``SLURM_NODEID``, rank 0's node address),
    brings up a gloo group across them: each worker sees the sum of both ranks' values. The frame
    runs the host's Python with torch's site-packages mounted read-only from where they lie."""
    torch = pytest.importorskip("torch", reason="torch is not installed (make test installs it)")
    if not Path("/usr/bin/python3.11").exists():
        pytest.skip("the host userland has no /usr/bin/python3.11 (the ABI of the venv's torch)")
    site_packages = Path(torch.__file__).resolve().parents[1]
    backend = slurm_backend(slurm_cluster, shared, shared_roots=[str(shared), str(site_packages)])
    request = JobRequest.model_validate({
        "schema_version": "1", "job_id": "torchrun-1", "image": IMAGE, "mode": "args",
        "command": ["/usr/bin/python3.11", "-m", "torch.distributed.run"],
        "args": ["--no-python", "/usr/bin/python3.11", "-c", ALL_REDUCE], "environment": {"PYTHONPATH": "/opt/torch"},
        "mounts": [{"source": str(site_packages), "target": "/opt/torch"}],
        "compute_shape": {"nodes": 2, "gpus": 0, "memory": "1Gi", "shm_size": "16Mi", "ephemeral_storage": "64Mi"}})
    job = launch(backend, request, shared)
    try:
        assert job.verify().ok
        status = job.finished()
        logs = backend.logs(job.ref)
        assert status.state == "COMPLETE", (status, logs)
    finally:
        backend.cancel(job.ref)
    nodes = set()
    for rank in range(2):
        said = f"[rank {rank}] rank {rank} of 2 as uid 65534"
        line = next(line for line in logs.splitlines() if line.startswith(said))
        assert line.endswith("all-reduced 3"), logs
        nodes.add(line.split(" on ")[1].split(":")[0])
    assert nodes == {"n1", "n2"}


# ----------------------------------------------------------------------------- 8. the CLI, end to end
def test_the_cli_stages_onto_the_shared_filesystem_submits_and_collect_uploads_from_this_host(
        slurm_cluster: harness.SlurmCluster, shared: Path, cli_env: dict[str, str], bucket: str,
        s3_client: Any) -> None:
    """``submit --backend slurm --target slurm.yaml``: this host stages the S3 input into the
    staging root on the shared filesystem, the job reads it there (no S3 inside the allocation:
    its environment has no bucket), and ``collect`` uploads its results from this host — TAO's
    ``.tao`` state never."""
    target = shared / "slurm.yaml"
    target.write_text(yaml.safe_dump({"slurm_conf": str(slurm_cluster.conf), "run_root": str(shared / "runs"),
                                      "shared_roots": [str(shared), str(STAND_IN)],
                                      "container_runtime": "bubblewrap", "cancel_grace_seconds": 3}))
    request = write_request(shared / "cli-1.yaml", {
        "schema_version": "1", "job_id": "cli-1", "image": IMAGE, "mode": "config", "config_format": "json",
        "command": "sh /stand-in/train.sh -e {config_path}", "spec": {"data": f"s3://{bucket}/ds/"},
        "mounts": [{"source": str(STAND_IN), "target": "/stand-in"}],
        "environment": {"EPOCHS": "2", "EPOCH_SECONDS": "0"}, "compute_shape": SHAPE})
    env = {**cli_env, "TAO_DATA_IO_WORKDIR": str(shared / "work")}
    submitted = run_cli("submit", "--backend", "slurm", "--target", str(target), "--request", str(request), env=env)
    assert submitted.returncode == 0, submitted.stderr
    assert (shared / "work" / "cli-1").is_dir()  # staged by this host, on the shared filesystem
    collected = run_cli("collect", "--job-id", "cli-1", "--wait", "--poll-seconds", "0.5", env=env)
    assert collected.returncode == 0, collected.stderr
    assert collected.stdout.startswith("job cli-1 COMPLETE"), collected.stdout
    keys = {item["Key"] for item in s3_client.list_objects_v2(Bucket=bucket, Prefix="results/cli-1/")["Contents"]}
    assert {"results/cli-1/checkpoint_epoch_2.pth", "results/cli-1/status.json"} <= keys, keys
    assert not [key for key in keys if "/.tao/" in key]
    logs = run_cli("logs", "--job-id", "cli-1", env=env)
    assert "epoch 2" in logs.stdout.lower(), logs.stdout


# ----------------------------------------------------------------------------- 9. once SLURM forgets
def test_a_job_slurm_has_forgotten_without_accounting_reads_its_end_from_its_own_ranks(tmp_path: Path) -> None:
    """Without accounting, ``sacct`` has nothing and slurmctld forgets a job ``MinJobAge`` after its
    end: a job first looked at after that reads how it ended from its ranks' own exit files —
    never PENDING for good, never UNKNOWN — and keeps reading it so."""
    cluster = harness.SlurmCluster.start(nodes=("f1", "f2"), min_job_age=2)
    try:
        shared = cluster.shared_dir("forgotten")
        backend = slurm_backend(cluster, shared)
        failed = running(backend, job_request("forgotten-3", "exit 3"), shared)
        done = running(backend, job_request("forgotten-0", "exit 0"), shared)
        wait_for("slurmctld to forget both jobs", lambda: not any(
            cluster.run("scontrol", "show", "job", job.slurm_id).returncode == 0 for job in (failed, done)),
            deadline_s=120)
        assert cluster.run("sacct", "-j", done.slurm_id).returncode != 0  # no accounting to ask
        assert backend.status(done.ref).state == "COMPLETE"
        status = backend.status(failed.ref)
        assert (status.state, status.err_class, status.exit_code) == ("ERROR", "ERR_PROGRAM", 3), status
        assert backend.status(failed.ref) == status
    finally:
        cluster.stop()


# ----------------------------------------------------------------------------- 10. a careless target
def test_a_pyxis_target_on_a_cluster_without_pyxis_is_refused_before_anything_is_submitted(
        slurm_cluster: harness.SlurmCluster, shared: Path) -> None:
    backend = slurm_backend(slurm_cluster, shared, container_runtime="pyxis")
    with pytest.raises(UsageError, match="no container-image option") as caught:
        launch(backend, job_request("pyxis-1", "true"), shared)
    assert "container_runtime" in str(caught.value)
    assert not (backend.run_root / "pyxis-1" / "run" / "launch.json").exists()


def test_a_verify_step_whose_frame_cannot_start_fails_the_verdict_at_once_with_its_words(
        slurm_cluster: harness.SlurmCluster, shared: Path) -> None:
    """A frame the nodes cannot make (here pyxis's flags, which this cluster's srun does not take,
    submitted past the preflight as a retried submit is): the batch script says which rank did not
    report and quotes its step, and the verdict fails at once — never a wait for its timeout."""
    checked = slurm_backend(slurm_cluster, shared)
    job = launch(checked, job_request("no-frame-1", "true"), shared)  # a plan preflight accepted
    checked.cancel(job.ref)
    backend = slurm_backend(slurm_cluster, shared, container_runtime="pyxis")
    again = job.plan.model_copy(update={"job_id": "no-frame-2"})
    submission = backend.submit(again, environ={})
    verdict = backend.verify(submission.backend_ref, again, timeout=60)
    assert not verdict.ok, verdict
    assert "did not report" in str(verdict.error) and "container-image" in str(verdict.error), verdict
    status = backend.status(submission.backend_ref)
    assert (status.state, status.err_class) == ("ERROR", "ERR_INFRA"), status


def test_a_slurm_conf_that_is_not_there_is_refused_naming_the_setting(
        slurm_cluster: harness.SlurmCluster, shared: Path) -> None:
    backend = slurm_backend(slurm_cluster, shared, slurm_conf=str(shared / "missing.conf"))
    with pytest.raises(UsageError, match="slurm_conf") as caught:
        launch(backend, job_request("conf-1", "true"), shared)
    assert "missing.conf" in str(caught.value)


def test_a_job_queued_longer_than_the_targets_pending_timeout_is_canceled_naming_the_reason(
        make: Any, control: Path, shared: Path) -> None:
    """Without ``pending_timeout`` a queued job is waited for (a busy cluster is no failure); with
    it, a job queued past it (here: not to begin for an hour) is canceled and the verdict names
    the scheduler's reason."""
    backend = make(pending_timeout=2, extra_options={"begin": "now+3600"})
    job = launch(backend, job_request("queued-1", REPORT + "report started yes", control=control), shared)
    verdict = job.verify()
    assert not verdict.ok and "pending_timeout" in str(verdict.error), verdict
    assert "BeginTime" in str(verdict.error), verdict
    assert backend.status(job.ref).state == "CANCELED"
    assert not (control / "started").exists()
