"""``tao-data-io``: command-line verbs over the Prefect-free core.

Exit codes: 0 success; 2 bad input (a message on stderr starting ``error:`` that names the bad
value and the fix); 1 failure (a summary of what failed). Every line printed passes through
the credential redactor. The verbs live in :mod:`tao_data_io.commands`, one module per area.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from .commands import MODULES
from .console import Console
from .credentials import RedactingFilter
from .errors import UsageError


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad command line raises UsageError (exit 2, ``error:`` line) instead of
    printing usage and exiting from deep inside the parser."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tao-data-io", description="Get data to and from the compute container of TAO jobs.")
    parser.add_argument("--progress", choices=("auto", "always", "never"), default="auto",
                        help="progress bar on stderr (auto: when stderr is a terminal)")
    verbs = parser.add_subparsers(dest="verb", required=True, parser_class=_Parser)
    for module in MODULES:
        module.register(verbs)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    console = Console()
    handler = logging.StreamHandler()
    handler.addFilter(RedactingFilter(console.redact))  # library warnings pass the same redactor
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s", handlers=[handler])
    try:
        args = build_parser().parse_args(argv)
        console.progress_mode = args.progress
        return int(args.run(args, console))
    except UsageError as exc:
        console.err(f"error: {exc}")
        return 2
    except Exception as exc:  # noqa: BLE001 - the last line of defence: redact, then report
        console.err(f"error: {type(exc).__name__}: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
