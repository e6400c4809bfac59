"""A real SLURM cluster for the test session, of the session's own: ``munged`` with its own key and
socket, ``slurmctld`` and one ``slurmd`` per emulated node (``n1``, ``n2``: two nodes on this host,
each on a port of its own), all under a short temporary directory under /tmp (its unix sockets'
paths stay short, and jobs that run as uid 65534 can traverse it to the shared directory). Clients
(sbatch, squeue, scontrol…) reach it through ``SLURM_CONF``, which :attr:`SlurmCluster.environ`
gives; nothing reads /etc/slurm or /etc/munge. A module of its own, so test modules share the
fixture without importing each other (``from . import slurm_cluster as harness`` and
``slurm_cluster = harness.slurm_cluster`` in a test module, as tests/docker_daemon.py's are).

The cluster is what a site runs, as far as one host allows: ``proctrack/cgroup`` and
``task/cgroup`` on this host's cgroup v1 with RAM and swap constrained, so ``--mem`` holds and a job
past it ends OUT_OF_MEMORY; ``select/cons_tres`` on cores and memory; no accounting database
(``sacct`` says accounting is disabled; ended jobs are in ``scontrol show job`` for
:data:`MIN_JOB_AGE_S` and in the jobcomp file). Cores are not constrained: both emulated nodes
claim the same CPUs, and pinning each node's first job to the same core would only slow the tests.
The partition shares each core among :data:`OVERSUBSCRIBE` jobs and a job asks
:data:`DEF_MEM_PER_CPU_MB` unless it says otherwise, so the tests' jobs run side by side.

One cluster serves the whole session however many modules take the fixture: pytest makes a fixture
definition per module that names it, so the cluster is counted out to them and stopped when the last
lets go. Stopping cancels the jobs still there and waits for their slurmstepd to end (slurmd leaves
its jobs running when it stops), then stops each daemon by the pid it was started as (SIGTERM, then
SIGKILL after a grace) and removes the directory. A killed session's daemons get SIGTERM as it goes
(``setpriv --pdeathsig``); the next session kills the slurmstepd it left running (one is told by
its working directory, the dead session's, and its job's processes by the job's freezer cgroup) and
removes the directory. A cluster that does not start fails the tests with its daemons' last log
lines: the project tests on real engines, never skips them.

cgroup v1 names a job's cgroup by node, uid and job id (``slurm_n1/uid_0/job_7``), not by cluster,
so each cluster's job ids start at a random :data:`FIRST_JOB_ID` and two sessions on one host never
share a job's cgroup."""

from __future__ import annotations

import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from .session_service import Shared

#: The emulated nodes of the session's cluster, all on this host.
NODES = ("n1", "n2")
PARTITION = "debug"
#: How many jobs may share a core: one-CPU jobs run side by side on a node of few cores.
OVERSUBSCRIBE = 4
#: What a job that names no memory is given; with none, it would take its node's whole memory and
#: the next job would wait for it.
DEF_MEM_PER_CPU_MB = 256
#: What each node offers the scheduler (at most half this host's memory); ``--mem`` is enforced by
#: the memory cgroup, whatever this says.
NODE_MEMORY_MB = 4096
#: How long an ended job stays in ``scontrol show job``.
MIN_JOB_AGE_S = 300
#: SIGTERM to SIGKILL when a job is cancelled: short, so cancel tests end quickly.
KILL_WAIT_S = 5
#: How long the cluster has to answer and have every node idle.
READY_S = 30.0
#: How long the jobs still there at the end have to end once cancelled (KillWait and a margin).
JOBS_END_S = 4 * KILL_WAIT_S
#: How long each daemon has to stop after SIGTERM.
STOP_GRACE_S = 10.0
#: How long a client command may take.
CLIENT_S = 60.0
LOG_LINES = 20
#: Where the daemons and clients are looked for after $PATH (Debian puts the daemons in /usr/sbin).
_SEARCH_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: Short, so the unix sockets under it (munge's, slurmstepd's in each spool) fit; every user can
#: traverse it, as a job run as uid 65534 must to reach the shared directory.
_BASE = Path("/tmp")
_PREFIX = "tao-slurm-"
_MUNGE_USER = "munge"
_MUNGE_KEY_BYTES = 1024


@dataclass(frozen=True)
class SlurmCluster:
    """A running cluster: ``root`` the directory it owns (0755), ``conf`` its slurm.conf, ``nodes``
    its node names, ``pids`` each daemon's pid by name (``munged``, ``slurmctld``,
    ``slurmd-<node>``). The session's cluster is the ``slurm_cluster`` fixture's; :meth:`start`
    starts another (it is the caller's to :meth:`stop`), with node names of its own."""

    root: Path
    conf: Path
    nodes: tuple[str, ...]
    pids: Mapping[str, int]
    _daemons: tuple[_Daemon, ...] = field(repr=False, compare=False)

    @classmethod
    def start(cls, nodes: tuple[str, ...] = NODES, *, min_job_age: int = MIN_JOB_AGE_S) -> SlurmCluster:
        """A new cluster of ``nodes`` once they are all idle; :class:`StartFailed` (with the
        daemons' last log lines) if not within :data:`READY_S`; slurmctld forgets an ended job
        ``min_job_age`` seconds after its end. Another cluster may have nodes of
        the same names (its job ids start elsewhere), yet names of its own keep even each node's
        cgroup (``slurm_<node>``) apart."""
        tools = _require_host()
        root = _new_root()
        paths = _Paths(root)
        daemons: list[_Daemon] = []
        try:
            _write_munge_key(paths)
            _write_config(paths, nodes, tools["slurmd"], min_job_age)
            environ = _daemon_environ()
            # munged runs as the munge user, as a site runs it (it would run as root too), and owns the
            # key, socket, pid and seed files. In the foreground it logs to its output, never to a log file.
            daemons.append(_spawn("munged", [tools["setpriv"], "--pdeathsig", "TERM", "--reuid", _MUNGE_USER,
                                             "--regid", _MUNGE_USER, "--clear-groups", "--", tools["munged"],
                                             "--foreground", f"--key-file={paths.munge_key}",
                                             f"--socket={paths.munge_socket}", f"--pid-file={paths.munge_pid}",
                                             f"--seed-file={paths.munge_seed}"], paths, environ))
            _wait(lambda: paths.munge_socket.is_socket(), daemons, f"munged to make {paths.munge_socket}")
            pdeathsig = [tools["setpriv"], "--pdeathsig", "TERM", "--"]
            daemons.append(_spawn("slurmctld", [*pdeathsig, tools["slurmctld"], "-D", "-c", "-f", str(paths.conf)],
                                  paths, environ))
            for node in nodes:
                daemons.append(_spawn(f"slurmd-{node}", [*pdeathsig, tools["slurmd"], "-D", "-N", node,
                                                         "-f", str(paths.conf)], paths, environ))
            cluster = cls(root=root, conf=paths.conf, nodes=nodes,
                          pids={daemon.name: daemon.process.pid for daemon in daemons}, _daemons=tuple(daemons))
            _wait(lambda: set(cluster.node_states().values()) == {"idle"}, daemons,
                  f"nodes {', '.join(nodes)} to be idle")
        except (StartFailed, OSError, subprocess.SubprocessError) as exc:
            # Read before the directory goes with the daemons.
            failure = f"{exc}\n{_logs_tail(daemons, paths)}"
        except BaseException:
            _stop(root, daemons)
            raise
        else:
            return cluster
        _stop(root, daemons)
        raise StartFailed(failure)

    def stop(self) -> None:
        """Cancel the jobs still there, stop the daemons, remove :attr:`root` (see the module's
        docstring)."""
        _stop(self.root, list(self._daemons))

    @property
    def environ(self) -> dict[str, str]:
        """What a process needs in its environment, added to its own, to reach this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, timeout: float = CLIENT_S) -> subprocess.CompletedProcess[str]:
        """A SLURM client command (``run("sbatch", "--wrap", "true")``) run against this cluster,
        its output captured as text, whatever its exit status. Variables a surrounding job set
        (``SLURM_JOB_ID``…) are left out: they would steer the command to that job."""
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=_client_environ(self.conf),
                              stdin=subprocess.DEVNULL, check=False)

    def node_states(self) -> dict[str, str]:
        """Each node's state as sinfo names it (``idle``, ``mixed``, ``down*``, ``drained``…)."""
        listed = self.run("sinfo", "--noheader", "--Node", "--format=%N %T", timeout=READY_S)
        if listed.returncode != 0:
            return {}
        return dict(line.split(maxsplit=1) for line in listed.stdout.splitlines() if line.strip())

    def down(self, node: str) -> None:
        """Mark ``node`` down, as an operator would; its jobs end NODE_FAIL or are requeued."""
        self._update(node, "state=down", "reason=test")

    def resume(self, node: str) -> None:
        """Return a downed ``node`` to service, once slurmctld has heard from its slurmd again
        (about a second: until then sinfo says ``idle*``, not responding)."""
        if "down" in self.node_states().get(node, "down"):  # ReturnToService=2 may have brought it back already
            self._update(node, "state=resume")
        try:
            _wait(lambda: self.node_states().get(node) in ("idle", "mixed", "allocated"), list(self._daemons),
                  f"node {node} to come back after resume")
        except StartFailed as exc:
            raise AssertionError(f"{exc}\n{self.log_tail()}") from None

    def _update(self, node: str, *settings: str) -> None:
        done = self.run("scontrol", "update", f"nodename={node}", *settings)
        if done.returncode != 0:
            raise AssertionError(f"scontrol update nodename={node} {' '.join(settings)}: {done.stderr.strip()}")

    def shared_dir(self, name: str) -> Path:
        """A directory (0755, root's) under the cluster's "shared filesystem", which every node
        sees at the same path; a job that runs as another user writes in a directory given to it."""
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"a shared directory's name is one path component, not {name!r}")
        directory = _Paths(self.root).shared / name
        directory.mkdir(exist_ok=True)
        directory.chmod(0o755)
        return directory

    def log_tail(self, lines: int = LOG_LINES) -> str:
        """The last ``lines`` of each daemon's log (slurmd's log has slurmstepd's lines too)."""
        return _logs_tail(list(self._daemons), _Paths(self.root), lines)


class StartFailed(Exception):
    """The cluster did not start; the message has the daemons' last log lines."""


# ---------------------------------------------------------------- the fixture
@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """The session's own SLURM cluster (see the module's docstring)."""
    cluster = _SHARED.acquire()
    try:
        yield cluster
    finally:
        _SHARED.release()


_SHARED = Shared("the session's SLURM cluster", SlurmCluster.start, SlurmCluster.stop, StartFailed)


# ---------------------------------------------------------------- the daemons
@dataclass(frozen=True)
class _Daemon:
    name: str
    process: subprocess.Popen[bytes]
    #: What it printed: all it logs (in the foreground it copies its log there), and what it said
    #: before its log file was open (a slurm.conf it refused).
    output: Path


def _spawn(name: str, argv: list[str], paths: _Paths, environ: dict[str, str]) -> _Daemon:
    output = paths.log / f"{name}.out"
    with output.open("wb") as log:
        # Its own session: a Ctrl-C of the test run reaches the tests, and the teardown stops it.
        # Its working directory is the cluster's, which the slurmstepd it starts inherit: the next
        # session tells a killed session's slurmstepd by it.
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                   env=environ, cwd=paths.root, start_new_session=True)
    return _Daemon(name, process, output)


def _wait(done: Callable[[], bool], daemons: list[_Daemon], what: str) -> None:
    deadline = time.monotonic() + READY_S
    while not done():
        for daemon in daemons:
            if daemon.process.poll() is not None:
                raise StartFailed(f"{daemon.name} (pid {daemon.process.pid}) exited with {daemon.process.returncode} "
                                  f"while waiting for {what}")
        if time.monotonic() > deadline:
            raise StartFailed(f"waited {READY_S:g}s for {what}")
        time.sleep(0.05)


def _stop(root: Path, daemons: list[_Daemon]) -> None:
    """Cancel every job while slurmctld runs, give their slurmstepd :data:`JOBS_END_S` to end,
    stop the daemons (slurmd first, munged last) by their pids, kill any slurmstepd left, and
    remove ``root``."""
    controller = next((daemon for daemon in daemons if daemon.name == "slurmctld"), None)
    if controller is not None and controller.process.poll() is None:
        cancelled = subprocess.run(["scancel", f"--partition={PARTITION}"], capture_output=True, text=True,
                                   env=_client_environ(_Paths(root).conf), timeout=CLIENT_S, check=False)
        if cancelled.returncode != 0:
            warnings.warn(f"cancelling the cluster's jobs before stopping it: {cancelled.stderr.strip()}")
        deadline = time.monotonic() + JOBS_END_S
        while _steps_of(root) and time.monotonic() < deadline:
            time.sleep(0.1)
    for daemon in reversed(daemons):
        if daemon.process.poll() is None:
            daemon.process.send_signal(signal.SIGTERM)
            try:
                daemon.process.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                warnings.warn(f"{daemon.name} (pid {daemon.process.pid}) ignored SIGTERM for {STOP_GRACE_S:g}s; killed")
                daemon.process.kill()
                daemon.process.wait()
    left = _steps_of(root)
    if left:
        warnings.warn(f"slurmstepd still running after the cluster stopped; killed with their jobs: pids {left}")
        _kill_steps(left)
    shutil.rmtree(root, ignore_errors=True)
    if root.exists():
        warnings.warn(f"could not remove all of {root}")


# ---------------------------------------------------------------- the host
def _require_host() -> dict[str, str]:
    """The paths of the programs the cluster runs, once root and the munge user are there too."""
    if os.geteuid() != 0:
        raise StartFailed("the SLURM tests start a cluster of their own, whose slurmd runs jobs as other users: "
                          "that needs root (the tests run as root here and on CI)")
    search = f"{os.environ.get('PATH', '')}:{_SEARCH_PATH}"
    tools = {name: shutil.which(name, path=search) for name in ("munged", "slurmctld", "slurmd", "setpriv")}
    missing = [name for name, path in tools.items() if path is None]
    if missing:
        raise StartFailed(f"{', '.join(missing)} not installed: `make slurm` installs Debian's slurm-wlm and munge")
    try:
        pwd.getpwnam(_MUNGE_USER)
    except KeyError:
        raise StartFailed(f"no {_MUNGE_USER} user: `make slurm` installs munge, which adds it") from None
    return {name: path for name, path in tools.items() if path is not None}


def _daemon_environ() -> dict[str, str]:
    """This process's environment without what would steer the daemons elsewhere (a surrounding
    job's SLURM_*, systemd's NOTIFY_SOCKET), with the daemons' directories on PATH."""
    environ = {name: value for name, value in os.environ.items()
               if not name.startswith("SLURM_") and name != "NOTIFY_SOCKET"}
    environ["PATH"] = f"{environ.get('PATH', '')}:{_SEARCH_PATH}".lstrip(":")
    return environ


def _client_environ(conf: Path) -> dict[str, str]:
    return {**_daemon_environ(), "SLURM_CONF": str(conf)}


class _Paths:
    """Where everything of a cluster is, under its ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.owner = root / "owner"
        self.conf = root / "slurm.conf"
        self.cgroup_conf = root / "cgroup.conf"
        self.munge = root / "munge"
        self.munge_key = self.munge / "munge.key"
        self.munge_socket = self.munge / "munge.socket"
        self.munge_pid = self.munge / "munged.pid"
        self.munge_seed = self.munge / "munged.seed"
        self.state = root / "state"
        self.spool = root / "spool"
        self.run = root / "run"
        self.log = root / "log"
        self.shared = root / "shared"

    def pidfiles(self) -> list[Path]:
        return [self.munge_pid, *self.run.glob("*.pid")]


def _new_root() -> Path:
    """A new directory under /tmp, 0755 (jobs of other users traverse it); what killed sessions
    left there is cleaned up first."""
    root = Path(tempfile.mkdtemp(prefix=_PREFIX, dir=_BASE))
    root.chmod(0o755)
    paths = _Paths(root)
    paths.owner.write_text(f"{os.getpid()}\n")
    for directory in (paths.state, paths.spool, paths.run, paths.log, paths.shared):
        directory.mkdir(mode=0o755)
    _sweep(root)
    return root


def _write_munge_key(paths: _Paths) -> None:
    """munged's directory (0755: clients must reach the socket; munged checks) and key (0400), both
    the munge user's."""
    user = pwd.getpwnam(_MUNGE_USER)
    paths.munge.mkdir(mode=0o755)
    os.chown(paths.munge, user.pw_uid, user.pw_gid)
    descriptor = os.open(paths.munge_key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
    with os.fdopen(descriptor, "wb") as key:
        key.write(os.urandom(_MUNGE_KEY_BYTES))
    os.chown(paths.munge_key, user.pw_uid, user.pw_gid)


def _write_config(paths: _Paths, nodes: tuple[str, ...], slurmd: str, min_job_age: int) -> None:
    """slurm.conf and cgroup.conf (read from slurm.conf's directory): see the module's docstring."""
    host = socket.gethostname().split(".")[0]
    hardware = _hardware(slurmd)
    memory = min(NODE_MEMORY_MB, int(hardware.pop("RealMemory")) // 2)
    controller_port, *node_ports = _free_ports(1 + len(nodes))
    for node in nodes:
        (paths.spool / node).mkdir(mode=0o755)
    topology = " ".join(f"{name}={value}" for name, value in hardware.items())
    node_lines = [f"NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} {topology} "
                  f"RealMemory={memory} State=UNKNOWN" for node, port in zip(nodes, node_ports, strict=True)]
    paths.conf.write_text("\n".join([
        "ClusterName=tao",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={controller_port}",
        "SlurmUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={paths.munge_socket}",
        f"StateSaveLocation={paths.state}",
        f"SlurmdSpoolDir={paths.spool}/%n",
        f"SlurmctldPidFile={paths.run}/slurmctld.pid",
        f"SlurmdPidFile={paths.run}/slurmd-%n.pid",
        # slurmstepd logs here (slurmctld and slurmd print theirs in the foreground).
        f"SlurmdLogFile={paths.log}/slurmd-%n.log",
        "ProctrackType=proctrack/cgroup",
        "TaskPlugin=task/cgroup",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/filetxt",
        f"JobCompLoc={paths.log}/jobcomp.txt",
        f"FirstJobId={random.randrange(1000, 60_000_000)}",
        f"MinJobAge={min_job_age}",
        f"KillWait={KILL_WAIT_S}",
        "SchedulerType=sched/backfill",
        # A batch job is scheduled when submitted, not up to 3 s later (the default delay, for sites
        # that take thousands of submissions a second).
        "SchedulerParameters=batch_sched_delay=0",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        f"DefMemPerCPU={DEF_MEM_PER_CPU_MB}",
        "ReturnToService=2",
        "MpiDefault=none",
        "SlurmdTimeout=30",
        "InactiveLimit=0",
        "Waittime=0",
        # No mail is sent; without a program that exists slurmctld logs an error at every start.
        "MailProg=/bin/true",
        *node_lines,
        (f"PartitionName={PARTITION} Nodes={','.join(nodes)} Default=YES MaxTime=INFINITE State=UP "
         f"OverSubscribe=FORCE:{OVERSUBSCRIBE}"),
        ""]))
    paths.cgroup_conf.write_text("CgroupPlugin=cgroup/v1\nConstrainCores=no\nConstrainRAMSpace=yes\n"
                                 "ConstrainSwapSpace=yes\n")


def _hardware(slurmd: str) -> dict[str, str]:
    """This host as slurmd sees it (``slurmd -C``): CPUs, boards, sockets, cores, threads,
    RealMemory. A node that claims more than slurmd finds is drained; one that claims exactly that
    is not."""
    found = subprocess.run([slurmd, "-C"], capture_output=True, text=True, check=True, timeout=CLIENT_S)
    fields = dict(item.split("=", 1) for item in found.stdout.splitlines()[0].split())
    return {name: fields[name] for name in ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore",
                                            "RealMemory")}


def _free_ports(count: int) -> list[int]:
    """``count`` TCP ports nothing listens on now (bound together, so distinct, then let go for
    the daemons to take)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _logs_tail(daemons: list[_Daemon], paths: _Paths, lines: int = LOG_LINES) -> str:
    parts = [f"--- {daemon.name}'s output, its last {lines} lines ---\n{_tail(daemon.output, lines)}"
             for daemon in daemons]
    parts += [f"--- {log.name}, its last {lines} lines ---\n{_tail(log, lines)}"
              for log in sorted(paths.log.glob("slurmd-*.log"))]
    return "\n".join(parts)


def _tail(path: Path, lines: int) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"(unreadable: {exc})"
    return "\n".join(text.splitlines()[-lines:])


# ---------------------------------------------------------------- cleanup
def _sweep(current: Path) -> None:
    """Clean up after sessions that were killed: a directory whose owner (the test process that
    made it) and daemons (their pidfiles) are all gone; one without an owner may be being made
    now, and stays. The slurmstepd it left are killed with their jobs before it is removed."""
    for root in _BASE.glob(f"{_PREFIX}*"):
        paths = _Paths(root)
        if root == current or not root.is_dir() or not paths.owner.exists():
            continue
        if any(_alive(pidfile) for pidfile in (paths.owner, *paths.pidfiles())):
            continue
        _kill_steps(_steps_of(root))
        shutil.rmtree(root, ignore_errors=True)


def _steps_of(root: Path) -> list[int]:
    """The slurmstepd started by a cluster whose directory is ``root``: they work in it, as the
    slurmd that started them did."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() == "slurmstepd" and \
                    Path(os.readlink(entry / "cwd")).is_relative_to(root):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _kill_steps(steps: list[int]) -> None:
    """SIGKILL each slurmstepd and every process of its job: the freezer cgroup proctrack/cgroup put
    the job in (``/slurm_<node>/uid_<uid>/job_<id>``, holding the slurmstepd and its steps)."""
    for step in steps:
        pids = {step}
        try:
            cgroups = Path(f"/proc/{step}/cgroup").read_text().splitlines()
        except OSError:
            continue
        for line in cgroups:
            _, controllers, path = line.split(":", 2)
            if "freezer" in controllers.split(",") and path.startswith("/slurm_"):
                for procs in Path("/sys/fs/cgroup/freezer", path.lstrip("/")).rglob("cgroup.procs"):
                    pids.update(int(pid) for pid in procs.read_text().split())
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _alive(pidfile: Path) -> bool:
    """Whether the process ``pidfile`` names runs (a missing or unreadable file names none)."""
    try:
        return running(int(pidfile.read_text().strip()))
    except (OSError, ValueError):
        return False


def running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not ended: a dead daemon's parent may not have reaped
    it yet (a killed session's daemons are reparented to an init that may be slow to)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # The state follows the command's name, which is in parentheses and may hold any character.
    return stat[stat.rindex(")") + 2] != "Z"
