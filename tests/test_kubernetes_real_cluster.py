"""The Kubernetes backend against a real cluster (opt-in: skipped unless TAO_E2E_KUBECONFIG names
one; the jobs that stage and upload in their pods also need TAO_E2E_S3_ENDPOINT and
TAO_E2E_STAGER_IMAGE). README: Kubernetes, proved here and on a real cluster."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tao_data_io import steps, verbs
from tao_data_io.errors import UsageError
from tao_data_io.backends.kubernetes.backend import KubernetesBackend
from tao_data_io.backends.kubernetes.render import JOB_ID_LABEL
from tao_data_io.backends.kubernetes.settings import KubernetesSettings
from tao_data_io.credentials import S3Credentials
from tao_data_io.request import JobRequest
from tao_data_io.transfer.client import make_s3_client

from .kube_cluster import store_in


E2E_KUBECONFIG = os.environ.get("TAO_E2E_KUBECONFIG")


real_cluster = pytest.mark.skipif(
    not E2E_KUBECONFIG, reason="set TAO_E2E_KUBECONFIG to a kind cluster's admin kubeconfig to run the real-cluster "
                               "suite (README: Kubernetes, proved here and on a real cluster)")
#: No GPU, and a /dev/shm (the training container's memory request) a laptop's kind node can hold.
E2E_SHAPE = {"gpus": 0, "shm_size": "64Mi"}
#: What the e2e claim holds for its tier A jobs.
E2E_FILES = {"datasets/demo/readme.txt": "a pre-positioned dataset\n"}


@contextmanager
def e2e_namespace(monkeypatch: pytest.MonkeyPatch, suffix: str, labels: dict[str, str] | None = None,
                  ) -> Iterator[tuple[Any, str, str]]:
    """(the admin's cluster, a fresh namespace ``tao-e2e-<suffix>``, its seeded claim); the
    namespace is deleted afterwards, and everything in it."""
    from .kube_e2e import RealCluster

    monkeypatch.setenv("KUBECONFIG", str(E2E_KUBECONFIG))
    monkeypatch.delenv("TAO_K8S_CONTEXT", raising=False)
    cluster = RealCluster()
    namespace = cluster.namespace(f"{os.environ.get('TAO_E2E_NAMESPACE', 'tao-e2e')}-{suffix}", labels)
    try:
        yield cluster, namespace, cluster.claim(namespace, "tao-e2e-data", E2E_FILES)
    finally:
        cluster.delete_namespace(namespace)


def e2e_request(job_id: str, **fields: Any) -> JobRequest:
    """A GPU-free tier A job, busybox as its "training" image (the POSIX sh and awk the probe needs)."""
    return JobRequest.model_validate({
        "schema_version": "1", "job_id": job_id, "image": os.environ.get("TAO_E2E_IMAGE", "busybox:1.36"),
        "mode": "args", "command": ["/bin/sh", "-c"],
        "args": ["echo listing /data; ls -a /data; echo trained > /results/out.txt; sleep 600"],
        "mounts": [{"source": "/datasets/demo", "target": "/data", "read_only": True}],
        "compute_shape": E2E_SHAPE, "outputs": {"results_dir": "/results"}, **fields})


def e2e_backend(namespace: str, claim: str, said: list[str], **settings: Any) -> KubernetesBackend:
    return KubernetesBackend(KubernetesSettings(namespace=namespace, pvc_claim=claim, **settings), verify_timeout=600,
                             image_pull_timeout=900, pod_poll_seconds=2.0, say=said.append)


@real_cluster
def test_e2e_a_tier_a_job_is_verified_followed_canceled_and_collected(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """submit → verify → status → logs → cancel → collect, on a claim of kind's local-path
    provisioner that a pod filled first."""
    said: list[str] = []
    with e2e_namespace(monkeypatch, "run") as (_, namespace, claim):
        backend, store = e2e_backend(namespace, claim, said), store_in(tmp_path)
        done = verbs.submit(e2e_request("e2e-run"), backend, store, staging_root=tmp_path / "work", environ={})
        try:
            assert done.tier == "A" and done.verdict.ok, (done.verdict.describe(), said)
            status = backend.status(done.backend_ref)
            for _ in range(60):
                if status.state != "PENDING":
                    break
                time.sleep(2)
                status = backend.status(done.backend_ref)
            assert status.state == "RUNNING", status
            for _ in range(30):
                if "readme.txt" in backend.logs(done.backend_ref, tail=20):
                    break
                time.sleep(1)
            assert "readme.txt" in backend.logs(done.backend_ref, tail=20)
        finally:
            stopped = verbs.cancel("e2e-run", backend, store)
        assert stopped.record.state == "CANCELED" and backend.status(done.backend_ref).state in ("CANCELED", "UNKNOWN")
        assert verbs.collect("e2e-run", backend, store, wait=False).state == "CANCELED"


@real_cluster
def test_e2e_a_source_missing_on_the_claim_fails_verify_and_the_kubelet_creates_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kubelet creates a missing subPath when a container that mounts it starts: the probe reads
    through the claim's root, so the missing source fails verify and is still missing after."""
    said: list[str] = []
    with e2e_namespace(monkeypatch, "missing") as (cluster, namespace, claim):
        request = e2e_request("e2e-missing", mounts=[
            {"source": "/datasets/demo", "target": "/data", "read_only": True},
            {"source": "/datasets/annotations.json", "target": "/ann.json", "read_only": True}])
        with pytest.raises(steps.VerifyFailed, match="datasets/annotations.json"):
            verbs.submit(request, e2e_backend(namespace, claim, said), store_in(tmp_path),
                         staging_root=tmp_path / "work", environ={})
        assert not cluster.holds(namespace, claim, "datasets/annotations.json")
        assert cluster.holds(namespace, claim, "datasets/demo/readme.txt")


@real_cluster
def test_e2e_a_restricted_namespace_refuses_the_image_user_up_front_and_admits_a_restricted_target(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pod Security admission on a real API server: the gate's Pod dry run is refused, naming the
    level; with training_security restricted and a non-root user every pod of the job passes."""
    said: list[str] = []
    labels = {"pod-security.kubernetes.io/enforce": "restricted"}
    with e2e_namespace(monkeypatch, "restricted", labels) as (_, namespace, claim):
        with pytest.raises(UsageError, match="enforces the 'restricted' Pod Security level"):
            verbs.submit(e2e_request("e2e-root"), e2e_backend(namespace, claim, said), store_in(tmp_path / "root"),
                         staging_root=tmp_path / "work", environ={})
        backend = e2e_backend(namespace, claim, said, training_security="restricted", training_user=1000)
        store = store_in(tmp_path / "strict")
        request = e2e_request("e2e-strict", args=["ls /data; sleep 600"])
        done = verbs.submit(request, backend, store, staging_root=tmp_path / "work", environ={})
        try:
            assert done.verdict.ok, (done.verdict.describe(), said)
        finally:
            verbs.cancel("e2e-strict", backend, store)


@real_cluster
def test_e2e_a_limit_range_default_is_said_before_anything_is_created(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    said: list[str] = []
    with e2e_namespace(monkeypatch, "limits") as (cluster, namespace, claim):
        cluster.create(namespace, {"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "defaults"},
                                   "spec": {"limits": [{"type": "Container", "default": {"cpu": "1"}}]}})
        backend, store = e2e_backend(namespace, claim, said), store_in(tmp_path)
        done = verbs.submit(e2e_request("e2e-limits"), backend, store, staging_root=tmp_path / "work", environ={})
        verbs.cancel("e2e-limits", backend, store)
        assert done.verdict.ok and any('container "train": limits.cpu=1' in line for line in said), said


@real_cluster
def test_e2e_a_quota_on_requests_refuses_only_what_the_request_leaves_unset(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    said: list[str] = []
    with e2e_namespace(monkeypatch, "quota") as (cluster, namespace, claim):
        cluster.create(namespace, {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "compute"},
                                   "spec": {"hard": {"requests.cpu": "4", "requests.memory": "64Gi"}}})
        time.sleep(5)  # the quota controller computes the quota's status before admission uses it
        backend = e2e_backend(namespace, claim, said)
        with pytest.raises(UsageError, match="admission refuses the pods of Job e2e-quota.*requests.cpu"):
            verbs.submit(e2e_request("e2e-quota"), backend, store_in(tmp_path / "q"),
                         staging_root=tmp_path / "work", environ={})
        store = store_in(tmp_path / "cpu")
        done = verbs.submit(e2e_request("e2e-cpu", compute_shape={**E2E_SHAPE, "cpu": "1"}), backend, store,
                            staging_root=tmp_path / "work", environ={})
        verbs.cancel("e2e-cpu", backend, store)
        assert done.verdict.ok, (done.verdict.describe(), said)


#: An S3 endpoint this host and the cluster's pods both reach (an S3 server on the kind nodes'
#: network), and the stager image loaded into the cluster (``kind load docker-image``): a job that
#: stages in its pods, or uploads from them, needs both.
E2E_S3 = os.environ.get("TAO_E2E_S3_ENDPOINT")
E2E_STAGER = os.environ.get("TAO_E2E_STAGER_IMAGE")
real_cluster_with_s3 = pytest.mark.skipif(
    not (E2E_KUBECONFIG and E2E_S3 and E2E_STAGER),
    reason="set TAO_E2E_KUBECONFIG, TAO_E2E_S3_ENDPOINT and TAO_E2E_STAGER_IMAGE to run the real-cluster jobs that "
           "stage and upload in their pods (README: Kubernetes, proved here and on a real cluster)")


@contextmanager
def e2e_bucket(job_id: str) -> Iterator[tuple[Any, str, dict[str, str]]]:
    """(an S3 client, a fresh bucket holding ``data/readme.txt``, the environment a submit
    forwards to the pods: the keys, the endpoint, the results bucket); the bucket is emptied and
    deleted afterwards."""
    keys = {"AWS_ACCESS_KEY_ID": os.environ.get("TAO_E2E_S3_KEY_ID", "tao-e2e-key"),
            "AWS_SECRET_ACCESS_KEY": os.environ.get("TAO_E2E_S3_SECRET", "tao-e2e-secret")}
    client = make_s3_client(S3Credentials(keys["AWS_ACCESS_KEY_ID"], keys["AWS_SECRET_ACCESS_KEY"],
                                          endpoint_url=E2E_S3))
    bucket = f"tao-e2e-{job_id}-{os.getpid()}"
    client.create_bucket(Bucket=bucket)
    client.put_object(Bucket=bucket, Key="data/readme.txt", Body=b"staged in the pod\n")
    try:
        yield client, bucket, {**keys, "AWS_ENDPOINT_URL": str(E2E_S3), "S3_BUCKET_NAME": bucket}
    finally:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for item in page.get("Contents", []):
                client.delete_object(Bucket=bucket, Key=item["Key"])
        client.delete_bucket(Bucket=bucket)


def e2e_staged_request(job_id: str, bucket: str, **shape: Any) -> JobRequest:
    """A GPU-free tier C job: its input staged from ``bucket`` inside the pod, its results uploaded."""
    return e2e_request(job_id, mounts=[], inputs=[{"source": f"s3://{bucket}/data/", "target": "/data"}],
                       forward_env=["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"],
                       args=["cat /data/readme.txt; echo trained > /results/out.txt"],
                       compute_shape={**E2E_SHAPE, **shape})


@real_cluster_with_s3
def test_e2e_a_tier_c_job_stages_in_its_pod_verifies_and_uploads_its_results(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Tier C on a real kubelet: the stager initContainer fetches the input into an emptyDir, the
    verify probe reads it and proves the results prefix writable, the command runs, and the
    results sidecar's final upload puts ``out.txt`` under the job's prefix."""
    said: list[str] = []
    with e2e_namespace(monkeypatch, "tier-c") as (_, namespace, _claim), e2e_bucket("c") as (client, bucket, env):
        backend = KubernetesBackend(KubernetesSettings(namespace=namespace, stager_image=str(E2E_STAGER)),
                                    verify_timeout=600, image_pull_timeout=900, pod_poll_seconds=2.0, say=said.append)
        store = store_in(tmp_path)
        done = verbs.submit(e2e_staged_request("e2e-tier-c", bucket), backend, store, staging_root=tmp_path / "work",
                            environ=env)
        assert done.tier == "C" and done.verdict.ok, (done.verdict.describe(), said)
        assert verbs.collect("e2e-tier-c", backend, store, poll_seconds=2.0, max_wait_seconds=600,
                             environ=env).state == "COMPLETE"
        listed = client.list_objects_v2(Bucket=bucket).get("Contents", [])
        assert any(item["Key"].endswith("/out.txt") for item in listed), [item["Key"] for item in listed]


@real_cluster_with_s3
def test_e2e_a_two_node_job_runs_one_rank_per_node_each_verified(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Multi-node on a real cluster: an Indexed Job of two pods, one per node (the required
    anti-affinity), each staging and verifying its own copy before rank 0 uploads."""
    said: list[str] = []
    with e2e_namespace(monkeypatch, "multi") as (cluster, namespace, _claim), e2e_bucket("m") as (_, bucket, env):
        backend = KubernetesBackend(KubernetesSettings(namespace=namespace, stager_image=str(E2E_STAGER)),
                                    verify_timeout=600, image_pull_timeout=900, pod_poll_seconds=2.0, say=said.append)
        store = store_in(tmp_path)
        done = verbs.submit(e2e_staged_request("e2e-multi", bucket, nodes=2), backend, store,
                            staging_root=tmp_path / "work", environ=env)
        try:
            assert done.verdict.ok, (done.verdict.describe(), said)
            pods = cluster.core.list_namespaced_pod(namespace, label_selector=f"{JOB_ID_LABEL}=e2e-multi").items
            assert len({pod.spec.node_name for pod in pods if pod.spec.node_name}) == 2, pods
        finally:
            verbs.cancel("e2e-multi", backend, store)
