"""``sync`` and ``cp``: the transfer engine on the command line."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from ..console import shown
from ..errors import UsageError
from ..transfer.filters import FilterRule
from ..transfer.shard import Shard, parse_shard
from ..vocabulary import DEFAULT_CONCURRENCY
from .examples import add_verb

if TYPE_CHECKING:
    from ..console import Console
    from ..transfer.summary import TransferSummary


class OrderedFilter(argparse.Action):
    """Collect --exclude/--include into one list in command-line order (order decides)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        rules = list(getattr(namespace, "filter_rules", None) or [])
        rules.append(FilterRule("exclude" if option_string == "--exclude" else "include", str(values)))
        namespace.filter_rules = rules


def concurrency(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 1024:
        raise argparse.ArgumentTypeError(f"--concurrency {text!r} must be a whole number from 1 to 1024")
    return value


def shard(text: str) -> Shard:
    try:
        return parse_shard(text, what="--shard")
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_transfer_options(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--concurrency", type=concurrency, default=DEFAULT_CONCURRENCY, metavar="N",
                     help=f"objects in flight at once (default {DEFAULT_CONCURRENCY})")
    sub.add_argument("--dry-run", action="store_true", help="show what would be transferred; move nothing")
    sub.add_argument("--json", action="store_true", help="print the summary as JSON")


def register(verbs: Any) -> None:
    sync = add_verb(verbs, "sync", help="sync a prefix to a directory or a directory to a prefix")
    sync.add_argument("source", metavar="SRC")
    sync.add_argument("destination", metavar="DST")
    sync.add_argument("--exclude", action=OrderedFilter, metavar="PATTERN",
                      help="skip paths matching PATTERN (repeatable)")
    sync.add_argument("--include", action=OrderedFilter, metavar="PATTERN",
                      help="re-admit paths matching PATTERN (repeatable)")
    sync.add_argument("--shard", type=shard, metavar="I/N",
                      help="download only the keys of shard I of N (a stable hash of each key); N runs, one per "
                           "shard, fill DST exactly as one run would")
    add_transfer_options(sync)
    sync.set_defaults(run=lambda args, console: _run(args, console, "sync"))

    cp = add_verb(verbs, "cp", help="copy one object to a file, or one file to an object")
    cp.add_argument("source", metavar="SRC")
    cp.add_argument("destination", metavar="DST")
    add_transfer_options(cp)
    cp.set_defaults(run=lambda args, console: _run(args, console, "cp"))


def _run(args: argparse.Namespace, console: Console, verb: str) -> int:
    from ..credentials import s3_credentials_from_env
    from ..transfer.engine import TransferEngine
    from ..transfer.options import TransferOptions
    from ..transfer.filters import PathFilter

    with TransferEngine(s3_credentials_from_env(), concurrency=args.concurrency) as engine, \
            console.progress(verb) as progress:
        options = TransferOptions(filter=PathFilter(tuple(getattr(args, "filter_rules", None) or ())),
                                  dry_run=args.dry_run, progress=progress, shard=getattr(args, "shard", None))
        method = engine.sync if verb == "sync" else engine.copy
        summary = method(args.source, args.destination, options)
    return report(summary, console, as_json=args.json)


def report(summary: TransferSummary, console: Console, *, as_json: bool, lines_only: bool = False) -> int:
    """Print a summary and return the exit code (1 if anything failed). ``lines_only``: only the
    per-item lines (what was skipped or failed, and why), for a caller that said the rest."""
    if as_json:
        console.json(summary.to_dict())
    else:
        if not lines_only:
            console.out(f"{shown(summary.source)} → {shown(summary.destination)}: {summary.describe()}")
        if summary.dry_run:
            for name in summary.transferred:
                console.out(f"  would transfer: {shown(name)}")
            if summary.transferred_files > len(summary.transferred):
                console.out(f"  … and {summary.transferred_files - len(summary.transferred)} more")
        for skipped in summary.skipped:
            console.out(f"  skipped: {shown(skipped.name)}: {shown(skipped.reason)}")
        if summary.skipped_unkept:
            console.out(f"  … and {summary.skipped_unkept} more skipped")
        for failure in summary.failed:
            console.out(f"  FAILED: {shown(failure.name)}: {shown(failure.reason)}")
        if summary.failed_unkept:
            console.out(f"  … and {summary.failed_unkept} more FAILED")
    if not summary.ok:
        console.err(f"error: {summary.failed_files} object(s) failed; complete files were kept — rerun to retry")
        return 1
    return 0
