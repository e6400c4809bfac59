"""The stand-in's Kueue (tests/kube/kueue.py) pinned to what kubernetes-sigs/kueue does, apart
from the product: the Job webhook's defaulting (``pkg/controller/jobframework/defaults.go``),
the Workload it keeps (``reconciler.go``: named after the Job, labelled with its uid), why a
Workload is not admitted (``getQueueBlocker``; ``findFlavorForPodSets``), what a LocalQueue's
status lists (``filterLocalQueueUsage``), and an eviction's requeue."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from .kube.apiserver import KubeStandIn
from .kube.kueue import LOCAL_QUEUES, QUEUE_LABEL, WORKLOADS, Kueue
from .kube.objects import JOBS

NAMESPACE = "tao"


@pytest.fixture
def kube() -> Iterator[KubeStandIn]:
    with KubeStandIn() as stand_in:
        yield stand_in


def _install(kube: KubeStandIn, covered: tuple[str, ...], *, queue: str = "gpu-queue", **config: Any) -> Kueue:
    kueue = Kueue(cluster_queues={"gpus": covered}, **config)
    kube.run(lambda: (kueue.install(kube.server), kueue.local_queue(kube.server, NAMESPACE, queue, "gpus")))
    return kueue


def _job(name: str, queue: str | None, requests: dict[str, str]) -> dict[str, Any]:
    labels = {QUEUE_LABEL: queue} if queue else {}
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": NAMESPACE, "uid": f"uid-{name}", "labels": labels},
            "spec": {"completions": 1, "template": {"metadata": {}, "spec": {"restartPolicy": "Never", "containers": [
                {"name": "train", "image": "tao", "resources": {"requests": requests}}]}}}}


def _made(kube: KubeStandIn, kueue: Kueue, job: dict[str, Any]) -> dict[str, Any]:
    """The Job as Kueue's webhook leaves it, stored, and one look of Kueue's controllers."""
    def make() -> dict[str, Any]:
        kueue.default(kube.server, NAMESPACE, job)
        kube.server.store(job)
        kueue.reconcile(kube.server, NAMESPACE, job["metadata"]["name"])
        return kube.server.objects[JOBS, NAMESPACE, job["metadata"]["name"]].raw

    return kube.run(make)


def _workload(kube: KubeStandIn, uid: str) -> dict[str, Any]:
    return kube.run(lambda: next(obj.raw for (resource, _, _), obj in kube.server.objects.items()
                                 if resource == WORKLOADS and obj.raw["metadata"]["labels"]["kueue.x-k8s.io/job-uid"]
                                 == uid))


def _reserved(workload: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in workload["status"]["conditions"] if c["type"] == "QuotaReserved")


def test_the_webhook_queues_a_job_in_a_local_queue_named_default_and_suspends_it(kube: KubeStandIn) -> None:
    kueue = _install(kube, ("cpu",), queue="default", room=False)
    job = _made(kube, kueue, _job("unqueued", None, {"cpu": "1"}))
    assert job["metadata"]["labels"][QUEUE_LABEL] == "default" and job["spec"]["suspend"] is True


def test_without_a_default_queue_only_manage_jobs_without_queue_name_suspends_an_unqueued_job(
        kube: KubeStandIn) -> None:
    kueue = _install(kube, ("cpu",))
    assert not _made(kube, kueue, _job("free", None, {"cpu": "1"}))["spec"].get("suspend")
    kueue.manage_jobs_without_queue_name = True
    kueue.room = False
    assert _made(kube, kueue, _job("managed", None, {"cpu": "1"}))["spec"]["suspend"] is True


def test_a_workload_is_named_after_its_job_and_admitted_when_covered_and_there_is_room(kube: KubeStandIn) -> None:
    kueue = _install(kube, ("cpu", "memory"))
    job = _made(kube, kueue, _job("fits", "gpu-queue", {"cpu": "1", "memory": "1Gi"}))
    workload = _workload(kube, "uid-fits")
    assert workload["metadata"]["name"].startswith("job-fits-")
    assert workload["metadata"]["ownerReferences"][0]["uid"] == "uid-fits"
    assert _reserved(workload)["status"] == "True" and job["spec"]["suspend"] is False


@pytest.mark.parametrize(("covered", "queue", "excluded", "message"), [
    (("cpu",), "gpu-queue", (), "couldn't assign flavors to pod set main: resource ephemeral-storage unavailable in "
                                "ClusterQueue"),
    (("cpu",), "missing", (), "LocalQueue missing doesn't exist"),
    (("cpu",), "gpu-queue", ("ephemeral-storage",), None),  # excludeResourcePrefixes drops it from the requests
])
def test_why_a_workload_is_not_admitted(kube: KubeStandIn, covered: tuple[str, ...], queue: str,
                                        excluded: tuple[str, ...], message: str | None) -> None:
    kueue = _install(kube, covered, excluded_prefixes=excluded)
    job = _made(kube, kueue, _job("asks", queue, {"cpu": "1", "ephemeral-storage": "10Gi"}))
    reserved = _reserved(_workload(kube, "uid-asks"))
    if message is None:
        assert reserved["status"] == "True" and job["spec"]["suspend"] is False
    else:
        assert (reserved["status"], reserved["message"]) == ("False", message) and job["spec"]["suspend"] is True


def test_a_local_queue_lists_every_resource_its_cluster_queue_covers(kube: KubeStandIn) -> None:
    _install(kube, ("nvidia.com/gpu", "cpu"))
    local = kube.run(lambda: kube.server.objects[LOCAL_QUEUES, NAMESPACE, "gpu-queue"].raw)
    assert local["status"]["flavorsReservation"] == [{"name": "default-flavor", "resources": [
        {"name": "cpu", "total": "0"}, {"name": "nvidia.com/gpu", "total": "0"}]}]


def test_an_eviction_suspends_the_job_and_requeues_its_workload(kube: KubeStandIn) -> None:
    kueue = _install(kube, ("cpu",))
    _made(kube, kueue, _job("taken", "gpu-queue", {"cpu": "1"}))
    kube.run(lambda: kueue.evict(kube.server, NAMESPACE, "taken", "PodsReadyTimeout", "Exceeded the PodsReady timeout"))
    job = kube.run(lambda: kube.server.objects[JOBS, NAMESPACE, "taken"].raw)
    workload = _workload(kube, "uid-taken")
    evicted = next(c for c in workload["status"]["conditions"] if c["type"] == "Evicted")
    assert job["spec"]["suspend"] is True and evicted["reason"] == "PodsReadyTimeout"
    assert workload["status"]["requeueState"]["count"] == 1
