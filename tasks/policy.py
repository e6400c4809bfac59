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
* **A timeout** per step, chosen by what the step waits on.
* **A masked failure**: no credential value in the text Prefect stores of a failed attempt
  (:mod:`tasks.masking`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.tasks import exponential_backoff

from tao_data_io.errors import is_retryable
from tasks.masking import masking_failures

F = TypeVar("F", bound=Callable[..., Any])

RETRIES = 3
#: First retry after ~2 s, then 4 s, 8 s (each plus up to half again of jitter). The core's
#: clients have already retried each request (AWS_MAX_ATTEMPTS, default 9 attempts) by then.
BACKOFF_SECONDS = 2.0
JITTER = 0.5

#: Timeouts, by what a step waits on.
QUICK = 120.0  # a record write, a route decision
CLUSTER = 600.0  # the backend's facts, a plan of the staging
TRANSFER = 6 * 3600.0  # moving one input or a job's results
LAUNCH = 1800.0  # preflight + submit; verify waits up to the backend's verify timeout (600 s)
WAIT = 7 * 24 * 3600.0  # a job's whole run: long PENDING is normal


def retry_if_retryable(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect's retry condition: retry the failed attempt only if its exception is transient."""
    exc = state.result(raise_on_failure=False)
    return isinstance(exc, BaseException) and is_retryable(exc)


def step(name: str, *, timeout_seconds: float, task_run_name: str | Callable[[], str] | None = None,
         retries: int = RETRIES) -> Callable[[F], F]:
    """The ``@task`` of every step (see the module docstring)."""
    def decorate(fn: F) -> F:
        return task(name=name, task_run_name=task_run_name, retries=retries,  # type: ignore[return-value]
                    retry_delay_seconds=exponential_backoff(backoff_factor=BACKOFF_SECONDS),
                    retry_jitter_factor=JITTER, retry_condition_fn=retry_if_retryable,
                    timeout_seconds=timeout_seconds, cache_policy=NO_CACHE, persist_result=False)(masking_failures(fn))

    return decorate
