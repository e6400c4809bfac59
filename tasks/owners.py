"""Who owns a job, in Prefect's words, and whether that owner was canceled or still runs.

Why the root flow run: a job belongs to the run a user started — ``submit-tao-job``,
``collect-tao-job`` or ``run-tao-job`` with the other two as its subflows — and canceling that
run must cancel the job. Prefect runs a flow's ``on_cancellation`` hooks on a best-effort basis
(a worker that dies with the run runs none), so the record names its owner and the scheduled
resync asks Prefect about it (:func:`canceled`). A crashed owner is not a canceled one: the
watcher died (a worker redeploy, a node drain), the job keeps running, and the next collect
takes it over.
"""

from __future__ import annotations

from uuid import UUID

from prefect import runtime
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import FlowRun, State
from prefect.exceptions import ObjectNotFound

OWNER_PREFIX = "prefect-flow-run/"


def this_run() -> str | None:
    """The owner this flow run stands for: its root run (itself, unless it is a subflow)."""
    root = runtime.flow_run.root_flow_run_id
    return f"{OWNER_PREFIX}{root}" if root else None


def owner_of(flow_run: FlowRun) -> str:
    """The owner a flow run (as a hook gets it) stands for: its root run, found by walking up
    through the task runs its subflows were called from."""
    run_id = flow_run.id
    parent = getattr(flow_run, "parent_task_run_id", None)
    with get_client(sync_client=True) as client:
        for _ in range(64):  # deeper nesting than any flow here; a loop is not a root
            if parent is None:
                break
            run_id = client.read_task_run(parent).flow_run_id
            parent = client.read_flow_run(run_id).parent_task_run_id
    return f"{OWNER_PREFIX}{run_id}"


def canceled(owner: str) -> bool:
    """Whether ``owner`` is a flow run that was canceled (or is being canceled). An owner that is
    not a flow run, or one deleted since, is not a cancel."""
    state = _state_of(owner)
    return state is not None and (state.is_cancelled() or state.is_cancelling())


def watching(owner: str) -> bool:
    """Whether ``owner`` is a flow run still running — a collect waiting on the job, or a
    ``run-tao-job`` (its root) — which records the job's end and uploads its results itself. An
    owner that is not a flow run, one deleted since, and one that ended are not."""
    state = _state_of(owner)
    return state is not None and state.is_running()


def _state_of(owner: str) -> State | None:
    """The state of the flow run ``owner`` names; None when it names none (any more)."""
    if not owner.startswith(OWNER_PREFIX):
        return None
    try:
        run_id = UUID(owner.removeprefix(OWNER_PREFIX))
    except ValueError:
        return None
    with get_client(sync_client=True) as client:
        try:
            return client.read_flow_run(run_id).state
        except ObjectNotFound:
            return None
