"""Issue 39, finding 19: a ResourceQuota that is only full right now refuses the admission dry
run of a pod with "exceeded quota" (apiserver pkg/admission/plugin/resourcequota/controller.go),
but the Job controller, given the Job, retries the pod's creation until the quota frees
(pkg/controller/job: FailedCreate, then a requeue with backoff). Only a pod that asks for more
than the quota allows at all can never run; the rest is a wait, said as a warning."""

from __future__ import annotations

from pathlib import Path

import pytest

from tao_data_io.errors import UsageError

from . import kube_cluster as cluster
from .kube.admission import quota_exceeded
from .kube.apiserver import KubeStandIn
from .kube_cluster import creates, job_request, launch_only, make_backend, ours

#: The stand-in cluster and the input bucket (pytest fixtures of tests/kube_cluster.py).
kube, input_bucket = cluster.kube, cluster.input_bucket


def test_the_stand_in_refuses_only_what_goes_past_the_quota() -> None:
    """controller.go CheckRequest: only the exceeded resources are named, with used and limited."""
    pod = {"containers": [{"name": "train", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}
    hard = {"requests.nvidia.com/gpu": "8", "requests.cpu": "100"}
    assert quota_exceeded(pod, hard, {"requests.nvidia.com/gpu": "6"}) is None
    assert quota_exceeded(pod, hard, {"requests.nvidia.com/gpu": "7"}) == (
        "exceeded quota: compute, requested: requests.nvidia.com/gpu=2, used: requests.nvidia.com/gpu=7, "
        "limited: requests.nvidia.com/gpu=8")


def test_a_quota_full_right_now_is_a_wait_not_a_refusal(kube: KubeStandIn, tmp_path: Path) -> None:
    kube.server.quota_hard = {"requests.nvidia.com/gpu": "8"}
    kube.server.quota_used = {"requests.nvidia.com/gpu": "8"}  # other teams' jobs hold every GPU now
    said: list[str] = []
    launch_only(tmp_path, job_request(), make_backend(said))
    assert "job-1" in ours(kube, "Job")
    warned = [line for line in said if "exceeded quota" in line]
    assert len(warned) == 1 and "full right now" in warned[0] and "requests.nvidia.com/gpu=8" in warned[0], said


def test_a_pod_that_asks_more_than_the_quota_allows_at_all_is_refused(kube: KubeStandIn, tmp_path: Path) -> None:
    kube.server.quota_hard = {"requests.nvidia.com/gpu": "4"}
    with pytest.raises(UsageError, match="ask for more than ResourceQuota compute allows at all: "
                                         "requests.nvidia.com/gpu 8 of 4"):
        launch_only(tmp_path, job_request(compute_shape={"gpus": 8}), make_backend())
    assert creates(kube) == []
