"""The admission plugins between a create and the store, as the stand-in runs them on every pod it
is asked to make, a dry run's too: the LimitRanger (``plugin/pkg/admission/limitranger``), quota
admission (``pkg/quota/v1/evaluator/core/pods.go``, ``apiserver/pkg/admission/plugin/
resourcequota/controller.go``); Pod Security is :mod:`.pod_security`, validating webhooks are
:class:`.apiserver.ApiServer`'s ``bare_pods_refused`` and ``admission_webhook``."""

from __future__ import annotations

from typing import Any

from .objects import quantity


def limit_range_defaults(pod: dict[str, Any], limit_ranges: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """The LimitRanger admission plugin (plugin/pkg/admission/limitranger): each ``Container``
    item's ``default`` becomes a container's limit and its ``defaultRequest`` (which defaults to
    ``default``, core/v1 SetDefaults_LimitRangeItem) its request, for every resource the
    container leaves unset — mutated before validation, which then refuses a request above its
    limit (pkg/apis/core/validation ValidateResourceRequirements). A dry run answers the
    mutated pod. Returns (what validation then refuses, what the LimitRanger's min and max
    refuse)."""
    spec = pod.get("spec") or {}
    for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
        # First the API server's own defaulting (pkg/apis/core/v1/defaults.go): a resource
        # with a limit and no request is requested at its limit.
        resources = container.get("resources") or {}
        for name, value in (resources.get("limits") or {}).items():
            container.setdefault("resources", {}).setdefault("requests", {}).setdefault(name, value)
    items = [_defaulted_item(item) for limit_range in limit_ranges
             for item in (limit_range.get("spec") or {}).get("limits", []) if item.get("type") == "Container"]
    if not items:
        return [], []
    problems, forbidden = [], []
    for where, containers in (("initContainers", spec.get("initContainers", [])),
                              ("containers", spec.get("containers", []))):
        for index, container in enumerate(containers):
            resources = container.setdefault("resources", {})
            for item in items:
                for name, value in item["default"].items():
                    resources.setdefault("limits", {}).setdefault(name, value)
                for name, value in item["defaultRequest"].items():
                    resources.setdefault("requests", {}).setdefault(name, value)
            for name, asked in (resources.get("requests") or {}).items():
                limit = (resources.get("limits") or {}).get(name)
                if limit is not None and quantity(asked) > quantity(limit):
                    problems.append(f"spec.{where}[{index}].resources.requests: Invalid value: \"{asked}\": "
                                    f"must be less than or equal to {name} limit of {limit}")
            for item in items:  # then the LimitRanger validates (PodValidateLimitFunc)
                for name, least in item.get("min", {}).items():
                    asked = (resources.get("requests") or {}).get(name)
                    if asked is None or quantity(asked) < quantity(least):
                        forbidden.append(f"minimum {name} usage per Container is {least}, but request is {asked}")
                for name, most in item.get("max", {}).items():
                    limit = (resources.get("limits") or {}).get(name)
                    if limit is None or quantity(limit) > quantity(most):
                        forbidden.append(f"maximum {name} usage per Container is {most}, but limit is {limit}")
    return problems, forbidden


def _defaulted_item(item: dict[str, Any]) -> dict[str, Any]:
    """A LimitRange item as the API server stores it (core/v1 SetDefaults_LimitRangeItem): a
    resource with a max and no default defaults to the max; one with a default (or else a min)
    and no defaultRequest requests it — resource by resource."""
    default = {**(item.get("max") or {}), **(item.get("default") or {})}
    request = {**(item.get("min") or {}), **default, **(item.get("defaultRequest") or {})}
    return {**item, "default": default, "defaultRequest": request}


def missing_constraints(spec: dict[str, Any], quota: set[str]) -> str | None:
    """Quota admission's podEvaluator.Constraints (pkg/quota/v1/evaluator/core/pods.go): only the
    quota's cpu and memory names are required (its validationSet), by every container, init
    containers included (enforcePodContainerConstraints); a bare name and requests.* are looked up
    in requests, limits.* in limits (podComputeUsageHelper), the requests as the API server's
    defaulting left them: a limit is a missing request. ``need for: containers; …`` or None."""
    required = quota & {f"{kind}{what}" for kind in ("", "requests.", "limits.") for what in ("cpu", "memory")}
    missing: dict[str, list[str]] = {}
    for c in [*spec.get("initContainers", []), *spec.get("containers", [])]:
        limits = (c.get("resources") or {}).get("limits") or {}
        has = {"limits": limits, "requests": {**limits, **((c.get("resources") or {}).get("requests") or {})}}
        for need in sorted(required):
            kind, _, what = need.rpartition(".")
            if what not in has[kind or "requests"]:
                missing.setdefault(need, []).append(c["name"])
    if not missing:
        return None
    return "; ".join(f"{need} for: {','.join(sorted(names))}" for need, names in sorted(missing.items()))


def pod_usage(spec: dict[str, Any], kind: str, what: str) -> float:
    """What a pod counts against a quota's ``kind.what`` (k8s.io/component-helpers resource
    PodRequests/PodLimits, as pods.go's podComputeUsageHelper calls them): its containers' sum,
    native sidecars added, and at least the largest of the other init containers. A limit with
    no request is requested at it (the API server's defaulting)."""
    def amount(container: dict[str, Any]) -> float:
        resources = container.get("resources") or {}
        limits = resources.get("limits") or {}
        chosen = limits if kind == "limits" else {**limits, **(resources.get("requests") or {})}
        return quantity(chosen[what]) if what in chosen else 0.0
    init = spec.get("initContainers", [])
    running = sum(amount(c) for c in [*spec.get("containers", []),
                                      *(c for c in init if c.get("restartPolicy") == "Always")])
    return max([running, *(amount(c) for c in init if c.get("restartPolicy") != "Always")])


def quota_exceeded(spec: dict[str, Any], hard: dict[str, str], used: dict[str, str]) -> str | None:
    """Quota admission's refusal of a pod that would take a tracked resource past its limit
    (apiserver pkg/admission/plugin/resourcequota/controller.go, CheckRequest): ``exceeded
    quota: NAME, requested: …, used: …, limited: …``, listing only the exceeded resources, sorted."""
    over = []
    for name in sorted(hard):
        kind, _, what = name.partition(".") if name.startswith(("requests.", "limits.")) else ("requests", "", name)
        asked = pod_usage(spec, kind, what)
        if asked and quantity(used.get(name, "0")) + asked > quantity(hard[name]):
            over.append((name, f"{asked:g}", used.get(name, "0"), hard[name]))
    if not over:
        return None
    listed = [",".join(f"{name}={value}" for name, *values in over for value in [values[i]]) for i in range(3)]
    return f"exceeded quota: compute, requested: {listed[0]}, used: {listed[1]}, limited: {listed[2]}"
