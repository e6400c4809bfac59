"""The SLURM backend: each job a batch job of the target's cluster, submitted from this host (a
login node, where the Prefect worker runs), its ranks one task per node.

Why it exists: TAO on HPC clusters runs under SLURM, on a shared filesystem (Lustre), never
fetching from S3 inside the allocation. So inputs are staged (or pre-positioned) by this host on
the shared filesystem, the job reads them there, its results stay there, and ``collect`` uploads
them from this host; no credential reaches the job unless the request forwards one, and then
only by name (``sbatch --export``). What the tools users pick today get wrong is done here: the
training's own exit status (never a wrapper's), per-rank exit codes and logs, the state read
from every source SLURM has (queue, controller, accounting) and, once it forgets, from our own
records; a cancel that is a cancel.

On the shared filesystem, under the run root (:class:`.settings.SlurmSettings`)::

    <job id>/run/       the run directory (:mod:`.rundir`, :mod:`.script`)
    <job id>/results/   the results directory, unless the route is a mount

Every call but ``submit`` reads the run directory and asks SLURM, so any process on a host of
the cluster — a later CLI call, a restarted Prefect worker — can follow a job submitted by another.
"""

from __future__ import annotations

import math
import os
import secrets
import signal
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path

from ...credentials import forwarded_values
from ...errors import BackendError, UsageError
from ...fs.atomic import atomic_write
from ...fs.locks import file_lock
from ...fs.reading import read_job_file
from ...launch.backend import (DEFAULT_VERIFY_TIMEOUT_S, TAIL_BYTES, FailureAnalysis, JobDocuments, JobStatus,
                               LogChunk, Submission, Waits, by_signal, error_status, polls, program_failed)
from ...launch.joblog import JobLog, follow
from ...launch.plan import LaunchPlan
from ...launch.rundir import RunRoot
from ...launch.probe import (PROBE_SCRIPT, TOKEN_FILE, Verdict, checklist, checklist_text, parse_probe_output,
                             ranks_verdict, remove_token, with_persistence)
from ...launch.results_owner import hand_over_checked, take_back_results
from ...launch.sandbox import Host, host_system_dirs
from ...launch.seccomp import filter_fd
from ...launch.sources import (Bind, SourceRules, check_binds, check_paths, host_source_rules,
                               plan_binds)
from ...launch.tools import BWRAP_INSTALL, find_tool
from ...launch.users import job_ids
from ...tier import ClusterFacts
from . import DECLARATION
from .commands import Slurm
from .rundir import Ended, Launch, RunDir
from .script import (BATCH_FILE, CANCEL, CHECKLIST_FILE, DEADLINE_EXIT, FRAME_AGENT, FRAME_CONTROL, FRAME_REPORT, GO,
                     OVER, PROBE_FILE, RANK_FILE, SECCOMP_FILE, STOP, TOKEN_PLACEHOLDER, TOKEN_VARIABLE, batch_script,
                     rank_script)
from .settings import SlurmSettings

#: The SLURM backend's ``backend_ref``: ``slurm/<job id>``.
NAMESPACE = "slurm"
#: The code this process runs: a job may never write it.
_PACKAGE_ROOT = Path(__file__).resolve().parents[3]
#: How much of a probe's output a rank's report may hold (each check is a line).
_PROBE_BYTES = 4 * 1024 * 1024
#: How much of each rank's log's end is searched for slurmstepd's word of an OOM kill.
_OOM_WINDOW = 64 * 1024
_OOM_WORDS = (b"oom-kill event", b"oom_kill event", b"out-of-memory")
_LOG_LINES_IN_ERRORS = 5
#: How often a wait asks slurmctld about a job (``scontrol``), at most: one daemon serves the whole
#: cluster, and a job's own files say most of what a wait looks for.
_STATE_EVERY_S = 1.0
#: How long a job may take to end after ``scancel`` (SLURM's ``KillWait`` and the kill), beyond the grace.
_SCANCEL_WAIT_S = 120
#: The environment variables SLURM's commands read as their own options: never a forwarded name.
_SLURM_PREFIXES = ("SBATCH_", "SLURM_", "SRUN_", "SALLOC_", "SLURMD_", "SPANK_", "PMI_", "PMIX_")
#: The most of a rank's log one look at it whole reads: SLURM keeps each rank's log on the shared
#: filesystem with no limit of its own, so a whole log is its last this many bytes.
_WHOLE_LOG_BYTES = 64 * 1024 * 1024
#: SLURM's states of a job that will not run again (``squeue``'s and ``scontrol``'s names).
_ENDED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL",
                    "DEADLINE", "PREEMPTED", "SPECIAL_EXIT", "REVOKED"})
#: States of a job that waits to run (again): in the queue, held, or requeued after a node failure.
_WAITING = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD",
                      "SUSPENDED", "STOPPED", "RESIZING"})
#: The exit statuses of a rank that was ended by a signal SLURM sent (another rank failed, a cancel).
_STOPPED_CODES = (128 + signal.SIGTERM, 128 + signal.SIGKILL)


class SlurmBackend(RunRoot[RunDir, Launch, SlurmSettings]):
    namespace = NAMESPACE
    title = "SLURM"
    run_type = RunDir
    name = SlurmSettings.name
    capabilities = DECLARATION.capabilities

    def __init__(self, settings: SlurmSettings) -> None:
        super().__init__(settings)
        self.slurm = Slurm(self.settings.slurm_conf)

    # ------------------------------------------------------------------ before
    def facts(self) -> ClusterFacts:
        """Inputs are staged by this host onto the shared filesystem or pre-positioned there: a job
        never fetches or uploads inside the allocation."""
        return ClusterFacts(backend=self.name, capabilities=self.capabilities)

    def preflight(self, plan: LaunchPlan, *, documents: JobDocuments | None = None) -> None:
        """Everything that can be refused before anything exists: the network, whom the job runs
        as, how its ranks run, that every path is on the shared filesystem and may be bound, and
        that the cluster answers."""
        self._refuse_network(plan)
        self._ids()
        self._host()
        rules = self._checked_rules(plan)
        check_paths(plan)
        binds = plan_binds(plan, self._results_host(plan))
        self._check_request(plan, binds)
        self._check_shared(plan, binds)
        check_binds(plan, binds, rules)
        self._check_cluster()

    def _check_cluster(self) -> None:
        """The cluster answers from this host, and has what the target's runtime needs."""
        conf = self.settings.slurm_conf
        if conf and not os.path.isfile(conf):
            raise UsageError(f"slurm_conf {conf!r} is not a file on this host: give the cluster's slurm.conf (scontrol "
                             "show config prints its path on a host that reaches the cluster), or leave slurm_conf "
                             "empty for $SLURM_CONF")
        pinged = self.slurm.run(["scontrol", "ping"], check=False)
        if pinged.returncode != 0:
            said = (pinged.stderr.strip() or pinged.stdout.strip())[-500:]
            if conf and any(word in said.lower() for word in ("parse", "configuration", "clustername", "s_p_parse")):
                raise UsageError(f"slurm_conf {conf!r} is no slurm.conf SLURM's commands can read ({said}): give the "
                                 "cluster's slurm.conf, or leave slurm_conf empty for $SLURM_CONF")
            raise BackendError(f"the cluster does not answer from this host (scontrol ping: {said}): is slurmctld up?",
                               retryable=True)
        if self.settings.container_runtime == "pyxis" and not self.slurm.has_pyxis():
            raise UsageError("container_runtime is pyxis, but srun on this host has no container-image option (pyxis, "
                             "NVIDIA's SPANK plugin, is not in the cluster's plugstack.conf here): install pyxis and "
                             "enroot, or set the target's container_runtime to bubblewrap or none")

    def waits(self, plan: LaunchPlan) -> Waits:
        """``submit`` may restore an earlier attempt's results (a transfer with no bound of time);
        ``verify`` waits for the job to leave the queue — for as long as the cluster is busy —
        and only then for its verdict."""
        return Waits(submit=None, verify=None)

    def _refuse_network(self, plan: LaunchPlan) -> None:
        if plan.network and not self.settings.allow_network:
            raise UsageError(f"job {plan.job_id} asks for the network (network: true), which this SLURM target does "
                             "not allow (allow_network is off): drop network from the request, or let the target "
                             "allow it (allow_network)")

    def _ids(self) -> tuple[int, int]:
        """Whom the job runs as (:func:`~tao_data_io.launch.users.job_ids`): ``sbatch --uid`` when
        this backend runs as root, never root itself."""
        return job_ids(self.settings.run_as_user, self.settings.run_as_group, "SLURM")

    def _host(self) -> Host | None:
        """How a bubblewrap frame is made on the nodes: this host's bubblewrap and userland, which
        a cluster's nodes share with its login node (one image)."""
        if self.settings.container_runtime != "bubblewrap":
            return None
        return Host(bwrap=find_tool("bwrap", BWRAP_INSTALL), system=host_system_dirs())

    def _source_rules(self, plan: LaunchPlan) -> SourceRules:
        return host_source_rules(plan, self.run_root, _PACKAGE_ROOT)

    def _check_request(self, plan: LaunchPlan, binds: list[Bind]) -> None:
        """What SLURM and the runtime would read otherwise than meant: a forwarded name sbatch or
        srun takes as an option from its environment (``SBATCH_OUTPUT`` would move the batch log,
        overriding the script's own line), a pyxis mount whose path holds pyxis's separators (one
        mount read as two: the second anything the path names), and — without a container — an
        input read at another place than it lies."""
        slurm = sorted(name for name in plan.forward_env if name.startswith(_SLURM_PREFIXES) or name == TOKEN_VARIABLE)
        if slurm:
            raise UsageError(f"forward_env names {', '.join(slurm)}, which SLURM's commands read as their own settings "
                             f"(sbatch takes SBATCH_* over the script's options; {TOKEN_VARIABLE} is the backend's): "
                             "forward credentials under other names")
        runtime = self.settings.container_runtime
        if runtime == "pyxis":
            split = [f"{bind.source} → {bind.target}" for bind in binds
                     if any(mark in bind.source + bind.target for mark in ",:")]
            if split:
                raise UsageError(f"job {plan.job_id} mounts {'; '.join(split[:5])}, whose path holds a comma or a "
                                 "colon, which pyxis's container-mounts option reads as the end of a mount: rename the "
                                 "directory (or its staging root), or use container_runtime bubblewrap")
        if runtime != "none":
            return
        moved = [f"{bind.source} → {bind.target}" for bind in binds if os.path.realpath(bind.source) != bind.target]
        if moved:
            raise UsageError(f"job {plan.job_id} reads {len(moved)} path(s) at another place than they lie on the "
                             f"shared filesystem ({'; '.join(moved[:5])}), which container_runtime none cannot do "
                             "(there is no container to bind them in): set the target's container_runtime to pyxis "
                             "or bubblewrap, or give each input and the results directory their own path as target")

    def _check_shared(self, plan: LaunchPlan, binds: list[Bind]) -> None:
        """Every bind's source lies on the filesystem the nodes share (the run root or one of the
        target's ``shared_roots``): a path only this host has would be missing on the nodes."""
        shared = [self.run_root, *(Path(root) for root in self.settings.shared_roots)]
        shared = [Path(os.path.realpath(root)) for root in shared]
        for bind in binds:
            real = Path(os.path.realpath(bind.source))
            if not any(real == root or root in real.parents for root in shared):
                what = "the staging directory" if bind.root == plan.staging_dir else (
                    "the results directory" if bind.target == plan.results_dir else "a pre-positioned input")
                raise UsageError(f"{what} {bind.source} (for {bind.target}) is not on the filesystem the compute nodes "
                                 f"share with this host (the run root {self.run_root} or shared_roots "
                                 f"{[str(root) for root in shared[1:]]}): the nodes would not find it. Stage into a "
                                 "directory on the shared filesystem, or add its shared directory to the "
                                 "target's shared_roots")

    # ------------------------------------------------------------------ submit
    def submit(self, plan: LaunchPlan, *, environ: Mapping[str, str] | None = None,
               documents: JobDocuments | None = None) -> Submission:
        credentials = forwarded_values(plan.forward_env, environ)  # a missing one fails before anything exists
        self._refuse_network(plan)
        uid, gid = self._ids()
        host = self._host()
        rules = self._checked_rules(plan)
        run, ref = self._open_run(plan, mode=0o711)  # the job's user passes through, never lists
        with file_lock(run.lock):
            existing = self._resubmitted(run, plan)
            if existing is not None:
                if existing.slurm_id is not None or run.ended() is not None:
                    return Submission(backend_ref=ref, started=False, restored=existing.restored)
                found = self.slurm.named(plan.job_id)  # sbatch answered, but its id was never written down
                mine = [job for job in found if self._belongs(job, run)]
                if mine:
                    run.write(run.launch_file, existing.model_copy(update={"slurm_id": mine[0]}))
                    return Submission(backend_ref=ref, started=False, restored=existing.restored)
                self._sbatch(run, existing, credentials)
                return Submission(backend_ref=ref, restored=existing.restored)
            results_host = self._results_host(plan)
            binds = plan_binds(plan, results_host)
            self._check_request(plan, binds)
            self._check_shared(plan, binds)
            restored = self._ready_results(plan, results_host, uid, environ)
            sources = check_binds(plan, binds, rules)
            launch = Launch(plan=plan, results_host=results_host, uid=uid, gid=gid, token=secrets.token_hex(16),
                            submitted_at=datetime.now(timezone.utc), restored=restored)
            self._write_frame(run, launch, binds, host)
            self.slurm.test(str(run.agent / BATCH_FILE))  # before anything is the job's user's
            if os.geteuid() == 0:
                hand_over_checked(sources[plan.results_dir], uid, gid)
                os.chown(run.report, uid, gid)
            run.write(run.launch_file, launch)
            self._sbatch(run, launch, credentials)
        return Submission(backend_ref=ref, restored=restored)

    def _sbatch(self, run: RunDir, launch: Launch, credentials: Mapping[str, str]) -> None:
        """Submit the batch script and write the job id down (the caller holds the lock). A script
        the cluster refuses leaves nothing: the job id is free for a corrected submit."""
        try:
            slurm_id = self.slurm.submit(str(run.agent / BATCH_FILE), {**credentials, TOKEN_VARIABLE: launch.token})
        except UsageError:
            run.launch_file.unlink(missing_ok=True)
            raise
        run.write(run.launch_file, launch.model_copy(update={"slurm_id": slurm_id}))

    def _belongs(self, slurm_id: str, run: RunDir) -> bool:
        """Whether SLURM's job ``slurm_id`` is this run's (its batch script is ours), not another
        run root's job of the same name."""
        job = self.slurm.job(slurm_id)
        return job is not None and job.get("Command") == str(run.agent / BATCH_FILE)

    def _write_frame(self, run: RunDir, launch: Launch, binds: list[Bind], host: Host | None) -> None:
        """The job's directories on the shared filesystem: the agent (scripts, the probe and its
        checklist, the seccomp filter), the control directory, and the report directory the job
        writes (its user's)."""
        plan = launch.plan
        for directory in (run.agent, run.control):
            directory.mkdir(mode=0o755, exist_ok=True)
            os.chmod(directory, 0o755)
        run.report.mkdir(mode=0o700, exist_ok=True)
        checks, _ = checklist(plan, TOKEN_PLACEHOLDER)  # the token itself never lies in a file
        inside = self.settings.container_runtime != "none"
        script = batch_script(plan, self.settings, run.files, binds, host,
                              uid=launch.uid if os.geteuid() == 0 else None,
                              gid=launch.gid if os.geteuid() == 0 else None,
                              wait_seconds=int(DEFAULT_VERIFY_TIMEOUT_S))
        files = {BATCH_FILE: script, PROBE_FILE: PROBE_SCRIPT, CHECKLIST_FILE: checklist_text(checks),
                 RANK_FILE: rank_script(plan, agent=FRAME_AGENT if inside else str(run.agent),
                                        control=FRAME_CONTROL if inside else str(run.control),
                                        report=FRAME_REPORT if inside else str(run.report))}
        for name, text in files.items():
            atomic_write(run.agent / name, text.encode(), mode=0o644)
        if host is not None:
            fd = filter_fd()
            try:
                atomic_write(run.agent / SECCOMP_FILE, _read_all(fd), mode=0o644)
            finally:
                os.close(fd)

    # ------------------------------------------------------------------ verify
    def verify(self, ref: str, plan: LaunchPlan, *, timeout: float = DEFAULT_VERIFY_TIMEOUT_S) -> Verdict:
        """Wait until every rank's probe has reported, judge them with the persistence token seen
        from this host, and give the batch script the word: ``go``, or ``stop`` — so a failed
        verdict always means the command never started. ``timeout`` counts from when the job left
        the queue (a busy cluster's wait is no failure); no verdict by then: the job is canceled. A
        job queued longer than the target's ``pending_timeout`` is canceled too, naming the
        scheduler's reason."""
        run, launch = self._launched(ref)
        deadline = time.monotonic() + timeout
        queued = time.monotonic()
        asked = -math.inf
        for _ in polls(float("inf")):
            verdict = run.verdict()
            if verdict is not None:
                return verdict
            if run.ended() is not None:
                return Verdict(ok=False, error="the job was canceled before its verdict" if run.canceled()
                               else self._outcome(run)[0].message or "the job ended before its verdict")
            reports = [self._report(run, launch.token, rank) for rank in range(launch.plan.nodes)]
            if all(report is not None for report in reports):
                return self._judge(run, launch, [report for report in reports if report is not None])
            if time.monotonic() - asked < _STATE_EVERY_S:  # the reports are files; SLURM is a daemon all share
                continue
            state, asked = self._state(launch), time.monotonic()
            if state is None or state[0] in _ENDED:
                status = self._outcome(run)[0]
                return Verdict(ok=False, error=f"the job ended before its verdict: {status.message or status.state}")
            if state[0] in _WAITING:
                deadline = time.monotonic() + timeout
                waited = self.settings.pending_timeout
                if waited is not None and time.monotonic() - queued >= waited:
                    reason = state[1].get("Reason", "")
                    self.cancel(ref)
                    return Verdict(ok=False, error=f"the job waited in the SLURM queue ({state[0].lower()}"
                                   f"{f', {reason}' if reason and reason != 'None' else ''}) longer than the "
                                   f"target's pending_timeout ({waited:g} s) and was canceled")
            elif time.monotonic() >= deadline:
                break
        self.cancel(ref)
        return Verdict(ok=False, error=f"no verdict within {timeout:g}s of the job's start; the job was canceled")

    def _report(self, run: RunDir, token: str, rank: int) -> tuple[str, int | None] | None:
        """A rank's probe output and exit status, once it wrote them (read as a job's files are)."""
        output = read_job_file(run.report, run.probe_report(token, rank), limit=_PROBE_BYTES)
        if output is None:
            return None
        code = (read_job_file(run.report, run.probe_exit(token, rank), limit=64) or b"").strip()
        return output.decode("utf-8", "replace"), int(code) if code.isdigit() else None

    def _judge(self, run: RunDir, launch: Launch, reports: list[tuple[str, int | None]]) -> Verdict:
        """The job's verdict from every rank's report (``rank N:`` before their details when there
        are several) and the persistence token seen from this host."""
        checks, _ = checklist(launch.plan, launch.token)
        verdicts = [parse_probe_output(output, checks, code) for output, code in reports]
        verdict = ranks_verdict(verdicts)
        token = read_job_file(Path(launch.results_host), TOKEN_FILE, limit=256)
        seen = token == launch.token.encode()
        verdict = with_persistence(verdict, launch.plan.results_dir, seen,
                                   "the token the probe wrote was seen on this host" if seen else
                                   f"the token the probe wrote is not in {launch.results_host} on this host (is it "
                                   "on the shared filesystem?)")
        remove_token(Path(launch.results_host))
        with file_lock(run.lock):
            recorded = run.verdict()
            if recorded is not None:
                return recorded
            if run.canceled() is not None:  # a cancel came first: its stop stands, whatever the probe said
                verdict = Verdict(ok=False, checks=verdict.checks, error="the job was canceled before its verdict")
            run.write(run.verdict_file, verdict)
            _touch(run.control / (GO if verdict.ok else STOP))
        return verdict

    # ------------------------------------------------------------------ follow
    def _state(self, launch: Launch) -> tuple[str, dict[str, str]] | None:
        """SLURM's state of the job and its fields (``scontrol``), from accounting once slurmctld
        has forgotten it; None when neither knows it (forgotten, no accounting)."""
        if launch.slurm_id is None:
            return "PENDING", {"Reason": "being submitted"}
        job = self.slurm.job(launch.slurm_id)
        if job is not None:
            return job.get("JobState", "").split(" ")[0], job
        steps = self.slurm.steps(launch.slurm_id)
        whole = next((step for step in steps or [] if step.id == launch.slurm_id), None)
        if whole is None:
            return None
        return whole.state.split(" ")[0], {"ExitCode": whole.exit_code, "DerivedExitCode": whole.derived}

    def _outcome(self, run: RunDir, *, locked: bool = False) -> tuple[JobStatus, FailureAnalysis | None]:
        """The job's state: from how it ended once it has (kept in ``ended.json``), else from
        SLURM — ending the job here when SLURM says it is over. ``locked``: the caller holds the
        run directory's lock."""
        launch = run.launch()
        assert launch is not None
        ended = run.ended()
        state = None
        if ended is None:
            state = self._state(launch)
            if state is None or state[0] in _ENDED:
                if locked:
                    ended = self._finish_locked(run, launch, state)
                else:
                    with file_lock(run.lock):
                        ended = run.ended() or self._finish_locked(run, launch, state)
        if ended is not None:
            return _ended(ended, run, launch)
        assert state is not None
        name, job = state
        reason = job.get("Reason", "")
        if name in _WAITING or run.verdict() is None and name not in ("RUNNING", "COMPLETING"):
            said = f"{name.lower()} in the SLURM queue" + (f" ({reason})" if reason and reason != "None" else "")
            return JobStatus(state="PENDING", message=said), None
        if run.verdict() is None:
            return JobStatus(state="PENDING", message=f"verifying on {launch.plan.nodes} node(s)"), None
        return JobStatus(state="RUNNING", message=f"{launch.plan.nodes} rank(s) running as SLURM job "
                         f"{launch.slurm_id}"), None

    def _finish_locked(self, run: RunDir, launch: Launch, state: tuple[str, dict[str, str]] | None) -> Ended:
        """Keep how the job ended, once (the caller holds the lock): SLURM's state and exit code,
        each rank's exit status, the ranks whose step saw an OOM kill; and take the results back
        from the job's user."""
        ended = run.ended()
        if ended is not None:
            return ended
        name, job = state if state is not None else ("", {})
        ranks: dict[int, int] = {}
        for rank in range(launch.plan.nodes):
            said = (read_job_file(run.report, run.rank_exit(launch.token, rank), limit=64) or b"").strip()
            if said.isdigit():
                ranks[rank] = int(said)
        oom = [rank for rank in range(launch.plan.nodes) if _oom_said(run.rank_log(rank))]
        ended = Ended(state=name, exit_code=job.get("ExitCode", ""), reason=job.get("Reason", ""), ranks=ranks,
                      oom_ranks=oom, taken_back=take_back_results(Path(launch.results_host)))
        run.write(run.ended_file, ended)
        _touch(run.control / OVER)
        return ended

    def logs(self, ref: str, tail: int | None = None) -> str:
        """Each rank's output as ``srun`` wrote it on the shared filesystem, ``tail`` lines per
        rank when given, each line prefixed ``[rank N]`` when there are several."""
        run, launch = self._launched(ref)
        logs = [JobLog(run.rank_log(rank), None) for rank in range(launch.plan.nodes)]
        said = [log.tail(None, _WHOLE_LOG_BYTES) if tail is None else log.tail(tail, TAIL_BYTES) for log in logs]
        if launch.plan.nodes == 1:
            return said[0]
        return "".join(f"[rank {rank}] {line}\n" for rank, text in enumerate(said) for line in text.splitlines())

    def follow_logs(self, ref: str, cursor: str | None) -> LogChunk:
        """What each rank printed since ``cursor`` (:func:`~tao_data_io.launch.joblog.follow`)."""
        run, launch = self._launched(ref)
        ended = run.ended() is not None
        return follow([JobLog(run.rank_log(rank), None) for rank in range(launch.plan.nodes)], cursor, ended=ended)

    # ------------------------------------------------------------------ cancel
    def cancel(self, ref: str) -> bool:
        """Stop the job: its ranks get SIGTERM and ``cancel_grace_seconds`` to end (to save a
        checkpoint), then SLURM ends it; the job is recorded CANCELED with its logs kept. True if
        something was running or waiting; a job that has ended keeps its end."""
        with self._canceling(ref) as known:
            if known is None:
                return False
            run, launch = known
            _touch(run.control / CANCEL)  # each rank hands its command SIGTERM and lets it end
            if run.verdict() is None:
                _touch(run.control / STOP)
        state = self._state(launch)
        alive = state is not None and state[0] not in _ENDED
        if alive and launch.slurm_id is not None:
            if state is not None and state[0] == "RUNNING" and run.verdict() is not None:
                self._ended_within(launch, self.settings.cancel_grace_seconds)  # the command's grace
            self.slurm.cancel(launch.slurm_id)
            if not self._ended_within(launch, self.settings.cancel_grace_seconds + _SCANCEL_WAIT_S):
                raise BackendError(f"SLURM job {launch.slurm_id} still runs after scancel and "
                                   f"{self.settings.cancel_grace_seconds + _SCANCEL_WAIT_S:g}s: is slurmd on its node "
                                   "up? Cancel again once it has ended (scontrol show job)", retryable=True)
        with file_lock(run.lock):
            self._finish_locked(run, launch, self._state(launch))
        return alive

    def _ended_within(self, launch: Launch, timeout: float) -> bool:
        """Whether SLURM says the job has ended within ``timeout``, asked every
        :data:`_STATE_EVERY_S` at most: slurmctld serves every user of the cluster."""
        deadline = time.monotonic() + timeout
        while True:
            state = self._state(launch)
            if state is None or state[0] in _ENDED:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(_STATE_EVERY_S, left))


def _ended(ended: Ended, run: RunDir, launch: Launch) -> tuple[JobStatus, FailureAnalysis | None]:
    """The state and analysis of a job that has ended (docs/slurm.md's table)."""
    plan = launch.plan
    if run.canceled() is not None:
        return JobStatus(state="CANCELED", message="canceled"), None
    verdict = run.verdict()
    if verdict is not None and not verdict.ok:
        return error_status("ERR_INFRA", verdict.describe(), "the command never started: make every path the "
                            "verdict names readable from the compute nodes (stage the inputs again, fix a mount's "
                            "source, make the results directory writable) and submit again")
    state = ended.state
    if state == "TIMEOUT":
        analysis = FailureAnalysis.deadline_passed(plan.deadline_seconds)
        return JobStatus(state="ERROR", message=analysis.reason, err_class=analysis.err_class), analysis
    if state in ("NODE_FAIL", "BOOT_FAIL"):
        return error_status("ERR_INFRA", f"a node of the job failed (SLURM: {state}{_reason(ended)})",
                            "submit again (a next attempt restores the results uploaded so far); ask the cluster's "
                            "admins about the node (sinfo -R)")
    if state == "PREEMPTED":
        return error_status("ERR_INFRA", "the job was preempted by a job of higher priority and not requeued",
                            "submit again, or to a partition or QOS that does not preempt")
    if state == "CANCELLED":
        return error_status("ERR_INFRA", f"the job was canceled outside tao-data-io (scancel, or an administrator"
                            f"{_reason(ended)})", "submit again if it should run")
    if verdict is None:
        said = _tail(run.batch_log())
        return error_status("ERR_INFRA", f"the job ended before its verdict (SLURM: {state or 'forgotten'})" +
                            (f": {said}" if said else ""), "read the job's batch log (" + str(run.batch_log()) + ")")
    failed = [rank for rank, code in sorted(ended.ranks.items()) if code != 0 and code not in _STOPPED_CODES]
    failed = failed or [rank for rank, code in sorted(ended.ranks.items()) if code != 0]
    if state == "OUT_OF_MEMORY" or (failed and failed[0] in ended.oom_ranks) or (not failed and state == "FAILED"
                                                                                 and ended.oom_ranks):
        who = f"rank {(failed or ended.oom_ranks or [0])[0]}" if plan.nodes > 1 else "the command"
        return error_status("ERR_INFRA", f"{who} was killed out of memory (an OOM kill; SLURM: "
                            f"{state or 'forgotten'}) under "
                            f"compute_shape.memory {plan.memory or '(no limit: the node ran out)'}",
                            "raise compute_shape.memory, or lower the batch size or the data loader workers",
                            ended.ranks.get((failed or [0])[0]))
    if not failed:
        if state in ("COMPLETED", "") and len(ended.ranks) == plan.nodes:
            warning = (f"; rank {ended.oom_ranks[0]}'s step saw an OOM kill though the command succeeded: check its "
                       "results" if ended.oom_ranks else "")
            return JobStatus(state="COMPLETE", message="exit code 0" + warning, exit_code=0), None
        code, by = _exit_code(ended.exit_code)
        return error_status("ERR_INFRA", f"the job ended (SLURM: {state or 'forgotten'}, exit code "
                            f"{ended.exit_code or '?'}"
                            f"{by}) without its ranks' exit statuses: a rank was stopped from outside",
                            "read the job's batch log (" + str(run.batch_log()) + ") and the node's slurmd log", code)
    first = failed[0]
    code = ended.ranks[first]
    who = f"rank {first}" if plan.nodes > 1 else "the command"
    if code == DEADLINE_EXIT:
        analysis = FailureAnalysis.deadline_passed(plan.deadline_seconds)
        return JobStatus(state="ERROR", message=analysis.reason, exit_code=code, err_class=analysis.err_class), analysis
    if code in _STOPPED_CODES:
        killed = signal.Signals(code - 128).name
        return error_status("ERR_INFRA", f"{who} was killed (exit code {code}, signal {killed}) though "
                            "tao-data-io did not cancel it: an administrator's scancel, the node's OOM killer or "
                            "slurmd", "read the node's slurmd log and the kernel log (dmesg); submit again: a next "
                            "attempt restores the results uploaded so far", code)
    return program_failed(who, code)


def _reason(ended: Ended) -> str:
    return f": {ended.reason}" if ended.reason and ended.reason != "None" else ""


def _exit_code(said: str) -> tuple[int | None, str]:
    """SLURM's ``code:signal`` as (code, the signal's words)."""
    code, _, number = said.partition(":")
    by = by_signal(int(number)) if number.isdigit() else ""
    return (int(code) if code.isdigit() else None), by


def _oom_said(log: Path) -> bool:
    """Whether slurmstepd wrote its word of an OOM kill (``Detected N oom-kill event(s)``) at the
    end of a rank's log: a step's OOM kill while the script goes on is said nowhere else."""
    tail = JobLog(log, None).tail(None, _OOM_WINDOW).encode()
    return any(word in tail for word in _OOM_WORDS) and b"slurmstepd" in tail


def _tail(log: Path) -> str:
    return JobLog(log, None).tail(_LOG_LINES_IN_ERRORS, TAIL_BYTES).strip()


def _touch(path: Path) -> None:
    atomic_write(path, b"", mode=0o644, replace=True)


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)
