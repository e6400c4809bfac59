"""The stand-in's quota admission pinned to upstream's (pkg/quota/v1/evaluator/core/pods.go,
``Constraints`` and ``enforcePodContainerConstraints``): of a quota's hard names only cpu and
memory ones (``validationSet``) must be set, by every container, init containers included;
``cpu``/``memory`` and ``requests.*`` are looked up in requests, ``limits.*`` in limits
(``podComputeUsageHelper``), with a request defaulted from its limit as the API server does
before admission. What the quota names that a container leaves unset is refused with 403,
"must specify NAME for: CONTAINERS; …", names and containers sorted."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from .kube.apiserver import KubeStandIn


@pytest.fixture(scope="module")
def stand_in() -> Iterator[KubeStandIn]:
    with KubeStandIn() as server:
        yield server


def container(name: str, **resources: dict[str, str]) -> dict[str, Any]:
    return {"name": name, "image": "busybox:1.36", "resources": resources}


def admit(stand_in: KubeStandIn, quota: set[str], *containers: dict[str, Any],
          init: tuple[dict[str, Any], ...] = ()) -> tuple[int, str]:
    """A dry-run create of a pod under a namespace quota on ``quota``: the status and message."""
    stand_in.server.quota = quota
    spec: dict[str, Any] = {"containers": list(containers), **({"initContainers": list(init)} if init else {})}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "tao"}, "spec": spec}
    sent = urllib.request.Request(f"{stand_in.url}/api/v1/namespaces/tao/pods?dryRun=All", method="POST",
                                  data=json.dumps(pod).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(sent, timeout=10) as answer:
            return answer.status, ""
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())["message"]


REQUESTS_ONLY = {"requests": {"cpu": "1", "memory": "1Gi"}}
BOTH = {**REQUESTS_ONLY, "limits": {"cpu": "1", "memory": "1Gi"}}


def test_a_quota_on_limits_refuses_a_container_that_sets_requests_only(stand_in: KubeStandIn) -> None:
    status, message = admit(stand_in, {"limits.memory"}, container("train", **REQUESTS_ONLY))
    assert status == 403
    assert message == 'pods "p" is forbidden: failed quota: compute: must specify limits.memory for: train'


def test_init_containers_are_counted_and_each_name_lists_its_containers(stand_in: KubeStandIn) -> None:
    status, message = admit(stand_in, {"limits.cpu", "limits.memory", "requests.cpu"},
                            container("train", **BOTH), container("results", requests={"cpu": "1"}),
                            init=(container("stage", **REQUESTS_ONLY),))
    assert status == 403
    assert message.endswith("must specify limits.cpu for: results,stage; limits.memory for: results,stage")


@pytest.mark.parametrize(("quota", "resources"), [
    ({"cpu", "memory"}, REQUESTS_ONLY),  # bare names are requests
    # A request the API server defaulted from its limit.
    ({"requests.cpu", "requests.memory"}, {"limits": {"cpu": "1", "memory": "1Gi"}}),
    ({"limits.cpu", "limits.memory", "requests.cpu", "requests.memory"}, BOTH),
    # Neither ephemeral-storage nor an extended resource is in validationSet: counted, never required.
    ({"requests.ephemeral-storage", "limits.ephemeral-storage", "requests.nvidia.com/gpu"}, {}),
], ids=["bare", "defaulted", "all", "not-required"])
def test_a_pod_that_sets_what_the_quota_requires_is_admitted(stand_in: KubeStandIn, quota: set[str],
                                                             resources: dict[str, dict[str, str]]) -> None:
    assert admit(stand_in, quota, container("train", **resources)) == (201, "")


def test_bare_names_are_looked_up_in_requests_not_limits(stand_in: KubeStandIn) -> None:
    status, message = admit(stand_in, {"memory", "limits.cpu"}, container("train", limits={"cpu": "1"}))
    assert status == 403 and message.endswith("must specify memory for: train")
