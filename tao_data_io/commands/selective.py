"""``selective-download``: stage only the objects an annotation file references.

The flags are those of TAO's ``selective_download.py`` (so existing job specs carry over),
plus ``--missing`` to choose between failing cleanly and staging what exists.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from ..vocabulary import ANNOTATION_FORMATS, DEFAULT_CONCURRENCY, MISSING_MODES
from .examples import add_verb
from .transfer import concurrency, report

if TYPE_CHECKING:
    from ..console import Console


def split_keys(values: Sequence[str]) -> list[str]:
    """``--key a --key b`` and ``--key a,b`` both mean columns ``a`` and ``b``."""
    keys = [name.strip() for value in values for name in value.split(",")]
    if any(not key for key in keys):
        raise UsageError(f"--key {','.join(values)!r} has an empty column name; write --key COL or --key COL1,COL2")
    return keys


def register(verbs: Any) -> None:
    sub = add_verb(verbs, "selective-download", help="download only the objects an annotation file references")
    sub.add_argument("--annotation", required=True, metavar="PATH_OR_S3_URI",
                     help="annotation file (parquet, jsonl, json, csv), local or s3://BUCKET/KEY")
    sub.add_argument("--key", dest="keys", required=True, action="append", metavar="COL",
                     help="column holding file paths (repeatable, or comma-separated)")
    sub.add_argument("--bucket", required=True, metavar="B", help="bucket holding the referenced objects")
    sub.add_argument("--src-prefix", required=True, metavar="P", help="key prefix the references are relative to")
    sub.add_argument("--dest", required=True, metavar="D", help="local directory; references keep their relative paths")
    sub.add_argument("--format", choices=ANNOTATION_FORMATS,
                     help="annotation format (default: from the file extension)")
    sub.add_argument("--missing", choices=MISSING_MODES, default="error",
                     help="a referenced object that does not exist: fail and remove this run's new files (error, "
                          "default) or stage the rest and list them beside D, in PARENT/.tao-data-io/NAME/"
                          "missing-references.txt (skip)")
    sub.add_argument("--concurrency", type=concurrency, default=DEFAULT_CONCURRENCY, metavar="N",
                     help=f"objects in flight at once (default {DEFAULT_CONCURRENCY})")
    sub.add_argument("--json", action="store_true", help="print the summary as JSON")
    sub.set_defaults(run=_run)


def _run(args: argparse.Namespace, console: Console) -> int:
    from ..credentials import s3_credentials_from_env
    from ..staging.selective import MissingReferencesError, selective_download
    from ..transfer.engine import TransferEngine
    from ..transfer.options import TransferOptions

    keys = split_keys(args.keys)
    with TransferEngine(s3_credentials_from_env(), concurrency=args.concurrency) as engine, \
            console.progress("selective-download") as progress:
        options = TransferOptions(progress=progress)
        try:
            result = selective_download(engine, args.annotation, keys, args.bucket, args.src_prefix, Path(args.dest),
                                        fmt=args.format, missing=args.missing, options=options)
        except MissingReferencesError as exc:
            console.err(f"error: {exc}")
            return 1
    if args.json:  # the summary's fields plus the annotation's, in one object
        console.json(result.to_dict())
        if not result.ok:
            console.err(f"error: {result.summary.failed_files} object(s) failed; "
                        "complete files were kept — rerun to retry")
        return 0 if result.ok else 1
    console.out(f"{args.annotation}: {result.references} references in {', '.join(result.keys)}")
    code = report(result.summary, console, as_json=False)
    if result.missing:
        console.out(f"  {len(result.missing)} referenced objects do not exist (--missing skip); "
                    f"their keys are listed in {result.missing_report}")
    return code
