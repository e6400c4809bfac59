"""The steps after launch as tasks: look at or wait for the job, upload its results (also after
a failure), report a failure, find the running jobs and resync one, cancel a job.

The upload shows its progress and then a report of where the results went and what was left
out; a failure report carries the log's last lines, masked with the run's mask (the worker's
credential values and the job's forwarded ones: a job may print anything).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact

from tao_data_io import steps
from tao_data_io.launch.backend import Backend, FailureAnalysis, JobStatus
from tao_data_io.outputs import UploadOutcome
from tao_data_io.records import JobRecord, RecordStore
from tasks.masking import run_mask
from tasks.policy import QUICK, TRANSFER, WAIT, step
from tasks.progress import ProgressArtifact, TrainingArtifacts
from tasks.reports import failure_report as failure_markdown
from tasks.reports import upload_report

#: Before each line a job printed, in the run's logs: no line of the job's passes for one of ours.
JOB_LINE = "| "


@step(timeout_seconds=WAIT, task_run_name="wait-for-end-{job_id}")
def wait_for_end(job_id: str, backend: Backend, store: RecordStore, *, poll_seconds: float,
                 timeout: float | None = None, say: Any = None, on_log: Any = None,
                 on_training: Any = None) -> JobStatus:
    """Poll the backend until the job is terminal (or ``timeout`` passed), logging each change of
    state and, as it arrives, what the job prints (masked whole by the run's log mask, even across
    the end of a look; each of its lines marked ``| `` as the job's) — and keeping TAO's own
    progress current as artifacts."""
    logger = get_run_logger()

    def printed(text: str) -> None:
        logger.info("job %s printed:\n%s", job_id, "\n".join(f"{JOB_LINE}{line}" for line in text.split("\n")))

    with TrainingArtifacts(job_id) as training:
        status = steps.wait_for_end(job_id, backend, store, poll_seconds=poll_seconds, timeout=timeout,
                                    say=logger.info, on_log=printed, on_training=training.show, mask=run_mask())
    logger.info("job %s: %s", job_id, status.describe())
    return status


@step(timeout_seconds=QUICK, task_run_name="observe-{job_id}")
def observe(job_id: str, backend: Backend, store: RecordStore) -> JobStatus:
    """The job's status now, writing nothing."""
    status = steps.observe(job_id, backend, store)
    get_run_logger().info("job %s: %s", job_id, status.describe())
    return status


@step(timeout_seconds=TRANSFER, task_run_name="upload-job-results-{job_id}")
def upload_job_results(job_id: str, backend: Backend, store: RecordStore, *,
                       environ: Mapping[str, str] | None = None, say: Any = None) -> UploadOutcome | None:
    """Upload the job's results to its route with its excludes, and report what happened."""
    logger = get_run_logger()
    with ProgressArtifact(f"upload of job {job_id}'s results") as progress:
        outcome = steps.upload_job_results(job_id, backend, store, environ=environ, progress=progress.callback,
                                           say=logger.info)
    if outcome is None:
        logger.info("job %s: the backend uploads its results itself", job_id)
        return None
    create_markdown_artifact(upload_report(store.get(job_id), outcome), key=f"results-{job_id}",
                             description=f"Where job {job_id}'s results went")
    logger.info("job %s: %s", job_id, outcome.describe())
    return outcome


@step(timeout_seconds=QUICK, task_run_name="failure-report-{job_id}")
def failure_report(job_id: str, backend: Backend, store: RecordStore) -> tuple[str | None, FailureAnalysis | None]:
    """The failure analysis and the log's last lines (masked), also as an artifact."""
    tail, analysis = steps.failure_report(job_id, backend, store)
    masked = run_mask()(tail) if tail else tail
    record = store.get(job_id)  # its end recorded just before: the state and the backend's message
    status = JobStatus(state=record.state, message=record.message or "")
    create_markdown_artifact(failure_markdown(job_id, status, analysis, masked), key=f"failure-{job_id}",
                             description=f"Why job {job_id} failed")
    return masked, analysis


@step(timeout_seconds=QUICK, task_run_name="running-jobs")
def running_jobs(store: RecordStore, backend: Backend, *, say: Any = None) -> tuple[list[JobRecord], list[str]]:
    """The RUNNING jobs this backend can see, and the others it has no trace of."""
    logger = get_run_logger()
    seen, elsewhere = steps.running_jobs(store, backend, say=logger.warning)
    if elsewhere:
        logger.warning("%d RUNNING jobs of the %s backend are not on this target (submitted through "
                       "another, or lost with their host), so their results are not resynced here: %s",
                       len(elsewhere), backend.name, ", ".join(elsewhere))
    return seen, elsewhere


@step(timeout_seconds=TRANSFER, task_run_name="resync-job-{job_id}")
def resync_job(job_id: str, backend: Backend, store: RecordStore, *, settle_seconds: float | None = None,
               environ: Mapping[str, str] | None = None) -> UploadOutcome | None:
    """Upload what is new in a running job's results; leaves at once when another upload of the
    job holds its lock (an overlapping resync, or the final upload)."""
    with ProgressArtifact(f"resync of job {job_id}'s results") as progress:
        outcome = steps.resync_job(job_id, backend, store, settle_seconds=settle_seconds, environ=environ,
                                   progress=progress.callback)
    if outcome is not None:
        get_run_logger().info("job %s: %s", job_id, outcome.describe())
    return outcome


@step(timeout_seconds=QUICK, task_run_name="cancel-job-{job_id}")
def cancel_job(job_id: str, backend: Backend, store: RecordStore, *, reporter: str,
               reason: str | None = None, owner: str | None = None) -> JobRecord:
    """Stop the job and everything it started; the record says CANCELED (unless it had ended)."""
    record = steps.cancel_job(job_id, backend, store, reporter=reporter, reason=reason, owner=owner)
    get_run_logger().info("job %s: %s", job_id, record.state + (f" ({record.message})" if record.message else ""))
    return record
