"""The cluster's Kubernetes version, against the API stand-in: the version gate refuses what an
older API server cannot run, and a cluster older than native sidecars runs a job that needs none
without the status sidecar."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tao_data_io.backends.kubernetes.render import STEP_LABEL

from . import kube_cluster
from .kube_cluster import ENV, claim, gate_case, job_request, launch_only, make_backend, ours
from .kube.apiserver import KubeStandIn

#: The stand-in cluster and the input bucket (pytest fixtures of tests/kube_cluster.py).
kube, input_bucket = kube_cluster.kube, kube_cluster.input_bucket


@pytest.mark.parametrize(("minor", "fields", "fragment"), [
    (27, {"compute_shape": {"gpus": 1, "nodes": 2}}, "a multi-node job (compute_shape.nodes 2) needs Kubernetes 1.28"),
    (28, {}, ("the job's pod runs the results sidecar (results uploaded to S3 while it runs), which needs Kubernetes "
             "1.29 or newer; the cluster runs 1.28")),
])
def test_gate_kubernetes_version(kube: KubeStandIn, tmp_path: Path, minor: int, fields: dict[str, Any],
                                 fragment: str) -> None:
    kube.server.minor = minor
    kube.server.store(claim())
    request = job_request(storage={"pvc_claim": "tao-data", "tier": "B"}, **fields)
    gate_case(kube, tmp_path, request, make_backend(), fragment)


def test_a_cluster_older_than_native_sidecars_runs_the_job_without_the_status_sidecar(
        kube: KubeStandIn, tmp_path: Path) -> None:
    """On 1.28 an initContainer with restartPolicy Always is not a sidecar (the SidecarContainers
    feature is off before 1.29, KEP-753): one that never exits would keep training from starting.
    A job that uploads nothing runs there, without progress; the results sidecar's gate above
    still refuses a job that needs it."""
    kube.server.minor = 28
    kube.server.store(claim())
    environ = {name: value for name, value in ENV.items() if name != "S3_BUCKET_NAME"}
    request = job_request(storage={"pvc_claim": "tao-data", "tier": "B"})
    launch_only(tmp_path, request, make_backend(), environ=environ)
    pod = next(pod for pod in ours(kube, "Pod").values() if pod["metadata"]["labels"][STEP_LABEL] == "train")
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["verify"]
