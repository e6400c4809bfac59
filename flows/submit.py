"""``submit-tao-job``: record → tier → stage (a task run per input) → config → plan → launch →
verify → RUNNING, returning the job id.

The flow is the verb :func:`tao_data_io.verbs.submit` — the CLI's own — run with the Prefect
runner, so each step is its task: each input staged as its own task run (shown and retried on
its own), progress and tables in the UI, retries of transient faults. A verify failure fails
the flow before the job's command starts, with the verdict per path in the UI. Canceling the run
cancels the job (``on_cancellation``); a crash of the run leaves it to the next collect.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, runtime
from prefect.client.orchestration import get_client

from flows import common
from flows.common import (DEFAULT_RECORDS, DEFAULT_TARGET, REPORTER, HFCredentials, NGCCredentials,
                          Records, S3Credentials, Setup, Target, cancel_owned_job, prepare)
from tao_data_io.errors import UsageError
from tao_data_io.forms import GuardedText
from tao_data_io.names import job_id_for_run
from tao_data_io.request import JobRequest, read_request
from tao_data_io.verbs import submit
from tasks.masking import mask_parameters_of_crashed_run, mask_run_logs, masking_failures, started_run_name
from tasks.owners import this_run


@flow(name="submit-tao-job", flow_run_name=started_run_name("submit", "request_path", "request"), persist_result=True,
      result_serializer="json", on_cancellation=[cancel_owned_job], validate_parameters=False,
      on_crashed=[mask_parameters_of_crashed_run])
@masking_failures
def submit_tao_job(request: JobRequest | None = None, request_path: GuardedText | None = None,
                   target: Target = DEFAULT_TARGET, records: Records = DEFAULT_RECORDS,
                   s3_credentials: S3Credentials = None, hf_credentials: HFCredentials = None,
                   ngc_credentials: NGCCredentials = None) -> dict[str, Any]:
    """Stage a TAO job's inputs, launch it, verify inside its frame, and leave it RUNNING.

    Args:
        request: the job request itself (the form), or empty to read request_path.
        request_path: a job request file on the worker (YAML or JSON, relative to the project
            directory), when the request is not given itself.
        target: the compute target block (or BLOCK-TYPE/NAME: tao-local-target/NAME, tao-docker-target/NAME…).
        records: the job records block (or tao-job-records/NAME).
        s3_credentials: an S3 credentials block (or tao-s3-credentials/NAME); empty: the AWS names.
        hf_credentials: a Hugging Face credentials block; empty: HF_TOKEN.
        ngc_credentials: an NGC credentials block; empty: NGC_KEY.
    """
    setup = prepare(target, records, s3_credentials, hf_credentials, ngc_credentials)
    job = identified_request(request, request_path, setup, "submit")
    return submit(job, setup.backend, setup.store, staging_root=setup.target.staging_root,
                  environ=setup.credentials, reporter=REPORTER, owner=this_run(), run=common.RUN).to_dict()


def identified_request(request: JobRequest | dict[str, Any] | None, request_path: str | None, setup: Setup,
                       word: str) -> JobRequest:
    """The request parameter — the request itself, or the file ``request_path`` names — read and
    checked against the credential blocks' values, with its job id — its own, else the one the
    root run's id gives, the same for every retry of the run (a retried run resumes its job rather
    than orphaning it) — its job's values masked in the run's logs, and the run named
    ``<word>-<job id>`` (a job id is shown only once it is known to hold no credential value)."""
    if (request is None) == (request_path is None):
        raise UsageError("give the job request itself (request) or the path of a request file on the worker "
                         "(request_path), one of the two")
    if isinstance(request, str):
        raise UsageError("request holds text; give a request file's path as request_path, or the request itself "
                         "as a mapping")
    given = request.model_dump(mode="json", exclude_none=True) if isinstance(request, JobRequest) else request
    job = read_request(request_path if given is None else given, environ=setup.credentials)
    if job.job_id is None:
        job = job.model_copy(update={"job_id": job_id_for_run(str(runtime.flow_run.root_flow_run_id))})
    mask_run_logs(setup.credentials.environ(), secret_names=job.forward_env)  # the job may print what it is given
    _rename_run(f"{word}-{job.job_id}")
    return job


def _rename_run(name: str) -> None:
    flow_run_id = runtime.flow_run.id
    if flow_run_id:
        with get_client(sync_client=True) as client:
            client.update_flow_run(flow_run_id, name=name)
