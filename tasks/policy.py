"""How every task of the Prefect layer retries, times out and caches — decided once, here.

* **Retries** only when the core says a retry can help (:func:`tao_data_io.errors.is_retryable`:
  throttling, 5xx, dropped connections, a transfer whose complete files were kept), with
  exponential backoff and jitter. Bad input fails at once: the same request fails the same way.
  Each step is idempotent in the core (a retried stage moves nothing already staged, a retried
  submit starts nothing, a retried mark writes nothing), so a retry is safe for the job and its
  record; what a retried task adds to the UI (a second progress artifact) stays beside the first.
* **No cache, no persisted result.** A retry must redo the work against the world as it is
  now, never read a stale cached answer; and a task's result is never written to result storage
  (with ``NO_CACHE`` Prefect would not write it anyway, and a reader of the state would fail on
  the missing file). Tasks return the core's models, which the verb passes on in memory.
* **A timeout** per step, chosen by what the step waits on; a step that runs a backend's wait
  (the launch's stage Job or collective probe, the verify's admission, node and image pull) is
  timed by that wait's own bound, which the backend says for the plan (:func:`waiting`), so a
  flow waits as long as the CLI, which has no timeout, would.
* **A masked failure**: no credential value in the text Prefect stores of a failed attempt
  (:mod:`tasks.masking`).
* **Named from its step**: a task is called as the function it wraps (``start`` → ``start``,
  ``upload_job_results`` → ``upload-job-results``), which is the name of the core's step it runs,
  so the task graph in the UI, the code and the CLI's step names are one vocabulary and cannot
  drift apart.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from prefect import Task, task
from prefect.cache_policies import NO_CACHE
from prefect.tasks import exponential_backoff

from tao_data_io.errors import is_retryable
from tasks.masking import masking_failures

F = TypeVar("F", bound=Callable[..., Any])
P = ParamSpec("P")
R = TypeVar("R")

RETRIES = 3
#: First retry after ~2 s, then 4 s, 8 s (each plus up to half again of jitter). The core's
#: clients have already retried each request (AWS_MAX_ATTEMPTS, default 9 attempts) by then.
BACKOFF_SECONDS = 2.0
JITTER = 0.5

#: Timeouts, by what a step waits on.
QUICK = 120.0  # a record write, a route decision
CLUSTER = 600.0  # the backend's facts, a plan of the staging
TRANSFER = 6 * 3600.0  # moving one input or a job's results
LAUNCH = 600.0  # what a launch step does besides the backend's waits: the preflight, the API calls, the record
WAIT = 7 * 24 * 3600.0  # a job's whole run: long PENDING is normal


def retry_if_retryable(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect's retry condition: retry the failed attempt only if its exception is transient."""
    exc = state.result(raise_on_failure=False)
    return isinstance(exc, BaseException) and is_retryable(exc)


def waiting(wrapped: Task[P, R], wait: float | None) -> Task[P, R]:
    """``wrapped`` with the timeout of a step that runs a backend's wait of at most ``wait`` seconds
    (:class:`~tao_data_io.launch.backend.Waits`): the wait's own bound and :data:`LAUNCH` for the
    step's own work — or no timeout at all for a wait with no bound of time, which ends when its
    transfer does. Why not a fixed timeout: it would end a queued job's admission, a large
    dataset's stage, in a flow and not from the CLI, while the backend still allows it."""
    seconds = None if wait is None else wait + LAUNCH
    timed = wrapped.with_options(timeout_seconds=seconds)
    timed.timeout_seconds = seconds  # with_options reads None as "keep the task's own"
    return timed


def step(*, timeout_seconds: float | None, task_run_name: str | Callable[[], str] | None = None,
         retries: int = RETRIES) -> Callable[[F], F]:
    """The ``@task`` of every step (see the module docstring), named from the function it wraps;
    ``timeout_seconds`` None: the task's timeout is set per call (:func:`waiting`)."""
    def decorate(fn: F) -> F:
        return task(name=fn.__name__.replace("_", "-"), task_run_name=task_run_name, retries=retries,  # type: ignore[return-value]
                    retry_delay_seconds=exponential_backoff(backoff_factor=BACKOFF_SECONDS),
                    retry_jitter_factor=JITTER, retry_condition_fn=retry_if_retryable,
                    timeout_seconds=timeout_seconds, cache_policy=NO_CACHE, persist_result=False)(masking_failures(fn))

    return decorate
