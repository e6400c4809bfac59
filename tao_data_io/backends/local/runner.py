"""What the supervisor does for one job: the verify probe in a frame, then — only if it passed —
the ranks, then the record of how they ended.

Why in this order, in one process: the command must never start on inputs the frame cannot
read, and every outcome must be written down by someone who saw it (status, logs and cancel run
later, in other processes, and read only the run directory).

* **Binds.** Every source is opened once and must be the very object submit checked; a swapped
  one fails the verdict and nothing runs (:mod:`tao_data_io.launch.binding`). Every frame binds these descriptors.
* **Verify.** The probe script and its checklist go into ``probe/`` in the run directory, bound
  read-only at :data:`~tao_data_io.launch.plan.PROBE_DIR` of a frame identical to the job's (same
  mounts, same results bind, same environment but the credentials, which the probe does not
  need). Its lines become the verdict; then, from *outside*, the persistence token must be in the
  host results directory (it is removed). The verdict is written before anything else happens.
* **Ranks.** One frame per node, rank 0 first; each reports its sandbox's pid 1 through
  bubblewrap's ``--json-status-fd`` and is recorded in ``ranks.json`` at once, so a cancel from
  another process finds it. Output goes to ``rank-<N>.log``. When a rank's command ends, its
  whole frame has ended with it (the command is the frame's pid 1), before anything is recorded;
  when a rank fails the others are ended, as a Kubernetes Indexed Job with ``backoffLimit: 0`` does.
* **Exit.** The first failure (or rank 0's exit) with its signal, or bubblewrap's own error when
  a frame never started, or ``canceled``.

A cancel is a SIGTERM (see :class:`Cancellation`); every frame is then killed through its
sandbox's pid 1 — the kernel ends the whole pid namespace with it — and its bubblewrap.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import FrameType

from ...redaction import Redactor
from ...fs.atomic import atomic_write
from ...launch.binding import SourceChanged, open_checked, open_source
from ...launch.plan import PROBE_DIR
from ...launch.probe import PROBE_SCRIPT, TOKEN_FILE, Verdict, checklist, checklist_text, parse_probe_output, \
    with_persistence
from ...launch.joblog import JobLog, LogWriter
from .process import ProcessId
from ...launch.results_owner import take_back
from .rundir import ExitRecord, Launch, RankProcesses, Ranks, RunDir
from ...launch.seccomp import filter_fd
from ...launch.sources import Bind
from ...launch.sandbox import Host, Namespaces, frame_argv, frame_binds, frame_env, host_system_dirs

#: Signals are 1..64; bubblewrap reports a command killed by signal N as exit code 128 + N.
_SIGNAL_CODES = range(129, 129 + 64)
#: How long rank 0's sandbox may take to write its user namespace maps (it takes milliseconds).
_SETUP_TIMEOUT_S = 30.0
#: How much of a frame's output one copy moves (a pipe's default capacity).
_COPY_BYTES = 1 << 16
#: What of a frame's log is read for bubblewrap's own message when the frame did not start.
_SETUP_LINES = 5
_SETUP_BYTES = 1 << 16


class CancelRequested(Exception):
    """The supervisor got SIGTERM: end every frame and record the job as canceled."""


class Cancellation:
    """SIGTERM means cancel. It is raised at once inside :meth:`interruptible` (around the
    supervisor's ``waitpid``) and otherwise at the next :meth:`check` — so it never lands half-way
    through starting or ending a frame, which could leave one running untracked."""

    def __init__(self) -> None:
        self.requested = False
        #: Set when the run's deadline (``compute_shape.deadline_seconds``) ended it, not a cancel.
        self.deadline: int | None = None
        self._interruptible = False
        signal.signal(signal.SIGTERM, self._on_term)

    def start_deadline(self, seconds: int | None) -> None:
        """End the run as a cancel does once ``seconds`` have passed, recorded as its deadline."""
        if seconds is not None:
            signal.signal(signal.SIGALRM, partial(self._on_deadline, seconds))
            signal.alarm(seconds)

    def _on_deadline(self, seconds: int, signum: int, frame: FrameType | None) -> None:
        self.deadline = seconds
        self._on_term(signum, frame)

    def _on_term(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True
        if self._interruptible:
            raise CancelRequested

    def check(self) -> None:
        if self.requested:
            raise CancelRequested

    @contextmanager
    def interruptible(self) -> Iterator[None]:
        self.check()
        self._interruptible = True
        try:
            yield
        finally:
            self._interruptible = False


class _Output:
    """One frame's output: the pipe its processes write, copied by a thread into the frame's
    capped log (:class:`.joblog.LogWriter`) — never a file the job writes to directly, whose size
    nothing would bound."""

    def __init__(self, log: LogWriter) -> None:
        self.log = log
        read_end, self.write_end = os.pipe()
        self._thread = threading.Thread(target=self._copy, args=(read_end,), name=f"output {log.path.name}",
                                        daemon=True)
        self._thread.start()

    def _copy(self, read_end: int) -> None:
        try:
            while chunk := os.read(read_end, _COPY_BYTES):
                self.log.write(chunk)
        finally:
            os.close(read_end)
            self.log.close()

    def finish(self) -> None:
        """Wait (bounded) until everything the frame printed is in the log: the pipe ends once the
        frame's last process has (a process stuck in the kernel is not waited for past
        :data:`_SETUP_TIMEOUT_S`)."""
        self._thread.join(_SETUP_TIMEOUT_S)


@dataclass
class _Frame:
    rank: int
    proc: subprocess.Popen[bytes]
    #: bubblewrap, this process's child: it stays in /proc until reaped, so it always has an identity.
    bwrap: ProcessId
    output: _Output
    #: The read end of bubblewrap's ``--json-status-fd``, and what was read from it so far.
    status_fd: int
    status: bytes = b""
    sandbox: ProcessId | None = None

    def read_status(self, *, until_eof: bool) -> None:
        """Read the status pipe up to the first document (the sandbox's pid), or to its end."""
        while until_eof or b"\n" not in self.status:
            chunk = os.read(self.status_fd, 4096)
            if not chunk:
                break
            self.status += chunk

    def end_namespace(self) -> None:
        """Kill the frame's pid 1 — the command itself (``--as-pid-1``, see :mod:`.sandbox`) — which
        ends the whole pid namespace, and return once the kernel has (pid 1 is gone only after
        every other process of its namespace). A command that ends by itself needs none of this:
        its exit ends its namespace the same way."""
        if self.sandbox is not None and self.sandbox.signal(signal.SIGKILL):
            _wait_gone(self.sandbox)

    def ended(self) -> ExitRecord:
        """Called once bubblewrap has exited: the command's exit code, or why there was none."""
        self.read_status(until_eof=True)
        os.close(self.status_fd)
        self.output.finish()
        code = self.proc.returncode
        if code < 0:  # bubblewrap itself was killed
            return ExitRecord(rank=self.rank, exit_code=128 - code, signal=-code)
        for line in self.status.splitlines():
            document = json.loads(line)
            if "exit-code" in document:
                exit_code = int(document["exit-code"])
                return ExitRecord(rank=self.rank, exit_code=exit_code,
                                  signal=exit_code - 128 if exit_code in _SIGNAL_CODES else None)
        log = JobLog(self.output.log.path, self.output.log.segment)
        last = [line for line in log.tail(_SETUP_LINES, _SETUP_BYTES).splitlines() if line.strip()][-1:]
        return ExitRecord(rank=self.rank, exit_code=code,
                          setup_error=last[0] if last else f"bubblewrap exited {code} without a message")


class Frames:
    """The frames this supervisor started, so that a cancel or a failed rank can end them all."""

    def __init__(self) -> None:
        self.running: dict[int, _Frame] = {}

    def start(self, argv_for: Callable[..., list[str]], env: Mapping[str, str], log: LogWriter, *, rank: int = 0,
              pass_fds: Sequence[int] = ()) -> _Frame:
        """Start ``argv_for(status_fd=N, seccomp_fd=M)`` (a partial :func:`frame_argv`) with exactly
        ``env``, its output appended to ``log``."""
        status_read, status_write = os.pipe()
        seccomp = filter_fd()  # bubblewrap reads it whole: one per frame
        output = _Output(log)
        try:
            proc = subprocess.Popen(argv_for(status_fd=status_write, seccomp_fd=seccomp), env=dict(env),
                                    stdin=subprocess.DEVNULL, stdout=output.write_end, stderr=subprocess.STDOUT,
                                    pass_fds=(status_write, seccomp, *pass_fds))
        except BaseException:
            os.close(status_read)
            raise
        finally:
            os.close(status_write)
            os.close(seccomp)
            os.close(output.write_end)  # the frame holds it now: the copy ends when the frame does
        bwrap = ProcessId.of(proc.pid)
        assert bwrap is not None, "an unreaped child is always in /proc"
        frame = _Frame(rank=rank, proc=proc, bwrap=bwrap, output=output, status_fd=status_read)
        self.running[proc.pid] = frame
        frame.read_status(until_eof=False)
        first = frame.status.split(b"\n", 1)[0]
        if first:
            frame.sandbox = ProcessId.of(int(json.loads(first)["child-pid"]), parent=proc.pid)
        return frame

    def wait(self, cancel: Cancellation) -> list[ExitRecord]:
        """Wait until every frame has ended, in the order they end; the first failure ends the rest."""
        ended: list[ExitRecord] = []
        while self.running:
            with cancel.interruptible():  # only the wait: a cancel never lands half-way through the bookkeeping
                pid, status = os.waitpid(-1, 0)
            frame = self.running.pop(pid, None)
            if frame is None:
                continue
            frame.proc.returncode = os.waitstatus_to_exitcode(status)
            ended.append(frame.ended())
            if ended[-1].failed:
                self.kill()
        return ended

    def kill(self) -> None:
        """SIGKILL every running frame — its sandbox's pid 1 first, which takes the whole pid
        namespace with it, then its bubblewrap — and reap them."""
        while self.running:
            _, frame = self.running.popitem()
            frame.end_namespace()
            frame.proc.kill()
            frame.proc.wait()
            os.close(frame.status_fd)
            frame.output.finish()


def _wait_gone(process: ProcessId) -> None:
    """Wait (bounded) until ``process`` has ended; a process stuck in the kernel (uninterruptible
    I/O on a dead mount) is not waited for beyond :data:`_SETUP_TIMEOUT_S`."""
    deadline = time.monotonic() + _SETUP_TIMEOUT_S
    while process.alive() and time.monotonic() < deadline:
        time.sleep(0.005)


def supervise(run_path: Path, credentials: Mapping[str, str]) -> int:
    cancel = Cancellation()
    run = RunDir(run_path)
    frames = Frames()
    opened: Mapping[str, int] = {}
    results = ""
    launch: Launch | None = None
    try:
        launch = run.launch()
        assert launch is not None, "submit writes launch.json before it starts the supervisor"
        host = Host(bwrap=launch.bwrap, system=host_system_dirs(), nsenter=launch.nsenter, run_as=launch.run_as)
        cancel.start_deadline(launch.plan.deadline_seconds)
        cancel.check()
        binds = frame_binds(launch.plan, launch.results_host)
        try:
            opened = open_checked(((bind.source, bind.target) for bind in binds), launch.sources)
        except SourceChanged as exc:
            run.write(run.verdict_file, Verdict(ok=False, error=str(exc)))
            return 0
        results = launch.plan.results_dir
        verdict = verify(run, launch, host, frames, cancel, opened)
        run.write(run.verdict_file, verdict)
        if verdict.ok:
            ended = run_ranks(run, launch, host, frames, credentials, cancel, binds, opened)
            _take_back(launch, opened.get(results))
            run.write(run.exit_file, ended)
    except CancelRequested:
        signal.alarm(0)  # decided: a deadline that fires while the frames are ended must not turn a cancel into it
        frames.kill()
        _take_back(launch, opened.get(results))
        run.write(run.exit_file, ExitRecord(exit_code=128 + signal.SIGKILL, signal=signal.SIGKILL,
                                            canceled=cancel.deadline is None, deadline_seconds=cancel.deadline))
    except BaseException as exc:  # noqa: BLE001 - the supervisor's own failure: said (redacted) and recorded as the end
        frames.kill()
        _take_back(launch, opened.get(results))
        redact = Redactor(credentials)
        print(redact(traceback.format_exc()), file=sys.stderr)
        run.write(run.exit_file, ExitRecord(exit_code=1, setup_error=redact(f"the supervisor failed: {exc!r}")))
        return 1
    return 0


def _take_back(launch: Launch | None, results_fd: int | None) -> None:
    """Once every frame has ended: what the job left in its results that could act for it on the
    host is made harmless, and — when the job ran as another user — the results are this
    backend's user's again (:func:`tao_data_io.launch.results_owner.take_back`), each change said in this log. A
    failure here is said and never keeps the job's end from being recorded."""
    if launch is None or results_fd is None:
        return
    try:
        owner = (os.geteuid(), os.getegid()) if launch.run_as is not None else None
        for line in take_back(results_fd, owner):
            print(f"results: {line}", file=sys.stderr)
    except Exception as exc:  # noqa: BLE001 - the end must be recorded whatever this meets
        print(f"results: not taken back: {exc!r}", file=sys.stderr)


def verify(run: RunDir, launch: Launch, host: Host, frames: Frames, cancel: Cancellation,
           opened: Mapping[str, int]) -> Verdict:
    """Run the probe in the job's frame (``opened``: the checked sources, see :mod:`tao_data_io.launch.binding`),
    with the probe's files; the verdict, with the persistence check made from outside."""
    plan = launch.plan
    checks, token = checklist(plan)
    # Readable by the job's user (the probe runs as it); the run directory keeps everyone else out.
    run.probe_dir.mkdir(mode=0o755, exist_ok=True)
    atomic_write(run.probe_dir / "probe.sh", PROBE_SCRIPT.encode(), mode=0o644)
    atomic_write(run.probe_dir / "checklist", checklist_text(checks).encode(), mode=0o644)
    command = ["/bin/sh", f"{PROBE_DIR}/probe.sh", f"{PROBE_DIR}/checklist"]
    probe_fd = open_source(str(run.probe_dir))  # the supervisor's own directory, made just above
    assert probe_fd is not None
    try:
        with_probe = {**opened, PROBE_DIR: probe_fd}
        binds = frame_binds(plan, launch.results_host, str(run.probe_dir))
        frames.start(partial(frame_argv, plan, host, binds, with_probe, command), frame_env(plan),
                     LogWriter(run.probe_log, launch.log_segment),
                     pass_fds=tuple(with_probe.values()))
        [ended] = frames.wait(cancel)
    finally:
        os.close(probe_fd)
    if ended.setup_error is not None:
        return Verdict(ok=False, error=f"the frame could not start: {ended.setup_error}")
    verdict = parse_probe_output(JobLog(run.probe_log, launch.log_segment).text(), checks, ended.exit_code)
    results_fd = opened.get(plan.results_dir)
    seen, detail = ((False, f"the results directory {launch.results_host} is not on this host") if results_fd is None
                    else _token_seen(Path(launch.results_host), results_fd, token))
    return with_persistence(verdict, plan.results_dir, seen, detail)


def _token_seen(results_host: Path, results_fd: int, token: str) -> tuple[bool, str]:
    """Whether the token the probe wrote inside the frame is in the host directory (read through
    the bound directory's descriptor, never following a link, never blocking on a FIFO, never
    reading more than a token's size: the directory is the job's); removes it."""
    path = results_host / TOKEN_FILE
    try:
        fd = os.open(TOKEN_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=results_fd)
    except (FileNotFoundError, NotADirectoryError):
        return False, f"the token written inside the frame is not in {results_host} on this host"
    except OSError as exc:  # ELOOP: a symlink; ENXIO: a socket
        return False, f"{path} is not the token file the probe writes ({exc.strerror})"
    try:
        found = os.read(fd, len(token) + 1).decode(errors="replace") if stat.S_ISREG(os.fstat(fd).st_mode) else None
    finally:
        os.close(fd)
    os.unlink(TOKEN_FILE, dir_fd=results_fd)
    if found != token:
        return False, f"{path} holds another token than the one this probe wrote"
    return True, f"the token written inside the frame was seen in {results_host} on this host"


def run_ranks(run: RunDir, launch: Launch, host: Host, frames: Frames, credentials: Mapping[str, str],
              cancel: Cancellation, binds: Sequence[Bind], opened: Mapping[str, int]) -> ExitRecord:
    """Start one frame per node (``binds`` from the checked sources ``opened``), record each at
    once, and wait for them (see the module docstring)."""
    plan = launch.plan
    recorded: list[RankProcesses] = []
    join: Namespaces | None = None
    join_fds: list[int] = []
    try:
        for rank in range(plan.nodes):
            cancel.check()
            if rank > 0 and not plan.network and join is None:
                frames.kill()  # without rank 0's network no rank can reach it
                return ExitRecord(exit_code=1, rank=rank, setup_error=f"rank 0 ended before rank {rank} could "
                                                                      "join its network namespace")
            frame = frames.start(partial(frame_argv, plan, host, binds, opened, plan.argv, rank=rank, join=join),
                                 frame_env(plan, rank=rank, credentials=credentials),
                                 LogWriter(run.rank_log(rank), launch.log_segment), rank=rank,
                                 pass_fds=(*join_fds, *opened.values()))
            recorded.append(RankProcesses(rank=rank, bwrap=frame.bwrap, sandbox=frame.sandbox))
            run.write(run.ranks_file, Ranks(ranks=recorded))
            if rank == 0 and plan.nodes > 1 and not plan.network:
                join, join_fds = _namespaces_of(frame.sandbox, user=host.run_as is None)
    finally:
        for fd in join_fds:
            os.close(fd)
    ended = frames.wait(cancel)
    return next((end for end in ended if end.failed), None) or next(end for end in ended if end.rank == 0)


def _namespaces_of(sandbox: ProcessId | None, *, user: bool) -> tuple[Namespaces | None, list[int]]:
    """Rank 0's network namespace, and its user namespace when it has one of its own (``user``),
    as descriptors this process holds (so they cannot be another process's by the time a rank
    opens them), once they can be joined; None when rank 0 ended first."""
    if sandbox is None:
        return None, []
    kinds = ("user", "net") if user else ("net",)
    fds = []
    try:
        for kind in kinds:
            fds.append(os.open(f"/proc/{sandbox.pid}/ns/{kind}", os.O_RDONLY | os.O_CLOEXEC))
    except FileNotFoundError:
        pass
    # Checked after opening, so the descriptors are rank 0's.
    if len(fds) < len(kinds) or not _user_namespace_mapped(sandbox):
        for fd in fds:
            os.close(fd)
        return None, []
    paths = [f"/proc/self/fd/{fd}" for fd in fds]
    return Namespaces(user=paths[0] if user else None, net=paths[-1]), fds


def _user_namespace_mapped(sandbox: ProcessId) -> bool:
    """Wait until the sandbox has written its uid and gid maps; False if it ends first.

    bubblewrap reports the sandbox's pid right after clone(), and an unprivileged sandbox writes
    its maps itself a moment later (the gid map last). A rank that joined the user namespace
    before that could not become root in it (nsenter: "setgid failed: Invalid argument")."""
    maps = [Path(f"/proc/{sandbox.pid}/{name}") for name in ("uid_map", "gid_map")]
    deadline = time.monotonic() + _SETUP_TIMEOUT_S
    while sandbox.alive() and time.monotonic() < deadline:
        try:
            if all(path.read_bytes().strip() for path in maps):
                return sandbox.alive()  # the maps read were this very process's
        except (FileNotFoundError, ProcessLookupError):
            return False
        time.sleep(0.001)
    return False
