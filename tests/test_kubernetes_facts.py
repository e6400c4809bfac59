"""What the Kubernetes backend reports of its cluster (facts), against the API stand-in."""

from __future__ import annotations

from . import kube_cluster
from .kube_cluster import claim, make_backend
from .kube.apiserver import KubeStandIn

#: The stand-in cluster and the input bucket (pytest fixtures of tests/kube_cluster.py).
kube, input_bucket = kube_cluster.kube, kube_cluster.input_bucket


def test_facts_report_claims_classes_version_and_gpus(kube: KubeStandIn) -> None:
    kube.server.store(claim())
    facts = make_backend().facts()
    assert facts.backend == "kubernetes" and facts.server_version == "1.30" and facts.capabilities.fetches_in_frame
    assert facts.allocatable_gpus == {"gpu-0": 8, "gpu-1": 8} and facts.storage_classes == ["standard"]
    assert [(v.name, v.phase, v.access_modes, v.capacity_bytes, v.holds_inputs) for v in facts.volumes] == [
        ("tao-data", "Bound", ["ReadWriteMany"], 100 * 1024**3, False)]
    kube.server.minor = 28
    assert not make_backend().facts().capabilities.fetches_in_frame
