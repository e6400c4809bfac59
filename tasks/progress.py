"""Prefect progress artifacts fed by the core: a transfer's, at most once a second, and a training
job's own (:class:`TrainingArtifacts`, from TAO's ``status.json``).

Why throttled: the core reports every completed file, possibly thousands a second, from its
transfer threads; each artifact update is one HTTP call to the Prefect API (~9 ms against a
local server). :func:`tao_data_io.reporting.throttled` passes the first snapshot, at most one a
second after it, and always the last, so a 20,000-file staging makes a few dozen calls, not
20,000.

Why lazy: a resync that finds nothing new never reports a snapshot with anything to move, and
creates no artifact — a schedule every five minutes must not fill the UI with empty bars.

Why careful: an update that fails (the API restarting) is logged once and dropped; a progress bar
must never fail the transfer it describes.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any
from uuid import UUID

from prefect import get_run_logger
from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.actions import ArtifactCreate, ArtifactUpdate
from prefect.context import TaskRunContext

from tao_data_io.launch.training import TrainingStatus
from tao_data_io.reporting import Progress, ProgressCallback, human_size, throttled
from tasks.masking import run_mask
from tasks.reports import training_key

UPDATES_PER_SECOND = 1.0


def percent(progress: Progress) -> float:
    """How far along, by bytes when their total is known, else by files."""
    if progress.final:
        return 100.0
    if progress.bytes_total > 0:
        return min(100.0, 100.0 * progress.bytes_done / progress.bytes_total)
    if progress.files_total > 0:
        return min(100.0, 100.0 * (progress.files_done + progress.files_failed) / progress.files_total)
    return 0.0


def progress_line(what: str, progress: Progress) -> str:
    """``staging s3://…: 1,200 of 2,000 files, 18.8 MiB of 31.2 MiB`` (totals omitted while unknown)."""
    files = f"{progress.files_done:,}" + (f" of {progress.files_total:,}" if progress.files_total else "") + " files"
    size = human_size(progress.bytes_done) + (f" of {human_size(progress.bytes_total)}" if progress.bytes_total else "")
    failed = f", {progress.files_failed:,} failed" if progress.files_failed else ""
    return f"{what}: {files}, {size}{failed}"


def moves_anything(progress: Progress) -> bool:
    """Whether ``progress`` has anything to show: something planned, or — once totals that were
    unknown are final (an archive's) — something done. The last snapshot of a run that found
    nothing to move (a resync of unchanged results) is all zeros: no bar of "0 files, 0 B"."""
    if progress.files_total or progress.bytes_total:
        return True
    return progress.final and bool(progress.files_done or progress.bytes_done or progress.files_failed)


class _TaskArtifacts:
    """Artifacts of the task run this is made in, created once and then updated in place through
    one client (opened on the first write, closed by :meth:`close`). Why captured here: updates
    may come from the core's transfer threads, which have no task run context of their own."""

    def __init__(self) -> None:
        context = TaskRunContext.get()
        self._task_run_id = context.task_run.id if context else None
        self._flow_run_id = context.task_run.flow_run_id if context else None
        self._client: SyncPrefectClient | None = None

    def put(self, artifact_id: UUID | None, *, kind: str, data: Any, description: str | None = None,
            key: str | None = None) -> UUID:
        """Create the artifact (``artifact_id`` None) or update it; returns its id."""
        if self._client is None:
            self._client = get_client(sync_client=True).__enter__()
        if artifact_id is None:
            return self._client.create_artifact(ArtifactCreate(
                type=kind, key=key, data=data, description=description, task_run_id=self._task_run_id,
                flow_run_id=self._flow_run_id)).id
        changed = {"data": data, **({"description": description} if description is not None else {})}
        self._client.update_artifact(artifact_id, ArtifactUpdate(**changed))
        return artifact_id

    def close(self) -> None:
        if self._client is not None:
            self._client.__exit__(None, None, None)
            self._client = None


class ProgressArtifact:
    """Use as a context manager inside a task and pass :attr:`callback` to a core step. Updates
    may come from the core's transfer threads, so the artifact is attached to the task run
    captured here, and one client (closed on exit) serves every update."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.artifact_id: UUID | None = None
        self.callback: ProgressCallback = throttled(self._report, per_second=UPDATES_PER_SECOND)
        self._artifacts = _TaskArtifacts()
        self._logger = get_run_logger()
        self._lock = threading.Lock()
        self._last: Progress | None = None
        self._broken = False

    def __enter__(self) -> ProgressArtifact:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        with self._lock:
            last = self._last
            if exc is None and self.artifact_id is not None and last is not None and not last.finished:
                self._send(Progress(last.files_total, last.bytes_total, last.files_done, last.bytes_done,
                                    last.files_failed, final=True))
            self._artifacts.close()

    def _report(self, progress: Progress) -> None:
        with self._lock:
            self._last = progress
            if self.artifact_id is None and not moves_anything(progress):
                return  # nothing to move (yet), or nothing at all: no artifact
            self._send(progress)

    def _send(self, progress: Progress) -> None:
        if self._broken:
            return
        try:
            self.artifact_id = self._artifacts.put(self.artifact_id, kind="progress", data=percent(progress),
                                                   description=progress_line(self.what, progress))
        except Exception as exc:  # noqa: BLE001 - a progress bar never fails the transfer
            self._broken = True
            self._logger.warning("progress of %s is no longer shown: %s", self.what, exc)


#: TAO's progress is shown at most this often: an epoch takes minutes, a look at the job seconds.
TRAINING_UPDATE_SECONDS = 5.0


class TrainingArtifacts:
    """TAO's own progress while the job trains, from its ``status.json``: a progress artifact
    (epochs done of max, time left, the newest KPIs) and a table artifact keyed
    ``training-<job>`` with the KPIs epoch by epoch — created on the first report, then kept
    current in place, at most once every :data:`TRAINING_UPDATE_SECONDS` (the newest report is
    always shown on exit). Use as a context manager inside a task; pass :meth:`show` to the core.
    Like :class:`ProgressArtifact`, a failed update is logged once and dropped."""

    def __init__(self, job_id: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.job_id = job_id
        self._clock = clock
        self._artifacts = _TaskArtifacts()
        self._logger = get_run_logger()
        self._progress_id: UUID | None = None
        self._table_id: UUID | None = None
        self._sent_at = float("-inf")
        self._pending: TrainingStatus | None = None
        self._broken = False

    def __enter__(self) -> TrainingArtifacts:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._pending is not None:
            self._send(self._pending)
        self._artifacts.close()

    def show(self, status: TrainingStatus) -> None:
        if self._clock() - self._sent_at < TRAINING_UPDATE_SECONDS:
            self._pending = status
            return
        self._send(status)

    def _send(self, status: TrainingStatus) -> None:
        self._pending = None
        self._sent_at = self._clock()
        if self._broken:
            return
        try:
            # status.json is the job's: what it wrote passes the run's mask like its log lines do.
            mask = run_mask()
            line = mask(f"training of job {self.job_id}: {status.describe()}")
            rows = [{"epoch": epoch, **{mask(name): mask(value) if isinstance(value, str) else value
                                        for name, value in values.items()}}
                    for epoch, values in sorted(status.kpi_by_epoch.items())]
            self._progress_id = self._artifacts.put(self._progress_id, kind="progress",
                                                    data=status.percent or 0.0, description=line)
            if rows:
                self._table_id = self._artifacts.put(
                    self._table_id, kind="table", key=training_key(self.job_id), data=json.dumps(rows),
                    description=None if self._table_id else f"KPIs of job {self.job_id}, epoch by epoch "
                                                             "(TAO's status.json)")
        except Exception as exc:  # noqa: BLE001 - a progress display never fails the job's watch
            self._broken = True
            self._logger.warning("the training progress of job %s is no longer shown: %s", self.job_id, exc)
