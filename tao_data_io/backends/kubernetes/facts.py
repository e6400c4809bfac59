"""What the cluster offers, read from the API server, for the tier decision and the gates.

Why these reads and no more: the tier decision needs the claims of the namespace (phase, access
modes, capacity), the StorageClasses (whether a claim could be provisioned) and whether pods can
run a native sidecar (1.29+) to fetch and upload for themselves. The server version and the GPUs
per node are reported beside them and checked by the preflight gates.

Node and StorageClass lists are cluster-scoped: an identity confined to its namespace may not
read them, and the facts then say "unknown" (None, no classes) instead of failing a submit that
needs neither. Whether a claim's stage cache already holds a request's inputs cannot be told
without mounting it in a pod (the cache's markers live on the volume, and ``facts()`` is asked
before any request-specific work), so ``holds_inputs`` stays False: the tier B stage Job then
finds the cache warm and moves nothing.
"""

from __future__ import annotations

import re
from typing import Any

from kubernetes.utils.quantity import parse_quantity

from ...tier import ClusterFacts, VolumeFacts
from . import DECLARATION
from .api import Api, ApiError
from .placement import Node

GPU = "nvidia.com/gpu"
#: Native sidecars (an initContainer with ``restartPolicy: Always``) are on by default from 1.29.
SIDECAR_VERSION = (1, 29)
#: Stable pod hostnames of an Indexed Job (``<job>-0.<service>``), needed for rendezvous.
MULTI_NODE_VERSION = (1, 28)


def server_version(api: Api) -> tuple[int, int]:
    """(major, minor) of the API server; minor as digits (GKE and EKS write ``30+``). Read once per
    connection."""
    if api.known_version is None:
        info = api.call("reading the server version", api.version.get_code)
        major, minor = (int(re.sub(r"\D.*", "", str(info.get(key, ""))) or 0) for key in ("major", "minor"))
        api.known_version = (major, minor)
    return api.known_version


def gpu_nodes(api: Api) -> list[Node] | None:
    """Every node, with its allocatable ``nvidia.com/gpu`` and what placement reads (labels,
    taints, whether cordoned); None when this identity may not list nodes."""
    try:
        nodes = api.call("listing the nodes", api.core.list_node)
    except ApiError as exc:
        if exc.status == 403:
            return None
        raise
    found = []
    for item in nodes.get("items", []):
        allocatable = (item.get("status") or {}).get("allocatable") or {}
        spec, meta = item.get("spec") or {}, item["metadata"]
        kubelet = re.match(r"v?(\d+)\.(\d+)", str(((item.get("status") or {}).get("nodeInfo") or {}).get(
            "kubeletVersion") or ""))
        found.append(Node(name=meta["name"], gpus=int(parse_quantity(allocatable.get(GPU, "0"))),
                          labels=meta.get("labels") or {}, taints=spec.get("taints") or (),
                          cordoned=bool(spec.get("unschedulable")),
                          kubelet=(int(kubelet[1]), int(kubelet[2])) if kubelet else None))
    return found


def allocatable_gpus(api: Api) -> dict[str, int] | None:
    """Allocatable ``nvidia.com/gpu`` per node; None when this identity may not list nodes."""
    nodes = gpu_nodes(api)
    return None if nodes is None else {node.name: node.gpus for node in nodes}


def volumes(api: Api) -> list[VolumeFacts]:
    claims = api.call(f"listing the PersistentVolumeClaims of namespace {api.namespace!r}",
                      api.core.list_namespaced_persistent_volume_claim, api.namespace)
    return [volume_facts(item) for item in claims.get("items", [])]


def volume_facts(claim: dict[str, Any]) -> VolumeFacts:
    status = claim.get("status") or {}
    storage = (status.get("capacity") or {}).get("storage")
    modes = status.get("accessModes") or (claim.get("spec") or {}).get("accessModes") or []
    return VolumeFacts(name=claim["metadata"]["name"], phase=status.get("phase") or "Pending", access_modes=list(modes),
                       capacity_bytes=int(parse_quantity(storage)) if storage else None)


def storage_classes(api: Api) -> list[dict[str, Any]]:
    """Every StorageClass; none when this identity may not list them."""
    try:
        found = api.call("listing the StorageClasses", api.storage.list_storage_class)
    except ApiError as exc:
        if exc.status == 403:
            return []
        raise
    return list(found.get("items", []))


def cluster_facts(api: Api) -> ClusterFacts:
    version = server_version(api)
    gpus = allocatable_gpus(api)
    capabilities = DECLARATION.capabilities.model_copy(update={"fetches_in_frame": version >= SIDECAR_VERSION})
    return ClusterFacts(backend=DECLARATION.name, capabilities=capabilities, volumes=volumes(api),
                        storage_classes=[c["metadata"]["name"] for c in storage_classes(api)],
                        server_version=f"{version[0]}.{version[1]}", allocatable_gpus=gpus)
