"""The steps after launch as tasks: wait for the end, upload the results (also after a
failure), report a failure, and the scheduled resync of every running job.

The upload shows its progress and then a report of where the results went and what was left
out; a failure report carries the log's last lines, masked with the worker's credential values
(a job may print anything).
"""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact

from blocks.credentials import CredentialSet
from tao_data_io import steps
from tao_data_io.credentials import Redactor
from tao_data_io.launch.backend import Backend, JobStatus
from tao_data_io.records import RecordStore
from tasks.policy import QUICK, TRANSFER, WAIT, step
from tasks.progress import ProgressArtifact
from tasks.reports import failure_report, upload_report


@step("wait-for-end", timeout_seconds=WAIT, task_run_name="wait-{job_id}")
def wait_for_end(job_id: str, backend: Backend, store: RecordStore, poll_seconds: float,
                 max_wait_seconds: float | None) -> dict[str, Any]:
    """Poll the backend every ``poll_seconds`` until the job is terminal (or ``max_wait_seconds``
    passed), logging each change of state."""
    logger = get_run_logger()
    status = steps.wait_for_end(job_id, backend, store, poll_seconds=poll_seconds, timeout=max_wait_seconds,
                                   say=logger.info)
    logger.info("job %s: %s", job_id, status.describe())
    return status.to_dict()


@step("upload-results", timeout_seconds=TRANSFER, task_run_name="upload-{job_id}")
def upload_results(job_id: str, backend: Backend, store: RecordStore, credentials: CredentialSet) -> dict[str, Any] | None:
    """Upload the job's results to its route with its excludes, and report what happened."""
    logger = get_run_logger()
    with ProgressArtifact(f"upload of job {job_id}'s results") as progress:
        outcome = steps.upload_job_results(job_id, backend, store, environ=credentials.environ(),
                                              progress=progress.callback, say=logger.info)
    if outcome is None:
        logger.info("job %s: the backend uploads its results itself", job_id)
        return None
    create_markdown_artifact(upload_report(store.get(job_id), outcome), key=f"results-{job_id}",
                             description=f"Where job {job_id}'s results went")
    logger.info("job %s: %s", job_id, outcome.describe())
    return outcome.to_dict()


@step("report-failure", timeout_seconds=QUICK, task_run_name="report-failure-{job_id}")
def report_failure(job_id: str, status: dict[str, Any], backend: Backend, store: RecordStore,
                   credentials: CredentialSet) -> dict[str, Any]:
    """The failure analysis and the log's last lines, as an artifact."""
    tail, analysis = steps.failure_report(job_id, backend, store)
    redact = Redactor(credentials.environ(), secret_names=store.get(job_id).forward_env)
    masked = redact(tail) if tail else tail
    create_markdown_artifact(failure_report(job_id, JobStatus.model_validate(status), analysis, masked),
                             key=f"failure-{job_id}",
                             description=f"Why job {job_id} failed")
    return {"failure": analysis.to_dict() if analysis else None, "logs_tail": masked}


@step("running-jobs", timeout_seconds=QUICK, task_run_name="running-jobs")
def running_jobs(store: RecordStore, backend: Backend) -> dict[str, list[str]]:
    """The RUNNING jobs this backend can see, and those of its platform it has no trace of."""
    logger = get_run_logger()
    seen, elsewhere = steps.running_jobs(store, backend, say=logger.warning)
    if elsewhere:
        logger.warning("%d RUNNING jobs of the %s platform are not on this target (submitted through "
                       "another, or lost with their host), so their results are not resynced here: %s",
                       len(elsewhere), backend.name, ", ".join(elsewhere))
    return {"seen": seen, "elsewhere": elsewhere}


@step("resync", timeout_seconds=TRANSFER, task_run_name="resync-{job_id}")
def resync_job(job_id: str, backend: Backend, store: RecordStore, credentials: CredentialSet,
               settle_seconds: float | None) -> dict[str, Any] | None:
    """Upload what is new in a running job's results; leaves at once when another upload of the
    job holds its lock (an overlapping resync, or the final upload)."""
    with ProgressArtifact(f"resync of job {job_id}'s results") as progress:
        outcome = steps.resync(job_id, backend, store, settle_seconds=settle_seconds,
                                  environ=credentials.environ(), progress=progress.callback)
    if outcome is not None:
        get_run_logger().info("job %s: %s", job_id, outcome.describe())
    return outcome.to_dict() if outcome else None
