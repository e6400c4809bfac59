"""The launch steps as tasks: plan the launch, start the job (preflight, then a local submit or
a Kubernetes apply — whatever the backend does), then wait for the verify verdict from inside
the frame.

Why separate tasks: starting is idempotent and quick to retry (a retried submit starts nothing
new); the verdict can take minutes (an image pull), and a failed verdict is final — the job's
command never started, the record says ERROR with the verdict, and the UI shows it path by path.

Why neither declares a timeout: each runs a backend's wait (a stage Job, a collective probe; a
queue's admission, a node, an image pull) whose bound only the backend knows, for the plan at
hand. The runner times each call by it (``tasks.runner.WAITS``, :func:`tasks.policy.waiting`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact

from tao_data_io import steps
from tao_data_io.launch import plan as planning
from tao_data_io.launch.backend import Backend, JobDocuments, Submission
from tao_data_io.launch.plan import LaunchPlan
from tao_data_io.launch.probe import Verdict
from tao_data_io.records import JobRecord, OutputRoute, RecordStore
from tao_data_io.request import JobRequest
from tao_data_io.staging.stage_map import StagingMap
from tao_data_io.tier import TierDecision
from tasks.policy import QUICK, step
from tasks.reports import launch_report


@step(timeout_seconds=QUICK, task_run_name="build-plan-{record.job_id}")
def build_plan(request: JobRequest, staging_map: StagingMap, decision: TierDecision, record: JobRecord,
               route: OutputRoute, *, environ: Mapping[str, str] | None = None,
               state_roots: Sequence[str] = ()) -> LaunchPlan:
    """What the backend launches: the image, command, mounts and environment, names only."""
    return planning.build_plan(request, staging_map, decision, record, route, environ=environ,
                               state_roots=state_roots)


@step(timeout_seconds=None, task_run_name="start-{plan.job_id}")
def start(plan: LaunchPlan, backend: Backend, *, environ: Mapping[str, str] | None = None,
          documents: JobDocuments | None = None, store: RecordStore | None = None,
          reporter: str = "cli") -> Submission:
    """Preflight and submit; credential values for the plan's ``forward_env`` are read here, on
    the worker, and go only to the frame."""
    submission = steps.start(plan, backend, environ=environ, documents=documents, store=store, reporter=reporter)
    get_run_logger().info("job %s: %s", plan.job_id, submission.describe())
    return submission


@step(timeout_seconds=None, task_run_name="confirm-{plan.job_id}")
def confirm(plan: LaunchPlan, backend: Backend, store: RecordStore, submission: Submission, *,
            reporter: str) -> Verdict:
    """The verdict from inside the frame, stored in the record and shown with the tier and route;
    a failed one raises (not retried) and the job never starts."""
    try:
        verdict = steps.confirm(plan, backend, store, submission, reporter=reporter)
    except steps.VerifyFailed as failed:
        assert failed.verdict is not None  # raised here, not rebuilt from a stored result
        _publish(plan, store, failed.verdict)
        raise
    _publish(plan, store, verdict)
    get_run_logger().info("job %s: %s", plan.job_id, verdict.describe())
    return verdict


def _publish(plan: LaunchPlan, store: RecordStore, verdict: Verdict) -> None:
    create_markdown_artifact(launch_report(store.get(plan.job_id), verdict), key=f"launch-{plan.job_id}",
                             description=f"Job {plan.job_id}: tier, output route and the verify verdict")
