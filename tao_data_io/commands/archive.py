"""``extract``: safe, atomic, idempotent archive extraction on the command line."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..vocabulary import ARCHIVE_FORMATS
from .examples import add_verb

if TYPE_CHECKING:
    from ..console import Console


def strip_components(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"--strip-components {text!r} must be a whole number, 0 or more")
    return value


def register(verbs: Any) -> None:
    extract = add_verb(verbs, "extract", help=f"extract an archive ({ARCHIVE_FORMATS}), local or s3://, "
                                              "into a directory: safely, atomically, once")
    extract.add_argument("--archive", required=True, metavar="PATH_OR_S3_URI", help="a local file or s3://BUCKET/KEY")
    extract.add_argument("--dest", required=True, metavar="DIR",
                         help="the directory to create or replace; it holds exactly the archive's members (the marker "
                              "that makes a rerun a no-op lives beside it, in PARENT/.tao-data-io/NAME/)")
    extract.add_argument("--strip-components", type=strip_components, default=0, metavar="N",
                         help="drop N leading path components from every member (shorter members are skipped)")
    extract.add_argument("--json", action="store_true", help="print the result as JSON")
    extract.set_defaults(run=run)


def run(args: argparse.Namespace, console: Console) -> int:
    from ..staging.archive import extract_archive

    result = extract_archive(args.archive, Path(args.dest), strip_components=args.strip_components)
    if args.json:
        console.json(result.to_dict())
    else:
        console.out(result.describe())
    return 0
