"""``plan`` and ``render-job``: the tier decision, and every manifest a job needs, offline."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from .examples import add_verb
from .record import add_root_option, given_fields

if TYPE_CHECKING:
    from ..console import Console
    from ..tier import ClusterFacts

def register(verbs: Any) -> None:
    plan = add_verb(verbs, "plan", help="print the storage tier decision and what the job would run and mount")
    plan.add_argument("--request", required=True, metavar="R", help="job request (YAML or JSON)")
    plan.add_argument("--facts", type=Path, metavar="F.json",
                      help="what the cluster offers (ClusterFacts as JSON); default: Kubernetes, no claim")
    plan.add_argument("--json", action="store_true", help="print the decision and the plan as JSON")
    plan.set_defaults(run=_plan)

    render = add_verb(verbs, "render-job", help="print every manifest the job needs as multi-document YAML "
                                                "(stage Job, Secret reference, ConfigMap, Service, Job)")
    render.add_argument("--request", required=True, metavar="R", help="job request (YAML or JSON)")
    render.add_argument("--staging-map", required=True, type=Path, metavar="M",
                        help="the staging map (`stage`, or `stage --plan-only` for tiers B and C)")
    render.add_argument("--job-id", required=True, metavar="ID", help="the job's record (open it first)")
    render.add_argument("--namespace", default=os.environ.get("TAO_K8S_NAMESPACE") or "default", metavar="NS",
                        help="default $TAO_K8S_NAMESPACE or 'default'")
    render.add_argument("--pvc-claim", metavar="C", help="the PersistentVolumeClaim (default: the request's "
                                                         "storage.pvc_claim)")
    render.add_argument("--credential-secret", metavar="S", help="a pre-created Secret holding the forward_env "
                                                                 "keys (default: the per-job Secret)")
    render.add_argument("--image-pull-secret", metavar="S", dest="image_pull_secrets", action="append",
                        help="a pre-created image pull secret (repeat for several: nvcr.io, the stager's registry)")
    render.add_argument("--stager-image", metavar="I", help="the tao-data-io stager image (docker/stager)")
    render.add_argument("--ttl-seconds", type=int, metavar="N", help="ttlSecondsAfterFinished")
    render.add_argument("--shm-size", metavar="Q", help="/dev/shm size, e.g. 32Gi (default: the request's)")
    render.add_argument("--shards", type=int, metavar="N", help="tier B: pods of the stage Job")
    render.add_argument("--records-url", metavar="U", help="a shared job record store (s3://…) for the pods")
    add_root_option(render)
    render.set_defaults(run=_render)


def _plan(args: argparse.Namespace, console: Console) -> int:
    from ..launch.plan import command_argv
    from ..request import load_request
    from ..staging.config import config_content
    from ..staging.layout import plan_inputs
    from ..tier import choose_tier

    request = load_request(args.request)
    facts = _facts(args.facts)
    decision = choose_tier(request, facts)
    config_path = config_content(request)[3] if request.mode == "config" else None
    argv, shell = command_argv(request, config_path)
    inputs = [{"source": p.source, "sub_path": p.sub_path, "container_path": p.container_path}
              for p in plan_inputs(request)]
    if args.json:
        console.json({"decision": decision.to_dict(), "argv": argv, "shell": shell, "config_path": config_path,
                      "inputs": inputs, "gpus": request.compute_shape.gpus, "nodes": request.compute_shape.nodes})
        return 0
    console.out(decision.describe())
    console.out(f"runs: {json.dumps(argv)}" + (" (under /bin/sh -c: the request's own shell text)" if shell else ""))
    if config_path:
        console.out(f"config: {config_path} (read-only)")
    for item in inputs:
        where = f"staged at {item['sub_path']}" if item["sub_path"] else "pre-positioned"
        console.out(f"input: {item['source']} → {item['container_path']} ({where})")
    console.out(f"compute: {request.compute_shape.gpus} GPU(s) × {request.compute_shape.nodes} node(s)")
    return 0


def _facts(path: Path | None) -> ClusterFacts:
    from pydantic import ValidationError

    from ..schema import describe_validation_error
    from ..tier import ClusterFacts

    if path is None:
        return ClusterFacts(backend="kubernetes")
    try:
        return ClusterFacts.model_validate_json(path.read_bytes())
    except OSError as exc:
        raise UsageError(f"facts {str(path)!r} cannot be read: {exc.strerror}") from None
    except ValidationError as exc:
        raise UsageError(describe_validation_error(exc, f"facts {str(path)!r} are not ClusterFacts")) from None


def _render(args: argparse.Namespace, console: Console) -> int:
    from ..kubernetes.render import read_config, render_job
    from ..kubernetes.settings import KubernetesSettings
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
    settings = KubernetesSettings.from_mapping({**given_fields(KubernetesSettings, args),
                                                "pvc_claim": args.pvc_claim or request.storage.pvc_claim})
    rendered = render_job(plan, settings, request=request, record=record, config=read_config(plan),
                          suspend_training=True)
    console.out(rendered.to_yaml().rstrip("\n"))
    for warning in rendered.warnings:
        console.err(f"warning: {warning}")
    return 0
