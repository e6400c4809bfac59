"""The launch steps as tasks: start the job (preflight, then a local submit or a Kubernetes
apply — whatever the backend does), then wait for the verify verdict from inside the frame.

Why two tasks: starting is idempotent and quick to retry (a retried submit starts nothing new);
the verdict can take minutes (an image pull), and a failed verdict is final — the job's command
never started, the record says ERROR with the verdict, and the UI shows it path by path.
"""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact

from blocks.credentials import CredentialSet
from tao_data_io import steps
from tao_data_io.launch.backend import Backend, JobDocuments, Submission
from tao_data_io.launch.plan import LaunchPlan
from tao_data_io.launch.probe import Verdict
from tao_data_io.records import RecordStore
from tao_data_io.request import JobRequest
from tasks.policy import LAUNCH, step
from tasks.records import SOURCE
from tasks.reports import launch_report


@step("launch", timeout_seconds=LAUNCH, task_run_name="launch-{plan[job_id]}")
def launch(plan: dict[str, Any], backend: Backend, credentials: CredentialSet, request: dict[str, Any],
           store: RecordStore) -> dict[str, Any]:
    """Preflight and submit; credential values for the plan's ``forward_env`` are read here, on
    the worker, and go only to the frame. The request and the record travel with the plan for a
    backend whose pods stage for themselves."""
    launch_plan = LaunchPlan.model_validate(plan)
    documents = JobDocuments(JobRequest.model_validate(request), store.get(launch_plan.job_id))
    submission = steps.start(launch_plan, backend, environ=credentials.environ(), documents=documents,
                                store=store)
    get_run_logger().info("job %s: %s", launch_plan.job_id, submission.describe())
    return submission.to_dict()


@step("verify", timeout_seconds=LAUNCH, task_run_name="verify-{plan[job_id]}")
def verify(plan: dict[str, Any], backend: Backend, store: RecordStore, submission: dict[str, Any]) -> dict[str, Any]:
    """The verdict from inside the frame, stored in the record and shown with the tier and route;
    a failed one raises (not retried) and the job never starts."""
    launch_plan = LaunchPlan.model_validate(plan)
    try:
        verdict = steps.confirm(launch_plan, backend, store, Submission.model_validate(submission), source=SOURCE)
    except steps.VerifyFailed as failed:
        assert failed.verdict is not None  # raised here, not rebuilt from a stored result
        _publish(launch_plan, store, failed.verdict)
        raise
    _publish(launch_plan, store, verdict)
    get_run_logger().info("job %s: %s", launch_plan.job_id, verdict.describe())
    return verdict.to_dict()


def _publish(plan: LaunchPlan, store: RecordStore, verdict: Verdict) -> None:
    create_markdown_artifact(launch_report(store.get(plan.job_id), verdict), key=f"launch-{plan.job_id}",
                             description=f"Job {plan.job_id}: tier, output route and the verify verdict")
