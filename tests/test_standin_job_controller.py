"""The stand-in's Job controller and kubelet (tests/kube/job_controller.py, tests/kube/kubelet.py)
pinned to what upstream does, apart from the product: the pod failure policy's order
(``pkg/controller/job/pod_failure_policy.go``), the terminal condition by version
(``job_controller.go``: FailureTarget first from 1.31, kubernetes/kubernetes#125510), a graceful
stop (native sidecars after the regular containers, KEP-753), the Eviction API's
``DisruptionTarget`` set before the delete, and suspension (``deleteJobPods``: the pods are
deleted uncounted, yet judged by the policy)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from .kube.apiserver import KubeStandIn
from .kube.job_controller import pod_failure_action
from .kube.objects import JOBS, PODS

NAMESPACE = "tao"
FAIL_ON_ANY_EXIT = {"rules": [
    {"action": "Count", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
    {"action": "FailJob", "onExitCodes": {"operator": "NotIn", "values": [0]}},
]}


@pytest.fixture
def kube() -> Iterator[KubeStandIn]:
    with KubeStandIn() as stand_in:
        yield stand_in


def _job(name: str, *, policy: dict[str, Any] | None = None, suspend: bool = False,
         deadline: int | None = None) -> dict[str, Any]:
    """A one-pod Job whose pod runs ``train`` beside a native ``results`` sidecar on a node."""
    spec: dict[str, Any] = {
        "backoffLimit": 2, "completions": 1, "suspend": suspend,
        "template": {"metadata": {"labels": {"tao-data-io/step": "train"}}, "spec": {
            "nodeName": "gpu-0", "restartPolicy": "Never", "terminationGracePeriodSeconds": 60,
            "initContainers": [{"name": "results", "image": "stager", "restartPolicy": "Always"}],
            "containers": [{"name": "train", "image": "tao"}]}}}
    if policy is not None:
        spec["podFailurePolicy"] = policy
    if deadline is not None:
        spec["activeDeadlineSeconds"] = deadline
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": NAMESPACE,
                                                                   "uid": f"uid-{name}"}, "spec": spec}


def _create(kube: KubeStandIn, job: dict[str, Any], steps: list[str]) -> None:
    def create() -> None:
        kube.server.control.scripts[job["metadata"]["name"]] = steps
        kube.server.store(job)
        kube.server.control.created(kube.server, job)

    kube.run(create)


def _look(kube: KubeStandIn, name: str, times: int = 1) -> dict[str, Any]:
    """The Job after ``times`` looks (each moves its pods one step, as a read by the backend does)."""
    for _ in range(times):
        kube.run(lambda: kube.server.control.advance(kube.server, NAMESPACE, name))
    return kube.run(lambda: dict(kube.server.objects[JOBS, NAMESPACE, name].raw))


def _conditions(job: dict[str, Any]) -> list[str]:
    return [c["type"] for c in job.get("status", {}).get("conditions", []) if c.get("status") == "True"]


def _pods(kube: KubeStandIn, name: str) -> list[dict[str, Any]]:
    return kube.run(lambda: [obj.raw for (resource, _, _), obj in kube.server.objects.items() if resource == PODS
                             and not obj.deleted and obj.raw["metadata"]["labels"].get("job-name") == name])


def _pod(exits: dict[str, int], conditions: tuple[str, ...] = ()) -> dict[str, Any]:
    statuses = [{"name": name, "state": {"terminated": {"exitCode": code}}} for name, code in exits.items()]
    return {"metadata": {"namespace": NAMESPACE, "name": "p"}, "status": {
        "phase": "Failed", "containerStatuses": statuses,
        "conditions": [{"type": kind, "status": "True"} for kind in conditions]}}


@pytest.mark.parametrize(("pod", "action"), [
    (_pod({"train": 137}, ("DisruptionTarget",)), "Count"),  # the first rule that matches wins
    (_pod({"train": 3}), "FailJob"),
    (_pod({"train": 0, "results": 0}), "Count"),  # an exit of 0 never matches NotIn [0]: no rule, counted
])
def test_the_policys_rules_are_tried_in_order_and_the_first_match_wins(pod: dict[str, Any], action: str) -> None:
    assert pod_failure_action(FAIL_ON_ANY_EXIT, pod)[0] == action


def test_a_rule_for_one_container_looks_at_that_container_only() -> None:
    policy = {"rules": [{"action": "Ignore", "onExitCodes": {"containerName": "train", "operator": "In",
                                                              "values": [143]}}]}
    assert pod_failure_action(policy, _pod({"train": 143}))[0] == "Ignore"
    assert pod_failure_action(policy, _pod({"train": 1, "results": 143}))[0] == "Count"


@pytest.mark.parametrize(("minor", "at_once"), [(30, ["FailureTarget", "Failed"]), (31, ["FailureTarget"])])
def test_a_job_past_its_deadline_is_failed_at_once_before_1_31_and_once_its_pods_stopped_from_1_31(
        kube: KubeStandIn, minor: int, at_once: list[str]) -> None:
    kube.server.minor = minor
    _create(kube, _job("late", deadline=60), ["running"])
    _look(kube, "late")

    def age() -> None:
        started = datetime.now(timezone.utc) - timedelta(seconds=120)
        kube.server.objects[JOBS, NAMESPACE, "late"].raw["status"]["startTime"] = started.strftime("%Y-%m-%dT%H:%M:%SZ")

    kube.run(age)
    assert _conditions(_look(kube, "late")) == at_once
    [pod] = _pods(kube, "late")
    assert pod["metadata"].get("deletionTimestamp")  # deleted with its grace, not at once
    assert _conditions(_look(kube, "late", times=3)) == ["FailureTarget", "Failed"]


def test_a_graceful_stop_ends_the_regular_containers_before_the_native_sidecars(kube: KubeStandIn) -> None:
    _create(kube, _job("evicted"), ["running", "evicting"])
    _look(kube, "evicted", times=2)  # running, then the Eviction API
    [pod] = _pods(kube, "evicted")
    assert "DisruptionTarget" in [c["type"] for c in pod["status"]["conditions"]]  # set before the delete
    assert pod["metadata"]["deletionTimestamp"] and pod["status"]["phase"] == "Running"
    name = pod["metadata"]["name"]

    def evicted() -> dict[str, Any]:
        return next(pod for pod in _pods(kube, "evicted") if pod["metadata"]["name"] == name)

    _look(kube, "evicted")
    states = {c["name"]: next(iter(c["state"])) for c in [*evicted()["status"]["initContainerStatuses"],
                                                          *evicted()["status"]["containerStatuses"]]}
    assert states == {"results": "running", "train": "terminated"} and evicted()["status"]["phase"] == "Running"
    _look(kube, "evicted")
    assert evicted()["status"]["phase"] == "Failed"


def test_a_suspended_jobs_pods_are_deleted_uncounted_yet_judged_by_its_policy(kube: KubeStandIn) -> None:
    """``deleteJobPods`` removes the tracking finalizer first (never counted towards
    backoffLimit), but ``getFailJobMessage`` judges every failed pod: a FailJob rule that the
    stopped pod matches fails even a suspended Job."""
    _create(kube, _job("kept"), ["running"])
    _create(kube, _job("judged", policy=FAIL_ON_ANY_EXIT), ["running"])
    for name in ("kept", "judged"):
        _look(kube, name)
        kube.run(lambda name=name: kube.server.objects[JOBS, NAMESPACE, name].raw["spec"].update(suspend=True))
    kept, judged = _look(kube, "kept", times=3), _look(kube, "judged", times=3)
    assert _conditions(kept) == ["Suspended"] and "failed" not in kept["status"]
    assert "FailureTarget" in _conditions(judged)
