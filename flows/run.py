"""``run-tao-job``: one run per training job — submit, then collect, as subflows — for users who
want the whole job in one place; the two flows stay for those who split them (a submit now, a
collect from a schedule or another worker).

Canceling the run cancels the job; a crash leaves it running for a collect to take over.

The run's own page says how the job ended — a line in its log and the ``job-<job>`` artifact,
which names and links what the collect subflow's page shows (the job's log, TAO's progress, the
results and failure reports) — so the outcome is seen without opening the subflow.
"""

from __future__ import annotations

import logging
from typing import Any
from uuid import UUID

from prefect import flow, get_run_logger, runtime
from prefect.artifacts import create_markdown_artifact
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName, FlowRunFilterParentFlowRunId
from prefect.client.schemas.sorting import FlowRunSort
from prefect.settings import PREFECT_UI_URL
from prefect.utilities.annotations import opaque
from prefect.utilities.urls import url_for

from flows.collect import collect_tao_job
from flows.common import (DEFAULT_RECORDS, DEFAULT_TARGET, HFCredentials, NGCCredentials, Records,
                          S3Credentials, Setup, Target, cancel_owned_job, prepare)
from flows.submit import identified_request, submit_tao_job
from tao_data_io.forms import GuardedText
from tao_data_io.request import JobRequest
from tao_data_io.verbs import DEFAULT_POLL_SECONDS
from tasks.masking import mask_parameters_of_crashed_run, masking_failures, run_mask, started_run_name
from tasks.outputs import observe
from tasks.records import read_record
from tasks.reports import job_line, job_report, training_key


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
    job_id = submitted["job_id"]
    try:
        collected = collect_tao_job(job_id, target=target, records=records, s3_credentials=s3_credentials,
                                    poll_seconds=poll_seconds, max_wait_seconds=max_wait_seconds)
    except Exception:  # the job failed, or the collect did: how the job ended is shown here all the same
        tell_the_end(setup, job_id)
        raise
    tell_the_end(setup, job_id)
    return {"submitted": submitted, "collected": collected}


def tell_the_end(setup: Setup, job_id: str) -> None:
    """Show on this run's own page how its job ended: a line in its log (a warning unless it
    completed) and the ``job-<job>`` artifact, which names (and links, where the UI's address is
    known) what the collect subflow shows — its run, with the job's log and TAO's progress, and its
    results and failure reports. Nothing for a job that has not ended (the collect's failure says
    so). Never fails the run: what it shows is the collect's to say first."""
    logger = get_run_logger()
    try:
        status = observe(job_id, setup.backend, setup.store)
        if not status.terminal:
            return
        record = read_record(setup.store, job_id)
        collect_run = f"collect-{job_id}"  # its name (flows.collect: job_run_name)
        logger.log(logging.INFO if status.state == "COMPLETE" else logging.WARNING, "%s",
                   job_line(record, status, collect_run))
        create_markdown_artifact(run_mask()(job_report(record, status, collect_run, _links(job_id, collect_run))),
                                 key=f"job-{job_id}", description=f"How job {job_id} ended")
    except Exception as exc:  # noqa: BLE001 - the job's outcome is the collect's; this only shows it again
        logger.warning("how job %s ended is not shown on this page (%s): the collect run shows it", job_id, exc)


def _links(job_id: str, collect_run: str) -> dict[str, str]:
    """Where the UI shows the collect run and the keyed artifacts ``job-<job>`` names; none when
    the UI's address is not known here."""
    ui = PREFECT_UI_URL.value()
    if not ui:
        return {}
    links = {key: f"{ui.rstrip('/')}/artifacts/key/{key}"
             for key in (f"results-{job_id}", f"failure-{job_id}", training_key(job_id))}
    this = runtime.flow_run.id
    if this:
        with get_client(sync_client=True) as client:
            runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[UUID(this)]),
                name=FlowRunFilterName(any_=[collect_run])), sort=FlowRunSort.START_TIME_DESC, limit=1)
        link = url_for("flow-run", obj_id=str(runs[0].id)) if runs else None
        if link:
            links[collect_run] = link
    return links
