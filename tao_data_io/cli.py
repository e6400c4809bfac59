"""``tao-data-io``: command-line verbs over the Prefect-free core.

Exit codes: 0 success; 2 bad input (a message on stderr starting ``error:`` that names the bad
value and the fix); 1 transfer failure (a summary of what failed). Every line this program
prints passes through the credential redactor.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from rich.progress import BarColumn, DownloadColumn, MofNCompleteColumn, Progress as RichProgress, TimeRemainingColumn, TransferSpeedColumn

from .credentials import Redactor, s3_credentials_from_env
from .errors import UsageError
from .transfer.engine import DEFAULT_CONCURRENCY, TransferEngine, TransferOptions
from .transfer.filters import FilterRule, PathFilter
from .transfer.summary import Progress, TransferSummary


class _OrderedFilter(argparse.Action):
    """Collect --exclude/--include into one list in command-line order (order decides)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        rules = list(getattr(namespace, "filter_rules", None) or [])
        rules.append(FilterRule("exclude" if option_string == "--exclude" else "include", str(values)))
        namespace.filter_rules = rules


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def _concurrency(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 1024:
        raise argparse.ArgumentTypeError(f"--concurrency {text!r} must be a whole number from 1 to 1024")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tao-data-io", description=__doc__.split("\n\n")[0])
    verbs = parser.add_subparsers(dest="verb", required=True, parser_class=_Parser)

    sync = verbs.add_parser("sync", help="sync a prefix to a directory or a directory to a prefix")
    sync.add_argument("source", metavar="SRC")
    sync.add_argument("destination", metavar="DST")
    sync.add_argument("--exclude", action=_OrderedFilter, metavar="PATTERN", help="skip paths matching PATTERN (repeatable)")
    sync.add_argument("--include", action=_OrderedFilter, metavar="PATTERN", help="re-admit paths matching PATTERN (repeatable)")
    _common(sync)
    sync.set_defaults(run=_run_sync)

    cp = verbs.add_parser("cp", help="copy one object to a file, or one file to an object")
    cp.add_argument("source", metavar="SRC")
    cp.add_argument("destination", metavar="DST")
    _common(cp)
    cp.set_defaults(run=_run_cp)
    return parser


def _common(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--concurrency", type=_concurrency, default=DEFAULT_CONCURRENCY, metavar="N",
                     help=f"objects in flight at once (default {DEFAULT_CONCURRENCY})")
    sub.add_argument("--dry-run", action="store_true", help="show what would be transferred; move nothing")
    sub.add_argument("--json", action="store_true", help="print the summary as JSON")
    sub.add_argument("--progress", choices=("auto", "always", "never"), default="auto",
                     help="progress bar on stderr (auto: when stderr is a terminal)")


def _options(args: argparse.Namespace, progress: Callable[[Progress], None] | None) -> TransferOptions:
    rules = tuple(getattr(args, "filter_rules", None) or ())
    return TransferOptions(concurrency=args.concurrency, filter=PathFilter(rules), dry_run=args.dry_run, progress=progress)


def _run_sync(args: argparse.Namespace, progress: Callable[[Progress], None] | None) -> TransferSummary:
    engine = TransferEngine(s3_credentials_from_env(), concurrency=args.concurrency)
    return engine.sync(args.source, args.destination, _options(args, progress))


def _run_cp(args: argparse.Namespace, progress: Callable[[Progress], None] | None) -> TransferSummary:
    engine = TransferEngine(s3_credentials_from_env(), concurrency=args.concurrency)
    return engine.copy(args.source, args.destination, _options(args, progress))


def _print_summary(summary: TransferSummary, as_json: bool, out: TextIO, redact: Redactor) -> None:
    if as_json:
        print(redact(json.dumps(summary.to_dict(), indent=2)), file=out)
        return
    print(redact(f"{summary.source} → {summary.destination}: {summary.describe()}"), file=out)
    if summary.dry_run:
        for name in summary.transferred:
            print(redact(f"  would transfer: {name}"), file=out)
    for skipped in summary.skipped:
        print(redact(f"  skipped: {skipped.name}: {skipped.reason}"), file=out)
    for failure in summary.failed:
        print(redact(f"  FAILED: {failure.name}: {failure.reason}"), file=out)


def main(argv: Sequence[str] | None = None) -> int:
    redact = Redactor()
    try:
        args = build_parser().parse_args(argv)
        show_bar = args.progress == "always" or (args.progress == "auto" and sys.stderr.isatty())
        if show_bar:
            with RichProgress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                              DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn(),
                              transient=False, console=None) as bar:
                task = bar.add_task(args.verb, total=None)

                def on_progress(p: Progress) -> None:
                    bar.update(task, total=p.bytes_total, completed=p.bytes_done,
                               description=f"{args.verb} {p.files_done}/{p.files_total} files")

                summary = args.run(args, on_progress)
        else:
            summary = args.run(args, None)
    except UsageError as exc:
        print(redact(f"error: {exc}"), file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - the last line of defence: redact, then report
        print(redact(f"error: {type(exc).__name__}: {exc}"), file=sys.stderr)
        return 1
    _print_summary(summary, args.json, sys.stdout, redact)
    if not summary.ok:
        print(redact(f"error: {len(summary.failed)} object(s) failed; complete files were kept — rerun to retry"), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
