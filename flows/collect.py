"""``collect-tao-job``: wait for the job's end, record it, upload its results with its excludes
(also after a failure: its checkpoints and logs are what the user needs to debug it), and, on
ERROR, attach the log's tail and the failure analysis — then fail the flow run, so the UI and
any automation see the job's failure.

The flow is the verb :func:`tao_data_io.verbs.collect`, run with the Prefect runner. The run owns
the job while it watches: canceling it cancels the job; a crash leaves the job running, and the
next collect takes over.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from flows import common
from flows.common import (DEFAULT_RECORDS, DEFAULT_TARGET, REPORTER, Records, S3Credentials, Target, cancel_owned_job,
                          prepare)
from tao_data_io.errors import JobOutcome
from tao_data_io.forms import GuardedText
from tao_data_io.verbs import DEFAULT_POLL_SECONDS, collect
from tasks.masking import job_run_name, mask_parameters_of_crashed_run, mask_run_logs, masking_failures
from tasks.owners import this_run
from tasks.records import read_record


class JobFailed(JobOutcome):
    """The job ended ERROR; its results were uploaded and the failure is reported."""


class JobNotFinished(JobOutcome):
    """The job has not ended (never launched, or still running when the wait gave up): nothing
    was collected, so the run is not Completed; a later collect picks it up."""


@flow(name="collect-tao-job", flow_run_name=job_run_name("collect"), persist_result=True, result_serializer="json",
      on_cancellation=[cancel_owned_job], validate_parameters=False, on_crashed=[mask_parameters_of_crashed_run])
@masking_failures
def collect_tao_job(job_id: GuardedText, target: Target = DEFAULT_TARGET, records: Records = DEFAULT_RECORDS,
                    s3_credentials: S3Credentials = None, poll_seconds: float = DEFAULT_POLL_SECONDS,
                    max_wait_seconds: float | None = None) -> dict[str, Any]:
    """Wait for a submitted job to end, then upload its results and record what happened.

    Args:
        job_id: the job, as submit-tao-job returned it.
        target: the compute target block it runs on.
        records: the job records block.
        s3_credentials: an S3 credentials block; empty: the AWS names.
        poll_seconds: the longest pause between two looks at the job while it is PENDING or
            RUNNING (the first looks come sooner).
        max_wait_seconds: give up waiting after this long (the job keeps running; collect again
            later); empty: wait for as long as it takes.
    """
    setup = prepare(target, records, s3_credentials)
    # Before any step logs: the job may print the values of what it is given, whatever their names.
    mask_run_logs(setup.credentials.environ(), secret_names=read_record(setup.store, job_id).forward_env)
    collected = collect(job_id, setup.backend, setup.store, poll_seconds=poll_seconds,
                        max_wait_seconds=max_wait_seconds, environ=setup.credentials, reporter=REPORTER,
                        owner=this_run(), run=common.RUN)
    if not collected.finished:
        raise JobNotFinished(collected.describe())
    if collected.state == "ERROR":
        raise JobFailed(collected.failure_summary())
    return collected.to_dict()
