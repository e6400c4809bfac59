"""``run-tao-job``: one run per training job — submit, then collect, as subflows — for users who
want the whole job in one place; the two flows stay for those who split them (a submit now, a
collect from a schedule or another worker).

Canceling the run cancels the job; a crash leaves it running for a collect to take over.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from flows.collect import collect_tao_job
from flows.common import DEFAULT_RECORDS, DEFAULT_TARGET, NEW_RUN_NAME, cancel_owned_job, prepare
from flows.submit import identified_request, submit_tao_job
from tao_data_io.verbs import DEFAULT_POLL_SECONDS
from tasks.masking import masking_failures


@flow(name="run-tao-job", flow_run_name=f"run-{NEW_RUN_NAME}", persist_result=True, result_serializer="json",
      on_cancellation=[cancel_owned_job])
@masking_failures
def run_tao_job(request: str | dict[str, Any], target: str = DEFAULT_TARGET, records: str = DEFAULT_RECORDS,
                s3_credentials: str | None = None, hf_credentials: str | None = None,
                ngc_credentials: str | None = None, poll_seconds: float = DEFAULT_POLL_SECONDS,
                max_wait_seconds: float | None = None) -> dict[str, Any]:
    """Submit a TAO job and collect it: stage, launch, verify, wait for the end, upload the results.

    Args:
        request: a job request file on the worker (YAML or JSON) or the request itself, as a mapping.
        target: the compute target block.
        records: the job records block.
        s3_credentials: an S3 credentials block; empty: the AWS names.
        hf_credentials: a Hugging Face credentials block; empty: HF_TOKEN.
        ngc_credentials: an NGC credentials block; empty: NGC_KEY.
        poll_seconds: the longest pause between two looks at the job while it runs.
        max_wait_seconds: give up waiting after this long (the job keeps running; collect later).
    """
    setup = prepare(target, records, s3_credentials, hf_credentials, ngc_credentials)
    job = identified_request(request, setup, "run")
    submitted = submit_tao_job(job.model_dump(mode="json", exclude_none=True), target=target, records=records,
                               s3_credentials=s3_credentials, hf_credentials=hf_credentials,
                               ngc_credentials=ngc_credentials)
    collected = collect_tao_job(submitted["job_id"], target=target, records=records, s3_credentials=s3_credentials,
                                poll_seconds=poll_seconds, max_wait_seconds=max_wait_seconds)
    return {"submitted": submitted, "collected": collected}
