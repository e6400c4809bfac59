"""Opening the record of a job request: the one way submit turns a request into a record.

Why a function: the request is what a user submits; the record needs a few facts derived from
it (the job id, the image, where results go, which network and action run). Deriving them in one
place means a retried submit of the same request derives the same facts and ``open`` — which is
idempotent on them — returns the same job.

Which network and action a command runs (:func:`network_and_action`), by its first words:

* TAO style, a bare entrypoint name and then an action word: ``dino train -e spec.yaml`` →
  (``dino``, ``train``); ``classification_pyt evaluate ...`` → (``classification_pyt``, ``evaluate``);
* a first word that is a path (contains ``/``) or an interpreter (``python``, ``python3``,
  ``python3.10``, ``sh``, ``bash``, ``torchrun``, ``mpirun``) → (its basename, ``run``):
  ``/opt/run.sh`` → (``run.sh``, ``run``), ``python3 train.py`` → (``python3``, ``run``);
* a bare name followed by nothing or by an option or a path → (the name, ``run``).
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
import shlex
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..errors import UsageError
from .model import JobRecord
from .store import RecordStore

if TYPE_CHECKING:  # the request model costs ~50 ms of imports that record verbs (resync) never need
    from ..request import JobRequest

#: First words that run something else: the job is named by them, not by a TAO entrypoint.
_INTERPRETER = re.compile(r"python(\d+(\.\d+)?)?|sh|bash|torchrun|mpirun")
#: What a TAO action looks like: a lowercase word (``train``, ``dataset_convert``, ``export``).
_ACTION = re.compile(r"[a-z][a-z0-9_-]*")


def network_and_action(command: str | Sequence[str]) -> tuple[str, str]:
    """(network_arch, action) of a job's command, by the rule in this module's docstring."""
    try:
        words = shlex.split(command) if isinstance(command, str) else list(command)
    except ValueError as exc:  # an unbalanced quote
        raise UsageError(f"command {command!r} does not split into words ({exc}): balance its quotes") from None
    if not words or not words[0]:
        raise UsageError(f"command {command!r} is empty: give the TAO entrypoint and action, e.g. 'dino train -e …'")
    first = words[0]
    if "/" in first or _INTERPRETER.fullmatch(first):
        return posixpath.basename(first.rstrip("/")) or first, "run"
    if len(words) > 1 and _ACTION.fullmatch(words[1]):
        return first, words[1]
    return first, "run"


def open_for(request: JobRequest, *, backend: str, reporter: str = "cli",
             store: RecordStore | None = None) -> JobRecord:
    """Open — or re-open, idempotently — the record of ``request`` in ``store`` (default: the
    store the environment names).

    The job id is ``request.job_id``, or a fresh one when the request names none; a retried
    submit is the same job exactly when it carries the same id, so a caller that may retry
    should pin the returned ``job_id`` into the request before its first attempt. The tier
    is left for the storage step (:meth:`RecordStore.set_tier`).
    """
    network_arch, action = network_and_action(request.command)
    return (store or RecordStore()).open(
        backend=backend, image=request.image, network_arch=network_arch, action=action,
        results_dir=request.outputs.results_dir, upload_excludes=request.outputs.upload_excludes,
        results_limit=request.outputs.results_limit, forward_env=request.forward_env, job_id=request.job_id,
        reporter=reporter, request_digest=request_digest(request))


def request_digest(request: JobRequest) -> str:
    """SHA-256 of the request as validated, its job id left out (a minted id is not part of what
    was asked): the same request always gives the same digest."""
    document = request.model_dump(mode="json", exclude={"job_id"})
    return hashlib.sha256(json.dumps(document, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
