"""The Prefect runner: each step a verb runs becomes its task run.

Why a table: the verbs (:mod:`tao_data_io.verbs`) name the core's step functions; this maps
each to the task that wraps it (its retries, timeout, run name, artifacts). A step without a
task is refused by name rather than run untracked, so a step added to a verb is added here too
(``tests/test_flows.py`` runs every verb through this runner).

Why ``opaque``: Prefect walks a task's arguments looking for futures and states, descending
into models and mappings — slow for a staging map, and wrong for a model with a field named
``keys``. ``opaque`` resolves the value itself but does not walk into it, so a task still
records the upstream task run whose result it received (the graph keeps its edges), which
``quote`` would lose.

Why ``WAITS``: the launch and verify steps run the backend's own waits, so their tasks' timeouts
are those waits' bounds for the plan at hand (``backend.waits(plan)``), set per call — never a
fixed number that would cut, in a flow and not from the CLI, a wait the backend still allows.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, ParamSpec, TypeVar

from prefect import Task
from prefect.context import FlowRunContext
from prefect.utilities.annotations import opaque

from tao_data_io import steps
from tao_data_io.launch import plan
from tao_data_io.staging import stage
from tasks import launch, outputs, records, staging
from tasks.policy import waiting

P = ParamSpec("P")
T = TypeVar("T")

#: Every step a verb runs → its task.
TASKS: Mapping[Callable[..., Any], Task[..., Any]] = {
    steps.open_record: records.open_record,
    steps.read_record: records.read_record,
    steps.read_staging_map: records.read_staging_map,
    steps.watch: records.watch,
    steps.fail_before_launch: records.fail_before_launch,
    steps.decide_tier: records.decide_tier,
    steps.route_outputs: records.route_outputs,
    steps.record_end: records.record_end,
    stage.stage_input: staging.stage_input,
    stage.stage_config: staging.stage_config,
    stage.publish_map: staging.publish_map,
    stage.plan_stage: staging.plan_stage,
    plan.build_plan: launch.build_plan,
    steps.start: launch.start,
    steps.confirm: launch.confirm,
    steps.wait_for_end: outputs.wait_for_end,
    steps.observe: outputs.observe,
    steps.upload_job_results: outputs.upload_job_results,
    steps.failure_report: outputs.failure_report,
    steps.running_jobs: outputs.running_jobs,
    steps.resync_job: outputs.resync_job,
    steps.cancel_job: outputs.cancel_job,
}

#: The steps that run one of the backend's waits, by its name in
#: :class:`~tao_data_io.launch.backend.Waits`; each takes the ``plan`` and the ``backend``.
WAITS: Mapping[Callable[..., Any], str] = {steps.start: "submit", steps.confirm: "verify"}


def prefect_runner(step: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """Run ``step`` as its task (in this flow run, on this thread: a task's timeout can interrupt
    only the flow's main thread)."""
    task = TASKS.get(step)
    if task is None:
        raise TypeError(f"step {step.__module__}.{step.__qualname__} has no task in tasks.runner.TASKS: wrap it "
                        "in a task and add it there")
    if step in WAITS:
        given = inspect.signature(step).bind(*args, **kwargs).arguments
        task = waiting(task, getattr(given["backend"].waits(given["plan"]), WAITS[step]))
    result: T = task(*(_opaque(value) for value in args), **{name: _opaque(value) for name, value in kwargs.items()})
    _forget_untracked_links()
    return result


def _forget_untracked_links() -> None:
    """Drop the links Prefect made from this flow run's results to their tasks that it cannot
    verify. Why: Prefect links a task's result *and its fields* to the task by ``id()``, and for
    a field that takes no weak reference (a list, a dict, a string) the link outlives the field;
    once it is freed, a new object at its address — the ``opaque`` wrapper of another task's
    argument — inherits an edge to the wrong task (PrefectHQ/prefect#20558: the graph once showed
    ``verify`` fed by ``open-record``). Every edge the verbs draw is a whole result (a model, a
    list's items), which Prefect links with a weak reference and checks; those links stay."""
    context = FlowRunContext.get()
    if context is None:
        return
    links = context.run_results
    for key in [key for key, entry in links.items() if isinstance(entry, tuple) and len(entry) == 3
                and entry[2] is None]:
        del links[key]


def _opaque(value: Any) -> Any:
    """``value`` wrapped in ``opaque``; a list's items each (the staged sources a map is made of
    are results of the stage tasks, and each edge belongs in the graph)."""
    if isinstance(value, list):
        return [opaque(item) for item in value]
    return opaque(value)
