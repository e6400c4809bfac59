"""``collect-tao-job``: wait for the job's end, record it, upload its results with its excludes
(also after a failure: its checkpoints and logs are what the user needs to debug it), and, on
ERROR, attach the log's tail and the failure analysis — then fail the flow run, so the UI and
any automation see the job's failure.

The steps of :func:`tao_data_io.steps.collect`, each a task calling the same function.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from flows.common import DEFAULT_RECORDS, DEFAULT_TARGET, prepare
from tao_data_io.errors import TaoDataIOError
from tao_data_io.launch.backend import JobStatus
from tasks.masking import mask_run_logs, masking_failures
from tasks.outputs import report_failure, upload_results, wait_for_end
from tasks.records import record_end

#: How often to ask the backend. TAO jobs run for hours and may sit PENDING for long (a GPU to
#: free up, an image to pull): a few API calls a minute is plenty.
DEFAULT_POLL_SECONDS = 30.0


class JobFailed(TaoDataIOError):
    """The job ended ERROR; its results were uploaded and the failure is reported."""


@flow(name="collect-tao-job", flow_run_name="collect-{job_id}", persist_result=True, result_serializer="json")
@masking_failures
def collect_tao_job(job_id: str, target: str = DEFAULT_TARGET, records: str = DEFAULT_RECORDS,
                    s3_credentials: str | None = None, poll_seconds: float = DEFAULT_POLL_SECONDS,
                    max_wait_seconds: float | None = None) -> dict[str, Any]:
    """Wait for a submitted job to end, then upload its results and record what happened.

    Args:
        job_id: the job, as submit-tao-job returned it.
        target: the compute target block it runs on.
        records: the job records block.
        s3_credentials: an S3 credentials block; empty: the AWS names.
        poll_seconds: how often to ask the backend while the job is PENDING or RUNNING.
        max_wait_seconds: give up waiting after this long (the job keeps running; collect again
            later); empty: wait for as long as it takes.
    """
    setup = prepare(target, records, s3_credentials)
    mask_run_logs(setup.credentials.environ(), secret_names=setup.store.get(job_id).forward_env)
    status = JobStatus.model_validate(wait_for_end(job_id, setup.backend, setup.store, poll_seconds,
                                                   max_wait_seconds))
    if not status.terminal:
        return {"job_id": job_id, "state": status.state, "message": status.message or "not finished; collect again "
                "later", "upload": None, "failure": None}
    record_end(setup.store, job_id, status.to_dict())
    upload = upload_results(job_id, setup.backend, setup.store, setup.credentials)
    if status.state != "ERROR":
        return {"job_id": job_id, "state": status.state, "message": status.message, "upload": upload,
                "failure": None}
    report = report_failure(job_id, status.to_dict(), setup.backend, setup.store, setup.credentials)
    failure = report["failure"]
    why = (f"{failure['err_class']}: {failure['reason']} — {failure['suggestion']}" if failure
           else status.message or "the backend gave no reason")
    kept = ("" if upload is None else f"; its results were uploaded to {upload['destination']}"
            if upload["status"] == "uploaded" else f"; results: {upload['message']}")
    raise JobFailed(f"job {job_id} ended ERROR: {why}{kept}")
