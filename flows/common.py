"""What every flow does first: load the blocks its parameters name, and keep the worker's
credential values out of the run's logs.

Parameters name blocks as ``BLOCK-TYPE/NAME`` (``tao-local-target/local``), as Prefect's own
``Block.load`` does. A credential parameter left empty means the standard variable names (the
same as a credential block with its defaults), so a flow runs without any saved credential block.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import TypeVar

from prefect.blocks.core import Block

from blocks.credentials import CredentialSet, HuggingFaceEnvCredentials, NGCEnvCredentials, S3EnvCredentials
from blocks.records import JobRecords
from blocks.targets import ComputeTarget
from tao_data_io.credentials import RedactingFilter, Redactor
from tao_data_io.errors import UsageError
from tao_data_io.launch.backend import Backend
from tao_data_io.records import RecordStore

DEFAULT_TARGET = "tao-local-target/local"
DEFAULT_RECORDS = "tao-job-records/local"
#: The loggers of flow and task runs, whose records go to the Prefect API.
RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")

B = TypeVar("B", bound=Block)


@dataclass(frozen=True)
class Setup:
    target: ComputeTarget
    backend: Backend
    store: RecordStore
    credentials: CredentialSet


def prepare(target: str, records: str, s3_credentials: str | None = None, hf_credentials: str | None = None,
            ngc_credentials: str | None = None) -> Setup:
    """Load the blocks, mask the run logs, open the record store and build the backend."""
    _freeze_imports()
    credentials = CredentialSet.of([
        load_block(s3_credentials, S3EnvCredentials) if s3_credentials else S3EnvCredentials(),
        load_block(hf_credentials, HuggingFaceEnvCredentials) if hf_credentials else HuggingFaceEnvCredentials(),
        load_block(ngc_credentials, NGCEnvCredentials) if ngc_credentials else NGCEnvCredentials(),
    ])
    environ = credentials.environ()
    mask_run_logs(environ)
    compute = load_block(target, ComputeTarget)
    return Setup(compute, compute.backend(), load_block(records, JobRecords).store(environ), credentials)


@cache
def _freeze_imports() -> None:
    """Leave what the process holds at its first flow run — Prefect's and our imports, well over a
    million objects — out of every later cyclic garbage collection. Otherwise each collection a
    transfer's allocations trigger walks them all: a resync of 10,000 files in a fresh flow-run
    process took ~2 s longer, growing with the file count (bench/flows.py). Once per process, so
    a long-lived process (the tests, ``serve``) never freezes the garbage of earlier runs."""
    gc.freeze()


def load_block(name: str, kind: type[B]) -> B:
    """The saved block ``BLOCK-TYPE/NAME``, which must be a ``kind``."""
    if name.count("/") != 1:
        raise UsageError(f"block {name!r} must be written BLOCK-TYPE/NAME, such as {DEFAULT_TARGET!r}")
    block = Block.load(name)
    if not isinstance(block, kind):
        raise UsageError(f"block {name!r} is a {type(block).__name__}, not a {kind.__name__}: name a block of "
                         "the right type")
    return block


class _RunLogMask(RedactingFilter):
    """Our filter on the run loggers (a class of its own, so a later flow run replaces it)."""


def mask_run_logs(environ: Mapping[str, str]) -> None:
    """Mask every credential value of ``environ`` in the messages and tracebacks this process
    sends as run logs — a safety net: nothing of ours logs a value, but a library's message or
    a job's output might hold one."""
    mask = _RunLogMask(Redactor(environ))
    for name in RUN_LOGGERS:
        logger = logging.getLogger(name)
        for old in [f for f in logger.filters if isinstance(f, _RunLogMask)]:
            logger.removeFilter(old)
        logger.addFilter(mask)
