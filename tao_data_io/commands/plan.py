"""``plan``: the storage tier decision for a backend, and what the job would run and mount, offline."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from .examples import add_verb
from .target import DEFAULT_BACKEND, when_used

if TYPE_CHECKING:
    from ..console import Console
    from ..tier import ClusterFacts


def register(verbs: Any) -> None:
    plan = add_verb(verbs, "plan", help="print the storage tier decision and what the job would run and mount")
    plan.add_argument("--request", required=True, metavar="R", help="job request (YAML or JSON)")
    plan.add_argument("--facts", type=Path, metavar="F.json",
                      help="what the backend offers (ClusterFacts as JSON: volumes, air_gapped, capabilities…); "
                           "default: what the backend can do at most, no claim")
    plan.add_argument("--json", action="store_true", help="print the decision and the plan as JSON")
    when_used(plan, lambda: _add_backend(plan))
    plan.set_defaults(run=_plan)


def _add_backend(plan: argparse.ArgumentParser) -> None:
    from ..backends import declarations

    plan.add_argument("--backend", choices=tuple(declarations()), default=DEFAULT_BACKEND,
                      help=f"the backend whose facts decide (default: {DEFAULT_BACKEND})")


def _plan(args: argparse.Namespace, console: Console) -> int:
    from ..launch.plan import command_argv
    from ..request import load_request
    from ..staging.config import config_content
    from ..staging.layout import plan_inputs
    from ..tier import choose_tier, refuse_unsupported

    request = load_request(args.request)
    facts = _facts(args.backend, args.facts)
    refuse_unsupported(request, args.backend, facts.capabilities)  # as a submit would, before deciding
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


def _facts(backend: str, path: Path | None) -> ClusterFacts:
    """What ``backend`` offers: the most it can do (its declaration), and what a facts file says
    of the cluster at hand over that — less, field by field, never more: a facts file that says
    the local frame runs two nodes would plan a job no submit runs."""
    from pydantic import ValidationError

    from ..backends import declaration_of
    from ..documents import load_document, read_document
    from ..schema import describe_validation_error
    from ..tier import ClusterFacts

    declared = declaration_of(backend).capabilities
    if path is None:
        return ClusterFacts(backend=backend, capabilities=declared)
    what = f"facts {str(path)!r}"
    given = load_document(read_document(path, what=what), "json", what=what)
    if not isinstance(given, dict) or not isinstance(given.get("capabilities", {}), dict):
        raise UsageError(f"{what} must be a JSON object of ClusterFacts fields, capabilities an object too")
    if "supports_in_frame_fetch" in given:
        raise UsageError(f"{what}: supports_in_frame_fetch is now capabilities.fetches_in_frame: write "
                         '{"capabilities": {"fetches_in_frame": ' + json.dumps(given["supports_in_frame_fetch"]) + "}}")
    if given.get("backend", backend) != backend:
        raise UsageError(f"{what} are those of the {given['backend']} backend, and --backend is {backend!r}: give "
                         "the backend the facts are of, or drop their backend field")
    for field, value in given.get("capabilities", {}).items():
        if value is True and getattr(declared, field, True) is False:
            raise UsageError(f"{what}: capabilities.{field} is true in facts, and the {backend} backend does not "
                             f"declare it (facts say what the cluster at hand offers of what the backend can do, "
                             f"never more): drop capabilities.{field}")
    try:
        return ClusterFacts.model_validate({**given, "backend": backend,
                                            "capabilities": {**declared.model_dump(), **given.get("capabilities", {})}})
    except ValidationError as exc:
        raise UsageError(describe_validation_error(exc, f"{what} are not ClusterFacts")) from None
