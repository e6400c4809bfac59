"""The record steps as tasks: open the job's record, read it, decide its tier, route its outputs,
record its end. Each runs one step of :mod:`tao_data_io.steps`, idempotent there: a retry finds
the record, tier, route or end already written and writes nothing new.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact

from tao_data_io import steps
from tao_data_io.launch.backend import Backend, JobStatus
from tao_data_io.records import JobRecord, RecordStore
from tao_data_io.request import JobRequest
from tao_data_io.staging.stage_map import StagingMap
from tao_data_io.tier import TierDecision
from tasks.masking import run_mask
from tasks.policy import CLUSTER, QUICK, step
from tasks.reports import request_report


@step(timeout_seconds=QUICK, task_run_name="open-record-{request.job_id}")
def open_record(request: JobRequest, backend: Backend, store: RecordStore, *, reporter: str) -> JobRecord:
    """Open (or re-open) the job's record; the request's job id is set, so a retry opens the same one."""
    record = steps.open_record(request, backend, store, reporter=reporter)
    get_run_logger().info("job %s: record in %s (%s)", record.job_id, store.location, record.state)
    create_markdown_artifact(run_mask()(request_report(request)), key=f"request-{record.job_id}",
                             description=f"the request job {record.job_id} runs")
    return record


@step(timeout_seconds=QUICK, task_run_name="fail-before-launch-{job_id}")
def fail_before_launch(store: RecordStore, job_id: str, request: JobRequest, error: BaseException, *,
                       environ: Mapping[str, str] | None = None, reporter: str) -> JobRecord:
    """Say in the record why the submit failed before the job launched (ERROR, the reason masked)."""
    record = steps.fail_before_launch(store, job_id, request, error, environ=environ, reporter=reporter)
    get_run_logger().info("job %s: %s", job_id, record.state + (f" ({record.message})" if record.message else ""))
    return record


@step(timeout_seconds=QUICK, task_run_name="watch-{job_id}")
def watch(store: RecordStore, job_id: str, owner: str) -> JobRecord:
    """Record this run as who watches the job: if it is canceled, so is the job."""
    return steps.watch(store, job_id, owner)


@step(timeout_seconds=QUICK, task_run_name="read-staging-map")
def read_staging_map(staging_dir: Path) -> StagingMap:
    """The staging map an earlier attempt of the submit published."""
    return steps.read_staging_map(staging_dir)


@step(timeout_seconds=QUICK, task_run_name="read-record-{job_id}")
def read_record(store: RecordStore, job_id: str) -> JobRecord:
    """The job's record as it stands."""
    return steps.read_record(store, job_id)


@step(timeout_seconds=CLUSTER, task_run_name="decide-tier-{job_id}")
def decide_tier(request: JobRequest, backend: Backend, store: RecordStore, job_id: str) -> TierDecision:
    """The storage tier from what the backend offers, stamped into the record before anything moves."""
    decision = steps.decide_tier(request, backend, store, job_id)
    get_run_logger().info("job %s: %s", job_id, decision.describe())
    return decision


@step(timeout_seconds=QUICK, task_run_name="route-outputs-{job_id}")
def route_outputs(store: RecordStore, job_id: str, environ: Mapping[str, str] | None = None) -> JobRecord:
    """Where results go (a mount, an S3 prefix or ephemeral), pinned in the record."""
    record = steps.route_outputs(store, job_id, environ)
    assert record.output_route is not None
    get_run_logger().info("job %s: results go to %s (%s)", job_id, record.output_route.destination,
                          record.output_route.reason)
    return record


@step(timeout_seconds=QUICK, task_run_name="record-end-{job_id}")
def record_end(store: RecordStore, job_id: str, status: JobStatus, *, reporter: str) -> JobRecord:
    """Mark the record with the job's terminal state (final: a retry writes nothing)."""
    return steps.record_end(store, job_id, status, reporter=reporter)
