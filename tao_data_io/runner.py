"""The seam between a verb and whatever runs its steps.

Why a seam: a job's life (submit, collect, resync, cancel) is composed once, in
:mod:`tao_data_io.verbs`, as a sequence of steps with decisions between them. The CLI runs each
step by calling it (:func:`direct`); the Prefect layer runs each step as its task, with retries,
a timeout, a run name and artifacts (``tasks.runner``). A verb calls ``run(step, *args)`` and
never knows which: the order of the steps, what passes between them and every decision exist
once, and a new step is added once.

A step is a plain function over the core's models (a request, a record, a staging map, a
plan); it returns a model, so the next step gets it as is — nothing is turned into a dict and
validated again at a boundary.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ParamSpec, Protocol, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class Runner(Protocol):
    """Runs one step with its arguments and returns what the step returns (or raises what it
    raises, after whatever retries the runner adds)."""

    def __call__(self, step: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T: ...


def direct(step: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """The CLI's runner: the step, called here and now."""
    return step(*args, **kwargs)
