"""``stage`` and ``materialize-config``: a job request's inputs and config, host-side."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .examples import add_verb

if TYPE_CHECKING:
    from ..console import Console


def register(verbs: Any) -> None:
    sub = add_verb(verbs, "stage", help="stage every input of a job request and write the staging map", examples=[
        ("Stage a request's inputs under the job's volume and print what went where",
         "tao-data-io stage --request examples/config-mode.yaml --workdir /mnt/job-42"),
        ("The same, printing the staging map as JSON (what a submit script reads)",
         "tao-data-io stage --request job.yaml --workdir /mnt/job-42 --json"),
    ])
    sub.add_argument("--request", required=True, metavar="R", help="job request (YAML or JSON)")
    sub.add_argument("--workdir", required=True, metavar="W", help="staging root (the job's volume in tier B)")
    sub.add_argument("--json", action="store_true", help="print the staging map as JSON")
    sub.set_defaults(run=_run_stage)

    sub = add_verb(verbs, "materialize-config", help="write the request's spec as a content-addressed config file",
                   examples=[
                       ("Write the spec of a config-mode request; prints the file's path",
                        "tao-data-io materialize-config --request examples/config-mode.yaml --output-dir /mnt/job-42/config"),
                       ("Run it again: the same spec gives the same file, written once",
                        "tao-data-io materialize-config --request job.yaml --output-dir /mnt/job-42/config"),
                   ])
    sub.add_argument("--request", required=True, metavar="R", help="job request (YAML or JSON), mode 'config'")
    sub.add_argument("--output-dir", required=True, metavar="D")
    sub.set_defaults(run=_run_materialize)


def _run_stage(args: argparse.Namespace, console: Console) -> int:
    from ..request import load_request
    from ..staging.stage import STAGING_MAP_NAME, stage

    staging_map = stage(load_request(args.request), Path(args.workdir))
    if args.json:
        console.json(staging_map.model_dump())
        return 0
    for entry in staging_map.sources:
        console.out(entry.describe())
    console.out(f"staging map: {Path(staging_map.workdir) / STAGING_MAP_NAME}")
    return 0


def _run_materialize(args: argparse.Namespace, console: Console) -> int:
    from ..request import load_request
    from ..staging.config import materialize_config

    config = materialize_config(load_request(args.request), Path(args.output_dir))
    console.out(str(config.path))
    return 0
