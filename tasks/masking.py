"""Keeping the worker's credential values out of what Prefect stores about a run.

Three channels reach the Prefect API from a run: its logs, the text of the exception that
failed it (stored as the run's state message in the database, and in a persisted result), and
its parameters, stored when the run was created. A run's logs pass :func:`mask_run_logs`'
filter; a failure passes :func:`masking_failures`, which every flow and every step wears; stored
parameters that hold a worker's credential value are replaced by a masked copy
(:func:`mask_stored_parameters`; of a run that crashed before its body, by
:func:`mask_parameters_of_crashed_run`). Nothing of ours puts a value in any — they are safety nets for
a library's message, a job's output, or a credential pasted into the wrong field.

Which values: those of the worker's environment whose names look like credentials', plus what
the running flow adds (the variables its credential blocks name, a job's ``forward_env``) —
the flow installs that mask once it knows, and every later failure in the process uses it.
"""

from __future__ import annotations

import functools
import logging
import traceback
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timezone
from pathlib import PurePosixPath
from typing import Any, TypeVar

from prefect import runtime
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import FlowRun
from prefect.context import FlowRunContext, TaskRunContext
from prefect.exceptions import FailedRun
from prefect.logging import get_run_logger
from prefect.states import Failed, State

from tao_data_io.redaction import (RedactingFilter, Redactor, credential_shape_fields, credential_value_fields,
                                   mask_credential_shapes, masked)
from tao_data_io.errors import JobOutcome, UsageError
from tao_data_io.names import is_job_id

F = TypeVar("F", bound=Callable[..., Any])

#: The loggers of flow and task runs, whose records go to the Prefect API.
RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")


class _RunLogMask(RedactingFilter):
    """Our filter on the run loggers (a class of its own, so a later flow run replaces it)."""


def mask_run_logs(environ: Mapping[str, str], secret_names: Iterable[str] = ()) -> None:
    """Mask every credential value of ``environ`` (and of ``secret_names``, whatever they are
    called) in the messages and tracebacks this process sends as run logs, and in the failures
    of the runs that follow (:func:`masking_failures`)."""
    mask = _RunLogMask(Redactor(environ, secret_names=secret_names))
    for name in RUN_LOGGERS:
        logger = logging.getLogger(name)
        for old in [f for f in logger.filters if isinstance(f, _RunLogMask)]:
            logger.removeFilter(old)
        logger.addFilter(mask)


def _installed() -> Redactor | None:
    found = [f for f in logging.getLogger(RUN_LOGGERS[0]).filters if isinstance(f, _RunLogMask)]
    return found[-1].redactor if found else None


def run_mask() -> Redactor:
    """The mask the running flow installed (:func:`mask_run_logs`), else the environment's: for
    text that reaches the Prefect API other than as a log line (an artifact)."""
    return _installed() or Redactor()


def mask_stored_parameters(environ: Mapping[str, str] | None = None) -> list[str]:
    """The running flow's stored parameters that hold a credential value of ``environ`` (default
    ``os.environ``) or a well-known credential's shape (field paths, masked), after replacing
    the stored parameters — and the run's name, which may have been made from one — with a
    masked copy through the API: the server keeps a run's parameters for as long as it keeps the
    run, where no log filter reaches. Nothing outside a flow run: nothing stored."""
    context = FlowRunContext.get()
    if context is None or context.flow_run is None:
        return []
    return _mask_parameters_of(context.flow_run, environ)  # as the server holds them (the run's own are live objects)


def mask_parameters_of_crashed_run(flow: Any, flow_run: FlowRun, state: State) -> None:
    """``on_crashed`` of every flow: a run that crashed before its first line — a parameter the
    flow does not take, which a run created without the server's check (an older deployment's
    schema, or ``enforce_parameter_schema: false``) can hold, fails binding — never reached
    :func:`mask_stored_parameters`. The worker runs this hook once the run is Crashed, so the
    parameters the server keeps are masked then, by the worker's environment and the well-known
    shapes (the credential blocks a crashed run names were never loaded)."""
    del flow, state
    with get_client(sync_client=True) as client:
        stored = client.read_flow_run(flow_run.id)  # as it is now: the hook's copy is the run's at its start
    _mask_parameters_of(stored, None)


def _mask_parameters_of(flow_run: FlowRun, environ: Mapping[str, str] | None) -> list[str]:
    stored = flow_run.parameters
    forwarded = _forwarded_names(stored)
    leaked = sorted({*credential_value_fields(stored, environ, secret_names=forwarded),
                     *credential_shape_fields(stored)})
    if leaked:
        redact = Redactor(environ, secret_names=forwarded)

        def clean(text: str) -> str:
            return mask_credential_shapes(redact(text))

        with get_client(sync_client=True) as client:
            client.update_flow_run(flow_run.id, parameters=_masked(stored, clean), name=clean(flow_run.name))
    return leaked


def _forwarded_names(parameters: Mapping[str, Any]) -> list[str]:
    """The ``forward_env`` of a request parameter: credentials by name, whatever they are called."""
    request = parameters.get("request")
    names = request.get("forward_env") if isinstance(request, Mapping) else None
    return [name for name in names if isinstance(name, str)] if isinstance(names, list) else []


def job_run_name(word: str) -> Callable[[], str]:
    """The run name ``<word>-<job id>`` of a flow whose ``job_id`` parameter names its job,
    made before the flow's first line (Prefect names the run then): the id is shown only when it
    is one (a credential's shape never is) and holds no credential value of this worker."""

    def name() -> str:
        job_id = runtime.flow_run.parameters.get("job_id")
        shown = isinstance(job_id, str) and is_job_id(job_id) and Redactor()(job_id) == job_id
        return f"{word}-{job_id if shown else 'unnamed-job'}"

    return name


def started_run_name(word: str, *parameters: str) -> Callable[[], str]:
    """The run name of a flow that does not know its job yet: ``<word>: <what it was given>,
    <when>`` (``submit: demo-local.yaml, 2026-12-01 21:30:05Z``; ``submit: request given in the
    form, …``), so a list of runs that failed before naming their job — or of scheduled resyncs —
    says which is which. What it was given is the first of ``parameters`` given: a text by its
    last path part, anything else (a form's request, a block) by the parameter's name. Masked like
    every name shown before the flow's first line, and never of the form ``<word>-<job id>``,
    which :func:`flows.common.job_of` reads as a job this run owns."""

    def name() -> str:
        given = next(((parameter, value) for parameter in parameters
                      if (value := runtime.flow_run.parameters.get(parameter)) not in (None, "")), None)
        if given is None:
            what = f"no {' or '.join(parameters)} given"
        elif not isinstance(given[1], str):
            what = f"{given[0]} given in the form"
        elif mask_credential_shapes(Redactor()(given[1])) != given[1]:  # the whole text: a secret's tail is no safer
            what = f"{given[0]} masked"
        else:
            what = PurePosixPath(given[1]).name
        return f"{word}: {what}, {datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S}Z"

    return name


def _masked(value: Any, clean: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return clean(value)
    if isinstance(value, Mapping):
        return {clean(str(key)): _masked(child, clean) for key, child in value.items()}
    if isinstance(value, list | tuple):
        return [_masked(child, clean) for child in value]
    return value


def masking_failures(fn: F) -> F:
    """``fn``, whose exceptions leave it with every credential value in their text masked (see
    :func:`tao_data_io.redaction.masked`: our errors keep their type, whether a retry can help
    is kept). Goes under ``@flow``/``@task``, so Prefect sees only the masked exception.

    A flow that fails on bad input (a :class:`UsageError`, whose text names the field, the value
    and the fix) or on its job's outcome (a :class:`JobOutcome`: the job ended ERROR) — or whose
    subflow did — ends ``Failed(message=…)`` with that text, logged once: Prefect's engine would
    log its whole traceback, which says nothing a user can act on and buries the one line that
    does."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            clean = exc
            for redactor in filter(None, (_installed(), Redactor())):
                clean = masked(clean, redactor)
            if isinstance(clean, UsageError | JobOutcome | FailedRun) and _in_a_flows_body():
                get_run_logger().error("%s", clean)
                return Failed(message=str(clean))
            if clean is exc and not _chain_quotes_a_credential(exc):
                raise
            raise clean from None  # the original's traceback and chain quote the value

    return run  # type: ignore[return-value]


def _chain_quotes_a_credential(exc: BaseException) -> bool:
    """Whether the exceptions ``exc`` was raised from (its cause, its context, their notes) quote a
    credential: the exception itself may be masked in place while its chain still holds the value
    — and Prefect logs the whole chain."""
    text = "".join(traceback.format_exception(exc))
    return any(mask(text) != text for mask in filter(None, (_installed(), Redactor(), mask_credential_shapes)))


def _in_a_flows_body() -> bool:
    return TaskRunContext.get() is None and FlowRunContext.get() is not None
