"""The stand-in's kubelet keeps of a container's termination message what the real one does, and
admits at its node what the real one admits.

Two cuts, both upstream's: ``getTerminationMessage`` (pkg/kubelet/kuberuntime/kuberuntime_container.go)
reads at most the *last* ``MaxContainerTerminationMessageLength`` (4096) bytes of the file, and
``normalizeStatus`` (pkg/kubelet/status/status_manager.go) then keeps the *first*
``MaxPodTerminationMessageLogLength / (containers + initContainers)`` (12288 / n) bytes of it.
"""

from __future__ import annotations

from typing import Any

import pytest

from .kube.apiserver import KubeStandIn
from .kube.kubelet import admission_refusal, kubelet_message


def pod_spec(init: int, main: int) -> dict[str, Any]:
    return {"initContainers": [{"name": f"init-{i}"} for i in range(init)],
            "containers": [{"name": f"main-{i}"} for i in range(main)]}


@pytest.mark.parametrize(("init", "main", "kept"), [(4, 1, 2457), (0, 1, 4096), (2, 1, 4096), (3, 1, 3072)],
                         ids=["five-containers", "one", "three", "four"])
def test_the_kubelet_keeps_12_kib_shared_by_the_pods_containers_and_at_most_4_kib(init: int, main: int,
                                                                                    kept: int) -> None:
    written = "".join(f"{i:07d}\n" for i in range(1000))  # 8000 bytes
    message = kubelet_message(written, pod_spec(init, main))
    assert len(message.encode()) == kept
    assert message == written[-4096:][:kept]  # the file's tail is read, then the status keeps its head


def test_a_message_within_the_budget_is_kept_whole() -> None:
    line = "TAO-VERIFY\tok\tfile\t/a\treadable\n"
    assert kubelet_message(line, pod_spec(4, 1)) == line


@pytest.mark.parametrize(("kubelet", "init", "refused"), [
    ("v1.28.9", [{"name": "results", "restartPolicy": "Always"}], True),
    ("v1.29.0", [{"name": "results", "restartPolicy": "Always"}], False),
    ("v1.28.9", [{"name": "stager"}], False),  # an ordinary init container is every kubelet's
])
def test_a_kubelet_older_than_1_29_refuses_a_native_sidecar_at_admission(kubelet: str, init: list[dict[str, Any]],
                                                                         refused: bool) -> None:
    """canAdmitPod (pkg/kubelet/kubelet.go) with SidecarContainers off, its default before 1.29:
    an init container with a restartPolicy is refused, reason InitContainerRestartPolicyForbidden."""
    with KubeStandIn() as kube:
        kube.server.store({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-0"},
                           "status": {"nodeInfo": {"kubeletVersion": kubelet}}})
        spec = {"nodeName": "gpu-0", "initContainers": init, "containers": [{"name": "train"}]}
        said = kube.run(lambda: admission_refusal(kube.server, spec))
    assert (said is not None and said[0] == "InitContainerRestartPolicyForbidden") == refused
