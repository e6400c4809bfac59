"""``render-job``: every manifest a Kubernetes job needs, offline."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from .examples import add_verb
from .record import add_root_option
from .target import add_settings_flags, target_settings, when_used

if TYPE_CHECKING:
    from ..console import Console


def register(verbs: Any) -> None:
    render = add_verb(verbs, "render-job", help="print every manifest the job needs as multi-document YAML "
                                                "(stage Job, Secret reference, ConfigMap, Service, Job)")
    render.add_argument("--request", required=True, metavar="R", help="job request (YAML or JSON)")
    render.add_argument("--staging-map", required=True, type=Path, metavar="M",
                        help="the staging map (`stage`, or `stage --plan-only` for tiers B and C)")
    render.add_argument("--job-id", required=True, metavar="ID", help="the job's record (open it first)")
    add_root_option(render)
    when_used(render, lambda: _add_kubernetes_flags(render))
    render.set_defaults(run=_render)


def _add_kubernetes_flags(render: argparse.ArgumentParser) -> None:
    from ..backends import declaration_of

    add_settings_flags(render, [declaration_of("kubernetes")], heading="the {name} backend's settings")


def _render(args: argparse.Namespace, console: Console) -> int:
    from ..backends.kubernetes.render import read_config, render_job
    from ..backends.kubernetes.settings import KubernetesSettings
    from ..launch.plan import build_plan
    from ..outputs import resolve_route
    from ..records import RecordStore
    from ..request import load_request
    from ..staging.stage_map import read_staging_map
    from ..tier import TierDecision

    request = load_request(args.request)
    if request.job_id is not None and request.job_id != args.job_id:
        raise UsageError(f"job_id {args.job_id!r} differs from the request's job_id {request.job_id!r}; render the "
                         "job the request names")
    staging_map = read_staging_map(args.staging_map)
    record = RecordStore(args.root).get(args.job_id)
    if record.storage_tier is None:
        raise UsageError(f"job {args.job_id!r} has no storage tier in its record yet, and the manifests depend on it: "
                         "open the record with --storage-tier A, B or C (`tao-data-io record open … --storage-tier "
                         "C`), or let `tao-data-io submit` decide it")
    decision = TierDecision(tier=record.storage_tier, reason=record.storage_reason or "recorded at open")
    plan = build_plan(request, staging_map, decision, record, resolve_route(record, os.environ))
    given = target_settings(args, backend="kubernetes")
    settings = KubernetesSettings.from_mapping({
        **given, "namespace": given.get("namespace") or os.environ.get("TAO_K8S_NAMESPACE") or "default",
        "pvc_claim": given.get("pvc_claim") or request.storage.pvc_claim})
    rendered = render_job(plan, settings, request=request, record=record, config=read_config(plan),
                          suspend_training=True)
    console.out(rendered.to_yaml().rstrip("\n"))
    for warning in rendered.warnings:
        console.err(f"warning: {warning}")
    return 0
