"""Issue 39, finding 7: kubelets may lag the API server by up to three minors (the version skew
policy, kubernetes.io/releases/version-skew-policy), and a kubelet older than 1.29 does not run
native sidecars: its pod admission refuses an initContainer with ``restartPolicy: Always``
(pkg/kubelet/lifecycle/predicate.go, ``InitContainerRestartPolicyForbidden``). The sidecar gate
must read each node's ``status.nodeInfo.kubeletVersion``, not only the API server's version."""

from __future__ import annotations

from pathlib import Path

import pytest

from tao_data_io.errors import UsageError
from tao_data_io.steps import VerifyFailed

from . import kube_cluster as cluster
from .kube.apiserver import KubeStandIn
from .kube_cluster import creates, job_request, make_backend, store_in, submit

#: The stand-in cluster and the input bucket (pytest fixtures of tests/kube_cluster.py).
kube, input_bucket = cluster.kube, cluster.input_bucket


def _kubelets(kube: KubeStandIn, versions: dict[str, str]) -> None:
    """The seeded 8-GPU nodes, each with the kubelet version it reports."""
    for name, version in versions.items():
        kube.server.store({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
                           "status": {"allocatable": {"nvidia.com/gpu": "8", "cpu": "64"},
                                      "nodeInfo": {"kubeletVersion": version}}})


def test_a_sidecar_job_is_refused_when_every_node_it_may_run_on_has_an_old_kubelet(kube: KubeStandIn,
                                                                                   tmp_path: Path) -> None:
    _kubelets(kube, {"gpu-0": "v1.28.9", "gpu-1": "v1.28.9-eks-1234"})  # the API server is 1.30
    with pytest.raises(UsageError) as info:
        submit(tmp_path, job_request(), make_backend())
    message = str(info.value)
    assert "kubelet 1.29 or newer" in message and "gpu-0 (1.28), gpu-1 (1.28)" in message, message
    assert "the API server runs 1.30" in message and "\n" not in message
    assert creates(kube) == []


def test_a_sidecar_job_warns_when_some_nodes_it_may_run_on_have_an_old_kubelet(kube: KubeStandIn,
                                                                               tmp_path: Path) -> None:
    _kubelets(kube, {"gpu-0": "v1.30.2", "gpu-1": "v1.28.9"})  # the stand-in's scheduler picks gpu-0
    said: list[str] = []
    assert submit(tmp_path, job_request(), make_backend(said)).verdict.ok
    warned = [line for line in said if "kubelet" in line]
    assert len(warned) == 1 and "gpu-1 (1.28)" in warned[0] and "node_selector" in warned[0], said


def test_a_pod_an_old_kubelet_refuses_is_that_kubelets_refusal_not_a_pod_waiting_for_a_node(
        kube: KubeStandIn, tmp_path: Path) -> None:
    """Where the warning came true: the pod was bound to the node with the old kubelet, which
    rejects it at admission (phase Failed, reason InitContainerRestartPolicyForbidden, no
    container ever created: pkg/kubelet/kubelet.go canAdmitPod). The submit ends at once naming
    the node, its refusal and the fix — not "waiting to be scheduled" until verify_timeout."""
    _kubelets(kube, {"gpu-0": "v1.28.9", "gpu-1": "v1.30.2"})
    with pytest.raises(VerifyFailed) as info:
        submit(tmp_path, job_request(), make_backend(verify_timeout=30))
    message = str(info.value)
    assert "the kubelet of gpu-0 refused the pod (InitContainerRestartPolicyForbidden)" in message, message
    assert "older than 1.29" in message and "node_selector" in message, message
    assert store_in(tmp_path).get("job-1").state == "ERROR"


def test_new_kubelets_and_nodes_the_pods_cannot_use_say_nothing(kube: KubeStandIn, tmp_path: Path) -> None:
    _kubelets(kube, {"gpu-0": "v1.30.2", "gpu-1": "v1.29.0"})
    kube.server.store({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "cpu-0"},  # no GPU: not a candidate
                       "status": {"allocatable": {"cpu": "64"}, "nodeInfo": {"kubeletVersion": "v1.27.1"}}})
    said: list[str] = []
    assert submit(tmp_path, job_request(), make_backend(said)).verdict.ok
    assert not [line for line in said if "kubelet" in line], said
