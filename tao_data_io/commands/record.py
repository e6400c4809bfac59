"""``record open|mark|show|list``: the durable job record on the command line.

Why a CLI for it: shell steps (a submit script, the in-pod agent) report job states without
Python, and an operator can read a job's history after Kubernetes has deleted the Job.
"""

from __future__ import annotations

import argparse
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..vocabulary import STATES, STORAGE_TIERS
from .examples import add_verb

if TYPE_CHECKING:
    from ..console import Console
    from ..record import JobRecord, RecordStore


def register(verbs: Any) -> None:
    record = add_verb(verbs, "record", help="the durable job record: open, mark, show, list", examples=[
        ("Open a record at submit time (prints the minted job id)",
         "tao-data-io record open --platform slurm --image nvcr.io/nvidia/tao/tao-toolkit:6.0.0-pyt "
         "--network-arch dino --action train --results-dir /results --storage-tier B"),
        ("Report that the job runs, naming its Kubernetes Job",
         "tao-data-io record mark dino-train-coco --state RUNNING --backend-ref tao/dino-train-coco"),
        ("Read a job's history after Kubernetes has forgotten it", "tao-data-io record show dino-train-coco"),
    ])
    actions = record.add_subparsers(dest="record_verb", metavar="open|mark|show|list", required=True)

    open_ = add_verb(actions, "open", help="create a PENDING record; prints only the job id", examples=[
        ("Open a record and keep its id for the next steps",
         "JOB=$(tao-data-io record open --platform k8s --image nvcr.io/nvidia/tao/tao-toolkit:6.0.0-pyt "
         "--network-arch dino --action train --results-dir /results --storage-tier C)"),
        ("Open it under a chosen id, with excludes every upload of its results applies",
         "tao-data-io record open --job-id dino-train-coco --platform slurm --image tao:6.0.0 --network-arch dino "
         "--action train --results-dir /results --storage-tier B --upload-exclude '*.tmp'"),
    ])
    for option in ("--platform", "--image", "--network-arch", "--action", "--results-dir"):
        open_.add_argument(option, required=True)
    open_.add_argument("--storage-tier", required=True, choices=STORAGE_TIERS)
    open_.add_argument("--storage-reason", help="why this tier was chosen")
    open_.add_argument("--upload-exclude", action="append", default=[], metavar="PATTERN",
                       help="the request's declared upload_excludes (repeatable); every upload applies them")
    open_.add_argument("--job-id", metavar="ID", help="use this id instead of minting one (a DNS label, at most 52)")
    open_.add_argument("--source", default="cli", help="who reports it (default: cli)")
    add_root_option(open_)
    open_.set_defaults(run=_open)

    mark = add_verb(actions, "mark", help="record a state report for a job", examples=[
        ("The job started", "tao-data-io record mark dino-train-coco --state RUNNING --source agent"),
        ("The job failed, with the reason", "tao-data-io record mark dino-train-coco --state ERROR --message 'OOM at epoch 3'"),
    ])
    mark.add_argument("job_id", metavar="ID")
    mark.add_argument("--state", required=True, choices=STATES)
    mark.add_argument("--backend-ref", metavar="NAMESPACE/NAME", help="the Kubernetes Job running it")
    mark.add_argument("--message")
    mark.add_argument("--source", default="cli", help="who reports it: cli, agent, flow… (default: cli)")
    add_root_option(mark)
    mark.set_defaults(run=_mark)

    show = add_verb(actions, "show", help="one job's record, history included", examples=[
        ("A job's state, route, uploads and history", "tao-data-io record show dino-train-coco"),
        ("The whole record document, from another record directory",
         "tao-data-io record show dino-train-coco --json --root /shared/tao-jobs"),
    ])
    show.add_argument("job_id", metavar="ID")
    show.add_argument("--json", action="store_true", help="print the record document")
    add_root_option(show)
    show.set_defaults(run=_show)

    list_ = add_verb(actions, "list", help="one line per job, oldest first", examples=[
        ("Every job of this machine's record directory", "tao-data-io record list"),
        ("Every record document of a shared directory, as JSON", "tao-data-io record list --json --root /shared/tao-jobs"),
    ])
    list_.add_argument("--json", action="store_true", help="print the record documents")
    add_root_option(list_)
    list_.set_defaults(run=_list)


def add_root_option(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--root", type=Path, metavar="DIR",
                     help="where records live (default: $TAO_DATA_IO_JOBS_DIR or ~/.tao-data-io/jobs)")


def _store(args: argparse.Namespace) -> RecordStore:
    from ..record import RecordStore

    return RecordStore(args.root)


def _open(args: argparse.Namespace, console: Console) -> int:
    record = _store(args).open(
        platform=args.platform, image=args.image, network_arch=args.network_arch, action=args.action,
        storage_tier=args.storage_tier, storage_reason=args.storage_reason, results_dir=args.results_dir,
        job_id=args.job_id, source=args.source, upload_excludes=args.upload_exclude)
    console.out(record.job_id)
    return 0


def _mark(args: argparse.Namespace, console: Console) -> int:
    record = _store(args).mark(args.job_id, args.state, source=args.source,
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
        ("platform", record.platform),
        ("image", record.image),
        ("network", f"{record.network_arch} {record.action}"),
        ("storage", f"tier {record.storage_tier}" + (f" — {record.storage_reason}" if record.storage_reason else "")),
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
        console.out(f"  {_time(step.at)}  {step.state:<8}  {step.source}" + (f"  {step.message}" if step.message else ""))
    return 0


def _list(args: argparse.Namespace, console: Console) -> int:
    damaged: list[str] = []

    def report(path: Path, reason: str) -> None:
        damaged.append(str(path))
        console.err(f"warning: skipping damaged record: {reason}")

    records = _store(args).list_records(on_damaged=report)
    if args.json:
        console.json([record.model_dump(mode="json") for record in records])
    else:
        width = max((len(record.job_id) for record in records), default=0)
        for record in records:
            console.out(f"{record.job_id:<{width}}  {record.state:<8}  {record.storage_tier}  "
                        f"{_time(record.updated_at)}  {record.action}")
    if damaged:
        console.err(f"error: {len(damaged)} record file(s) could not be read; the others are listed above")
        return 1
    return 0


def _route(record: JobRecord) -> str:
    route = record.output_route
    if route is None:
        return "-"
    return f"{route.route} → {route.destination}" + (f" — {route.reason}" if route.reason else "")


def _time(value: datetime) -> str:
    return value.isoformat(timespec="seconds").replace("+00:00", "Z")
