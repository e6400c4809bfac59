"""``run-tao-job``: one run per training job — submit, then collect, as subflows — for users who
want the whole job in one place; the two flows stay for those who split them (a submit now, a
collect from a schedule or another worker).

Canceling the run cancels the job; a crash leaves it running for a collect to take over.
"""

from __future__ import annotations

from typing import Any

from prefect import flow
from prefect.utilities.annotations import opaque

from flows.collect import collect_tao_job
from flows.common import (DEFAULT_RECORDS, DEFAULT_TARGET, HFCredentials, NGCCredentials, Records,
                          S3Credentials, Target, cancel_owned_job, prepare)
from flows.submit import identified_request, submit_tao_job
from tao_data_io.forms import GuardedText
from tao_data_io.request import JobRequest
from tao_data_io.verbs import DEFAULT_POLL_SECONDS
from tasks.masking import mask_parameters_of_crashed_run, masking_failures, started_run_name


#: The submit subflow, its result not persisted, so that a Retry of a failed run submits again:
#: Prefect reuses a Completed subflow that has a persisted result when its parent is retried, and
#: the retry then only collected the failed attempt again. Submitted again, the job — the same id,
#: from the root run — is launched as its next attempt with its results restored (the verb is
#: idempotent: a running or COMPLETE job is left as it is). submit-tao-job on its own keeps its
#: persisted result, for ``run_deployment(…).state.result()``.
_submit_on_every_attempt = submit_tao_job.with_options(persist_result=False)


@flow(name="run-tao-job", flow_run_name=started_run_name("run", "request_path", "request"), persist_result=True,
      result_serializer="json", on_cancellation=[cancel_owned_job], validate_parameters=False,
      on_crashed=[mask_parameters_of_crashed_run])
@masking_failures
def run_tao_job(request: JobRequest | None = None, request_path: GuardedText | None = None,
                target: Target = DEFAULT_TARGET, records: Records = DEFAULT_RECORDS,
                s3_credentials: S3Credentials = None, hf_credentials: HFCredentials = None,
                ngc_credentials: NGCCredentials = None, poll_seconds: float = DEFAULT_POLL_SECONDS,
                max_wait_seconds: float | None = None) -> dict[str, Any]:
    """Submit a TAO job and collect it: stage, launch, verify, wait for the end, upload the results.

    Args:
        request: the job request itself (the form), or empty to read request_path.
        request_path: a job request file on the worker (YAML or JSON), when the request is not
            given itself.
        target: the compute target block.
        records: the job records block.
        s3_credentials: an S3 credentials block; empty: the AWS names.
        hf_credentials: a Hugging Face credentials block; empty: HF_TOKEN.
        ngc_credentials: an NGC credentials block; empty: NGC_KEY.
        poll_seconds: the longest pause between two looks at the job while it runs.
        max_wait_seconds: give up waiting after this long (the job keeps running; collect later).
    """
    setup = prepare(target, records, s3_credentials, hf_credentials, ngc_credentials)
    job = identified_request(request, request_path, setup, "run")
    # opaque: Prefect would walk into the request looking for futures (a field named keys trips it).
    submitted = _submit_on_every_attempt(opaque(job), target=target, records=records,
                                         s3_credentials=s3_credentials, hf_credentials=hf_credentials,
                                         ngc_credentials=ngc_credentials)
    collected = collect_tao_job(submitted["job_id"], target=target, records=records, s3_credentials=s3_credentials,
                                poll_seconds=poll_seconds, max_wait_seconds=max_wait_seconds)
    return {"submitted": submitted, "collected": collected}
