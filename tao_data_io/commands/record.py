"""``record open|mark|show|list``: the durable job record on the command line.

Why a CLI for it: shell steps (a submit script, the in-pod agent) report job states without
Python, and an operator can read a job's history after Kubernetes has deleted the Job.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from ..vocabulary import (DEFAULT_RECORDS_ROOT, JOBS_DIR_VARIABLE, RECORDS_VARIABLE, STATES, STORAGE_TIERS,
                          seconds_within)
from .examples import add_verb

if TYPE_CHECKING:
    from ..console import Console
    from ..records import JobRecord, RecordStore


def register(verbs: Any) -> None:
    record = add_verb(verbs, "record", help="the durable job record: open, mark, show, list")
    actions = record.add_subparsers(dest="record_verb", metavar="open|mark|show|list", required=True)

    open_ = add_verb(actions, "open", help="create a PENDING record; prints only the job id")
    for option in ("--backend", "--image", "--network-arch", "--action", "--results-dir"):
        open_.add_argument(option, required=True)
    open_.add_argument("--storage-tier", choices=STORAGE_TIERS,
                       help="the storage tier, when already decided (usually the storage step sets it later)")
    open_.add_argument("--storage-reason", help="why this tier was chosen (with --storage-tier)")
    open_.add_argument("--upload-exclude", action="append", default=[], metavar="PATTERN",
                       help="the request's declared upload_excludes (repeatable); every upload applies them")
    open_.add_argument("--job-id", metavar="ID", help="use this id instead of minting one (a DNS label, at most 52)")
    open_.add_argument("--reporter", default="cli", help="who reports it (default: cli)")
    add_root_option(open_)
    open_.set_defaults(run=_open)

    import_ = add_verb(actions, "import", help="adopt a record document (a job's ConfigMap copy) into this store; "
                                               "idempotent, refuses a different job under the same id")
    import_.add_argument("path", metavar="FILE", type=Path)
    import_.add_argument("--reporter", default="pod", help="who reports it (default: pod)")
    add_root_option(import_)
    import_.set_defaults(run=_import)

    mark = add_verb(actions, "mark", help="record a state report for a job")
    mark.add_argument("job_id", metavar="ID")
    mark.add_argument("--state", required=True, choices=STATES)
    mark.add_argument("--backend-ref", metavar="REF",
                      help="the backend's own reference to the job (a Kubernetes Job's NAMESPACE/NAME, local/<job id>)")
    mark.add_argument("--message")
    mark.add_argument("--reporter", default="cli", help="who reports it: cli, agent, flow… (default: cli)")
    add_root_option(mark)
    mark.set_defaults(run=_mark)

    show = add_verb(actions, "show", help="one job's record, history included")
    show.add_argument("job_id", metavar="ID")
    show.add_argument("--json", action="store_true", help="print the record document")
    add_root_option(show)
    show.set_defaults(run=_show)

    list_ = add_verb(actions, "list", help="one line per job, oldest first")
    list_.add_argument("--state", choices=STATES, help="only jobs in this state (on S3: reads only those records)")
    list_.add_argument("--json", action="store_true", help="print the record documents")
    add_root_option(list_)
    list_.set_defaults(run=_list)


def add_root_option(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--root", metavar="DIR|s3://BUCKET/PREFIX/",
                     help=f"where records live: a directory or an S3 prefix (default: ${RECORDS_VARIABLE}, "
                          f"${JOBS_DIR_VARIABLE} or {DEFAULT_RECORDS_ROOT})")


def seconds_type(flag: str, bounds: tuple[float, float]) -> Callable[[str], float]:
    """An argparse ``type`` for a number of seconds within ``bounds``, by the core's rule
    (:func:`~tao_data_io.vocabulary.seconds_within`), naming ``flag`` when the value is refused."""

    def parse(text: str) -> float:
        try:
            return seconds_within(float(text), bounds, name=flag)
        except ValueError as exc:  # UsageError is one too
            raise argparse.ArgumentTypeError(str(exc) if isinstance(exc, UsageError) else
                                             f"{flag} {text!r} is not a number of seconds") from None

    return parse


def _store(args: argparse.Namespace) -> RecordStore:
    from ..records import RecordStore

    return RecordStore(args.root)


def _open(args: argparse.Namespace, console: Console) -> int:
    from ..backends import declaration_of

    declaration_of(args.backend)  # a record of no backend could be opened, but no later verb would reach its job
    record = _store(args).open(
        backend=args.backend, image=args.image, network_arch=args.network_arch, action=args.action,
        storage_tier=args.storage_tier, storage_reason=args.storage_reason, results_dir=args.results_dir,
        job_id=args.job_id, reporter=args.reporter, upload_excludes=args.upload_exclude)
    console.out(record.job_id)
    return 0


def _import(args: argparse.Namespace, console: Console) -> int:
    """Open the same job here (identity, excludes, results limit, forwarded names, request digest,
    reason) and pin its recorded output route, so a pod's resync and upload follow the route
    decided at submit and are held to the same limit."""
    from pydantic import ValidationError

    from ..records import JobRecord
    from ..routing import record_route
    from ..schema import describe_validation_error

    try:
        given = JobRecord.model_validate_json(args.path.read_bytes())
    except OSError as exc:
        raise UsageError(f"path {str(args.path)!r} cannot be read: {exc.strerror}") from None
    except ValidationError as exc:
        raise UsageError(describe_validation_error(exc, f"path {str(args.path)!r} is not a job record")) from None
    store = _store(args)
    store.open(backend=given.backend, image=given.image, network_arch=given.network_arch, action=given.action,
               storage_tier=given.storage_tier, storage_reason=given.storage_reason, results_dir=given.results_dir,
               job_id=given.job_id, reporter=args.reporter, upload_excludes=given.upload_excludes,
               forward_env=given.forward_env, request_digest=given.request_digest, results_limit=given.results_limit)
    if given.output_route is not None:
        record_route(store, given.job_id, given.output_route)
    console.out(given.job_id)
    return 0


def _mark(args: argparse.Namespace, console: Console) -> int:
    record = _store(args).mark(args.job_id, args.state, reporter=args.reporter,
                                         backend_ref=args.backend_ref, message=args.message)
    console.out(f"{record.job_id} {record.state}")
    return 0


def _show(args: argparse.Namespace, console: Console) -> int:
    record = _store(args).get(args.job_id)
    if args.json:
        console.json(record.model_dump(mode="json"))
        return 0
    lines = [
        ("job", record.job_id),
        ("state", record.state + (f" — {record.message}" if record.message else "")),
        ("backend", record.backend),
        ("image", record.image),
        ("network", f"{record.network_arch} {record.action}"),
        ("storage", _tier(record)),
        ("results", record.results_dir),
        ("backend", record.backend_ref or "-"),
        ("output", _route(record)),
        ("uploads", str(len(record.uploads))),
        ("created", _time(record.created_at)),
        ("updated", _time(record.updated_at)),
    ]
    for label, value in lines:
        console.out(f"{label:<9} {value}")
    console.out("history:")
    for step in record.history:
        said = f"  {step.message}" if step.message else ""
        console.out(f"  {_time(step.at)}  {step.state:<8}  {step.reporter}{said}")
    return 0


def _list(args: argparse.Namespace, console: Console) -> int:
    damaged: list[str] = []

    def report(where: str, reason: str) -> None:
        damaged.append(where)
        console.err(f"warning: skipping damaged record: {reason}")

    records = _store(args).list_records(state=args.state, on_damaged=report)
    if args.json:
        console.json([record.model_dump(mode="json") for record in records])
    else:
        width = max((len(record.job_id) for record in records), default=0)
        for record in records:
            console.out(f"{record.job_id:<{width}}  {record.state:<8}  {record.storage_tier or '-'}  "
                        f"{_time(record.updated_at)}  {record.action}")
    if damaged:
        console.err(f"error: {len(damaged)} record(s) could not be read; the others are listed above")
        return 1
    return 0


def _tier(record: JobRecord) -> str:
    if record.storage_tier is None:
        return "tier not decided yet"
    return f"tier {record.storage_tier}" + (f" — {record.storage_reason}" if record.storage_reason else "")


def _route(record: JobRecord) -> str:
    route = record.output_route
    if route is None:
        return "-"
    return f"{route.route} → {route.destination}" + (f" — {route.reason}" if route.reason else "")


def _time(value: datetime) -> str:
    return value.isoformat(timespec="seconds").replace("+00:00", "Z")
