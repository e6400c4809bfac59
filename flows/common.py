"""What every flow does first: load the blocks its parameters name, and keep the worker's
credential values out of the run's logs — and how every flow runs a verb's steps.

Parameters name blocks as ``BLOCK-TYPE/NAME`` (``tao-local-target/local``), as Prefect's own
``Block.load`` does. A credential parameter left empty means the standard variable names (the
same as a credential block with its defaults), so a flow runs without any saved credential block.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from functools import cache
from typing import Any, TypeVar

from prefect.blocks.core import Block
from prefect.client.schemas.objects import FlowRun
from prefect.states import State

from blocks.credentials import CredentialSet, HuggingFaceEnvCredentials, NGCEnvCredentials, S3EnvCredentials
from blocks.records import JobRecords
from blocks.targets import ComputeTarget
from tao_data_io.errors import UsageError
from tao_data_io.runner import Runner, direct
from tao_data_io.verbs import Backend, RecordStore, cancel
from tasks.masking import mask_run_logs
from tasks.owners import owner_of
from tasks.runner import prefect_runner

DEFAULT_TARGET = "tao-local-target/local"
DEFAULT_RECORDS = "tao-job-records/local"
#: Who the record's history says made a change.
SOURCE = "flow"
#: How the flows run a verb's steps: each as its task. Read at call time (``common.RUN``), so a
#: test can record the steps a flow runs.
RUN: Runner = prefect_runner
#: A submit or run flow's name until it knows its job's id; then ``submit-<id>`` / ``run-<id>``.
NEW_RUN_NAME = "new-job"
#: The flows whose runs own a job, by the word their run names start with.
OWNING_FLOWS = ("submit", "run", "collect")

B = TypeVar("B", bound=Block)


@dataclass(frozen=True)
class Setup:
    target: ComputeTarget
    backend: Backend
    store: RecordStore
    credentials: CredentialSet


def prepare(target: str, records: str, s3_credentials: str | None = None, hf_credentials: str | None = None,
            ngc_credentials: str | None = None) -> Setup:
    """Load the blocks, mask the run logs, open the record store and build the backend. The
    credentials are the environment the verb's steps see (names only; see :class:`CredentialSet`)."""
    _freeze_imports()
    credentials = CredentialSet.of([
        load_block(s3_credentials, S3EnvCredentials, "s3_credentials") if s3_credentials else S3EnvCredentials(),
        (load_block(hf_credentials, HuggingFaceEnvCredentials, "hf_credentials") if hf_credentials
         else HuggingFaceEnvCredentials()),
        load_block(ngc_credentials, NGCEnvCredentials, "ngc_credentials") if ngc_credentials else NGCEnvCredentials(),
    ])
    environ = credentials.environ()
    mask_run_logs(environ)
    compute = load_block(target, ComputeTarget, "target")
    return Setup(compute, compute.backend(), load_block(records, JobRecords, "records").store(environ), credentials)


@cache
def _freeze_imports() -> None:
    """Leave what the process holds at its first flow run — Prefect's and our imports, well over a
    million objects — out of every later cyclic garbage collection. Otherwise each collection a
    transfer's allocations trigger walks them all: a resync of 10,000 files in a fresh flow-run
    process took ~2 s longer, growing with the file count (bench/flows.py). Once per process, so
    a long-lived process (the tests, ``serve``) never freezes the garbage of earlier runs."""
    gc.freeze()


def load_block(name: str, kind: type[B], parameter: str) -> B:
    """The saved block ``BLOCK-TYPE/NAME`` that the flow parameter ``parameter`` names, which must
    be a ``kind``."""
    if name.count("/") != 1:
        raise UsageError(f"{parameter} {name!r} must name a block as BLOCK-TYPE/NAME, such as {DEFAULT_TARGET!r}")
    try:
        block = Block.load(name)
    except ValueError as exc:  # Prefect's word for a block (or block type) that is not saved
        raise UsageError(f"{parameter} {name!r} names no saved block ({exc}): see the saved ones with `prefect block "
                         "ls`, or save this project's with `python -m deployments.blocks`") from None
    if not isinstance(block, kind):
        raise UsageError(f"{parameter} {name!r} is a {type(block).__name__}, not a {kind.__name__}: name a block "
                         "of the right type")
    return block


def job_of(flow_run: FlowRun) -> str | None:
    """The job a run of an owning flow is about: its ``job_id`` parameter, else the id in its name
    (``submit-<id>``, ``run-<id>``: named once the request is read); None before that, when no
    record was opened yet."""
    given = flow_run.parameters.get("job_id")
    if isinstance(given, str) and given:
        return given
    word, _, job_id = flow_run.name.partition("-")
    return job_id if word in OWNING_FLOWS and job_id and job_id != NEW_RUN_NAME else None


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
    cancel(job_id, setup.backend, setup.store, source=SOURCE, reason=f"its flow run {flow_run.name} was canceled",
           owner=owner_of(flow_run), run=direct)
