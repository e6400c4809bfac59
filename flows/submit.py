"""``submit-tao-job``: record → tier → stage (a task run per input) → config → plan → launch →
verify → RUNNING, returning the job id.

The same steps, in the same order, as :func:`tao_data_io.steps.submit` (the CLI's
composition) — each task calls the pipeline's step function — so the two cannot drift; the flow
adds what an orchestrator adds: each input staged as its own task run (shown and retried on its
own), progress and tables in the UI, retries of transient faults. A verify failure fails the
flow before the job's command starts, with the verdict per path in the UI.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from prefect import flow, runtime
from prefect.client.orchestration import get_client

from flows.common import DEFAULT_RECORDS, DEFAULT_TARGET, Setup, prepare
from tao_data_io.launch.backend import Submission
from tao_data_io.launch.plan import build_plan
from tao_data_io.launch.probe import Verdict
from tao_data_io.names import mint_job_id
from tao_data_io.steps import Submitted, already_launched
from tao_data_io.request import JobRequest, load_request, parse_request
from tao_data_io.staging.layout import plan_inputs
from tao_data_io.staging.stage import check_air_gap
from tao_data_io.staging.stage_map import StagingMap
from tao_data_io.tier import TierDecision
from tasks.launch import launch, verify
from tasks.masking import mask_run_logs, masking_failures
from tasks.records import decide_tier, open_record, route_outputs
from tasks.staging import plan_staging, publish_staging_map, stage_job_config, stage_one


def read_request(request: str | Mapping[str, Any], environ: Mapping[str, str]) -> JobRequest:
    """The request parameter: a path to a YAML/JSON request on the worker, or the request itself."""
    if isinstance(request, Mapping):
        return parse_request(request, source="request parameter", environ=environ)
    return load_request(request, environ=environ)


#: The run's name until the request is read: a job id is shown only once it is known to hold no
#: credential value, which takes the credential blocks the run loads (they may name any variable).
NEW_RUN_NAME = "submit-new-job"


@flow(name="submit-tao-job", flow_run_name=NEW_RUN_NAME, persist_result=True, result_serializer="json")
@masking_failures
def submit_tao_job(request: str | dict[str, Any], target: str = DEFAULT_TARGET, records: str = DEFAULT_RECORDS,
                   s3_credentials: str | None = None, hf_credentials: str | None = None,
                   ngc_credentials: str | None = None) -> dict[str, Any]:
    """Stage a TAO job's inputs, launch it, verify inside its frame, and leave it RUNNING.

    Args:
        request: a job request file on the worker (YAML or JSON, relative to the project
            directory) or the request itself, as a mapping.
        target: the compute target block (``tao-local-target/NAME`` or ``tao-kubernetes-target/NAME``).
        records: the job records block (``tao-job-records/NAME``).
        s3_credentials: an S3 credentials block (``tao-s3-credentials/NAME``); empty: the AWS names.
        hf_credentials: a Hugging Face credentials block; empty: HF_TOKEN.
        ngc_credentials: an NGC credentials block; empty: NGC_KEY.
    """
    setup = prepare(target, records, s3_credentials, hf_credentials, ngc_credentials)
    environ = setup.credentials.environ()
    job = read_request(request, environ)
    mask_run_logs(environ, secret_names=job.forward_env)  # the job may print what it is given
    if job.job_id is None:  # minted once, here: every retry below must open the same record
        job = job.model_copy(update={"job_id": mint_job_id(datetime.now(timezone.utc))})
    _rename_run(f"submit-{job.job_id}")
    job_id = str(job.job_id)
    request_doc = job.model_dump(mode="json")
    open_record(request_doc, setup.backend, setup.store)
    launched = already_launched(setup.store.get(job_id))
    if launched is not None:  # a rerun for a job that runs: nothing is staged again under it
        return launched.to_dict()
    decision = TierDecision.model_validate(decide_tier(request_doc, setup.backend, setup.store, job_id))
    staging_map = _stage(job, request_doc, setup, job_id)
    route_outputs(setup.store, job_id, setup.credentials)
    record = setup.store.get(job_id)
    assert record.output_route is not None
    plan = build_plan(job, staging_map, decision, record, record.output_route, environ=environ).model_dump(mode="json")
    submission = Submission.model_validate(launch(plan, setup.backend, setup.credentials, request_doc, setup.store))
    verdict = Verdict.model_validate(verify(plan, setup.backend, setup.store, submission.to_dict()))
    return Submitted(job_id, submission.backend_ref, decision.tier, submission.started, verdict).to_dict()


def _stage(job: JobRequest, request_doc: dict[str, Any], setup: Setup, job_id: str) -> StagingMap:
    """Stage each input as its own task run, then the config, then publish the map — the steps of
    :func:`tao_data_io.staging.stage.stage` — or, when the cluster stages, only plan it."""
    workdir = setup.target.workdir(job_id)
    if not setup.backend.stages_on_host:
        return StagingMap.model_validate(plan_staging(request_doc, setup.backend, workdir, setup.credentials))
    check_air_gap(job)
    # One input after another: each transfer is concurrent inside the core already, and a task's
    # timeout can interrupt it only on the flow's main thread.
    sources = [stage_one(planned.model_dump(mode="json"), workdir, setup.credentials, job_id)
               for planned in plan_inputs(job)]
    if job.mode == "config":
        sources.append(stage_job_config(request_doc, workdir))
    return StagingMap.model_validate(publish_staging_map(request_doc, workdir, sources))


def _rename_run(name: str) -> None:
    flow_run_id = runtime.flow_run.id
    if flow_run_id:
        with get_client(sync_client=True) as client:
            client.update_flow_run(flow_run_id, name=name)

