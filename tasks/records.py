"""The record steps as tasks: open the job's record, decide its tier, route its outputs, record
its end. Each calls one function of :mod:`tao_data_io.steps` (the CLI's composition calls the
same), and each is idempotent there: a retry finds the record, tier, route or end already
written and writes nothing new.

Every task of this layer takes the core's contract models as their JSON form (a request, a
planned input, a plan) and validates them back: they are JSON-able on purpose, and Prefect's
walk over task parameters must not descend into models (it mistakes a field named ``keys``, as
an input's annotation keys, for a mapping's method).
"""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger

from blocks.credentials import CredentialSet
from tao_data_io import steps
from tao_data_io.launch.backend import Backend, JobStatus
from tao_data_io.records import JobRecord, RecordStore
from tao_data_io.request import JobRequest
from tasks.policy import CLUSTER, QUICK, step

#: Who the record's history says made a change.
SOURCE = "flow"


def summary(record: JobRecord) -> dict[str, Any]:
    """The few fields of a record a task returns (the record itself stays in the store)."""
    return record.model_dump(mode="json", include={"job_id", "state", "platform", "storage_tier", "backend_ref"})


@step("open-record", timeout_seconds=QUICK, task_run_name="open-record-{request[job_id]}")
def open_record(request: dict[str, Any], backend: Backend, store: RecordStore) -> dict[str, Any]:
    """Open (or re-open) the job's record; the request's job id is set, so a retry opens the same one."""
    record = steps.open_record(JobRequest.model_validate(request), backend, store, source=SOURCE)
    get_run_logger().info("job %s: record in %s (%s)", record.job_id, store.location, record.state)
    return summary(record)


@step("decide-tier", timeout_seconds=CLUSTER, task_run_name="decide-tier-{job_id}")
def decide_tier(request: dict[str, Any], backend: Backend, store: RecordStore, job_id: str) -> dict[str, Any]:
    """The storage tier from what the backend offers, stamped into the record before anything moves."""
    decision = steps.decide_tier(JobRequest.model_validate(request), backend, store, job_id)
    get_run_logger().info("job %s: %s", job_id, decision.describe())
    return decision.to_dict()


@step("route-outputs", timeout_seconds=QUICK, task_run_name="route-outputs-{job_id}")
def route_outputs(store: RecordStore, job_id: str, credentials: CredentialSet) -> dict[str, Any]:
    """Where results go (a mount, an S3 prefix or ephemeral), pinned in the record."""
    record = steps.route_outputs(store, job_id, credentials.environ())
    assert record.output_route is not None
    get_run_logger().info("job %s: results go to %s (%s)", job_id, record.output_route.destination,
                          record.output_route.reason)
    return record.output_route.model_dump(mode="json")


@step("record-end", timeout_seconds=QUICK, task_run_name="record-end-{job_id}")
def record_end(store: RecordStore, job_id: str, status: dict[str, Any]) -> dict[str, Any]:
    """Mark the record with the job's terminal state (final: a retry writes nothing)."""
    return summary(steps.record_end(store, job_id, JobStatus.model_validate(status), source=SOURCE))
