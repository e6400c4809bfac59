"""``route-outputs``, ``upload-results``, ``resync`` and ``restore-results``: where a job's results go,
getting them there, and getting them back for a job's next attempt.

Why verbs: submit records the route with one shell line, collect uploads with another, and a
scheduler (cron, a SLURM epilogue, a Prefect schedule) runs ``resync`` while the job writes.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from ..vocabulary import ALWAYS_EXCLUDED, DEFAULT_SETTLE_SECONDS, SETTLE_SECONDS_BOUNDS
from .examples import add_verb
from .record import add_root_option, seconds_type
from .transfer import OrderedFilter, report

if TYPE_CHECKING:
    from ..console import Console
    from ..outputs import Kind

#: Set by SLURM inside an allocation; the only SLURM-specific thing we look at.
SLURM_JOB_VARIABLE = "SLURM_JOB_ID"


def register(verbs: Any) -> None:
    route = add_verb(verbs, "route-outputs", help="decide where a job's results go: mount, s3 or ephemeral (JSON)")
    route.add_argument("--job-id", required=True, metavar="ID")
    route.add_argument("--record", action="store_true",
                       help="store the decision in the job record (what submit calls); idempotent")
    route.add_argument("--force", action="store_true", help="with --record: replace a different recorded route")
    add_root_option(route)
    route.set_defaults(run=_route)

    upload = add_verb(verbs, "upload-results", help="upload a job's results to its routed destination, also after "
                                                    "a failed job; records a summary")
    _add_upload_arguments(upload, settle_help="leave files modified in the last N seconds for a later run "
                                              "(default 0: this runs after the job, so everything goes now)")
    upload.add_argument("--no-upload-in-allocation", action="store_true",
                        help=f"refuse to upload inside a SLURM allocation (${SLURM_JOB_VARIABLE} set): uploads "
                             "belong on the login node after the allocation ends")
    upload.set_defaults(run=lambda args, console: _upload(args, console, "upload"))

    resync = add_verb(verbs, "resync", help="upload what is new while a job runs (the unit a schedule calls); "
                                            "safe beside the writer and beside another resync")
    _add_upload_arguments(resync, settle_help="leave files modified in the last N seconds for a later run "
                                              f"(default {DEFAULT_SETTLE_SECONDS:g})")
    resync.set_defaults(run=lambda args, console: _upload(args, console, "resync"))

    restore = add_verb(verbs, "restore-results", help="download what earlier attempts of a job uploaded into its "
                                                      "results directory, before its next attempt's command starts")
    restore.add_argument("--from", dest="source", required=True, metavar="S3_PREFIX",
                         help="where the earlier attempts uploaded (the job's output route)")
    restore.add_argument("--results-dir", required=True, metavar="DIR", type=Path,
                         help="the directory the job writes its results to")
    restore.add_argument("--job-id", metavar="ID",
                         help="the job whose results these are: its record must own the prefix (another record's "
                              "results are never restored); without it, nothing is checked")
    add_root_option(restore)
    restore.set_defaults(run=_restore)

    check = add_verb(verbs, "check-upload", help="prove results can reach the job's S3 route from here: put and "
                                                 "delete one object under its results prefix")
    check.add_argument("--job-id", required=True, metavar="ID")
    check.add_argument("--verdict", type=Path, metavar="FILE",
                       help="also write 'ok|fail<TAB>detail' here (what the verify probe's persistent check reads)")
    add_root_option(check)
    check.set_defaults(run=_check_upload)


def _add_upload_arguments(sub: argparse.ArgumentParser, *, settle_help: str) -> None:
    sub.add_argument("--job-id", required=True, metavar="ID")
    sub.add_argument("--results-dir", required=True, metavar="DIR", type=Path,
                     help="the directory the job writes its results to")
    sub.add_argument("--exclude", action=OrderedFilter, metavar="PATTERN",
                     help=f"skip paths matching PATTERN (repeatable); {ALWAYS_EXCLUDED} is always excluded")
    sub.add_argument("--include", action=OrderedFilter, metavar="PATTERN",
                     help=f"re-admit paths matching PATTERN (repeatable); never re-admits {ALWAYS_EXCLUDED}")
    sub.add_argument("--settle-seconds", type=seconds_type("--settle-seconds", SETTLE_SECONDS_BOUNDS), metavar="N",
                     help=settle_help)
    add_root_option(sub)
    sub.set_defaults(filter_rules=())


def _restore(args: argparse.Namespace, console: Console) -> int:
    from ..outputs import restore_results

    belongs_to = None
    if args.job_id is not None:
        from ..records import RecordStore
        from ..results_claim import claimant_of

        record = RecordStore(args.root).get(args.job_id)
        route = record.output_route
        if route is None or route.destination.rstrip("/") != args.source.rstrip("/"):
            named = "no output route" if route is None else f"the output route {route.destination}"
            console.err(f"error: --from {args.source} is not where job {args.job_id}'s results go: its record names "
                        f"{named}; restore from the prefix its record names")
            return 2
        belongs_to = claimant_of(record, route)
    console.out(f"restored {restore_results(args.source, args.results_dir, belongs_to=belongs_to)}")
    return 0


def _check_upload(args: argparse.Namespace, console: Console) -> int:
    from ..fs.atomic import atomic_write
    from ..outputs import check_upload
    from ..records import RecordStore

    outcome = check_upload(RecordStore(args.root), args.job_id)
    if args.verdict is not None:
        atomic_write(args.verdict, f"{'ok' if outcome.ok else 'fail'}\t{outcome.detail}\n".encode())
    (console.out if outcome.ok else console.err)(("" if outcome.ok else "error: ") + outcome.detail)
    return 0 if outcome.ok else 1


def _route(args: argparse.Namespace, console: Console) -> int:
    from ..records import RecordStore
    from ..routing import decide_route, loud_ephemeral_warning, record_route

    if args.force and not args.record:
        raise UsageError("--force only replaces a recorded route: add --record, or drop --force")
    route = decide_route(args.job_id, os.environ)
    if args.record:
        recorded = record_route(RecordStore(args.root), args.job_id, route, force=args.force).output_route
        assert recorded is not None  # record_route always leaves one
        route = recorded
    console.json(route.model_dump())
    if route.route == "ephemeral":
        console.err(loud_ephemeral_warning(args.job_id))
    return 0


def _upload(args: argparse.Namespace, console: Console, kind: Kind) -> int:
    from ..upload_head_start import head_start

    slurm_job = os.environ.get(SLURM_JOB_VARIABLE)
    if kind == "upload" and args.no_upload_in_allocation and slurm_job:
        raise UsageError(f"{SLURM_JOB_VARIABLE} is {slurm_job!r}, so this runs inside a SLURM allocation, and "
                         "--no-upload-in-allocation keeps uploads out of it: run `tao-data-io upload-results "
                         f"--job-id {args.job_id} --results-dir {args.results_dir.absolute()}` on the login node "
                         "after the allocation ends")
    # The lock and the listing first, the record's models while the listing's requests run.
    with head_start(args.root, args.job_id, args.results_dir, resync=kind == "resync", on_wait=console.err) as begun:
        from ..outputs import upload_results
        from ..records import RecordStore
        from ..routing import loud_ephemeral_warning

        with console.progress(kind) as progress:
            outcome = upload_results(RecordStore(args.root), args.job_id, args.results_dir, kind=kind,
                                     rules=args.filter_rules, settle_seconds=args.settle_seconds,
                                     progress=progress, on_wait=console.err, begun=begun)
    if outcome.status == "ephemeral":
        console.err(loud_ephemeral_warning(args.job_id))
        return 0
    if outcome.summary is None:
        console.out(outcome.message)
        return 0
    code = report(outcome.summary, console, as_json=False)
    console.out(outcome.message)
    return code
