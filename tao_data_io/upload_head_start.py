"""An upload's head start: the job's upload lock taken and its destination's listing begun
before the record model is loaded.

Why: ``tao-data-io resync`` is a fresh process, run every few minutes by a schedule, and before
this its first request waited for what it could not start without — pydantic and the record's
models, ~120 ms of imports and schema building, CPU the listing does not need. Traced with
2,000 result files of which 20 changed, the listing went out at ~180 ms and the process then
sat idle ~90 ms for its pages. Begun from the raw record, the listing's round trips run on the
server while this process builds its models. Only the command gains: a Prefect worker has
pydantic loaded already and calls :func:`tao_data_io.outputs.upload_results` without one.

What the raw record is trusted for: where to begin, nothing else. The upload itself still reads
and validates the record under the lock and decides from that alone; a destination other than
the one begun (a document this version reads differently) gets a listing of its own (the
engine checks the prefix), and a route that is no S3 route, a finished job or a busy lock end
the upload the ordinary way with the lock released unused. The listing begins only once the lock
is held, so it sees exactly what a listing begun later under the lock sees: skip-unchanged
stays exact, and one upload of a job at a time still holds.

It begins nothing — the upload then goes the ordinary way, and says what is wrong in the
ordinary words — when the raw record names no S3 route, does not parse, the job id is not one,
the results directory is not there, the credentials are missing, or a resync's job has ended
(its final upload is usually recorded: nothing to list).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from .credentials import S3Credentials, s3_credentials_from_env
from .errors import TaoDataIOError
from .names import is_job_id
from .records.storage import DEFAULT_LEASE_SECONDS, RecordStorage
from .records.location import locate
from .transfer.activity import Activity
from .transfer.engine import TransferEngine
from .transfer.remote_index import RemoteIndex
from .uris import S3Url, parse_s3_url
from .vocabulary import TERMINAL_STATES


@dataclass(frozen=True)
class HeadStart:
    """What was begun, for :func:`tao_data_io.outputs.upload_results` to take over."""

    #: Whether the job's upload lock is held (False: a resync found it held by another upload).
    held: bool
    #: The upload's progress, which renews the lock; the upload must beat this one.
    activity: Activity
    #: The engine the listing runs on, for the upload (None when the lock is not held).
    engine: TransferEngine | None
    #: The listing of the destination the raw record names (its ``prefix``), filling from the
    #: moment the lock was taken.
    listing: RemoteIndex | None


@contextmanager
def head_start(root: Path | str | None, job_id: str, results_dir: Path, *, resync: bool,
               environ: Mapping[str, str] | None = None,
               on_wait: Callable[[str], None] | None = None) -> Iterator[HeadStart | None]:
    """Take the job's upload lock and begin listing its S3 destination, as its raw record names
    them; yield what was begun (None: nothing, the upload goes the ordinary way). The lock is
    never waited for here: a resync finding it held leaves the work to its holder (``held``
    False); an upload begins nothing and waits the ordinary way, once its record is validated —
    a record the model refuses is said at once, not after another upload's hour. Leaving
    releases whatever the upload did not take over, the lock last."""
    env = os.environ if environ is None else environ
    begun = _begin(root, job_id, results_dir, resync=resync, env=env)
    if begun is None:
        yield None
        return
    storage, prefix, credentials = begun
    activity = Activity()
    with ExitStack() as stack:
        held = stack.enter_context(storage.upload_lock(job_id, wait=False, on_wait=on_wait,
                                                       lease_seconds=DEFAULT_LEASE_SECONDS, activity=activity))
        if not held:
            yield HeadStart(False, activity, None, None) if resync else None
            return
        engine = stack.enter_context(TransferEngine(credentials))
        listing = engine.list_into_index(prefix, activity)
        stack.callback(listing.close)
        yield HeadStart(True, activity, engine, listing)


def _begin(root: Path | str | None, job_id: str, results_dir: Path, *, resync: bool,
           env: Mapping[str, str]) -> tuple[RecordStorage, S3Url, S3Credentials] | None:
    """(the record storage, the destination's prefix, credentials) when there is something to begin."""
    if not is_job_id(job_id) or not results_dir.is_dir():
        return None
    try:
        storage = locate(root, env).storage
        document = storage.read(job_id)
        destination = None if document is None else s3_destination(document.data, resync=resync)
        if destination is None:
            return None
        return storage, parse_s3_url(destination, field="output_route.destination").as_prefix(), \
            s3_credentials_from_env(env)
    except (TaoDataIOError, OSError):
        return None  # the ordinary way says what is wrong, in its words


def s3_destination(document: bytes, *, resync: bool) -> str | None:
    """The S3 destination a stored record's raw JSON routes results to, if any — and, for a
    resync, if the job has not ended. A hint: the validated record decides."""
    try:
        raw = json.loads(document)
    except ValueError:
        return None
    if not isinstance(raw, dict) or (resync and raw.get("state") in TERMINAL_STATES):
        return None
    route = raw.get("output_route")
    if not isinstance(route, dict) or route.get("route") != "s3" or not isinstance(route.get("destination"), str):
        return None
    return str(route["destination"])
