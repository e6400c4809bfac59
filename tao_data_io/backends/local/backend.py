"""The local backend: each job in bubblewrap frames on this host, run by a detached supervisor.

Why it is the embedded default: it needs no cluster, no image registry and no daemon — only
bubblewrap and user namespaces — yet each job sees what a pod would (see :mod:`tao_data_io.launch.sandbox`), the
verify probe runs inside that frame before the command, and credentials reach the frame the way
a per-job Secret reaches a pod: by value into its environment, never into argv, a file or a log.

On disk, under the run root (:class:`.settings.LocalSettings`: ``run_root``, else
``$TAO_DATA_IO_LOCAL_ROOT``, else ``~/.tao-data-io/local``)::

    <job id>/run/       the run directory (:mod:`.rundir`): records and logs
    <job id>/results/   the results directory, unless the route is a mount
                        (then it is the route's ``$TAO_RESULTS_ROOT/<job id>``)

Every call but ``submit`` reads only the run directory, so any process on this host — a later
CLI call, a restarted Prefect worker — can follow a job submitted by another.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path

from ...credentials import forwarded_values
from ...errors import BackendError, UsageError
from ...fs.locks import file_lock
from ...fs.temp import remove_if_exists
from ...launch.backend import (DEFAULT_VERIFY_TIMEOUT_S, TAIL_BYTES, FailureAnalysis, JobDocuments, JobStatus, LogChunk,
                               Submission, Waits, polls)
from ...launch.plan import LaunchPlan
from ...launch.rundir import RunRoot
from ...launch.probe import Verdict
from ...tier import ClusterFacts
from ...launch.sources import SourceRules, check_binds, check_paths, host_source_rules
from . import DECLARATION
from .preflight import check_memory_sizes, check_sandbox, host_memory_bytes, needs_nsenter
from .process import ProcessId
from ...launch.results_owner import hand_over_checked
from ...launch.joblog import JobLog, follow, segment_bytes
from .rundir import ExitRecord, Launch, RunDir
from ...launch.run_as import RunAs, run_as
from ...launch.sandbox import FRAME_LANG, FRAME_PATH, Host, frame_binds, host_system_dirs
from .settings import LocalSettings
from .supervisor import credentials_env
from ...launch.tools import BWRAP_INSTALL, NSENTER_INSTALL, find_tool

#: The local backend's own ``backend_ref``: ``local/<job id>``, as records have kept it from the start
#: (the record keeps any printable text; this backend parses its own, :meth:`LocalBackend._run_dir`).
NAMESPACE = "local"
#: How long cancel lets the supervisor end the frames itself before it kills what is left.
CANCEL_GRACE_S = 30.0
_SUPERVISOR_START_TIMEOUT_S = 60.0
#: The directory that holds the ``tao_data_io`` package: the supervisor imports this same code.
_PACKAGE_ROOT_PATH = Path(__file__).resolve().parents[3]
_PACKAGE_ROOT = str(_PACKAGE_ROOT_PATH)
_LOG_LINES_IN_ERRORS = 5


class LocalBackend(RunRoot[RunDir, Launch, LocalSettings]):
    namespace = NAMESPACE
    title = "local"
    run_type = RunDir
    name = LocalSettings.name
    capabilities = DECLARATION.capabilities

    # ------------------------------------------------------------------ before
    def facts(self) -> ClusterFacts:
        """Inputs are staged on this host (tier B) or pre-positioned (tier A): a frame without
        network and without an upload sidecar cannot fetch its own (tier C)."""
        return ClusterFacts(backend=self.name, capabilities=self.capabilities)

    def preflight(self, plan: LaunchPlan, *, documents: JobDocuments | None = None) -> None:
        """``documents`` are not needed: the frame reads what this host staged."""
        if plan.network and not self.settings.allow_network:
            raise UsageError(f"job {plan.job_id} asks for the network (network: true), which this local backend does "
                             "not allow (allow_network is off): drop network from the request, or, if the job may "
                             "reach this host's network, let the backend allow it (allow_network)")
        check_sandbox(Host(bwrap=find_tool("bwrap", BWRAP_INSTALL), system=host_system_dirs(), run_as=self._run_as()))
        if needs_nsenter(plan):
            find_tool("nsenter", NSENTER_INSTALL)
        rules = self._checked_rules(plan)
        check_paths(plan)
        check_memory_sizes(plan, host_memory_bytes())
        check_binds(plan, frame_binds(plan, self._results_host(plan)), rules)

    def _source_rules(self, plan: LaunchPlan) -> SourceRules:
        """What no pre-positioned source may show (:func:`~tao_data_io.launch.sources.host_source_rules`):
        the code the supervisor imports is what runs outside every frame."""
        return host_source_rules(plan, self.run_root, _PACKAGE_ROOT_PATH)

    # ------------------------------------------------------------------ submit
    def submit(self, plan: LaunchPlan, *, environ: Mapping[str, str] | None = None,
               documents: JobDocuments | None = None) -> Submission:
        credentials = forwarded_values(plan.forward_env, environ)  # a missing one fails before anything exists
        bwrap = find_tool("bwrap", BWRAP_INSTALL)
        nsenter = find_tool("nsenter", NSENTER_INSTALL) if needs_nsenter(plan) else None
        user = self._run_as()
        rules = self._checked_rules(plan)
        # 0700 whoever made the job's directory (staging, on the command line): the results below are
        # the job's user's and this backend's alone.
        run, ref = self._open_run(plan, mode=0o700)
        with file_lock(run.lock):
            existing = self._resubmitted(run, plan)
            if existing is not None:
                return Submission(backend_ref=ref, started=False, restored=existing.restored)
            results_host = self._results_host(plan)
            restored = self._ready_results(plan, results_host, user.uid if user is not None else None, environ)
            sources = check_binds(plan, frame_binds(plan, results_host), rules)
            if user is not None:
                hand_over_checked(sources[plan.results_dir], user.uid, user.gid)
            run.write(run.launch_file, Launch(plan=plan, results_host=results_host, bwrap=bwrap, nsenter=nsenter,
                                              run_as=user, log_segment=segment_bytes(self.settings.log_limit),
                                              submitted_at=datetime.now(timezone.utc), sources=sources,
                                              restored=restored))
            try:
                self._start_supervisor(run, credentials)
            except BaseException:
                remove_if_exists(run.launch_file)  # nothing runs: a retry may start it
                raise
        return Submission(backend_ref=ref, restored=restored)

    def _run_as(self) -> RunAs | None:
        return run_as(self.settings.run_as_user, self.settings.run_as_group)

    def _start_supervisor(self, run: RunDir, credentials: Mapping[str, str]) -> None:
        """Start the supervisor and wait until it has detached and is on record (see
        :mod:`.supervisor`); its environment is built, never inherited, and carries the credentials."""
        env = {"PATH": FRAME_PATH, "LANG": FRAME_LANG, "PYTHONPATH": _PACKAGE_ROOT, **credentials_env(credentials)}
        argv = [sys.executable, "-m", f"{__package__}.supervisor", str(run.path)]
        try:
            with open(run.supervisor_log, "ab") as log:
                done = subprocess.run(argv, env=env, cwd=run.path, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                      start_new_session=True, timeout=_SUPERVISOR_START_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise BackendError(f"the supervisor of {run.path} did not detach within {_SUPERVISOR_START_TIMEOUT_S:g}s",
                               retryable=True) from None
        if done.returncode != 0:
            said = JobLog(run.supervisor_log, None).tail(_LOG_LINES_IN_ERRORS, TAIL_BYTES).strip()
            raise BackendError(f"the supervisor of {run.path} did not start (exit code {done.returncode}): {said}")

    def waits(self, plan: LaunchPlan) -> Waits:
        """``submit`` waits for the supervisor to detach — after restoring an earlier attempt's
        results, a transfer with no bound of time; ``verify`` for the verdict, then for the cancel
        of a job whose verdict never came (SIGTERM, SIGKILL, the frames: a grace each)."""
        return Waits(submit=None if plan.restore_from is not None else _SUPERVISOR_START_TIMEOUT_S,
                     verify=DEFAULT_VERIFY_TIMEOUT_S + 3 * CANCEL_GRACE_S)

    # ------------------------------------------------------------------ follow
    def verify(self, ref: str, plan: LaunchPlan, *, timeout: float = DEFAULT_VERIFY_TIMEOUT_S) -> Verdict:
        """Wait for the verdict the supervisor writes; on timeout the job is canceled, so a failed
        verdict always means the command never started and nothing is left running."""
        run = self._known(ref)
        if run is None:
            raise UsageError(f"{ref} is not known to the local backend under {self.run_root}; submit it first")
        for _ in polls(timeout):
            alive = _alive(run.supervisor())  # before the records: a dead supervisor's records are final
            verdict = run.verdict()
            if verdict is not None:
                return verdict
            ended = run.exit()
            if ended is not None:
                return Verdict(ok=False, error="the job was canceled before its verdict" if ended.canceled
                               else ended.setup_error or "the job ended before its verdict")
            if not alive:
                return Verdict(ok=False, error=f"the supervisor ended before its verdict; see {run.supervisor_log}")
        self.cancel(ref)
        return Verdict(ok=False, error=f"no verdict within {timeout:g}s; the job was canceled")

    def logs(self, ref: str, tail: int | None = None) -> str:
        """The command's output as kept (:mod:`tao_data_io.launch.joblog`: within the target's ``log_limit``); each
        line prefixed ``[rank N]`` when there are several ranks (``tail`` lines per rank, as
        ``kubectl logs -l … --tail`` gives per pod, from at most :data:`TAIL_BYTES` each)."""
        run = self._known(ref)
        if run is None:
            raise UsageError(f"{ref} is not known to the local backend under {self.run_root}")
        launch = run.launch()
        assert launch is not None
        logs = [JobLog(run.rank_log(rank), launch.log_segment) for rank in range(launch.plan.nodes)]
        said = [log.text() if tail is None else log.tail(tail, TAIL_BYTES) for log in logs]
        if launch.plan.nodes == 1:
            return said[0]
        return "".join(f"[rank {rank}] {line}\n" for rank, text in enumerate(said) for line in text.splitlines())

    def follow_logs(self, ref: str, cursor: str | None) -> LogChunk:
        """What each rank printed since ``cursor`` (:func:`~tao_data_io.launch.joblog.follow`: a
        byte offset per rank's log, which lives in the run directory, out of the job's reach)."""
        run = self._known(ref)
        if run is None:
            raise UsageError(f"{ref} is not known to the local backend under {self.run_root}")
        launch = run.launch()
        assert launch is not None
        ended = run.exit() is not None  # read first: what a look finds after it is all there is
        return follow([JobLog(run.rank_log(rank), launch.log_segment) for rank in range(launch.plan.nodes)],
                      cursor, ended=ended)

    # ------------------------------------------------------------------ cancel
    def cancel(self, ref: str) -> bool:
        """Ask the supervisor to end every frame (SIGTERM) and wait for it; whatever is still
        there after :data:`CANCEL_GRACE_S` — or whatever a vanished supervisor left — is killed.
        Of a job that has ended, only what its frames left running is ended (the supervisor ends
        each frame with its command; one that died in between leaves them): its end stands."""
        run = self._known(ref)
        if run is None:
            return False
        with file_lock(run.lock):
            verdict = run.verdict()
            if run.exit() is not None or (verdict is not None and not verdict.ok):
                return _end(_frame_processes(run))
            run.ask_cancel()
        supervisor = run.supervisor()
        running = _alive(supervisor) or any(process.alive() for process in _frame_processes(run))
        if supervisor is not None:
            for signum in (signal.SIGTERM, signal.SIGKILL):  # SIGKILL only if it did not end in the grace time
                if supervisor.signal(signum):
                    _wait_until_ended([supervisor], CANCEL_GRACE_S)
        _end(_frame_processes(run))  # final now: the supervisor, which writes it, is gone
        return running

    # ------------------------------------------------------------------ helpers
    def _outcome(self, run: RunDir, *, locked: bool = False) -> tuple[JobStatus, FailureAnalysis | None]:
        alive = _alive(run.supervisor())  # before the records: a dead supervisor's records are final
        ended = run.exit()
        verdict = run.verdict()
        if ended is not None:
            return _ended(ended, run)
        if verdict is not None and not verdict.ok:
            analysis = FailureAnalysis(err_class="ERR_INFRA", reason=verdict.describe(),
                                       suggestion="the command never started: make every path the verdict names "
                                                  "readable (stage the inputs again, fix a mount's source, make the "
                                                  "results directory writable) and submit again")
            return JobStatus(state="ERROR", message=verdict.describe(), err_class="ERR_INFRA"), analysis
        if alive:
            ranks = run.ranks()
            if ranks is not None:
                return JobStatus(state="RUNNING", message=f"{len(ranks.ranks)} rank(s) started"), None
            return JobStatus(state="PENDING", message="verifying inside the frame" if verdict is None
                             else "verified inside the frame; starting"), None
        if run.canceled() is not None:
            return JobStatus(state="CANCELED", message="canceled"), None
        analysis = FailureAnalysis(err_class="ERR_INFRA", reason="the supervisor ended without recording how the "
                                                                 "job ended", suggestion=f"read {run.supervisor_log}; "
                                   "then submit again under a new job id")
        return JobStatus(state="ERROR", message=analysis.reason, err_class="ERR_INFRA"), analysis


def _ended(ended: ExitRecord, run: RunDir) -> tuple[JobStatus, FailureAnalysis | None]:
    """The state and analysis of a job whose supervisor recorded how it ended."""
    if ended.canceled:
        return JobStatus(state="CANCELED", message="canceled", exit_code=ended.exit_code), None
    if ended.deadline_seconds is not None:
        analysis = FailureAnalysis.deadline_passed(ended.deadline_seconds)
        return JobStatus(state="ERROR", message=analysis.reason, exit_code=ended.exit_code,
                         err_class=analysis.err_class), analysis
    if ended.setup_error is not None:
        analysis = FailureAnalysis(err_class="ERR_INFRA", reason=f"the frame did not start: {ended.setup_error}",
                                   suggestion="run the backend's preflight on this host; it says what bubblewrap "
                                              "lacks")
        return JobStatus(state="ERROR", message=analysis.reason, err_class="ERR_INFRA"), analysis
    if ended.exit_code == 0:
        return JobStatus(state="COMPLETE", message="exit code 0", exit_code=0), None
    launch = run.launch()
    who = f"rank {ended.rank}" if launch is not None and launch.plan.nodes > 1 else "the command"
    code = f"exit code {ended.exit_code}"
    if ended.signal == signal.SIGKILL:
        analysis = FailureAnalysis(err_class="ERR_INFRA", reason=f"{who} was killed ({code}, SIGKILL): killed, "
                                   "possibly out of memory", suggestion="lower the batch size or the data loader "
                                   "workers, or run where there is more memory; the kernel log (dmesg) names OOM kills")
    else:
        by = f", signal {signal.Signals(ended.signal).name}" if ended.signal is not None else ""
        analysis = FailureAnalysis(err_class="ERR_PROGRAM", reason=f"{who} failed ({code}{by})",
                                   suggestion="read the last lines of the job's log")
    return JobStatus(state="ERROR", message=analysis.reason, exit_code=ended.exit_code,
                     err_class=analysis.err_class), analysis


def _alive(process: ProcessId | None) -> bool:
    return process is not None and process.alive()


def _frame_processes(run: RunDir) -> list[ProcessId]:
    """Every recorded rank's sandbox pid 1 (killing it ends the rank's pid namespace) and bubblewrap."""
    ranks = run.ranks()
    found: list[ProcessId] = []
    for rank in ranks.ranks if ranks is not None else []:
        found += [process for process in (rank.sandbox, rank.bwrap) if process is not None]
    return found


def _end(processes: list[ProcessId]) -> bool:
    """SIGKILL each of ``processes`` still running and wait (bounded) until they have ended;
    whether any was running."""
    running = [process for process in processes if process.signal(signal.SIGKILL)]
    _wait_until_ended(running, CANCEL_GRACE_S)
    return bool(running)


def _wait_until_ended(processes: list[ProcessId], timeout: float) -> None:
    for _ in polls(timeout):
        if not any(process.alive() for process in processes):
            return
