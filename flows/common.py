"""What every flow does first: load the blocks its parameters name, and keep the worker's
credential values out of the run's logs and its stored parameters — and how every flow runs a
verb's steps.

A block parameter is typed as its block classes, so the run form shows a block picker and the
server checks a reference to a saved block; it may also be written ``BLOCK-TYPE/NAME``
(``tao-local-target/local``), as Prefect's own ``Block.load`` reads it, which is what the
deployment files and ``prefect deployment run -p`` use. A credential parameter left empty means
the standard variable names (the same as a credential block with its defaults), so a flow runs
without any saved credential block.

Why the flows take their parameters unvalidated (``validate_parameters=False``) and load them
here: Prefect would validate them before the flow's first line, and a failure's text — our
validators name the value they refuse — would become the run's state message before any mask
exists. The server has already checked them against the schema; the rest is checked here, masked.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from functools import cache
from collections.abc import Mapping
from typing import Any, TypeVar, Union

from prefect.blocks.core import Block
from pydantic import ValidationError
from prefect.client.schemas.objects import FlowRun
from prefect.logging.loggers import flow_run_logger
from prefect.states import State

from blocks.credentials import CredentialSet, HuggingFaceEnvCredentials, NGCEnvCredentials, S3EnvCredentials
from blocks.records import JobRecords
from blocks.targets import TARGETS, ComputeTarget
from tao_data_io.errors import UsageError
from tao_data_io.forms import GuardedText
from tao_data_io.runner import Runner, direct
from tao_data_io.verbs import Backend, RecordStore, cancel
from tasks.masking import mask_run_logs, mask_stored_parameters
from tasks.owners import owner_of
from tasks.runner import prefect_runner

DEFAULT_TARGET = "tao-local-target/local"
DEFAULT_RECORDS = "tao-job-records/local"
#: Who the record's history says made a change.
REPORTER = "flow"
#: How the flows run a verb's steps: each as its task. Read at call time (``common.RUN``), so a
#: test can record the steps a flow runs.
RUN: Runner = prefect_runner
#: The flows whose runs own a job, by the word their run names start with.
OWNING_FLOWS = ("submit", "run", "collect")

B = TypeVar("B", bound=Block)

#: The block parameters' types: a picker in the run form, or ``BLOCK-TYPE/NAME``.
Target = Union[(*TARGETS.values(), GuardedText)]  # every backend's target block
Records = JobRecords | GuardedText
S3Credentials = S3EnvCredentials | GuardedText | None
HFCredentials = HuggingFaceEnvCredentials | GuardedText | None
NGCCredentials = NGCEnvCredentials | GuardedText | None


@dataclass(frozen=True)
class Setup:
    target: ComputeTarget
    backend: Backend
    store: RecordStore
    credentials: CredentialSet


def prepare(target: Target, records: Records, s3_credentials: S3Credentials = None,
            hf_credentials: HFCredentials = None, ngc_credentials: NGCCredentials = None) -> Setup:
    """Load the blocks, mask the run logs (and the run's stored parameters, should they hold a
    credential value of this worker), open the record store and build the backend. The
    credentials are the environment the verb's steps see (names only; see :class:`CredentialSet`)."""
    _freeze_imports()
    _refuse_credentials_in_parameters(None)  # before a block parameter's text reaches any message
    credentials = CredentialSet.of([
        load_block(s3_credentials, S3EnvCredentials, "s3_credentials") if s3_credentials else S3EnvCredentials(),
        (load_block(hf_credentials, HuggingFaceEnvCredentials, "hf_credentials") if hf_credentials
         else HuggingFaceEnvCredentials()),
        load_block(ngc_credentials, NGCEnvCredentials, "ngc_credentials") if ngc_credentials else NGCEnvCredentials(),
    ])
    environ = credentials.environ()
    mask_run_logs(environ)
    _refuse_credentials_in_parameters(environ)
    kept = load_block(records, JobRecords, "records")
    if kept.bucket is not None:  # its own credentials: masked as well, and looked for in the parameters
        watched = {**environ, **{f"RECORDS_{name}": value for name, value in kept.bucket.credentials.environ().items()}}
        mask_run_logs(watched)
        _refuse_credentials_in_parameters(watched)
    compute = load_block(target, ComputeTarget, "target")
    return Setup(compute, compute.backend(), kept.store(environ), credentials)


def _refuse_credentials_in_parameters(environ: Mapping[str, str] | None) -> None:
    """Fail the run when its stored parameters hold a credential — a value of the worker's
    environment (``environ``, default its own; then again with the variables the credential
    blocks name) or a well-known shape — once they have been replaced by a masked copy."""
    leaked = mask_stored_parameters(environ)
    if leaked:
        raise UsageError(f"parameter {', '.join(leaked)} holds a credential (a value of this worker's credential "
                         "variables, or a key's or token's shape); the run's stored parameters were masked. "
                         "Parameters name credentials (blocks, forward_env), never hold them")


@cache
def _freeze_imports() -> None:
    """Leave what the process holds at its first flow run — Prefect's and our imports, well over a
    million objects — out of every later cyclic garbage collection. Otherwise each collection a
    transfer's allocations trigger walks them all: a resync of 10,000 files in a fresh flow-run
    process took ~2 s longer, growing with the file count (bench/flows.py). Once per process, so
    a long-lived process (the tests, ``serve``) never freezes the garbage of earlier runs."""
    gc.freeze()


def load_block(value: Block | str | Mapping[str, Any], kind: type[B], parameter: str) -> B:
    """The block the flow parameter ``parameter`` gives, which must be a ``kind``: the block itself
    (a flow called from Python), a saved block's ``BLOCK-TYPE/NAME``, or a reference to a saved
    block (``{"$ref": {"block_document_id": …}}``, what the run form's picker sends)."""
    if isinstance(value, Block):
        block = value
        shown = f"a {type(value).__name__}"
    elif isinstance(value, str):
        if value.count("/") != 1:
            raise UsageError(f"{parameter} {value!r} must name a block as BLOCK-TYPE/NAME, such as {DEFAULT_TARGET!r}")
        block = _loaded(parameter, value, lambda: Block.load(value))
        shown = repr(value)
    elif isinstance(value, Mapping) and isinstance(value.get("$ref"), Mapping | str) and len(value) == 1:
        block = _loaded(parameter, str(value["$ref"]), lambda: Block.load_from_ref(value["$ref"]))
        shown = "the block the form picked"
    else:
        raise UsageError(f"{parameter} must be a saved block: its BLOCK-TYPE/NAME, such as {DEFAULT_TARGET!r}, or "
                         "the one the run form's picker chose; a block's fields are not accepted (save it first)")
    if not isinstance(block, kind):
        raise UsageError(f"{parameter} {shown} is a {type(block).__name__}, not a {kind.__name__}: give a block of "
                         "the right type")
    return block  # type: ignore[return-value]


def _loaded(parameter: str, shown: str, load: Any) -> Block:
    try:
        return load()
    except ValueError as exc:  # Prefect's word for a block (or block type) that is not saved
        raise UsageError(f"{parameter} {shown} names no saved block ({exc}): see the saved ones with `prefect block "
                         "ls`, or save this project's with `python -m deployments.blocks`") from None
    except RuntimeError as exc:  # saved, but its document no longer validates: Prefect hides why in the cause
        invalid = exc.__cause__
        if not isinstance(invalid, ValidationError):
            raise
        said = "; ".join(error["msg"].removeprefix("Value error, ") for error in invalid.errors())
        raise UsageError(f"{parameter} {shown}: the saved block does not load as it is: {said}. Save it again (in "
                         "the UI, or with .save(NAME, overwrite=True)) to fix it") from None


def job_of(flow_run: FlowRun) -> str | None:
    """The job a run of an owning flow is about: its ``job_id`` parameter, else the id in its name
    (``submit-<id>``, ``run-<id>``: named once the request is read); None before that, when no
    record was opened yet."""
    given = flow_run.parameters.get("job_id")
    if isinstance(given, str) and given:
        return given
    word, _, job_id = flow_run.name.partition("-")
    return job_id if word in OWNING_FLOWS and job_id else None


def cancel_owned_job(flow: Any, flow_run: FlowRun, state: State) -> None:
    """``on_cancellation`` of the flows that own a job: the job is canceled through its backend,
    with everything it started (idempotent; the record says which run was canceled). Runs in the
    flow's process or in the worker's, after the run's own process is gone — so directly, not as
    tasks. Only a job this run's root still owns is canceled (a newer collect may have taken it
    over). A crash is not a cancel and runs nothing (see :mod:`tasks.owners`)."""
    job_id = job_of(flow_run)
    if job_id is None:
        return  # canceled before the request was read: no record, nothing launched
    parameters = flow_run.parameters
    setup = prepare(parameters.get("target") or DEFAULT_TARGET, parameters.get("records") or DEFAULT_RECORDS,
                    parameters.get("s3_credentials"))
    canceled = cancel(job_id, setup.backend, setup.store, reporter=REPORTER,
                      reason=f"its flow run {flow_run.name} was canceled", owner=owner_of(flow_run), run=direct)
    if canceled.record.state == "CANCELED" and not canceled.already_ended:
        # Prefect's own lines say only that the run's process was ended (a "crash" in a subflow):
        # this one says what became of the job, and of its results, in the run's log.
        flow_run_logger(flow_run, flow).warning(
            "%s: its results were not uploaded; collect-tao-job with job_id %s uploads what it wrote",
            canceled.describe(), job_id)
