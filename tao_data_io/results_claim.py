"""Which job record a results prefix belongs to: a claim beside the prefix, made once.

Why: the results of job J go to ``s3://BUCKET/results/J/`` (:mod:`.routing`), and a job id is
unique only within one record store. Two stores that share a bucket — two teams, a laptop and a
Prefect worker — can each run a ``train-1``: unclaimed, the second one's upload overwrote the
first's ``model.pth``, and its next attempt restored the first's private files into its own
frame, where it printed them. So the first upload of a job, or its frame's upload check before
the command starts, claims the prefix for the job's record with a conditional write
(``If-None-Match: *``: of two claimers, one wins); every upload and restore checks the claim
before a byte moves; a prefix claimed for another record is refused, naming both and the fix.

**Where.** Beside the prefix, never inside it, as :func:`tao_data_io.fs.state.state_dir_for` keeps
local state beside a tree: ``results/.tao-data-io/J/claim.json`` for ``results/J/``. So a
restore brings back results only, no file a job writes can reach the claim (its upload's keys
are the prefix plus a relative path), and the results limit counts results only. A job id never
starts with ``.``, so no job's prefix is this one.

**Who.** The record, not where it is stored: :meth:`~tao_data_io.records.JobRecord.claimant`. The
route pins it (``OutputRoute.belongs_to``), so a pod that imports a copy of the record — created
in the pod's own store, now — claims for the original. The claim also names the store its
claimer read the record from, for whoever reads a refusal.

**Cost.** A check lists the claim's own prefix (one signed LIST, no botocore: a resync that moves
nothing stays as cheap as it was) and compares the claim's ETag with the MD5 of the document this
claimer would write; only a first claim (a PUT) or a claim written by another claimer (a GET)
costs more.
"""

from __future__ import annotations

import hashlib
import json
from typing import NamedTuple

from .errors import TransferError, UsageError
from .fs.confinement import STATE_DIR_NAME
from .records import JobRecord, OutputRoute
from .records.conditional import put_if
from .routing import BUCKET_VARIABLE, RESULTS_PREFIX
from .transfer.client import explained, get_or_none
from .transfer.engine import TransferEngine
from .transfer.listing import RemoteObject, remote_objects
from .uris import S3Url

CLAIM_NAME = "claim.json"
#: A claim is one line of JSON; an object larger than this under its name is none of ours.
CLAIM_LIMIT_BYTES = 64 * 1024


class ClaimedElsewhere(UsageError):
    """The results prefix belongs to another job record, or holds a claim this version cannot read:
    nothing of this job may be written there or restored from there."""


class Claim(NamedTuple):
    """What a stored claim says: the record the prefix belongs to, and the store it was read from."""

    belongs_to: str
    records: str


def claimant_of(record: JobRecord, route: OutputRoute) -> str:
    """Who ``route``'s prefix must belong to: the claimant the route pins, else ``record`` itself
    (a route recorded before claims)."""
    return route.belongs_to or record.claimant()


def claim_url(prefix: S3Url) -> S3Url:
    """Where the claim of ``prefix`` lives: ``<parent>/.tao-data-io/<name>/claim.json``."""
    parent, _, name = prefix.as_prefix().key.rstrip("/").rpartition("/")
    return S3Url(prefix.bucket, "/".join(part for part in (parent, STATE_DIR_NAME, name, CLAIM_NAME) if part))


def claim(engine: TransferEngine, prefix: S3Url, ours: Claim, *, refused: str) -> None:
    """Claim ``prefix`` for ``ours.belongs_to``, or find it claimed for that record already; raise
    :class:`ClaimedElsewhere` when it belongs to another (``refused``: what the caller therefore
    did not do, e.g. "nothing was uploaded")."""
    url = claim_url(prefix)
    document = (json.dumps(ours._asdict(), sort_keys=True) + "\n").encode()
    listed = _listed(engine, url)
    if listed is not None and listed.etag == hashlib.md5(document, usedforsecurity=False).hexdigest():
        return  # the very document this claimer writes: no GET
    if listed is None and put_if(engine.client, url.bucket, url.key, document, IfNoneMatch="*") is not None:
        return
    _check(engine, prefix, url, ours, refused=refused)


def check_claim(engine: TransferEngine, prefix: S3Url, belongs_to: str, *, refused: str) -> None:
    """Raise :class:`ClaimedElsewhere` when ``prefix`` is claimed for a record other than
    ``belongs_to``. An unclaimed prefix passes: what is there was uploaded before claims, and the
    job's next upload claims it."""
    url = claim_url(prefix)
    if _listed(engine, url) is not None:
        _check(engine, prefix, url, Claim(belongs_to, ""), refused=refused)


def _listed(engine: TransferEngine, url: S3Url) -> RemoteObject | None:
    """The claim as its folder's listing shows it (key, size, ETag), or None when there is none."""
    folder = S3Url(url.bucket, url.key.rpartition("/")[0] + "/")
    return next((obj for obj in remote_objects(engine.pages(folder), folder.key) if obj.key == url.key), None)


def _check(engine: TransferEngine, prefix: S3Url, url: S3Url, ours: Claim, *, refused: str) -> None:
    """Read the stored claim and refuse ``prefix`` unless it is ``ours``."""
    stored = _read(engine, prefix, url, refused=refused)
    if stored.belongs_to == ours.belongs_to:
        return
    ours_from = f", read from {ours.records}" if ours.records else ""
    raise ClaimedElsewhere(
        f"output_route.destination {str(prefix)!r} belongs to job record {stored.belongs_to} (claimed in {url}, "
        f"read from {stored.records}), not to this job's record {ours.belongs_to}{ours_from}: two record stores "
        f"share this bucket and this job id, and neither may write or restore the other's results; {refused}. "
        f"Submit this job under another job id (its results go to s3://BUCKET/{RESULTS_PREFIX}/<job id>/), or set "
        f"{BUCKET_VARIABLE} to another bucket; if no job needs the results at {prefix} any more, delete them and "
        f"{url}")


def _read(engine: TransferEngine, prefix: S3Url, url: S3Url, *, refused: str) -> Claim:
    """The stored claim; one this version cannot read is refused, never replaced."""
    answer = get_or_none(engine.client, url.bucket, url.key)
    if answer is None:
        raise TransferError(f"the claim {url} of the job's results was removed while it was read; try again")
    with explained(url.bucket, engine.credentials.endpoint_url):
        try:
            data = answer["Body"].read(CLAIM_LIMIT_BYTES + 1)
        finally:
            answer["Body"].close()
    try:
        parsed = json.loads(data) if len(data) <= CLAIM_LIMIT_BYTES else None
    except ValueError:
        parsed = None
    if not (isinstance(parsed, dict) and isinstance(parsed.get("belongs_to"), str)
            and isinstance(parsed.get("records"), str)):
        raise ClaimedElsewhere(f"{url}, where the claim of output_route.destination {str(prefix)!r} lives, holds "
                               f"no claim this version reads ({len(data)} bytes); {refused}. A newer tao-data-io may "
                               f"have written it: upgrade; if no job needs the results at {prefix} any more, delete "
                               f"them and {url}")
    return Claim(parsed["belongs_to"], parsed["records"])
