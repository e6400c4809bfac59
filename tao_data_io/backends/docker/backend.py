"""The Docker backend: each rank of a job a container of the request's image on this host's daemon.

Why it exists: most TAO users run TAO with a plain ``docker run`` on a GPU workstation. This
backend runs the same images the same way, with what ``docker run`` leaves to the user done for
them: inputs staged on this host and bound read-only, every source checked and proved bound as
checked (:mod:`.frame`), the verify probe in the job's own container before the command, no
credential in the container's configuration, GPUs by id, the exit status, OOM kill and signal
told apart, the log kept until collect has read it.

On disk, under the run root (:class:`.settings.DockerSettings`)::

    <job id>/run/       the run directory (:mod:`.rundir`): state, the frame's directories,
                        saved logs
    <job id>/results/   the results directory, unless the route is a mount

Every call but ``submit`` reads the run directory and asks the daemon, so any process on this
host — a later CLI call, a restarted Prefect worker — can follow a job submitted by another. The
containers are the daemon's: they outlive whoever submitted them.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import stat
import tempfile
from collections.abc import Mapping
from datetime import datetime, timezone
from functools import cached_property
from pathlib import Path
from typing import Any

import docker
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.models.containers import Container
from docker.utils import parse_repository_tag

from ...credentials import forwarded_values
from ...errors import BackendError, UsageError
from ...fs.atomic import atomic_write
from ...fs.locks import file_lock
from ...fs.reading import read_job_file
from ...launch.backend import (DEFAULT_VERIFY_TIMEOUT_S, FOLLOW_BYTES, FOLLOW_START_BYTES, TAIL_BYTES, FailureAnalysis,
                               JobDocuments, JobStatus, LogChunk, Submission, Waits, cursor_fields, error_status,
                               program_failed, polls)
from ...launch.binding import BoundSource, open_source
from ...launch.plan import LaunchPlan
from ...launch.rundir import RunRoot
from ...launch.probe import (PROBE_SCRIPT, TOKEN_FILE, CheckResult, Verdict, checklist, checklist_text,
                             parse_probe_output, ranks_verdict, remove_token, with_persistence)
from ...launch.results_owner import hand_over_checked, take_back_results
from ...launch.sources import (SourceRules, check_binds, check_paths, host_source_rules,
                               plan_binds)
from ...launch.users import job_ids
from ...quantities import cpu_millicores, quantity_bytes
from ...tier import ClusterFacts
from . import DECLARATION
from .containers import RUN_LABEL, RankFrame, container_name, create_arguments, rank_gpus
from .frame import (CHECKLIST_FILE, DEADLINE_EXIT, FRAME_FILE, FRAME_SCRIPT, GO, PROBE_EXIT, PROBE_FILE, PROBE_OUTPUT,
                    RUN_FILE, RUN_SCRIPT, SETUP_EXIT, SHELL_FILE, STOP, STOPPED_EXIT, credentials_file, host_busybox)
from .logs import Position, after, last, lines, stamp_ns
from .rundir import Ended, Launch, RankEnd, RunDir
from .settings import DockerSettings

#: The Docker backend's ``backend_ref``: ``docker/<job id>``.
NAMESPACE = "docker"
#: The code this process runs: a job may never write it (it would run outside every container).
_PACKAGE_ROOT = Path(__file__).resolve().parents[3]
#: Where credentials files are made: a tmpfs, so a value never reaches a disk.
_CREDENTIALS_ROOT = Path("/dev/shm")
_API_TIMEOUT_S = 120
_LOG_LINES_IN_ERRORS = 5
#: What dockerd looks for on its PATH to give GPUs without a runtime of that name, and that PATH.
_NVIDIA_HOOK = "nvidia-container-runtime-hook"
_DAEMON_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: The least memory Docker lets a container have (``Minimum memory limit allowed is 6MB``).
_DOCKER_MIN_MEMORY = 6 * 2**20
#: How much of a probe's output a rank's report may hold (each check is a line).
_PROBE_BYTES = 4 * 1024 * 1024


class DockerBackend(RunRoot[RunDir, Launch, DockerSettings]):
    namespace = NAMESPACE
    title = "Docker"
    run_type = RunDir
    name = DockerSettings.name
    capabilities = DECLARATION.capabilities

    @cached_property
    def client(self) -> docker.DockerClient:
        """The daemon, reached at ``docker_host`` (never through the environment of a later process)."""
        try:
            return docker.DockerClient(base_url=self.settings.docker_host, timeout=_API_TIMEOUT_S)
        except DockerException as exc:
            raise BackendError(f"cannot reach the Docker daemon at {self.settings.docker_host}: {exc}; start it "
                               "(systemctl start docker) or set the target's docker_host", retryable=True) from None

    # ------------------------------------------------------------------ before
    def facts(self) -> ClusterFacts:
        """Inputs are staged on this host (tier B) or pre-positioned (tier A): a container without
        network and without an upload sidecar cannot fetch its own (tier C)."""
        return ClusterFacts(backend=self.name, capabilities=self.capabilities)

    def preflight(self, plan: LaunchPlan, *, documents: JobDocuments | None = None) -> None:
        """Everything that can be refused before anything exists: the network, whom the job runs
        as, its GPUs, the daemon, and every source it binds. ``documents`` are not needed: the
        containers read what this host staged."""
        self._refuse_network(plan)
        self._ids()
        host_busybox()
        rank_gpus(plan, self.settings.gpu_devices)
        self._ping()
        if plan.gpus:
            self._check_gpu_runtime()
        self._check_limits(plan)
        self._ensure_image(plan.image)
        rules = self._checked_rules(plan)
        check_paths(plan)
        self._check_sources(plan, self._results_host(plan), rules)

    def waits(self, plan: LaunchPlan) -> Waits:
        """``submit`` may pull the image and restore an earlier attempt's results: transfers with
        no bound of time; ``verify`` waits for the verdict, then for a cancel's grace."""
        return Waits(submit=None, verify=DEFAULT_VERIFY_TIMEOUT_S + self.settings.cancel_grace_seconds + 30)

    def _refuse_network(self, plan: LaunchPlan) -> None:
        if plan.network and not self.settings.allow_network:
            raise UsageError(f"job {plan.job_id} asks for the network (network: true), which this Docker target does "
                             "not allow (allow_network is off): drop network from the request, or let the target "
                             "allow it (allow_network)")

    def _ids(self) -> tuple[int, int]:
        """Who the job's containers run as (:func:`~tao_data_io.launch.users.job_ids`)."""
        return job_ids(self.settings.run_as_user, self.settings.run_as_group, "Docker")

    def _ping(self) -> None:
        try:
            self.client.ping()
        except (DockerException, OSError) as exc:
            raise BackendError(f"the Docker daemon at {self.settings.docker_host} does not answer ({exc}): start it "
                               "(systemctl start docker), or set the target's docker_host to its socket",
                               retryable=True) from None

    def _check_gpu_runtime(self) -> None:
        """A daemon that cannot give GPUs accepts a GPU request at create and fails it at start
        (``could not select device driver "" with capabilities: [[gpu]]``): refused here instead.
        dockerd gives GPUs through the NVIDIA Container Toolkit — its ``nvidia`` runtime, or the
        runtime hook it finds on its PATH at start (on this host: the backend refuses a remote
        daemon) — so neither there is refused, naming the toolkit."""
        runtimes = self.client.info().get("Runtimes") or {}
        if "nvidia" in runtimes or shutil.which(_NVIDIA_HOOK, path=_DAEMON_PATH) is not None:
            return
        raise UsageError(f"this job asks for GPUs, but the Docker daemon at {self.settings.docker_host} cannot give "
                         f"them: it has no nvidia runtime (its runtimes: {', '.join(sorted(runtimes)) or 'none'}) "
                         f"and this host no {_NVIDIA_HOOK}. Install the NVIDIA Container Toolkit and run "
                         "`nvidia-ctk runtime configure` (for docker, its default), then restart dockerd; or set "
                         "compute_shape.gpus to 0")

    def _check_limits(self, plan: LaunchPlan) -> None:
        """The limits the daemon would refuse at create, refused here naming the request's field:
        less memory than Docker allows a container, more CPUs than the daemon's host has."""
        if plan.memory is not None and quantity_bytes(plan.memory) < _DOCKER_MIN_MEMORY:
            raise UsageError(f"compute_shape.memory {plan.memory!r} is below the {_DOCKER_MIN_MEMORY // 2**20} MiB "
                             "Docker gives a container at the least: raise it")
        if plan.cpu is not None:
            cpus = int(self.client.info().get("NCPU") or 0)
            if cpus and cpu_millicores(plan.cpu) > cpus * 1000:
                raise UsageError(f"compute_shape.cpu {plan.cpu!r} is more than the {cpus} CPUs of the Docker daemon's "
                                 "host: lower it")

    def _source_rules(self, plan: LaunchPlan) -> SourceRules:
        """The launch seam's rules (:func:`~tao_data_io.launch.sources.host_source_rules`), with the
        daemon's own socket private too: a job that reaches it is root on this host."""
        rules = host_source_rules(plan, self.run_root, _PACKAGE_ROOT)
        socket = Path(str(self.settings.docker_host).removeprefix("unix://"))
        return SourceRules(private=[*rules.private, Path(os.path.realpath(socket))], homes=rules.homes,
                           package_root=rules.package_root, results_root=rules.results_root)

    def _check_sources(self, plan: LaunchPlan, results_host: str, rules: SourceRules) -> dict[str, BoundSource]:
        """Every bind's source checked (:func:`~tao_data_io.launch.sources.check_binds`), and none a
        socket: a socket bound into a job is a door to whatever listens on it (a daemon's API)."""
        checked = check_binds(plan, plan_binds(plan, results_host), rules)
        for target, source in checked.items():
            try:
                found = os.stat(source.resolved)
            except OSError:
                continue
            if stat.S_ISSOCK(found.st_mode):
                raise UsageError(f"mount source {source.source!r} (target {target}) is a socket ({source.resolved}), "
                                 "which no job may have: it would reach whatever listens on it (the Docker daemon is "
                                 "root on this host). Mount only the directories the job reads or writes")
        return checked

    # ------------------------------------------------------------------ submit
    def submit(self, plan: LaunchPlan, *, environ: Mapping[str, str] | None = None,
               documents: JobDocuments | None = None) -> Submission:
        credentials = forwarded_values(plan.forward_env, environ)  # a missing one fails before anything exists
        self._refuse_network(plan)
        uid, gid = self._ids()
        gpus = rank_gpus(plan, self.settings.gpu_devices)
        if plan.gpus:
            self._check_gpu_runtime()
        rules = self._checked_rules(plan)
        run, ref = self._open_run(plan, mode=0o700)
        with file_lock(run.lock):
            existing = self._resubmitted(run, plan)
            if existing is not None:
                started = self._start_ranks(run, existing, credentials)
                return Submission(backend_ref=ref, started=started, restored=existing.restored)
            results_host = self._results_host(plan)
            restored = self._ready_results(plan, results_host, uid, environ)
            sources = self._check_sources(plan, results_host, rules)
            if os.geteuid() == 0:
                hand_over_checked(sources[plan.results_dir], uid, gid)
            launch = Launch(plan=plan, results_host=results_host, uid=uid, gid=gid, gpus=gpus, sources=sources,
                            token=secrets.token_hex(16), submitted_at=datetime.now(timezone.utc), restored=restored)
            self._write_frame(run, launch)
            run.write(run.launch_file, launch)
            try:
                self._start_ranks(run, launch, credentials)
            except UsageError:  # the daemon refused the request: nothing runs, the job id stays free
                if all(self._container(plan, rank) is None for rank in range(plan.nodes)):
                    run.launch_file.unlink(missing_ok=True)
                raise
        return Submission(backend_ref=ref, restored=restored)

    def _write_frame(self, run: RunDir, launch: Launch) -> None:
        """The frame's own directories: the agent (the script, the probe and its checklist, with a
        ``bound`` check per source), the control directory and each rank's report directory."""
        plan = launch.plan
        for directory in (run.agent, run.control):
            directory.mkdir(mode=0o755, exist_ok=True)
            os.chmod(directory, 0o755)
        checks, _ = checklist(plan, launch.token)
        for name, text in ((FRAME_FILE, FRAME_SCRIPT), (RUN_FILE, RUN_SCRIPT), (PROBE_FILE, PROBE_SCRIPT),
                           (CHECKLIST_FILE, checklist_text(checks))):
            atomic_write(run.agent / name, text.encode(), mode=0o644)
        atomic_write(run.agent / SHELL_FILE, host_busybox().read_bytes(), mode=0o755)
        for rank in range(plan.nodes):
            report = run.report(rank)
            report.mkdir(mode=0o700, exist_ok=True)
            if os.geteuid() == 0:
                os.chown(report, launch.uid, launch.gid)

    def _start_ranks(self, run: RunDir, launch: Launch, credentials: Mapping[str, str]) -> bool:
        """Make and start each rank's container that is not running yet (in rank order: ranks above
        0 join rank 0's network); whether any was started. A container a retried submit meets
        (HTTP 409) is its own; one made but never started (a submit that died in between) is made
        again, since its credentials file is gone. A rank the daemon cannot start ends the job:
        the ranks already started are stopped and the daemon's reason is kept for the status."""
        if run.ended() is not None:
            return False
        self._ensure_image(launch.plan.image)
        started = False
        for rank in range(launch.plan.nodes):
            container = self._container(launch.plan, rank)
            if container is not None and container.status == "created" and not container.attrs["State"].get("Error"):
                container.remove(force=True)
                container = None
            if container is not None:
                continue
            try:
                self._create_and_start(run, launch, rank, credentials)
            except APIError as exc:
                self._fail_start(run, launch, rank, _explained(exc))
                return True
            started = True
        return started

    def _create_and_start(self, run: RunDir, launch: Launch, rank: int, credentials: Mapping[str, str]) -> None:
        """One rank's container, its credentials file unlinked once it started: the bind holds the
        file's contents for the container alone, and nothing of them stays on the host."""
        plan = launch.plan
        secret = self._credentials_file(launch, rank, credentials) if credentials else None
        try:
            frame = RankFrame(rank=rank, run_root=str(self.run_root), binds=plan_binds(plan, launch.results_host),
                              agent=str(run.agent), control=str(run.control), report=str(run.report(rank)),
                              credentials=str(secret) if secret is not None else None,
                              user=f"{launch.uid}:{launch.gid}",
                              gpus=launch.gpus[rank] if launch.gpus else [], network=plan.network,
                              pids_limit=self.settings.pids_limit, log_limit=self.settings.log_limit,
                              grace_seconds=self.settings.cancel_grace_seconds,
                              wait_seconds=int(DEFAULT_VERIFY_TIMEOUT_S) + 2 * self.settings.cancel_grace_seconds)
            try:
                container = self.client.containers.create(**create_arguments(plan, frame))
            except APIError as exc:
                if exc.status_code == 409:  # made by a submit running at the same time: its own
                    return
                if exc.status_code == 400 or isinstance(exc, ImageNotFound):
                    raise UsageError(f"the Docker daemon refused rank {rank}'s container of job {plan.job_id}: "
                                     f"{_explained(exc)}; fix the request (its image, mounts or compute_shape) and "
                                     "submit again") from None
                raise
            container.start()
        finally:
            if secret is not None:
                secret.unlink(missing_ok=True)

    def _credentials_file(self, launch: Launch, rank: int, credentials: Mapping[str, str]) -> Path:
        """A 0400 file of the forwarded values on a tmpfs, the job's user's, in a directory only this
        backend's user can enter."""
        if not _CREDENTIALS_ROOT.is_dir():
            raise BackendError(f"{_CREDENTIALS_ROOT} (a tmpfs) is not on this host: the Docker backend hands forwarded "
                               "credentials to a container through a file there, never through its configuration")
        directory = _CREDENTIALS_ROOT / f"tao-data-io-docker-{os.geteuid()}"
        directory.mkdir(mode=0o700, exist_ok=True)
        found = os.lstat(directory)
        if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.geteuid() or found.st_mode & 0o077:
            raise BackendError(f"{directory} is not this user's private directory: remove it and submit again")
        fd, name = tempfile.mkstemp(dir=directory, prefix=f"{launch.plan.job_id}-r{rank}-")
        try:
            os.write(fd, credentials_file(credentials))
            if os.geteuid() == 0:
                os.fchown(fd, launch.uid, launch.gid)
            os.fchmod(fd, 0o400)
        finally:
            os.close(fd)
        return Path(name)

    def _ensure_image(self, image: str) -> None:
        """The request's image on the daemon: pulled when missing, as ``docker run`` would."""
        try:
            self.client.images.get(image)
            return
        except ImageNotFound:
            pass
        except APIError as exc:
            raise UsageError(f"image {image!r} cannot be looked up: {_explained(exc)}; "
                             "fix the request's image") from None
        repository, tag = parse_repository_tag(image)
        try:
            self.client.images.pull(repository, tag=tag or "latest")
        except APIError as exc:
            raise UsageError(f"image {image!r} is not on the Docker daemon and could not be pulled "
                             f"({_explained(exc)}): pull it on this host first (`docker pull {image}`; for nvcr.io, "
                             "`docker login nvcr.io` before), or fix the request's image") from None

    def _fail_start(self, run: RunDir, launch: Launch, rank: int, reason: str) -> None:
        """The daemon could not start ``rank`` (the caller, a submit, holds the lock): tell the
        frames, and end the job with the daemon's reason kept for its status."""
        _touch(run.control / STOP)
        self._finish_locked(run, launch, known={rank: RankEnd(rank=rank, exit_code=None, error=reason)})

    # ------------------------------------------------------------------ follow
    def verify(self, ref: str, plan: LaunchPlan, *, timeout: float = DEFAULT_VERIFY_TIMEOUT_S) -> Verdict:
        """Wait until every rank's probe has reported, judge them with the persistence token seen
        from this host, and give the frames the word: ``go``, or ``stop`` — so a failed verdict
        always means the command never started. No verdict in ``timeout``: the job is canceled."""
        run = self._known(ref)
        if run is None:
            raise UsageError(f"{ref} is not known to the Docker backend under {self.run_root}; submit it first")
        launch = run.launch()
        assert launch is not None
        for _ in polls(timeout):
            verdict = run.verdict()
            if verdict is not None:
                return verdict
            ended = run.ended()
            if ended is not None:
                return Verdict(ok=False, error="the job was canceled before its verdict" if run.canceled()
                               else self._outcome(run)[0].message or "the job ended before its verdict")
            reports = [self._report(run, rank) for rank in range(launch.plan.nodes)]
            if all(report is not None for report in reports):
                return self._judge(run, launch, [report for report in reports if report is not None])
            gone = self._exited_before_report(launch, reports)
            if gone is not None:
                _touch(run.control / STOP)
                self._release(run, launch)
                return Verdict(ok=False, error=gone)
        self.cancel(ref)
        return Verdict(ok=False, error=f"no verdict within {timeout:g}s; the job was canceled")

    def _report(self, run: RunDir, rank: int) -> tuple[str, int | None] | None:
        """A rank's probe output and exit status, once it wrote them (read as a job's files are)."""
        output = read_job_file(run.report(rank), PROBE_OUTPUT, limit=_PROBE_BYTES)
        if output is None:
            return None
        code = (read_job_file(run.report(rank), PROBE_EXIT, limit=64) or b"").strip()
        return output.decode("utf-8", "replace"), int(code) if code.isdigit() else None

    def _exited_before_report(self, launch: Launch, reports: list[tuple[str, int | None] | None]) -> str | None:
        for rank, report in enumerate(reports):
            if report is not None:
                continue
            container = self._container(launch.plan, rank)
            if container is None:
                return f"rank {rank}'s container is gone before its verdict"
            state = container.attrs["State"]
            if state.get("Status") in ("exited", "dead") or state.get("Error"):
                said = _last_lines(container)
                why = state.get("Error") or f"exit code {state.get('ExitCode')}"
                return f"rank {rank} ended before its verdict ({why})" + (f": {said}" if said else "")
        return None

    def _judge(self, run: RunDir, launch: Launch, reports: list[tuple[str, int | None]]) -> Verdict:
        """The job's verdict from every rank's report (each rank's checks, ``rank N:`` before their
        details when there are several) and the persistence token seen from this host."""
        checks, _ = checklist(launch.plan, launch.token)
        verdicts = [self._bound(launch, rank, parse_probe_output(output, checks, code))
                    for rank, (output, code) in enumerate(reports)]
        verdict = ranks_verdict(verdicts)
        token = read_job_file(Path(launch.results_host), TOKEN_FILE, limit=256)
        seen = token == launch.token.encode()
        verdict = with_persistence(verdict, launch.plan.results_dir, seen,
                                   "the token the probe wrote was seen on this host" if seen else
                                   f"the token the probe wrote is not in {launch.results_host} on this host")
        remove_token(Path(launch.results_host))
        with file_lock(run.lock):
            recorded = run.verdict()
            if recorded is not None:
                return recorded
            run.write(run.verdict_file, verdict)
            if os.geteuid() == 0:  # the reports are read: the job writes no more to this host's disk there
                for rank in range(launch.plan.nodes):
                    os.chown(run.report(rank), 0, 0, follow_symlinks=False)
            _touch(run.control / (GO if verdict.ok else STOP))
        if not verdict.ok:
            self._release(run, launch)
        return verdict

    def _release(self, run: RunDir, launch: Launch) -> None:
        """After a failed verdict: the frames leave on ``stop`` (within a second); once they have,
        or a grace later (then stopped), the job is ended and its containers removed."""
        for _ in polls(self.settings.cancel_grace_seconds):
            containers = [self._container(launch.plan, rank) for rank in range(launch.plan.nodes)]
            if all(c is None or c.status in ("exited", "dead", "created") for c in containers):
                break
        self._finish(run, launch)

    def _bound(self, launch: Launch, rank: int, verdict: Verdict) -> Verdict:
        """``verdict`` with a ``bound`` check per mount, made from this host: the object at each
        target, seen through the rank's own root (``/proc/<pid>/root``, walked without leaving it),
        is the very one submit checked (device and inode). Docker binds by path at start, so a
        source swapped after the check would otherwise be bound unchecked; and the frame's own
        tools (``stat``, ``sh``) are the job's, so the frame is never asked."""
        container = self._container(launch.plan, rank)
        state = container.attrs["State"] if container is not None else {}
        pid = state.get("Pid") if state.get("Running") else None
        results: list[CheckResult] = []
        for target, source in launch.sources.items():
            found = _identity(f"/proc/{pid}/root", target) if pid else None
            ok = found == (source.device, source.inode)
            detail = ("the object checked on this host" if ok else "the container's frame is gone" if not pid else
                      "cannot be looked at through the container's root" if found is None else
                      f"is not the object checked on this host ({source.resolved}): the source changed after the "
                      f"check ({source.source!r}); make it a directory nothing swaps, and submit again")
            results.append(CheckResult(kind="bound", path=target, ok=ok, detail=detail, subject=source.source))
        if container is not None and pid:  # the pid looked at was the frame's all along, not a reused one
            container.reload()
            after = container.attrs["State"]
            if not after.get("Running") or (after.get("Pid"), after.get("StartedAt")) != (pid, state.get("StartedAt")):
                results = [result.model_copy(update={"ok": False, "detail": "the container ended while it was looked "
                                                     "at: its pid may have been another process's"})
                           for result in results]
        return Verdict(ok=verdict.ok and all(r.ok for r in results), checks=[*verdict.checks, *results],
                       error=verdict.error)

    def _outcome(self, run: RunDir, *, locked: bool = False) -> tuple[JobStatus, FailureAnalysis | None]:
        """The job's state: from how it ended once it has (:meth:`_finish` keeps that), else from
        its containers — ending the job when they say it is over (:meth:`_over`). ``locked``: the
        caller holds the run directory's lock (a submit putting an attempt away)."""
        launch = run.launch()
        assert launch is not None
        ended = run.ended()
        if ended is None and self._over(run, launch):
            if locked:
                ended = self._finish_locked(run, launch)
            else:
                with file_lock(run.lock):  # decided again under the lock: a submit may be making the ranks
                    ended = run.ended() or (self._finish_locked(run, launch) if self._over(run, launch) else None)
        if ended is not None:
            return _ended(ended, run, launch)
        if run.verdict() is None:
            return JobStatus(state="PENDING", message="verifying inside the containers"), None
        return JobStatus(state="RUNNING", message=f"{launch.plan.nodes} rank(s) running"), None

    def _over(self, run: RunDir, launch: Launch) -> bool:
        """Whether the containers say the job is over: one is gone or could not start, every one
        exited, the verdict failed, or — once the command started — one rank exited non-zero
        (the others are then stopped, as a Job's pods are when one fails)."""
        states = [c.attrs["State"] if c is not None else None
                  for c in (self._container(launch.plan, rank) for rank in range(launch.plan.nodes))]
        verdict = run.verdict()
        exited = [state is not None and state.get("Status") in ("exited", "dead") for state in states]
        return (any(state is None or state.get("Error") for state in states) or all(exited)
                or (verdict is not None and not verdict.ok)
                or (verdict is not None and any(gone and state is not None and state.get("ExitCode")
                                                for gone, state in zip(exited, states))))

    def _finish(self, run: RunDir, launch: Launch) -> Ended:
        with file_lock(run.lock):
            return self._finish_locked(run, launch)

    def _finish_locked(self, run: RunDir, launch: Launch, known: Mapping[int, RankEnd] | None = None) -> Ended:
        """End the job for good, once (the caller holds the lock): stop what still runs (with the
        grace; such a rank is marked stopped, never taken for the one that failed), keep each
        rank's end and log, take the results back from the job's user, remove the containers."""
        ended = run.ended()
        if ended is not None:
            return ended
        ranks: list[RankEnd] = []
        vanished = True
        go = (run.control / GO).exists()
        containers = {rank: self._container(launch.plan, rank) for rank in range(launch.plan.nodes)}
        for rank, container in containers.items():
            if known and rank in known:
                ranks.append(known[rank])
                continue
            if container is None:
                ranks.append(RankEnd(rank=rank, exit_code=None, error="the container was removed outside tao-data-io"))
                continue
            vanished = False
            stopped = container.status in ("running", "restarting", "paused")
            if stopped:
                container.stop(timeout=self.settings.cancel_grace_seconds)
                container.reload()
            state = container.attrs["State"]
            ranks.append(RankEnd(rank=rank, exit_code=state.get("ExitCode"), oom_killed=bool(state.get("OOMKilled")),
                                 error=state.get("Error") or "", started=go, stopped=stopped,
                                 ran_seconds=_ran_seconds(state)))
            _save_log(container, run.saved_log(rank))
        taken = take_back_results(Path(launch.results_host))
        ended = Ended(ranks=ranks, taken_back=taken, vanished=vanished and not known)
        run.write(run.ended_file, ended)
        for container in containers.values():
            if container is not None:
                container.remove(force=True)
        return ended

    def logs(self, ref: str, tail: int | None = None) -> str:
        """Each rank's output (the daemon's, or the copy kept once its container was removed),
        ``tail`` lines per rank when given, each line prefixed ``[rank N]`` when there are several."""
        run, launch = self._launched(ref)
        said = []
        for rank in range(launch.plan.nodes):
            found = lines(self._raw_log(run, launch, rank, tail=tail))
            said.append(last(found, tail)[0] if tail is not None else "".join(line.text for line in found))
        if launch.plan.nodes == 1:
            return said[0]
        return "".join(f"[rank {rank}] {line}\n" for rank, text in enumerate(said) for line in text.splitlines())

    def follow_logs(self, ref: str, cursor: str | None) -> LogChunk:
        """What each rank printed since ``cursor`` (each rank's position: :mod:`.logs`), at most
        :data:`FOLLOW_BYTES` per rank, ``[rank N]`` before each line when there are several."""
        run, launch = self._launched(ref)
        positions = _positions(cursor)
        shown: list[str] = []
        for rank in range(launch.plan.nodes):
            position = positions.get(rank)
            if position is None:
                found = list(lines(self._raw_log(run, launch, rank, tail=200)))
                text, position = _start(found)
            else:
                text, position = after(lines(self._raw_log(run, launch, rank, since=position)), position, FOLLOW_BYTES)
            positions[rank] = position
            if launch.plan.nodes == 1:
                shown.append(text)
            else:
                shown.append("".join(f"[rank {rank}] {line}" for line in text.splitlines(keepends=True)))
        return LogChunk(text="".join(shown), cursor=json.dumps({str(rank): [p.stamp, p.count]
                                                               for rank, p in sorted(positions.items())}))

    def _raw_log(self, run: RunDir, launch: Launch, rank: int, *, tail: int | None = None,
                 since: Position | None = None) -> bytes:
        """A rank's stamped log: the saved copy once the job ended, else the daemon's (from
        ``since``, or its last ``tail`` lines), read up to twice a look's bytes."""
        if run.ended() is not None:
            try:
                return run.saved_log(rank).read_bytes()
            except FileNotFoundError:
                return b""
        container = self._container(launch.plan, rank)
        if container is None:
            return b""
        return _read_log(container, tail=tail, since=since.since() if since is not None else None)

    # ------------------------------------------------------------------ cancel
    def cancel(self, ref: str) -> bool:
        """Stop every rank (SIGTERM through Docker's init, SIGKILL after ``cancel_grace_seconds``)
        and record the job CANCELED, keeping its logs; True if something was running. A job that
        has ended keeps its end."""
        with self._canceling(ref) as known:
            if known is None:
                return False
            run, launch = known
            if run.verdict() is None:
                _touch(run.control / STOP)
        containers = [c for c in (self._container(launch.plan, rank) for rank in range(launch.plan.nodes)) if c]
        running = any(c.status in ("running", "restarting", "paused", "created") for c in containers)
        for container in reversed(containers):  # rank 0, whose network the others share, last
            if container.status in ("running", "restarting", "paused"):
                container.stop(timeout=self.settings.cancel_grace_seconds)
        self._finish(run, launch)
        return running

    # ------------------------------------------------------------------ helpers
    def _container(self, plan: LaunchPlan, rank: int) -> Container | None:
        """Rank ``rank``'s container of this attempt, if the daemon has it; one of that name made
        for another run root (a digest's collision) is never taken for it."""
        name = container_name(str(self.run_root), plan.job_id, plan.attempt, rank)
        try:
            container = self.client.containers.get(name)
        except NotFound:
            return None
        except APIError as exc:
            raise BackendError(f"the Docker daemon did not say how rank {rank} of {plan.job_id} is: {_explained(exc)}",
                               retryable=True) from None
        if container.labels.get(RUN_LABEL) != str(self.run_root):
            raise BackendError(f"the Docker daemon's container {name} belongs to another run root "
                               f"({container.labels.get(RUN_LABEL)!r}), not {self.run_root}: remove it (docker rm -f "
                               f"{name}) if nothing of that run needs it")
        return container


def _ended(ended: Ended, run: RunDir, launch: Launch) -> tuple[JobStatus, FailureAnalysis | None]:
    """The state and analysis of a job that has ended (see the issue's table in docs/docker.md)."""
    plan = launch.plan
    if run.canceled() is not None:
        return JobStatus(state="CANCELED", message="canceled"), None
    if ended.vanished:
        return error_status("ERR_INFRA", "the job's containers were removed outside tao-data-io (docker rm) "
                      "before their end was read", "submit again; a next attempt restores the results uploaded so far")
    broken = next((rank for rank in ended.ranks if rank.error), None)
    if broken is not None:
        return error_status("ERR_INFRA", f"rank {broken.rank}'s container could not start: {broken.error}",
                      _start_fix(broken.error))
    verdict = run.verdict()
    if verdict is not None and not verdict.ok:
        return error_status("ERR_INFRA", verdict.describe(), "the command never started: make every path the "
                      "verdict names readable (stage the inputs again, fix a mount's source, make the results "
                      "directory writable) and submit again")
    if verdict is None:
        said = _saved_tail(run, 0)
        return error_status("ERR_INFRA", "the job ended before its verdict" + (f": {said}" if said else ""),
                      "read the job's log; the image needs a POSIX sh")
    failed = [rank for rank in ended.ranks if rank.exit_code not in (0, None) and not rank.stopped]
    failed = failed or [rank for rank in ended.ranks if rank.exit_code not in (0, None)]
    if not failed:
        oom = [rank.rank for rank in ended.ranks if rank.oom_killed]
        warning = (f"; a process of rank {oom[0]} was killed out of memory (OOMKilled) though the command succeeded: "
                   "check its results" if oom else "")
        return JobStatus(state="COMPLETE", message="exit code 0" + warning, exit_code=0), None
    first = failed[0]
    code = first.exit_code
    assert code is not None
    who = f"rank {first.rank}" if plan.nodes > 1 else "the command"
    if first.oom_killed:
        return error_status("ERR_INFRA", f"{who} was killed out of memory (exit code {code}, OOMKilled) under "
                      f"compute_shape.memory {plan.memory or '(no limit: the host ran out)'}",
                      "raise compute_shape.memory, or lower the batch size or the data loader workers", code)
    if code == DEADLINE_EXIT and _late(first, plan):
        analysis = FailureAnalysis.deadline_passed(plan.deadline_seconds)
        return JobStatus(state="ERROR", message=analysis.reason, exit_code=code, err_class=analysis.err_class), analysis
    if code in (STOPPED_EXIT, 128 + signal.SIGKILL):
        return error_status("ERR_INFRA", f"{who} was stopped (exit code {code}) though tao-data-io did not "
                      "cancel it: the Docker daemon stopped or restarted, someone ran docker stop or kill, or the "
                      "host ran out of memory", "read `journalctl -u docker` and the kernel log (dmesg); submit "
                      "again: a next attempt restores the results uploaded so far", code)
    if code == SETUP_EXIT:
        said = _saved_tail(run, first.rank)
        return error_status("ERR_INFRA", f"{who}'s frame could not run the command" + (f": {said}" if said else ""),
                      "read the job's log", code)
    return program_failed(who, code)


def _late(rank: RankEnd, plan: LaunchPlan) -> bool:
    """Whether a rank the frame ended for its deadline (:data:`DEADLINE_EXIT`) did run that long by
    the daemon's clock: the frame's signal is the job's to send too, and a job without a deadline
    never passed one."""
    return (plan.deadline_seconds is not None and rank.ran_seconds is not None
            and rank.ran_seconds >= plan.deadline_seconds)


def _ran_seconds(state: Mapping[str, Any]) -> float | None:
    started, finished = stamp_ns(str(state.get("StartedAt") or "")), stamp_ns(str(state.get("FinishedAt") or ""))
    if started is None or finished is None or finished < started:
        return None
    return (finished - started) / 1e9


def _start_fix(error: str) -> str:
    """What to do about the daemon's reason for not starting a container."""
    if "could not select device driver" in error or "nvidia" in error.lower():
        return ("install the NVIDIA Container Toolkit on the daemon's host (`nvidia-ctk runtime configure`, "
                "then restart dockerd), or set compute_shape.gpus to 0")
    if "rlimit" in error:
        return "the daemon cannot raise that limit (it lacks CAP_SYS_RESOURCE): raise dockerd's own limit, or drop it"
    return "fix what the daemon names, then submit again"


def _explained(exc: APIError) -> str:
    return str(exc.explanation or exc)


def _touch(path: Path) -> None:
    atomic_write(path, b"", mode=0o644, replace=True)


def _identity(root: str, target: str) -> tuple[int, int] | None:
    """(device, inode) of what ``target`` is inside ``root`` (a container's root), or None."""
    try:
        fd = open_source(target, root)
    except OSError:
        return None
    if fd is None:
        return None
    try:
        found = os.fstat(fd)
        return found.st_dev, found.st_ino
    finally:
        os.close(fd)


def _read_log(container: Container, *, tail: int | None = None, since: float | None = None) -> bytes:
    """The container's stamped log from ``since`` (or its last ``tail`` lines), read until twice a
    look's bytes: a job that printed gigabytes is read a look at a time."""
    arguments: dict[str, Any] = {"stdout": True, "stderr": True, "timestamps": True, "stream": True, "follow": False}
    if tail is not None:
        arguments["tail"] = tail
    if since is not None:
        arguments["since"] = since
    chunks: list[bytes] = []
    size = 0
    stream = container.logs(**arguments)
    try:
        for chunk in stream:
            chunks.append(chunk)
            size += len(chunk)
            if size > 2 * FOLLOW_BYTES:
                raw = b"".join(chunks)
                return raw[:raw.rfind(b"\n") + 1]  # whole lines only: the rest comes next look
    finally:
        stream.close()
    return b"".join(chunks)


def _save_log(container: Container, path: Path) -> None:
    """A rank's whole stamped log, kept for every later look once its container is removed (the
    daemon kept at most the target's ``log_limit`` of it)."""
    atomic_write(path, container.logs(stdout=True, stderr=True, timestamps=True), mode=0o600)


def _last_lines(container: Container) -> str:
    raw = container.logs(stdout=True, stderr=True, tail=_LOG_LINES_IN_ERRORS)
    return raw.decode("utf-8", "replace").strip()[-TAIL_BYTES:]


def _saved_tail(run: RunDir, rank: int) -> str:
    try:
        raw = run.saved_log(rank).read_bytes()
    except FileNotFoundError:
        return ""
    return last(lines(raw), _LOG_LINES_IN_ERRORS)[0].strip()


def _positions(cursor: str | None) -> dict[int, Position]:
    """A cursor of :meth:`DockerBackend.follow_logs` read back; anything else starts afresh."""
    found: dict[int, Position] = {}
    for rank, value in cursor_fields(cursor).items():
        if (str(rank).isdigit() and isinstance(value, list) and len(value) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)):
            found[int(rank)] = Position(value[0], value[1])
    return found


def _start(found: list[Any]) -> tuple[str, Position]:
    """Where following starts: the last lines, up to :data:`FOLLOW_START_BYTES`."""
    size = 0
    keep = 0
    for line in reversed(found):
        size += len(line.text.encode())
        if size > FOLLOW_START_BYTES and keep:
            break
        keep += 1
    return last(found, keep)
