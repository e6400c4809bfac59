"""``stage`` and ``materialize-config``: a job request's inputs and config, host-side."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from ..vocabulary import STAGING_MAP_NAME
from .examples import add_verb
from .transfer import shard

if TYPE_CHECKING:
    from ..console import Console


def register(verbs: Any) -> None:
    sub = add_verb(verbs, "stage", help="stage every input of a job request and write the staging map")
    sub.add_argument("--request", required=True, metavar="R", help="job request (YAML or JSON)")
    sub.add_argument("--staging-dir", required=True, type=Path, metavar="DIR",
                     help="the directory to stage into: one job's on a host, the claim's cache/ in tier B")
    sub.add_argument("--json", action="store_true", help="print the staging map as JSON")
    sub.add_argument("--plan-only", action="store_true",
                     help="write the staging map the cluster's stage step will produce, and the config; move "
                          "nothing (for render-job in tiers B and C)")
    sub.add_argument("--size", action="store_true",
                     help="with --plan-only: bound the inputs' staged size from their listings (tier C: the pod's "
                          "staging volume is sized to it)")
    sub.add_argument("--cache", action="store_true",
                     help="DIR is a shared stage cache (a tier B volume's cache/): stage each entry under its "
                          "lock, skip it when its marker shows the source unchanged")
    sub.add_argument("--shard", type=shard, metavar="I/N",
                     help="stage only shard I of N (folder keys by a stable hash; other inputs whole)")
    sub.add_argument("--map", type=Path, metavar="PATH", help="write the staging map here (default DIR/"
                                                              f"{STAGING_MAP_NAME})")
    sub.set_defaults(run=_run_stage)

    sub = add_verb(verbs, "materialize-config", help="write the request's spec as a content-addressed config file")
    sub.add_argument("--request", required=True, metavar="R", help="job request (YAML or JSON), mode 'config'")
    sub.add_argument("--output-dir", required=True, metavar="D")
    sub.set_defaults(run=_run_materialize)


def _run_stage(args: argparse.Namespace, console: Console) -> int:
    from ..request import load_request
    from ..staging.cache import stage_cached
    from ..staging.stage import plan_stage, stage

    request = load_request(args.request)
    if args.plan_only:
        if args.cache or args.shard:
            raise UsageError("--plan-only stages nothing, so --cache and --shard do not apply to it")
        staging_map = plan_stage(request, args.staging_dir, map_path=args.map, size=args.size)
    else:
        if args.size:
            raise UsageError("--size bounds what a cluster will stage; it goes with --plan-only (a stage here "
                             "measures what it writes)")
        staging_map = stage(request, args.staging_dir, stager=stage_cached if args.cache else None, shard=args.shard,
                            map_path=args.map)
    if args.json:
        console.json(staging_map.model_dump())
        return 0
    for entry in staging_map.sources:
        console.out(entry.describe())
    console.out(f"staging map: {args.map or Path(staging_map.staging_dir) / STAGING_MAP_NAME}")
    return 0


def _run_materialize(args: argparse.Namespace, console: Console) -> int:
    from ..request import load_request
    from ..staging.config import materialize_config

    config = materialize_config(load_request(args.request), Path(args.output_dir))
    console.out(str(config.path))
    return 0
