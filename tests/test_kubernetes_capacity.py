"""The GPU gate counts the nodes the job's pods may run on — those the target's nodeSelector
selects and whose scheduling taints its tolerations tolerate, cordoned ones excluded — as the
scheduler's NodeAffinity, TaintToleration and NodeUnschedulable filters do (upstream
``pkg/scheduler/framework/plugins``; a toleration matches as ``Toleration.ToleratesTaint`` in
``k8s.io/api/core/v1``). On a pool that autoscales, "no room now" is a warning, and the pod may
wait for a node for the target's ``pending_timeout`` — past it the Job is deleted, with the
scheduler's reason in the record."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tao_data_io.errors import UsageError
from tao_data_io.steps import VerifyFailed

from . import kube_cluster as cluster
from .kube.objects import RESOURCES
from .kube.apiserver import KubeStandIn
from .kube.kubelet import TRAIN_SCRIPT
from .kube_cluster import creates, gate_case, job_request, make_backend, ours, store_in, submit

#: The stand-in cluster and the input bucket (pytest fixtures of tests/kube_cluster.py).
kube, input_bucket = cluster.kube, cluster.input_bucket

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def _node(kube: KubeStandIn, name: str, gpus: int, labels: dict[str, str] | None = None,
          taints: list[dict[str, Any]] | None = None, cordoned: bool = False) -> None:
    kube.server.store({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels or {}},
                       "spec": {**({"taints": taints} if taints else {}),
                                **({"unschedulable": True} if cordoned else {})},
                       "status": {"allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "64"}}})


@pytest.fixture
def a100s(kube: KubeStandIn) -> KubeStandIn:
    """Besides the two plain 8-GPU nodes: a100-0 (labelled, untainted), a100-1 (labelled, GPU
    taint), a100-2 (labelled, cordoned), a100-3 (labelled, a PreferNoSchedule taint: no bar)."""
    pool = {"pool": "a100"}
    _node(kube, "a100-0", 8, pool)
    _node(kube, "a100-1", 8, pool, [GPU_TAINT])
    _node(kube, "a100-2", 8, pool, cordoned=True)
    _node(kube, "a100-3", 8, pool, [{"key": "spot", "value": "yes", "effect": "PreferNoSchedule"}])
    return kube


def test_the_gpu_gate_counts_only_the_nodes_the_pods_may_run_on(a100s: KubeStandIn, tmp_path: Path) -> None:
    request = job_request(compute_shape={"gpus": 8, "nodes": 3})
    with pytest.raises(UsageError) as info:
        submit(tmp_path, request, make_backend(node_selector={"pool": "a100"}))
    message = str(info.value)
    assert "the nodes the pods may run on can hold 2 such pod(s)" in message, message
    assert "a100-1: taint nvidia.com/gpu=present:NoSchedule not tolerated" in message
    assert "a100-2: cordoned" in message and "gpu-0: no label pool=a100" in message
    assert creates(a100s) == []


@pytest.mark.parametrize("toleration", [
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "nvidia.com/gpu", "operator": "Equal", "value": "present"},
    {"operator": "Exists"},
], ids=["exists-with-effect", "equal-any-effect", "everything"])
def test_a_taint_the_target_tolerates_counts_its_node(a100s: KubeStandIn, tmp_path: Path,
                                                      toleration: dict[str, Any]) -> None:
    backend = make_backend(node_selector={"pool": "a100"}, tolerations=[toleration])
    assert submit(tmp_path, job_request(compute_shape={"gpus": 8, "nodes": 3}), backend).started


def test_a_toleration_of_another_value_or_effect_does_not_count_the_node(a100s: KubeStandIn, tmp_path: Path) -> None:
    for toleration in ({"key": "nvidia.com/gpu", "operator": "Equal", "value": "absent"},
                       {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}):
        backend = make_backend(node_selector={"pool": "a100"}, tolerations=[toleration])
        with pytest.raises(UsageError, match="can hold 2 such pod"):
            submit(tmp_path, job_request(compute_shape={"gpus": 8, "nodes": 3}), backend)


def test_on_an_autoscaled_pool_no_room_now_is_a_warning_and_the_pod_waits_for_a_node(kube: KubeStandIn,
                                                                                   tmp_path: Path) -> None:
    """A GPU pool scaled to zero has no GPU node at all until a pod asks: refusing would refuse
    every job. The job is submitted, said to wait; a node that comes lets it run."""
    said: list[str] = []
    kube.server.control.scripts["job-1"] = ["unschedulable", "unschedulable", *TRAIN_SCRIPT]
    backend = make_backend(said, capacity="autoscaled")
    done = submit(tmp_path, job_request(compute_shape={"gpus": 16}), backend)
    assert done.started and store_in(tmp_path).get("job-1").state == "RUNNING"
    assert any(line.startswith("warning: compute_shape asks for 1 pod(s) of 16") and
               "can hold 0 such pod(s) now" in line and "the pool autoscales" in line for line in said), said


def test_past_the_pending_timeout_the_job_is_deleted_with_the_schedulers_reason(kube: KubeStandIn,
                                                                                tmp_path: Path) -> None:
    kube.server.control.scripts["job-1"] = ["unschedulable"]
    backend = make_backend(capacity="autoscaled", pending_timeout=0.05)
    with pytest.raises(VerifyFailed) as info:
        submit(tmp_path, job_request(compute_shape={"gpus": 16}), backend)
    message = str(info.value)
    assert "more than pending_timeout (0.05s)" in message and "Insufficient nvidia.com/gpu" in message, message
    assert "job-1" not in ours(kube, "Job")
    record = store_in(tmp_path).get("job-1")
    assert record.state == "ERROR" and "pending_timeout" in (record.message or "")


def test_pending_timeout_is_refused_unless_the_pool_autoscales() -> None:
    from tao_data_io.backends.kubernetes.settings import KubernetesSettings

    with pytest.raises(ValueError, match="pending_timeout applies to capacity 'autoscaled'"):
        KubernetesSettings(pending_timeout=60)
    with pytest.raises(ValueError, match="pending_timeout"):
        KubernetesSettings(capacity="autoscaled", pending_timeout=0)


# ------------------------------------------------------------ scheduling metadata (Kueue: test_kubernetes_kueue)
def test_the_targets_labels_and_annotations_ride_on_every_job_and_pod_but_never_ours(kube: KubeStandIn,
                                                                                    tmp_path: Path) -> None:
    kube.server.control.scripts["job-1"] = ["pulling"]
    backend = make_backend(labels={"team": "vision"}, annotations={"example.com/cost-centre": "ml-42"})
    cluster.launch_only(tmp_path, job_request(), backend)
    job = ours(kube, "Job")["job-1"]
    for meta in (job["metadata"], job["spec"]["template"]["metadata"]):
        assert meta["labels"]["team"] == "vision" and meta["labels"]["app.kubernetes.io/managed-by"] == "tao-data-io"
        assert meta["annotations"]["example.com/cost-centre"] == "ml-42"
    with pytest.raises(UsageError, match="labels key 'app.kubernetes.io/managed-by' is tao-data-io's own"):
        submit(tmp_path, job_request(job_id="job-2"),
               make_backend(labels={"app.kubernetes.io/managed-by": "someone-else"}))


def test_a_multi_node_jobs_pods_are_placed_one_per_node_unless_the_target_says_otherwise(kube: KubeStandIn,
                                                                                        tmp_path: Path) -> None:
    kube.server.control.scripts["job-1"] = ["pulling"]
    cluster.launch_only(tmp_path, job_request(compute_shape={"gpus": 8, "nodes": 2}), make_backend())
    pod = ours(kube, "Job")["job-1"]["spec"]["template"]["spec"]
    [term] = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == {"tao-data-io/job-id": "job-1", "tao-data-io/step": "train"}
    kube.server.control.scripts["job-2"] = ["pulling"]
    cluster.launch_only(tmp_path, job_request(job_id="job-2", compute_shape={"gpus": 8, "nodes": 2}),
                       make_backend(exclusive_topology=None))
    assert "affinity" not in ours(kube, "Job")["job-2"]["spec"]["template"]["spec"]


@pytest.mark.parametrize(("settings", "match"), [
    ({"queue_name": "gpu-queue"}, "queue_name 'gpu-queue' with capacity 'fixed'"),
    ({"capacity": "queued"}, "queue_name None with capacity 'queued'"),
    ({"labels": {"Not A Key": "x"}}, "labels key 'Not A Key' is not a label key"),
    ({"priority_class": "High_Priority"}, "priority_class 'High_Priority' is not a DNS subdomain"),
])
def test_bad_scheduling_settings_are_refused_naming_the_field(settings: dict[str, Any], match: str) -> None:
    from tao_data_io.backends.kubernetes.settings import KubernetesSettings

    with pytest.raises(ValueError, match=match):
        KubernetesSettings(**settings)


@pytest.mark.parametrize("key", ["batch.kubernetes.io/job-name", "job-name", "controller-uid", "kubernetes.io/team",
                                 "node.k8s.io/x"])
def test_labels_kubernetes_selects_pods_by_or_reserves_are_refused(key: str) -> None:
    """A Job's pods are found by job-name and controller-uid (pkg/registry/batch/job/strategy.go
    keeps one the template already has, so the Service would select nothing); kubernetes.io/ and
    k8s.io/ are reserved. app.kubernetes.io/, the recommended labels, stays the user's."""
    from tao_data_io.backends.kubernetes.settings import KubernetesSettings

    with pytest.raises(ValueError, match=f"labels key '{key}' is Kubernetes' own"):
        KubernetesSettings(labels={key: "x"})
    assert KubernetesSettings(labels={"app.kubernetes.io/part-of": "vision"}).labels


def test_annotations_past_what_an_object_may_hold_are_refused() -> None:
    from tao_data_io.backends.kubernetes.settings import KubernetesSettings

    with pytest.raises(ValueError, match="annotations hold more than 131072 bytes"):
        KubernetesSettings(annotations={"example.com/note": "x" * 300_000})


def test_the_gate_counts_one_rank_per_node_when_the_ranks_are_placed_one_per_node(kube: KubeStandIn,
                                                                                 tmp_path: Path) -> None:
    """Two ranks of 4 GPUs fit one 8-GPU node by count, but their required anti-affinity puts each
    on a node of its own: with one such node the job would wait Pending forever, so it is refused."""
    for (resource, _, name), obj in list(kube.server.objects.items()):
        if resource == RESOURCES["Node"] and name in ("gpu-0", "gpu-1"):
            obj.delete()  # only the one big node is left
    _node(kube, "big-0", 8)
    with pytest.raises(UsageError, match="can hold 1 such pod"):
        submit(tmp_path, job_request(compute_shape={"gpus": 4, "nodes": 2}), make_backend())
    assert submit(tmp_path / "shared", job_request(job_id="job-2", compute_shape={"gpus": 4, "nodes": 2}),
                  make_backend(exclusive_topology=None)).started


@pytest.mark.parametrize(("toleration", "match"), [
    ({"operator": "Exists", "value": "v"}, "matches every taint|give no value"),
    ({"effect": "NoSchedule"}, "without a key matches every taint, so its operator must be Exists"),
    ({"key": "k", "operator": "exists"}, "operator 'exists' is not Equal or Exists"),
    ({"key": "k", "value": "v", "effect": "NoSchedule", "tolerationSeconds": 60}, "applies to the NoExecute effect"),
    ({"key": "k", "effect": "NoSched"}, "effect 'NoSched' is not"),
])
def test_a_toleration_the_api_server_would_refuse_is_refused_when_the_target_is_made(toleration: dict[str, Any],
                                                                                    match: str) -> None:
    """Upstream's ValidateTolerations, at settings time: before, such a toleration passed into the
    GPU gate's node counting and was refused only by the server-side dry run."""
    from tao_data_io.backends.kubernetes.settings import KubernetesSettings

    with pytest.raises(ValueError, match=match):
        KubernetesSettings(tolerations=[toleration])
    KubernetesSettings(tolerations=[{"operator": "Exists"}, {"key": "nvidia.com/gpu", "operator": "Exists",
                                                              "effect": "NoSchedule"},
                                    {"key": "k", "value": "v", "effect": "NoExecute", "tolerationSeconds": 30}])


def test_gate_gpu_capacity_refuses_a_job_no_node_can_hold(kube: KubeStandIn, tmp_path: Path) -> None:
    message = gate_case(kube, tmp_path, job_request(compute_shape={"gpus": 16}), make_backend(),
                        "compute_shape asks for 1 pod(s) of 16 nvidia.com/gpu each (16 in all) but the nodes the pods "
                        "may run on can hold 0 such pod(s) (allocatable gpu-0: 8, gpu-1: 8)")
    assert "lower compute_shape.gpus" in message
    assert not any("selfsubjectaccessreviews" in r for r in kube.requests())  # the first gate


def test_gate_gpu_capacity_is_skipped_for_a_job_without_gpus(kube: KubeStandIn, tmp_path: Path) -> None:
    for index in range(2):  # no node has a GPU to give
        kube.server.store({"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"gpu-{index}"},
                           "status": {"allocatable": {"cpu": "64"}}})
    assert submit(tmp_path, job_request(compute_shape={"gpus": 0}), make_backend()).verdict.ok
    preflight = kube.requests()[4:]
    assert preflight.count("GET /api/v1/nodes") <= 1  # read once, for the kubelets' versions (the sidecar)
