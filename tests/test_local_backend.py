"""The local compute frame: the sandbox argv and environment (pure, table-tested), then real jobs
in real bubblewrap frames — what a job can see, what the probe finds, credentials, the frame ending
with its command, detachment and multi-node ranks. The protocol's promises (a resubmit starts
nothing, a failed verify starts no command, cancel, how an end is classified, following the log,
progress, a next attempt) are the conformance suite's: tests/test_backend_contract.py.

Real-frame tests skip (with bubblewrap's own words) only where the kernel refuses it user
namespaces; a missing bwrap is a failure (``make test`` installs it). No timing assertions: a
test waits for a state with a generous deadline, and jobs that must stay RUNNING wait for a file.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tao_data_io.errors import UsageError
from tao_data_io.backends import backend_for
from tao_data_io.launch.collective import HANG_EXIT, PROBE_PROGRAM, read_probe
from tao_data_io.launch.backend import Backend
from tao_data_io.launch.plan import PROBE_DIR, LaunchPlan
from tao_data_io.launch.rendezvous import MASTER_PORT
from tao_data_io.backends.local.backend import LocalBackend, _ended
from tao_data_io.launch.tools import BWRAP_INSTALL, find_tool
from tao_data_io.launch.sources import Bind
from tao_data_io.launch.sandbox import (FRAME_PATH, MASTER_ADDR, Host, Namespaces, SystemDir, frame_argv,
                                       frame_binds, frame_env, host_system_dirs)
from tao_data_io.backends.local.rundir import ExitRecord, RunDir
from tao_data_io.launch.run_as import RunAs
from tao_data_io.backends.local.settings import LocalSettings
from tao_data_io.records import OutputRoute

from .helpers import (DEADLINE_S, args_request, job_processes, live_processes, needs_bwrap, proc_text, run_cli,
                      torchrun_arguments, wait_for, write_request)
from .local_frame import (CONFIG, DATA, PACKAGE_ROOT, REPO, STAND_IN, VISIBILITY, control, finished, make_plan,
                          wait_state)


@pytest.fixture
def backend(local_backend: LocalBackend) -> LocalBackend:
    return local_backend


# ----------------------------------------------------------------------------- the argv, pure
ARITY = {"--ro-bind": 2, "--ro-bind-try": 2, "--ro-bind-fd": 2, "--bind-fd": 2, "--symlink": 2, "--proc": 1,
         "--dev": 1, "--dir": 1, "--tmpfs": 1, "--size": 1, "--perms": 1, "--hostname": 1, "--cap-drop": 1,
         "--cap-add": 1, "--chdir": 1, "--json-status-fd": 1, "--remount-ro": 1, "--unshare-user": 0,
         "--unshare-ipc": 0, "--unshare-pid": 0, "--unshare-uts": 0, "--unshare-cgroup-try": 0, "--unshare-net": 0,
         "--as-pid-1": 0, "--new-session": 0}
HOST = Host(bwrap="/usr/bin/bwrap", system=(SystemDir("/usr"), SystemDir("/bin", "usr/bin"), SystemDir("/etc/passwd")),
            nsenter="/usr/bin/nsenter")
#: The same host with the backend run by root: the frame's command becomes nobody.
ROOT_HOST = Host(bwrap=HOST.bwrap, system=HOST.system, nsenter=HOST.nsenter,
                 run_as=RunAs(uid=65534, gid=65534, setpriv="/usr/bin/setpriv"))


def options(argv: list[str]) -> tuple[list[tuple[str, ...]], list[str]]:
    """bubblewrap's argv as (option, arguments…) tuples, and the command after ``--``."""
    assert argv[0] == HOST.bwrap
    found, index = [], 1
    while argv[index] != "--":
        option = argv[index]
        assert option in ARITY, f"unexpected bubblewrap option {option}"
        found.append(tuple(argv[index:index + 1 + ARITY[option]]))
        index += 1 + ARITY[option]
    return found, argv[index + 1:]


def argv_of(plan: LaunchPlan, command: list[str], *, results_host: str = "/host/results", probe_dir: str | None = None,
            absent: tuple[str, ...] = (), host: Host = HOST, **kwargs: Any) -> tuple[list[Bind], list[str]]:
    """The frame's binds and argv, each bind's source given descriptor ``100 + its index``
    (but the targets in ``absent``: no descriptor, as when the source is missing)."""
    binds = frame_binds(plan, results_host, probe_dir)
    opened = {bind.target: 100 + n for n, bind in enumerate(binds) if bind.target not in absent}
    return binds, frame_argv(plan, host, binds, opened, command, **kwargs)


def test_frame_argv_unshares_everything_and_binds_exactly_the_plan(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    plan = make_plan(tmp_path, mounts=[{"source": str(scratch / "sub"), "target": "/scratch-rw", "read_only": False},
                                       {"source": str(scratch), "target": "/scratch"}])
    binds, argv = argv_of(plan, ["sh", "-c", "true"], results_host="/host/results/job-1")
    found, command = options(argv)
    stage = tmp_path / "stage"
    assert command == ["sh", "-c", "true"]
    assert found[:10] == [("--unshare-user",), ("--unshare-ipc",), ("--unshare-pid",), ("--unshare-uts",),
                          ("--unshare-cgroup-try",), ("--unshare-net",), ("--as-pid-1",), ("--new-session",),
                          ("--cap-drop", "ALL"), ("--hostname", "job-1-0")]  # no network unless the plan asks
    assert found[10:29] == [
        ("--size", str(4 * 1024**3)), ("--tmpfs", "/"),  # the root: the request's ephemeral_storage (4Gi here)
        ("--tmpfs", "/etc"), ("--ro-bind", "/usr", "/usr"), ("--symlink", "usr/bin", "/bin"),
        ("--ro-bind", "/etc/passwd", "/etc/passwd"), ("--remount-ro", "/etc"),
        ("--perms", "1777"), ("--dir", "/tmp"),
        ("--proc", "/proc"), ("--ro-bind", "/proc/sys", "/proc/sys"),
        ("--ro-bind-try", "/proc/sysrq-trigger", "/proc/sysrq-trigger"),
        ("--dev", "/dev"), ("--perms", "1777"), ("--size", str(64 * 1024**2)), ("--tmpfs", "/dev/shm"),
        ("--remount-ro", "/dev"),
        ("--dir", "/tao-action-config"), ("--dir", "/tao-inputs")]
    assert found[29:31] == [("--dir", "/tao-inputs/s3"), ("--dir", "/tao-inputs/s3/bkt")]  # parents, mode 0755
    assert sorted((b.source, b.target, b.read_only) for b in binds) == sorted([
        (str(stage / "s3/bkt/data"), DATA, True),
        (str(stage / "config/spec.yaml"), CONFIG, True),
        (str(STAND_IN), "/stand-in", True),
        (str(control(tmp_path)), "/control", False),
        (str(scratch), "/scratch", True),
        (str(scratch / "sub"), "/scratch-rw", False),
        ("/host/results/job-1", "/results", False)])  # nothing else of the host
    depths = [b.target.count("/") for b in binds]
    assert depths == sorted(depths)  # a parent before anything mounted inside it
    assert found[31:-1] == [("--ro-bind-fd" if b.read_only else "--bind-fd", str(100 + n), b.target)
                            for n, b in enumerate(binds)]  # each source by its checked descriptor, never a path
    assert found[-1] == ("--chdir", "/tmp")


def test_a_frame_started_by_root_switches_its_command_to_the_job_user(tmp_path: Path) -> None:
    """Started by root, bubblewrap makes no user namespace (its namespaces stay the host's, as a
    rootful container's do), keeps only what setpriv needs, and setpriv makes the command the
    job's user with nothing kept: the command never runs as host root."""
    found, command = options(argv_of(make_plan(tmp_path), ["sh", "-c", "true"], host=ROOT_HOST)[1])
    assert found[:12] == [("--unshare-ipc",), ("--unshare-pid",), ("--unshare-uts",), ("--unshare-cgroup-try",),
                          ("--unshare-net",), ("--as-pid-1",), ("--new-session",), ("--cap-drop", "ALL"),
                          ("--cap-add", "CAP_SETUID"), ("--cap-add", "CAP_SETGID"), ("--cap-add", "CAP_SETPCAP"),
                          ("--hostname", "job-1-0")]
    assert command == ["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all",
                       "--bounding-set=-all", "--no-new-privs", "--", "sh", "-c", "true"]


def test_a_bind_without_a_descriptor_leaves_its_target_absent(tmp_path: Path) -> None:
    _, argv = argv_of(make_plan(tmp_path), ["true"], absent=(DATA,))
    found, _ = options(argv)
    assert DATA not in [option[-1] for option in found if option[0].endswith("-fd")]
    assert "/results" in [option[-1] for option in found if option[0].endswith("-fd")]


@pytest.mark.parametrize(("kwargs", "present", "absent"), [
    ({"network": True}, [], [("--unshare-net",)]),
    ({}, [("--unshare-net",)], [PROBE_DIR]),
    ({"probe_dir": "/run/probe"}, [PROBE_DIR], []),
    ({"status_fd": 7}, [("--json-status-fd", "7")], []),
], ids=["network", "no-probe-files-for-the-job", "probe-files", "status-fd"])
def test_frame_argv_options(tmp_path: Path, kwargs: dict[str, Any], present: list[Any], absent: list[Any]) -> None:
    plan = make_plan(tmp_path, network=kwargs.pop("network", False))
    found, _ = options(argv_of(plan, ["true"], **kwargs)[1])
    items = found + [option[-1] for option in found if option[0] == "--ro-bind-fd"]
    assert all(item in items for item in present) and not any(item in items for item in absent)


@pytest.mark.parametrize(("host", "joined"), [(HOST, ["--user=/proc/self/fd/5", "--net=/proc/self/fd/6"]),
                                              (ROOT_HOST, ["--net=/proc/self/fd/6"])], ids=["user", "root"])
def test_a_higher_rank_joins_rank_0s_network_through_nsenter(tmp_path: Path, host: Host, joined: list[str]) -> None:
    plan = make_plan(tmp_path, nodes=2)
    user = "/proc/self/fd/5" if host.run_as is None else None
    _, argv = argv_of(plan, ["true"], rank=1, join=Namespaces(user=user, net="/proc/self/fd/6"), host=host)
    assert argv[:len(joined) + 2] == ["/usr/bin/nsenter", *joined, "--"]
    found, _ = options(argv[len(joined) + 2:])
    assert ("--unshare-net",) not in found and ("--hostname", "job-1-1") in found


def test_argv_never_carries_an_environment_value(tmp_path: Path) -> None:
    plan = make_plan(tmp_path, environment={"DECLARED": "declared-value"})
    _, argv = argv_of(plan, ["true"])
    assert not {"--setenv", "--unsetenv", "--clearenv"} & set(argv) and "declared-value" not in argv


@pytest.mark.parametrize(("nodes", "rank", "extra"), [
    (1, 0, {}),
    (2, 1, {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "1", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "127.0.0.1",
            "PET_MASTER_PORT": "29500", "WORLD_SIZE": "2", "NUM_GPU_PER_NODE": "1", "NODE_RANK": "1",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}),
], ids=["one-node", "rank-1-of-2"])
def test_frame_env_is_built_not_inherited(tmp_path: Path, nodes: int, rank: int, extra: dict[str, str]) -> None:
    plan = make_plan(tmp_path, script="true", environment={"DECLARED": "yes"}, nodes=nodes)
    env = frame_env(plan, rank=rank, credentials={"HF_TOKEN": "forwarded-value"})
    assert env == {"PATH": FRAME_PATH, "LANG": "C.UTF-8", "HOME": "/tmp", "DECLARED": "yes", "TAO_JOB_ID": "job-1",
                   "TAO_RESULTS_DIR": "/results", **extra, "HF_TOKEN": "forwarded-value"}


@pytest.mark.parametrize("rank", [0, 1])
def test_torchrun_takes_its_rendezvous_from_the_frame_environment(tmp_path: Path, rank: int) -> None:
    """torchrun's own parser, built in a rank's frame environment, takes the node count, the GPUs
    per node, the rank and rank 0's address and port from it (its ``PET_*`` defaults)."""
    plan = make_plan(tmp_path, script="true", nodes=2)
    args = torchrun_arguments(frame_env(plan, rank=rank), ["train.py"])
    assert (args.nnodes, args.nproc_per_node, args.node_rank, args.master_addr, args.master_port) == (
        str(plan.nodes), str(plan.gpus), rank, MASTER_ADDR, MASTER_PORT)


# ----------------------------------------------------------------------------- real frames
def test_a_job_is_verified_then_runs_and_writes_its_results(tmp_path: Path, backend: LocalBackend) -> None:
    plan = make_plan(tmp_path, environment={"EPOCHS": "2"})
    submission = backend.submit(plan)
    assert submission.started and submission.backend_ref == "local/job-1"
    verdict = backend.verify(submission.backend_ref, plan, timeout=DEADLINE_S)
    assert verdict.ok, verdict.describe()
    assert [c.kind for c in verdict.checks] == ["dir-nonempty", "file", "readable", "present", "results-writable",
                                                "persistent"]
    status = finished(backend, submission.backend_ref)
    assert status.state == "COMPLETE" and status.exit_code == 0, status
    results = Path(str(backend.results_path(submission.backend_ref)))
    assert results == backend.run_root / "job-1" / "results"
    assert {p.name for p in results.iterdir()} == {"checkpoint_epoch_1.pth", "checkpoint_epoch_2.pth", "status.json",
                                                   "train.log", ".tao"}  # the persistence token was removed
    assert [json.loads(line)["status"] for line in (results / "status.json").read_text().splitlines()] == [
        "STARTED", "RUNNING", "RUNNING", "SUCCESS"]
    assert (results / ".tao" / "state.json").exists()
    assert "epoch 2/2 done" in backend.logs(submission.backend_ref)
    assert backend.logs(submission.backend_ref, tail=1) == "train.sh[rank 0]: done\n"
    assert backend.failure_analysis(submission.backend_ref) is None


def test_the_frames_tmp_and_shm_hold_what_the_compute_shape_gives_and_no_more(tmp_path: Path,
                                                                              backend: LocalBackend) -> None:
    """/tmp (a container's writable layer: compute_shape.ephemeral_storage) and /dev/shm
    (shm_size) are memory here: bubblewrap's --size binds them, so a job cannot fill the host's
    RAM through either; a write past the size fails with ENOSPC inside the job."""
    script = ('dd if=/dev/zero of=/tmp/fits bs=1M count=2 2>/dev/null && echo tmp-fits; '
              'dd if=/dev/zero of=/tmp/spills bs=1M count=16 2>/dev/null || echo tmp-full; '
              'dd if=/dev/zero of=/dev/shm/spills bs=1M count=16 2>/dev/null || echo shm-full')
    plan = make_plan(tmp_path, script=script, shape={"shm_size": "8Mi", "ephemeral_storage": "8Mi"})
    ref = backend.submit(plan).backend_ref
    finished(backend, ref)
    said = backend.logs(ref)
    assert "tmp-fits" in said and "tmp-full" in said and "shm-full" in said, said


def test_results_go_to_the_mount_route(tmp_path: Path, backend: LocalBackend) -> None:
    (tmp_path / "shared").mkdir()
    route = OutputRoute(route="mount", destination=str(tmp_path / "shared" / "job-1"), reason="TAO_RESULTS_ROOT")
    plan = make_plan(tmp_path, route=route)
    ref = backend.submit(plan).backend_ref
    assert finished(backend, ref).state == "COMPLETE"
    assert backend.results_path(ref) == str(tmp_path / "shared" / "job-1")
    assert (tmp_path / "shared" / "job-1" / "checkpoint_epoch_1.pth").exists()


@pytest.mark.parametrize(("ended", "says", "err_class"), [
    (ExitRecord(exit_code=137, signal=signal.SIGKILL), "the command was killed (exit code 137, SIGKILL): killed, "
                                                      "possibly out of memory", "ERR_INFRA"),
    (ExitRecord(exit_code=139, signal=signal.SIGSEGV), "the command failed (exit code 139, signal SIGSEGV)",
     "ERR_PROGRAM"),
    (ExitRecord(exit_code=137, deadline_seconds=2), "the job ran longer than its compute_shape.deadline_seconds "
                                                    "(2 s) and was ended", "ERR_PROGRAM"),
], ids=["sigkill", "sigsegv", "deadline"])
def test_how_a_frame_ended_is_said_in_the_local_backends_words(tmp_path: Path, ended: ExitRecord, says: str,
                                                                err_class: str) -> None:
    """The classes are the conformance suite's (tests/test_backend_contract.py); the words are the
    local backend's: a SIGKILL may be the kernel's OOM killer, which the frame cannot tell apart,
    and a deadline's end is no kill."""
    status, analysis = _ended(ended, RunDir(tmp_path))
    assert (status.message, status.err_class) == (says, err_class) and analysis is not None


def _break_dataset(tmp_path: Path, how: str) -> None:
    data = tmp_path / "stage" / "s3/bkt/data"
    if how == "missing":
        (data / "part-0.bin").unlink()
        data.rmdir()
    elif how == "empty":
        (data / "part-0.bin").unlink()
    elif how == "unreadable":
        data.chmod(0)
    else:
        results = tmp_path / "local" / "job-1" / "results"
        results.mkdir(parents=True)
        results.chmod(0o555)


@pytest.mark.parametrize(("how", "path", "detail"), [
    ("missing", DATA, "does not exist"),
    ("empty", DATA, "is empty"),
    ("unreadable", DATA, "is not readable"),
    ("results-not-writable", "/results", "is not writable"),
])
def test_the_probe_in_the_frame_names_each_input_it_cannot_use(tmp_path: Path, backend: LocalBackend, how: str,
                                                               path: str, detail: str) -> None:
    """That the command then never starts is the conformance suite's promise; here, what the probe
    finds inside the frame, and says."""
    plan = make_plan(tmp_path)
    _break_dataset(tmp_path, how)
    try:
        ref = backend.submit(plan).backend_ref
        verdict = backend.verify(ref, plan, timeout=DEADLINE_S)
        status = finished(backend, ref)
    finally:
        if how == "unreadable":
            (tmp_path / "stage" / "s3/bkt/data").chmod(0o755)
    assert not verdict.ok and [(c.path, c.detail) for c in verdict.failures][0] == (path, detail), verdict.describe()
    assert (status.state, status.err_class) == ("ERROR", "ERR_INFRA") and detail in status.message


def test_the_frame_sees_only_what_the_plan_declares(tmp_path: Path, backend: LocalBackend,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    other = make_plan(tmp_path, "other-job")
    other_ref = backend.submit(other).backend_ref
    assert finished(backend, other_ref).state == "COMPLETE"
    home_file = Path.home() / f".tao-data-io-test-{uuid.uuid4().hex}"
    home_file.write_text("private")
    monkeypatch.setenv("HOST_ONLY_VARIABLE", "host-value")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    scratch.chmod(0o1777)  # a read-write mount the job's user writes
    hidden = [str(home_file), str(REPO / "pyproject.toml"), str(Path(__file__)),
              str(backend.run_root / "other-job" / "run" / "launch.json"),
              str(backend.run_root / "other-job" / "results" / "checkpoint_epoch_1.pth"), str(tmp_path)]
    script = """
        out=$TAO_RESULTS_DIR
        {visibility} > "$out/visibility"
        env > "$out/env"
        ls -A / > "$out/root"
        for p in /stand-in/x /tao-inputs/s3/bkt/data/x /usr/x /etc/x; do
          if touch "$p" 2>/dev/null; then echo "wrote $p"; else echo "refused $p"; fi
        done > "$out/writes"
        echo scratch > /scratch/written
    """.format(visibility=VISIBILITY)
    plan = make_plan(tmp_path, script=script, script_args=hidden, environment={"DECLARED": "yes"},
                     mounts=[{"source": str(scratch), "target": "/scratch", "read_only": False}])
    try:
        ref = backend.submit(plan, environ=dict(os.environ)).backend_ref
        assert finished(backend, ref).state == "COMPLETE", backend.logs(ref)
    finally:
        home_file.unlink()
    results = Path(str(backend.results_path(ref)))
    assert (results / "visibility").read_text().splitlines() == [f"absent {p}" for p in hidden]
    names = {line.split("=", 1)[0] for line in (results / "env").read_text().splitlines()}
    assert names - {"PWD"} == {"PATH", "LANG", "HOME", "DECLARED", "TAO_JOB_ID", "TAO_RESULTS_DIR"}  # sh sets PWD
    assert set((results / "root").read_text().split()) == {d.path.split("/")[1] for d in host_system_dirs()} | {
        "proc", "dev", "tmp", "tao-inputs", "stand-in", "control", "scratch", "results"}
    assert (results / "writes").read_text().split("\n")[:4] == [
        "refused /stand-in/x", "refused /tao-inputs/s3/bkt/data/x", "refused /usr/x", "refused /etc/x"]
    assert not (STAND_IN / "x").exists() and (scratch / "written").read_text() == "scratch\n"


def test_credentials_reach_the_frame_and_nowhere_else(tmp_path: Path, backend: LocalBackend,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    secret = f"tao-test-secret-{uuid.uuid4().hex}"
    monkeypatch.setenv("HF_TOKEN", secret)
    script = """
        printf %s "$HF_TOKEN" | sha256sum > "$TAO_RESULTS_DIR/token.sha256"
        touch /control/ready
        while [ ! -e /control/release ]; do sleep 0.1; done
    """
    plan = make_plan(tmp_path, script=script, forward_env=["HF_TOKEN"], environ=dict(os.environ))
    assert secret not in plan.model_dump_json()
    ref = backend.submit(plan, environ=dict(os.environ)).backend_ref
    wait_for("the job to hold", lambda: (control(tmp_path) / "ready").exists())
    processes = job_processes(backend, "job-1")
    argvs = list(processes.values())
    assert any("tao_data_io.backends.local.supervisor" in argv for argv in argvs), argvs
    assert any(argv.startswith(find_tool("bwrap", BWRAP_INSTALL)) for argv in argvs), argvs
    assert all(secret not in proc_text(str(pid), "cmdline") for pid in processes)
    (control(tmp_path) / "release").touch()
    assert finished(backend, ref).state == "COMPLETE", backend.logs(ref)
    results = Path(str(backend.results_path(ref)))
    assert (results / "token.sha256").read_text().split()[0] == hashlib.sha256(secret.encode()).hexdigest()
    written = [p for p in backend.run_root.rglob("*") if p.is_file()]
    assert len(written) > 8 and not [p for p in written if secret.encode() in p.read_bytes()]
    assert secret not in backend.logs(ref)


LINGER = """
    nohup sh -c 'while :; do echo tick >> "$TAO_RESULTS_DIR/lingering"; sleep 0.05; done' >/dev/null 2>&1 &
    setsid sh -c 'while :; do sleep 1; done' >/dev/null 2>&1 &
    touch /control/backgrounded
    exit 0
"""


def test_when_the_command_ends_every_process_of_its_frame_ends(tmp_path: Path, backend: LocalBackend,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """As a pod's containers end with their command: what the command left in the background
    (``nohup``, ``setsid``) ends too, with the forwarded credential in its environment, before the
    job is reported ended — so collect uploads a tree nothing writes to any more."""
    secret = f"tao-test-secret-{uuid.uuid4().hex}"
    monkeypatch.setenv("HF_TOKEN", secret)
    plan = make_plan(tmp_path, script=LINGER, forward_env=["HF_TOKEN"], environ=dict(os.environ))
    ref = backend.submit(plan, environ=dict(os.environ)).backend_ref
    status = finished(backend, ref)
    assert (status.state, status.exit_code) == ("COMPLETE", 0), backend.logs(ref)
    assert (control(tmp_path) / "backgrounded").exists()
    frame = {pid: argv[:60] for pid, argv, environ in live_processes() if "\0TAO_JOB_ID=job-1\0" in f"\0{environ}"}
    assert frame == {}, f"processes of the job's frame outlived its command: {sorted(frame.values())}"
    wait_for("the supervisor to exit", lambda: job_processes(backend, "job-1") == {})
    assert not [pid for pid, _, environ in live_processes() if secret in environ]
    written = Path(str(backend.results_path(ref))) / "lingering"
    before = written.read_bytes() if written.exists() else b""
    time.sleep(0.3)  # six ticks of the loop, were it alive
    assert (written.read_bytes() if written.exists() else b"") == before


def test_cancel_of_an_ended_job_ends_what_it_left_running(tmp_path: Path, backend: LocalBackend) -> None:
    """A job recorded as ended whose frame still has processes (a supervisor that died between the
    command's end and the frame's) is not "nothing to cancel": cancel ends what is left."""
    plan = make_plan(tmp_path, environment={"HOLD_FILE": "/control/never"})
    ref = backend.submit(plan).backend_ref
    wait_for("the stand-in to start", lambda: (control(tmp_path) / "started").exists())
    run = backend.run_root / "job-1" / "run"
    os.kill(json.loads((run / "supervisor.json").read_text())["pid"], signal.SIGKILL)
    (run / "exit.json").write_text(json.dumps({"exit_code": 0}))
    assert backend.status(ref).state == "COMPLETE" and job_processes(backend, "job-1")
    assert backend.cancel(ref) is True
    wait_for("the frames to end", lambda: job_processes(backend, "job-1") == {})
    assert backend.status(ref).state == "COMPLETE"  # how it ended stays as recorded
    assert backend.cancel(ref) is False


def _credentials_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    """A home whose ``.aws/credentials`` holds a marker no frame may ever print."""
    home = tmp_path / "home"
    (home / ".aws").mkdir(parents=True)
    secret = f"aws_secret_access_key = tao-test-{uuid.uuid4().hex}"
    (home / ".aws" / "credentials").write_text(secret + "\n")
    monkeypatch.setenv("HOME", str(home))
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "credentials").write_text("only data here\n")
    return home, secret


def _point(link: Path, target: Path) -> None:
    """Repoint the symlink ``link`` at ``target`` in one step (rename over it)."""
    fresh = link.with_name(f".{link.name}.{uuid.uuid4().hex}")
    fresh.symlink_to(target)
    os.replace(fresh, link)


def test_a_mount_source_swapped_after_preflight_is_checked_again(tmp_path: Path, backend: LocalBackend,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The check and the bind are of one object: a source that passed preflight as data and
    points at the home's credentials by submit is refused, never bound."""
    home, secret = _credentials_home(tmp_path, monkeypatch)
    link = tmp_path / "dataset"
    _point(link, tmp_path / "data")
    plan = make_plan(tmp_path, script="cat /dataset/credentials", mounts=[{"source": str(link), "target": "/dataset"}])
    backend.preflight(plan)
    _point(link, home / ".aws")
    try:
        ref = backend.submit(plan).backend_ref
    except UsageError as exc:
        assert "hidden directory of a home" in str(exc) and secret not in str(exc)
        return
    finished(backend, ref)
    assert secret not in backend.logs(ref), "the frame bound the home's credentials"
    pytest.fail("a source that became a home dot-directory after preflight was submitted")


def test_a_mount_source_that_keeps_flipping_never_binds_what_was_not_checked(
        tmp_path: Path, backend: LocalBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    """A symlink flipped every millisecond between data and ``~/.aws``: every job either binds
    the data it was checked against or is refused — none reads the credentials."""
    home, secret = _credentials_home(tmp_path, monkeypatch)
    link = tmp_path / "dataset"
    _point(link, tmp_path / "data")
    stop = threading.Event()

    def flip() -> None:
        while not stop.is_set():
            for target in (tmp_path / "data", home / ".aws"):
                _point(link, target)
                time.sleep(0.001)

    flipper = threading.Thread(target=flip, daemon=True)
    flipper.start()
    outcomes: dict[str, str] = {}
    try:
        refs = {}
        for n in range(16):
            plan = make_plan(tmp_path, f"swap-{n}", script="cat /dataset/credentials",
                             mounts=[{"source": str(link), "target": "/dataset"}])
            try:
                backend.preflight(plan)
                refs[plan.job_id] = backend.submit(plan).backend_ref
            except UsageError as exc:
                outcomes[plan.job_id] = f"refused: {exc}"
        for job_id, ref in refs.items():
            status = finished(backend, ref)
            outcomes[job_id] = f"{status.describe()}: {backend.logs(ref)}"
    finally:
        stop.set()
        flipper.join()
    leaked = [job for job, said in outcomes.items() if secret in said]
    assert not leaked, f"{len(leaked)} of {len(outcomes)} jobs read the home's credentials"
    for said in outcomes.values():  # each bound the data, or was refused saying why
        assert ("only data here" in said or "hidden directory of a home" in said
                or "no longer the object checked at submit" in said), said
    _point(link, tmp_path / "data")  # once nothing flips, the same mount runs
    plan = make_plan(tmp_path, "swap-still", script="cat /dataset/credentials",
                     mounts=[{"source": str(link), "target": "/dataset"}])
    ref = backend.submit(plan).backend_ref
    assert finished(backend, ref).state == "COMPLETE" and backend.logs(ref) == "only data here\n"


@pytest.mark.parametrize(("leads_to", "refusal"), [
    ("the home's credentials", "which is refused: it holds or lies in .*hidden directory"),
    ("an empty directory elsewhere", "not where tao-data-io made it"),
])
def test_a_results_directory_planted_as_a_symlink_is_never_bound(tmp_path: Path, backend: LocalBackend,
                                                                   monkeypatch: pytest.MonkeyPatch, leads_to: str,
                                                                   refusal: str) -> None:
    """``$TAO_RESULTS_ROOT/<job id>`` is where tao-data-io makes the results directory; a symlink
    planted there (by an earlier job that could write the root) is refused, not followed."""
    home, secret = _credentials_home(tmp_path, monkeypatch)
    target = home / ".aws" if leads_to == "the home's credentials" else tmp_path / "elsewhere"
    target.mkdir(exist_ok=True)
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "job-1").symlink_to(target)
    route = OutputRoute(route="mount", destination=str(tmp_path / "shared" / "job-1"), reason="TAO_RESULTS_ROOT")
    plan = make_plan(tmp_path, script='cat "$TAO_RESULTS_DIR/credentials"; touch "$TAO_RESULTS_DIR/planted"',
                     route=route)
    with pytest.raises(UsageError, match=refusal) as refused:
        backend.submit(plan)
    assert str(target) in str(refused.value)
    assert not (target / "planted").exists() and sorted(p.name for p in (home / ".aws").iterdir()) == ["credentials"]


def test_a_staged_input_replaced_by_a_symlink_is_never_bound(tmp_path: Path, backend: LocalBackend,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A staged source lies exactly where staging wrote it, below the staging root: one that
    became a symlink (anyone who can write the staging tree) is refused, wherever it leads."""
    home, secret = _credentials_home(tmp_path, monkeypatch)
    plan = make_plan(tmp_path, script="cat /tao-inputs/s3/bkt/data/credentials")
    staged = tmp_path / "stage" / "s3/bkt/data"
    for child in staged.iterdir():
        child.unlink()
    staged.rmdir()
    staged.symlink_to(home / ".aws")
    with pytest.raises(UsageError, match="not where tao-data-io made it"):
        backend.preflight(plan)
    with pytest.raises(UsageError, match="not where tao-data-io made it"):
        backend.submit(plan)


@pytest.mark.parametrize("where", ["a dot-directory of a home from the password database", "/var", "the results root"])
def test_mount_sources_that_would_show_the_host_are_refused(tmp_path: Path, backend: LocalBackend,
                                                            monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """Whatever ``HOME`` says: every user's home (from the password database) and its
    dot-directories, ``/var`` (cron spools and services' state that run as root), and a directory
    that holds ``$TAO_RESULTS_ROOT`` (every job's results, writable) are not mountable."""
    monkeypatch.setenv("HOME", str(tmp_path / "elsewhere"))
    made: Path | None = None
    if where == "/var":
        source = "/var/spool"
    elif where == "the results root":
        (tmp_path / "shared").mkdir()
        monkeypatch.setenv("TAO_RESULTS_ROOT", str(tmp_path / "shared"))
        source = str(tmp_path / "shared")
    else:
        import pwd
        made = Path(pwd.getpwuid(os.getuid()).pw_dir) / f".tao-data-io-test-{uuid.uuid4().hex}"
        made.mkdir()
        source = str(made)
    try:
        plan = make_plan(tmp_path, script="true", mounts=[{"source": source, "target": "/mounted"}])
        with pytest.raises(UsageError, match=f"mount source '{source}' .*is refused") as refused:
            backend.preflight(plan)
        assert "mount only the directories" in str(refused.value)
    finally:
        if made is not None:
            made.rmdir()


@pytest.mark.parametrize("planted", ["fifo", "symlink"])
def test_the_persistence_check_never_follows_or_blocks_on_what_the_results_hold(
        tmp_path: Path, backend: LocalBackend, planted: str) -> None:
    """The results directory is the job's (an earlier attempt's, on a mount route): a FIFO or a
    symlink to a host file where the probe's token goes is replaced by the probe (which writes a
    fresh file), so it neither hangs the probe nor writes through to the host; the supervisor
    reads the token through the directory's descriptor, never following or blocking."""
    (tmp_path / "shared" / "job-1").mkdir(parents=True)
    token = tmp_path / "shared" / "job-1" / ".tao-data-io-verify"
    os.mkfifo(token) if planted == "fifo" else token.symlink_to("/etc/hostname")
    route = OutputRoute(route="mount", destination=str(tmp_path / "shared" / "job-1"), reason="TAO_RESULTS_ROOT")
    plan = make_plan(tmp_path, script="true", route=route).model_copy(update={"attempt": 2})  # its earlier results
    hostname = Path("/etc/hostname").read_bytes()
    ref = backend.submit(plan).backend_ref
    verdict = backend.verify(ref, plan, timeout=DEADLINE_S)
    assert verdict.ok, verdict.describe()
    assert finished(backend, ref).state == "COMPLETE" and Path("/etc/hostname").read_bytes() == hostname
    assert not token.exists() and not token.is_symlink()  # the supervisor removed the token it read


def test_a_verify_that_times_out_cancels_the_job(tmp_path: Path, backend: LocalBackend) -> None:
    fifo = tmp_path / "never-written"
    os.mkfifo(fifo)  # the probe's read of it blocks: there is no writer
    plan = make_plan(tmp_path, mounts=[{"source": str(fifo), "target": "/pretrained"}])
    ref = backend.submit(plan).backend_ref
    wait_for("the probe to hang", lambda: any("/tao-data-io-verify/probe.sh" in argv
                                              for argv in job_processes(backend, "job-1").values()))
    assert backend.status(ref).state == "PENDING"
    verdict = backend.verify(ref, plan, timeout=1)
    assert not verdict.ok and verdict.error == "no verdict within 1s; the job was canceled"
    assert backend.status(ref).state == "CANCELED" and job_processes(backend, "job-1") == {}
    assert not (control(tmp_path) / "started").exists()


def test_cancel_ends_the_frames_of_a_supervisor_that_is_gone(tmp_path: Path, backend: LocalBackend) -> None:
    plan = make_plan(tmp_path, environment={"HOLD_FILE": "/control/never"})
    ref = backend.submit(plan).backend_ref
    wait_for("the stand-in to start", lambda: (control(tmp_path) / "started").exists())
    supervisor = json.loads((backend.run_root / "job-1" / "run" / "supervisor.json").read_text())
    os.kill(supervisor["pid"], signal.SIGKILL)
    status = wait_state(backend, ref, "ERROR")
    assert status.err_class == "ERR_INFRA" and "supervisor ended" in status.message
    assert job_processes(backend, "job-1")  # its frames still run
    assert backend.cancel(ref) is True
    wait_for("the frames to end", lambda: job_processes(backend, "job-1") == {})  # SIGKILL is not instant
    assert backend.status(ref).state == "CANCELED"


def test_two_jobs_at_once_do_not_see_each_other(tmp_path: Path, backend: LocalBackend) -> None:
    script = """
        touch /control/ready
        while [ ! -e /control/release ]; do sleep 0.1; done
        cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep '^TAO_JOB_ID=' | sort -u > "$TAO_RESULTS_DIR/jobs"
        {visibility} > "$TAO_RESULTS_DIR/paths"
    """.format(visibility=VISIBILITY)
    refs = {}
    for me, peer in (("job-a", "job-b"), ("job-b", "job-a")):
        peer_paths = [str(backend.run_root / peer / "run"), str(backend.run_root / peer / "results"),
                      str(control(tmp_path, peer))]
        refs[me] = backend.submit(make_plan(tmp_path, me, script=script, script_args=peer_paths)).backend_ref
    for job in refs:
        wait_for(f"{job} to hold", lambda job=job: (control(tmp_path, job) / "ready").exists())
    assert {backend.status(ref).state for ref in refs.values()} == {"RUNNING"}  # both at once
    for job in refs:
        (control(tmp_path, job) / "release").touch()
    for job, ref in refs.items():
        assert finished(backend, ref).state == "COMPLETE", backend.logs(ref)
        results = Path(str(backend.results_path(ref)))
        assert (results / "jobs").read_text().splitlines() == [f"TAO_JOB_ID={job}"]
        assert all(line.startswith("absent ") for line in (results / "paths").read_text().splitlines())


def test_killing_the_submitting_process_does_not_kill_the_job(tmp_path: Path, backend: LocalBackend) -> None:
    plan = make_plan(tmp_path, environment={"HOLD_FILE": "/control/release"})
    (tmp_path / "plan.json").write_text(plan.model_dump_json())
    code = ("import sys, time\n"
            "from tao_data_io.launch.plan import LaunchPlan\n"
            "from tao_data_io.backends.local.backend import LocalBackend\n"
            "from tao_data_io.backends.local.settings import LocalSettings\n"
            "plan = LaunchPlan.model_validate_json(open(sys.argv[1]).read())\n"
            "print(LocalBackend(LocalSettings(run_root=sys.argv[2])).submit(plan).backend_ref, flush=True)\n"
            "time.sleep(3600)\n")
    submitter = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "plan.json"), str(backend.run_root)],
                                 stdout=subprocess.PIPE, text=True, cwd=REPO, start_new_session=True,
                                 env={**os.environ, "PYTHONPATH": str(REPO)})
    assert submitter.stdout is not None
    ref = submitter.stdout.readline().strip()
    os.killpg(submitter.pid, signal.SIGKILL)  # the submitter and its whole process group
    submitter.wait()
    wait_state(backend, ref, "RUNNING")
    (control(tmp_path) / "release").touch()
    assert finished(backend, ref).state == "COMPLETE", backend.logs(ref)


def test_another_plan_under_a_submitted_job_id_is_refused(tmp_path: Path, backend: LocalBackend) -> None:
    """A submit of the same plan again starts nothing (the conformance suite's promise); another
    plan under the job's id is not that job: it is refused, not run as if it were."""
    plan = make_plan(tmp_path)
    backend.submit(plan)
    with pytest.raises(UsageError, match="another plan"):
        backend.submit(plan.model_copy(update={"argv": ["true"]}))


def test_two_ranks_run_with_the_rendezvous_variables(tmp_path: Path, backend: LocalBackend) -> None:
    ref = backend.submit(make_plan(tmp_path, nodes=2)).backend_ref
    assert finished(backend, ref).state == "COMPLETE", backend.logs(ref)
    logs = backend.logs(ref)
    for rank in (0, 1):
        assert (f"[rank {rank}] train.sh[rank {rank}]: rendezvous: WORLD_SIZE=2 NUM_GPU_PER_NODE=1 NODE_RANK={rank} "
                f"MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 PET_NNODES=2 PET_NPROC_PER_NODE=1 PET_NODE_RANK={rank} "
                "PET_MASTER_ADDR=127.0.0.1 PET_MASTER_PORT=29500") in logs
    assert sorted((control(tmp_path) / "started").read_text().splitlines()) == ["rank 0 started", "rank 1 started"]
    assert len(json.loads((backend.run_root / "job-1" / "run" / "ranks.json").read_text())["ranks"]) == 2


RENDEZVOUS = """
import os, socket, sys, time
rank, addr, port = int(os.environ["NODE_RANK"]), os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
out = os.path.join(os.environ["TAO_RESULTS_DIR"], f"rank-{rank}")
if rank == 0:
    server = socket.create_server((addr, port))
    peer, _ = server.accept()
    open(out, "w").write(peer.recv(100).decode())
else:
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5).close()
        host = "host loopback reachable"
    except OSError:
        host = "host loopback unreachable"
    deadline = time.monotonic() + 60
    while True:
        try:
            connection = socket.create_connection((addr, port), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    connection.sendall(b"hello from rank 1")
    open(out, "w").write(host)
"""


@pytest.mark.skipif(not Path("/usr/bin/python3").exists(), reason="the host userland has no /usr/bin/python3")
def test_ranks_reach_rank_0_on_a_loopback_private_to_the_job(tmp_path: Path, backend: LocalBackend) -> None:
    with socket.create_server(("127.0.0.1", 0)) as host_service:
        port = host_service.getsockname()[1]
        plan = make_plan(tmp_path, command=["/usr/bin/python3", "-c", RENDEZVOUS, str(port)], nodes=2)
        ref = backend.submit(plan).backend_ref
        assert finished(backend, ref).state == "COMPLETE", backend.logs(ref)
    results = Path(str(backend.results_path(ref)))
    assert (results / "rank-0").read_text() == "hello from rank 1"
    assert (results / "rank-1").read_text() == "host loopback unreachable"


ALL_REDUCE = """
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
print(f"rank {dist.get_rank()} of {dist.get_world_size()}: all-reduced {value.item():g}", flush=True)
dist.destroy_process_group()
"""


def test_two_ranks_rendezvous_through_torchrun_and_all_reduce(tmp_path: Path, backend: LocalBackend) -> None:
    """torchrun in each of two frames, told nothing but the node count, GPUs per node and the
    backend (rank and rank 0's address come from the frame's environment), brings up a gloo
    process group across them: each rank's worker sees the sum of both ranks' values. The frame
    runs the host's Python (the venv's lives outside the frame) with torch's site-packages
    mounted read-only."""
    torch = pytest.importorskip("torch", reason="torch is not installed (make test installs it)")
    if not Path("/usr/bin/python3.11").exists():
        pytest.skip("the host userland has no /usr/bin/python3.11 (the ABI of the venv's torch)")
    site_packages = str(Path(torch.__file__).resolve().parents[1])
    plan = make_plan(tmp_path, nodes=2, command=[
        "/usr/bin/python3.11", "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
        "--rdzv-backend=static", "/control/all_reduce.py"],
        environment={"PYTHONPATH": "/opt/torch-site-packages"},
        mounts=[{"source": site_packages, "target": "/opt/torch-site-packages"}])
    (control(tmp_path) / "all_reduce.py").write_text(ALL_REDUCE)
    ref = backend.submit(plan).backend_ref
    assert finished(backend, ref).state == "COMPLETE", backend.logs(ref)
    logs = backend.logs(ref)
    world = plan.nodes  # one worker per node
    for rank in range(world):  # the sum of every worker's rank + 1
        assert f"[rank {rank}] rank {rank} of {world}: all-reduced {sum(range(1, world + 1))}" in logs, logs


def _collective_probe_plan(tmp_path: Path, *, rank_1_joins: bool) -> LaunchPlan:
    """The collective probe as each node's frame runs it: the host's Python with torch mounted,
    one process per node, gloo (no GPU). With ``rank_1_joins`` False rank 1 exits at once, as a
    node whose traffic never reaches rank 0 would look from rank 0: waiting in the rendezvous."""
    torch = pytest.importorskip("torch", reason="torch is not installed (make test installs it)")
    if not Path("/usr/bin/python3.11").exists():
        pytest.skip("the host userland has no /usr/bin/python3.11 (the ABI of the venv's torch)")
    (control(tmp_path) / "probe.py").parent.mkdir(parents=True, exist_ok=True)
    (control(tmp_path) / "probe.py").write_text(PROBE_PROGRAM)
    gate = "" if rank_1_joins else 'if [ "$NODE_RANK" = 1 ]; then exit 0; fi; '
    return make_plan(tmp_path, nodes=2, script=gate + "exec /usr/bin/python3.11 /control/probe.py",
                     environment={"PYTHONPATH": "/opt/torch-site-packages", "TAO_DATA_IO_PROBE_BACKEND": "gloo",
                                  "TAO_DATA_IO_PROBE_TIMEOUT": "5"},
                     mounts=[{"source": str(Path(torch.__file__).resolve().parents[1]),
                              "target": "/opt/torch-site-packages"}])


def test_the_collective_probe_all_reduces_across_two_nodes(tmp_path: Path, backend: LocalBackend) -> None:
    ref = backend.submit(_collective_probe_plan(tmp_path, rank_1_joins=True)).backend_ref
    status = finished(backend, ref)
    logs = backend.logs(ref)
    assert status.state == "COMPLETE", logs
    verdict = read_probe(logs, 0)
    assert verdict.ok and verdict.detail.startswith("2 nodes all-reduced over gloo in "), verdict


def test_a_collective_probe_that_hangs_ends_at_its_deadline_naming_the_nccl_settings_to_try(
        tmp_path: Path, backend: LocalBackend) -> None:
    ref = backend.submit(_collective_probe_plan(tmp_path, rank_1_joins=False)).backend_ref
    status = finished(backend, ref)
    assert status.state == "ERROR" and status.exit_code == HANG_EXIT, status
    verdict = read_probe(backend.logs(ref), status.exit_code or 0)
    assert not verdict.ok and verdict.outcome == "hang" and "in the rendezvous" in verdict.detail, verdict
    assert "NCCL_SOCKET_IFNAME" in verdict.advice and "NCCL_IB_DISABLE=1" in verdict.advice


def test_a_probe_verdict_is_read_from_each_outcome_the_program_prints() -> None:
    assert read_probe("TAO-COLLECTIVE\twrong\tall-reduce\tall-reduced 2, expected 3\n", 1).outcome == "wrong"
    failed = read_probe("noise\nTAO-COLLECTIVE\tfail\trendezvous\tRuntimeError: connection refused\n", 1)
    assert failed.outcome == "fail" and "NCCL_SOCKET_IFNAME" in failed.advice
    assert read_probe("Traceback …\nModuleNotFoundError: No module named 'torch'\n", 1).outcome == "silent"


# ----------------------------------------------------------------------------- preflight and lookups
def test_preflight_passes_a_good_plan_and_names_missing_sources(tmp_path: Path, backend: LocalBackend) -> None:
    backend.preflight(make_plan(tmp_path))
    plan = make_plan(tmp_path, mounts=[{"source": str(tmp_path / "nowhere"), "target": "/pretrained"}])
    with pytest.raises(UsageError, match=f"{tmp_path / 'nowhere'} → /pretrained"):
        backend.preflight(plan)
    route = OutputRoute(route="mount", destination=str(tmp_path / "no-mount" / "job-1"), reason="TAO_RESULTS_ROOT")
    with pytest.raises(UsageError, match="TAO_RESULTS_ROOT"):
        backend.preflight(make_plan(tmp_path, route=route))


def test_a_request_for_the_network_is_refused_unless_the_settings_allow_it(tmp_path: Path) -> None:
    closed = LocalBackend(LocalSettings(run_root=str(tmp_path / "local")))  # the default: off
    closed.preflight(make_plan(tmp_path))
    with pytest.raises(UsageError, match=r"asks for the network \(network: true\).*allow_network is off"):
        closed.preflight(make_plan(tmp_path, network=True))
    LocalBackend(LocalSettings(run_root=str(tmp_path / "local"), allow_network=True)).preflight(
        make_plan(tmp_path, network=True))
    assert not (tmp_path / "local").exists()


def test_preflight_says_how_to_install_bubblewrap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    backend = LocalBackend(LocalSettings(run_root=str(tmp_path / "local")))
    for call in (lambda: backend.preflight(make_plan(tmp_path)), lambda: backend.submit(make_plan(tmp_path))):
        with pytest.raises(UsageError, match="apt-get install bubblewrap"):
            call()
    assert not (tmp_path / "local").exists()


def test_preflight_names_the_sysctl_when_namespaces_are_refused(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "bin" / "bwrap"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    with pytest.raises(UsageError, match="uid map: Permission denied.*sysctl user.max_user_namespaces"):
        LocalBackend(LocalSettings(run_root=str(tmp_path / "local"))).preflight(make_plan(tmp_path))


def test_an_unknown_ref_names_the_run_root_and_a_foreign_one_is_refused(tmp_path: Path) -> None:
    backend = LocalBackend(LocalSettings(run_root=str(tmp_path)))
    assert str(tmp_path) in backend.status("local/never-submitted").message  # where it was looked for
    assert backend.results_path("local/never-submitted") is None
    with pytest.raises(UsageError, match="not the local backend's"):
        backend.status("tao-jobs/job-1")
    with pytest.raises(UsageError, match="not the local backend's"):
        backend.status("local/../etc")


def test_backend_for_local_and_its_facts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    backend = backend_for("local", {"run_root": str(tmp_path)})
    assert isinstance(backend, LocalBackend) and isinstance(backend, Backend) and backend.run_root == tmp_path
    facts = backend.facts()
    assert (facts.backend, facts.capabilities.fetches_in_frame) == ("local", False)
    monkeypatch.setenv("TAO_DATA_IO_LOCAL_ROOT", "from-env")
    monkeypatch.chdir(tmp_path)
    assert LocalBackend(LocalSettings()).config() == {"run_root": str(tmp_path / "from-env"), "allow_network": False,
                                                      "run_as_user": None, "run_as_group": None, "log_limit": "64Mi"}


# ----------------------------------------------------------------------------- what a job may not reach
@needs_bwrap
def test_a_request_cannot_bind_the_checkout_read_write(cli_env: dict[str, str], tmp_path: Path) -> None:
    """A job may not bind the checkout the supervisor imports its code from read-write: code planted
    there would run outside every frame, in the next job's supervisor, with that job's forwarded
    credentials. Submit refuses it (exit 2, an ``error:`` naming the mount) and nothing is written."""
    planted = PACKAGE_ROOT / "tao_data_io" / "local" / "planted-by-a-job.planted"
    request = write_request(tmp_path / "plant.yaml", args_request(
        job_id="plant-checkout",
        command=["sh", "-c", "echo pwned > /checkout/tao_data_io/backends/local/planted-by-a-job.planted"],
        mounts=[{"source": str(PACKAGE_ROOT), "target": "/checkout", "read_only": False}]))
    try:
        submitted = run_cli("submit", "--request", str(request), env=cli_env)
        if submitted.returncode == 0:
            run_cli("collect", "--job-id", "plant-checkout", "--wait", "--poll-seconds", "0.2", env=cli_env)
        assert not planted.exists(), "the job wrote into the checkout the supervisor imports its code from"
        assert submitted.returncode == 2 and "error:" in submitted.stderr, submitted.stderr
    finally:
        planted.unlink(missing_ok=True)


@needs_bwrap
@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/etc/shadow"), reason="needs root and /etc/shadow")
def test_the_frame_cannot_read_root_only_host_files(cli_env: dict[str, str], tmp_path: Path) -> None:
    """Run as root (a worker, a CI container), the frame's uid 0 still cannot read the host's
    root-only files (``/etc/shadow``, SSH host keys) through the read-only ``/etc`` it sees."""
    request = write_request(tmp_path / "shadow.yaml", args_request(
        job_id="read-shadow", command=["sh", "-c", "head -c 16 /etc/shadow > /results/stolen"]))
    assert run_cli("submit", "--request", str(request), env=cli_env).returncode == 0
    run_cli("collect", "--job-id", "read-shadow", "--wait", "--poll-seconds", "0.2", env=cli_env)
    stolen = tmp_path / "work" / "read-shadow" / "results" / "stolen"
    assert not (stolen.exists() and stolen.stat().st_size > 0), "the job read the host's /etc/shadow"


@needs_bwrap
def test_a_request_that_sets_path_still_verifies(cli_env: dict[str, str], tmp_path: Path) -> None:
    """The verify probe finds its own tools (``mkdir``, ``dd``) whatever ``PATH`` the request sets for
    its image (``/opt/conda/bin:…``, common for TAO images), so such a job verifies and runs."""
    request = write_request(tmp_path / "path.yaml", args_request(
        job_id="sets-path", command=["/bin/sh", "-c", "echo ran > /results/ran"],
        environment={"PATH": "/opt/conda/bin:/usr/local/nvidia/bin"}))
    submitted = run_cli("submit", "--request", str(request), env=cli_env)
    assert submitted.returncode == 0, submitted.stderr


def test_a_frame_whose_tmp_and_shm_would_take_more_memory_than_the_host_has_is_refused(tmp_path: Path) -> None:
    from tao_data_io.backends.local.preflight import check_memory_sizes, host_memory_bytes

    plan = make_plan(tmp_path, shape={"shm_size": "3Gi", "ephemeral_storage": "2Gi"})
    with pytest.raises(UsageError, match=r"/tmp \(2\.0 GiB: compute_shape.ephemeral_storage\) and /dev/shm "
                                         r"\(3\.0 GiB: compute_shape.shm_size\).*more than this host's 4\.0 GiB"):
        check_memory_sizes(plan, 4 * 1024**3)
    check_memory_sizes(plan, 8 * 1024**3)
    with pytest.raises(UsageError, match=r"for each of its 2 ranks.*10\.0 GiB in all"):
        check_memory_sizes(make_plan(tmp_path, nodes=2, shape={"shm_size": "3Gi", "ephemeral_storage": "2Gi"}),
                           8 * 1024**3)
    assert (host_memory_bytes() or 0) > 0
