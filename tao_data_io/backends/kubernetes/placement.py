"""Which nodes a job's pods may be scheduled on: what the scheduler's filters would say, from the
node list alone, so the GPU gate counts only those.

Upstream's rules (``pkg/scheduler/framework/plugins``): NodeAffinity keeps a node whose labels
hold every ``nodeSelector`` pair; TaintToleration keeps a node whose every ``NoSchedule`` and
``NoExecute`` taint some toleration tolerates (``PreferNoSchedule`` only scores); and a cordoned
node (``spec.unschedulable``) is refused by NodeUnschedulable unless the pod tolerates the taint
the node lifecycle controller puts on it, ``node.kubernetes.io/unschedulable:NoSchedule``. A
toleration tolerates a taint as ``Toleration.ToleratesTaint`` (``k8s.io/api/core/v1``) has it: an
effect, when given, must be the taint's; a key, when given, must be the taint's; ``Exists``
matches any value, ``Equal`` (the default) the taint's value.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: The label every node carries with its own name (the kubelet sets it).
HOSTNAME_LABEL = "kubernetes.io/hostname"
#: The taint a cordoned node is treated as carrying.
CORDON_TAINT = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
#: The effects that keep a pod off a node (PreferNoSchedule only lowers its score).
_BARRING = ("NoSchedule", "NoExecute")


@dataclass(frozen=True)
class Node:
    """What the placement rules read of a node."""

    name: str
    gpus: int
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: Sequence[Mapping[str, Any]] = ()
    cordoned: bool = False
    #: (major, minor) of the kubelet (``status.nodeInfo.kubeletVersion``); None when not reported.
    kubelet: tuple[int, int] | None = None


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    if toleration.get("key") and toleration["key"] != taint.get("key"):
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return True
    return operator == "Equal" and (toleration.get("value") or "") == (taint.get("value") or "")


def barred(node: Node, node_selector: Mapping[str, str], tolerations: Sequence[Mapping[str, Any]]) -> str | None:
    """Why the job's pods may not run on ``node`` (None: they may)."""
    for key, value in node_selector.items():
        if node.labels.get(key) != value:
            return f"no label {key}={value}"
    if node.cordoned and not any(tolerates(t, CORDON_TAINT) for t in tolerations):
        return "cordoned"
    for taint in node.taints:
        if taint.get("effect") in _BARRING and not any(tolerates(t, taint) for t in tolerations):
            value = f"={taint['value']}" if taint.get("value") else ""
            return f"taint {taint.get('key')}{value}:{taint['effect']} not tolerated"
    return None
