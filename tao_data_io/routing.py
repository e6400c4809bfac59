"""Where a job's results go: a shared mount, an S3 prefix, or nowhere (ephemeral).

The rule, decided once per job from two variables, in this order:

1. ``TAO_RESULTS_ROOT`` set → the job writes to ``$TAO_RESULTS_ROOT/<job id>`` on a mount that
   outlives the container; **nothing is uploaded** (a copy would only double the bytes).
2. else ``S3_BUCKET_NAME`` set → results are uploaded to ``s3://$S3_BUCKET_NAME/results/<job id>/``,
   a prefix that belongs to the job's record alone (:mod:`.results_claim`: a job id is unique
   within one record store only).
3. else → ``ephemeral``: results stay in the container and are lost when it exits. That is
   legal (a smoke test needs no storage) but must never be silent, so the warning is loud and
   comes from :func:`ephemeral_warning` alone: submit and collect print the same words.

:func:`decide_route` is pure (no I/O, the environment is a parameter) so submit, collect and a
Prefect flow reach the same decision from the same variables; :func:`record_route` pins the
decision in the job record so a later step in a different environment cannot drift from it.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from pathlib import PurePosixPath

from .errors import UsageError
from .names import check_job_id
from .records import JobRecord, OutputRoute, RecordStore
from .uris import parse_s3_url

RESULTS_ROOT_VARIABLE = "TAO_RESULTS_ROOT"
BUCKET_VARIABLE = "S3_BUCKET_NAME"
#: Results of job J go under this key prefix of the bucket: ``results/J/``.
RESULTS_PREFIX = "results"

#: ``OutputRoute.destination`` must be non-empty; for ``ephemeral`` it says where results stay.
EPHEMERAL_DESTINATION = "container-local (lost when the container exits)"


def decide_route(job_id: str, environ: Mapping[str, str]) -> OutputRoute:
    """Decide where results of ``job_id`` go from ``environ``; a bad value raises :class:`UsageError`
    naming the variable, its value and the fix. An empty variable counts as unset."""
    check_job_id(job_id)
    root = environ.get(RESULTS_ROOT_VARIABLE)
    bucket = environ.get(BUCKET_VARIABLE)
    if root:
        precedence = f" (it takes precedence over {BUCKET_VARIABLE}, which is ignored)" if bucket else ""
        return OutputRoute(route="mount", destination=str(_results_root(root) / job_id),
                           reason=f"{RESULTS_ROOT_VARIABLE} is set{precedence}: results stay on that mount; "
                                  "nothing is uploaded")
    if bucket:
        return OutputRoute(route="s3", destination=f"s3://{_bucket_name(bucket)}/{RESULTS_PREFIX}/{job_id}/",
                           reason=f"{BUCKET_VARIABLE} is set and {RESULTS_ROOT_VARIABLE} is not: results are "
                                  "uploaded to the bucket")
    return OutputRoute(route="ephemeral", destination=EPHEMERAL_DESTINATION,
                       reason=f"neither {RESULTS_ROOT_VARIABLE} nor {BUCKET_VARIABLE} is set: results stay in "
                              "the container")


def _results_root(value: str) -> PurePosixPath:
    # Absolute only: a relative root would resolve against whatever directory each step
    # happens to run in, so submit and collect would disagree about where results are.
    path = PurePosixPath(value)
    if not path.is_absolute() or ".." in path.parts or "\x00" in value:
        raise UsageError(f"{RESULTS_ROOT_VARIABLE} {value!r} must be an absolute path without '..' (the shared "
                         f"mount results are written to, e.g. /mnt/tao-results): set it to the mount's absolute "
                         f"path, or unset it to upload to {BUCKET_VARIABLE} instead")
    return path


def _bucket_name(value: str) -> str:
    # Surrounding slashes are forgiven (they would make `//` in the URL); anything else that
    # is not a bare bucket name is refused, because guessing would upload to the wrong place.
    name = value.strip("/")
    fix = (f"set {BUCKET_VARIABLE} to the bare bucket name — 3-63 lowercase letters, digits, '.' or '-', "
           "without s3:// or a path (results go to s3://BUCKET/results/<job id>/)")
    if "/" in name:
        raise UsageError(f"{BUCKET_VARIABLE} {value!r} is not a bucket name: {fix}")
    try:
        parse_s3_url(f"s3://{name}/", field=BUCKET_VARIABLE)  # the package's one bucket-name rule
    except UsageError:
        raise UsageError(f"{BUCKET_VARIABLE} {value!r} is not a valid S3 bucket name: {fix}") from None
    return name


def ephemeral_warning(job_id: str) -> str:
    """The words every step uses to say results will be lost (one source, so they never drift)."""
    return (f"Results of job {job_id} are EPHEMERAL: neither {RESULTS_ROOT_VARIABLE} nor {BUCKET_VARIABLE} is "
            f"set, so they stay inside the container and WILL BE LOST when the container exits. To keep them, "
            f"set {RESULTS_ROOT_VARIABLE} (a shared mount) or {BUCKET_VARIABLE} (an S3 bucket) before submitting "
            "the job.")


def boxed(title: str, text: str, width: int = 76) -> str:
    """``text`` in an ASCII box under a capitalised title: hard to miss in a terminal or a log
    (ASCII because logs and CI consoles mangle box-drawing characters)."""
    inner = width - 4
    lines = [title.upper(), ""] + textwrap.wrap(text, inner)
    bar = "!" * width
    return "\n".join([bar, *(f"! {line:<{inner}} !" for line in lines), bar])


def loud_ephemeral_warning(job_id: str) -> str:
    """:func:`ephemeral_warning` boxed for stderr."""
    return boxed("warning: results are ephemeral", ephemeral_warning(job_id))


def record_route(store: RecordStore, job_id: str, route: OutputRoute, *, force: bool = False) -> JobRecord:
    """Store ``route`` as the job's output route and return the record.

    Idempotent: a retried submit with the same decision changes nothing. A *different* route or
    destination already recorded is refused unless ``force`` — the job may already be writing
    to the recorded place, and silently moving the target would split its results in two. A
    different ``reason`` alone is not a conflict (the recorded one is kept).

    An S3 route is pinned with the record it belongs to (``belongs_to``: the record's own claimant
    unless ``route`` names one, as a pod's imported copy does), so every upload, wherever it runs,
    claims the prefix for the same record (:mod:`tao_data_io.results_claim`).
    """

    def change(record: JobRecord) -> JobRecord:
        existing = record.output_route
        if existing is not None and (existing.route, existing.destination) == (route.route, route.destination):
            return record
        if existing is not None and not force:
            differs = [f"{name} is {getattr(existing, name)!r} in the record, {getattr(route, name)!r} now"
                       for name in ("route", "destination") if getattr(existing, name) != getattr(route, name)]
            raise UsageError(f"job {job_id!r} already has an output route and this decision differs: "
                             f"{'; '.join(differs)}. The environment ({RESULTS_ROOT_VARIABLE}, {BUCKET_VARIABLE}) "
                             "changed since it was recorded; restore it, or replace the recorded route deliberately "
                             "(force)")
        pinned = (route.model_copy(update={"belongs_to": record.claimant()})
                  if route.route == "s3" and route.belongs_to is None else route)
        return record.model_copy(update={"output_route": pinned})

    return store.update(job_id, change)
