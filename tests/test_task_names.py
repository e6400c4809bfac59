"""Each Prefect task is named as the core's step it runs, so the task graph in the UI, the code
and the steps' docs use one word for each step (a task called ``launch`` ran ``start``)."""

from __future__ import annotations

import importlib
import inspect

import pytest
from prefect import Task

import tao_data_io.launch.plan
import tao_data_io.staging.stage
import tao_data_io.steps

CORE = (tao_data_io.steps, tao_data_io.staging.stage, tao_data_io.launch.plan)
TASK_MODULES = ("tasks.launch", "tasks.outputs", "tasks.records", "tasks.staging")


def _tasks() -> list[tuple[str, Task]]:  # type: ignore[type-arg]
    found = []
    for name in TASK_MODULES:
        module = importlib.import_module(name)
        found += [(f"{name}.{attr}", value) for attr, value in vars(module).items()
                  if isinstance(value, Task) and getattr(value.fn, "__module__", None) == name]
    return found


def test_every_step_module_has_tasks() -> None:
    assert len(_tasks()) >= 20, [where for where, _ in _tasks()]


@pytest.mark.parametrize(("where", "task"), _tasks(), ids=lambda value: value if isinstance(value, str) else "")
def test_a_task_is_named_as_the_core_step_it_runs(where: str, task: Task) -> None:  # type: ignore[type-arg]
    function = task.fn.__name__
    assert task.name == function.replace("_", "-"), where
    steps = [module for module in CORE if inspect.isfunction(getattr(module, function, None))]
    assert steps, f"{where}: no step called {function} in {[module.__name__ for module in CORE]}"
