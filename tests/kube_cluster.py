"""The stand-in cluster the Kubernetes backend's tests run on, as a user's would be reached (a
kubeconfig context, two 8-GPU nodes, a StorageClass, an S3 input over HTTP), and what those tests
share: the request they start from, the backend built on the cluster, and readers of what a
submit made. A module of its own, so test modules share it without importing each other."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tao_data_io import verbs
from tao_data_io.backends.kubernetes.backend import DEFAULT_IMAGE_PULL_TIMEOUT_S, KubernetesBackend
from tao_data_io.backends.kubernetes.render import CACHE_LABEL
from tao_data_io.backends.kubernetes.settings import KubernetesSettings
from tao_data_io.credentials import S3Credentials
from tao_data_io.errors import UsageError
from tao_data_io.launch.backend import DEFAULT_VERIFY_TIMEOUT_S, Submission
from tao_data_io.launch.plan import LaunchPlan
from tao_data_io.records import RecordStore
from tao_data_io.request import JobRequest
from tao_data_io.transfer.client import make_s3_client

from .contract.harness import launch_through_steps
from .helpers import req
from .kube.apiserver import KubeStandIn
from .kube.objects import RESOURCES
from .kube_helpers import STAGER

NAMESPACE = "tao"
SECRETS = {"AWS_ACCESS_KEY_ID": "AKIAEXAMPLEKEY12345", "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI-k8s-very-secret"}
ENV = {**SECRETS, "S3_BUCKET_NAME": "tao-results"}
MANAGED = "app.kubernetes.io/managed-by"


#: The job the backend's tests start from: tier C (an S3 input, results uploaded to S3), the S3
#: keys forwarded, one GPU.
TIER_C_JOB: dict[str, Any] = {"schema_version": "1", "job_id": "job-1", "image": "nvcr.io/nvidia/tao/tao-toolkit:6.0.0",
                              "mode": "args", "command": ["dino", "train"], "args": ["--epochs", "1"],
                              "inputs": [{"source": "s3://bkt-1/data/", "target": "/data"}],
                              "forward_env": list(SECRETS), "compute_shape": {"gpus": 1}}


def job_request(**fields: Any) -> JobRequest:
    """Tier C by default (:data:`TIER_C_JOB`), ``fields`` over it."""
    return req(TIER_C_JOB, **fields)


#: What the jobs' S3 input holds (moto's S3 server over HTTP, which takes any key): tier C sizes
#: it before submit (tao_data_io.staging.sizing).
INPUT_OBJECTS = {"data/train/0001.jpg": 3000, "data/train/0002.jpg": 5000, "data/labels.json": 192}


@pytest.fixture(scope="module")
def input_bucket(moto_credentials: S3Credentials) -> str:
    client = make_s3_client(S3Credentials(SECRETS["AWS_ACCESS_KEY_ID"], SECRETS["AWS_SECRET_ACCESS_KEY"],
                                          endpoint_url=moto_credentials.endpoint_url))
    client.create_bucket(Bucket="bkt-1")
    for key, size in INPUT_OBJECTS.items():
        client.put_object(Bucket="bkt-1", Key=key, Body=b"x" * size)
    assert moto_credentials.endpoint_url is not None
    return moto_credentials.endpoint_url


@contextmanager
def seeded_cluster(where: Path, monkeypatch: pytest.MonkeyPatch, s3_endpoint: str) -> Iterator[KubeStandIn]:
    """The stand-in with two 8-GPU nodes and a StorageClass, and a kubeconfig context for it
    (namespace ``tao``) in $KUBECONFIG, as a user would have it; the jobs' environment reaches
    the S3 server holding their input."""
    monkeypatch.setitem(ENV, "AWS_ENDPOINT_URL", s3_endpoint)
    with KubeStandIn() as stand_in:
        write_kubeconfig(where / "kubeconfig", stand_in.url)
        monkeypatch.setenv("KUBECONFIG", str(where / "kubeconfig"))
        monkeypatch.setenv("TAO_K8S_CONTEXT", "stand-in")
        monkeypatch.delenv("TAO_K8S_NAMESPACE", raising=False)
        for index in range(2):
            stand_in.server.store({"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"gpu-{index}"},
                                   "status": {"allocatable": {"nvidia.com/gpu": "8", "cpu": "64"}}})
        stand_in.server.store({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                               "metadata": {"name": "standard"}, "provisioner": "rancher.io/local-path",
                               "volumeBindingMode": "WaitForFirstConsumer"})
        yield stand_in


@pytest.fixture
def kube(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, input_bucket: str) -> Iterator[KubeStandIn]:
    with seeded_cluster(tmp_path, monkeypatch, input_bucket) as stand_in:
        yield stand_in


def write_kubeconfig(path: Path, url: str) -> None:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "stand-in",
        "clusters": [{"name": "stand-in", "cluster": {"server": url}}],
        "users": [{"name": "tester", "user": {"token": "kubeconfig-bearer-t0ken"}}],
        "contexts": [{"name": "stand-in", "context": {"cluster": "stand-in", "user": "tester",
                                                       "namespace": NAMESPACE}}]}))


#: A request's fields for tier A (pre-positioned on the claim) and tier B (staged onto it).
TIER_A = {"inputs": [], "mounts": [{"source": "/datasets/coco", "target": "/data"}]}
TIER_B = {"storage": {"pvc_claim": "tao-data"}}


def claim(name: str = "tao-data", phase: str = "Bound", modes: tuple[str, ...] = ("ReadWriteMany",),
          storage_class: str = "standard") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"accessModes": list(modes), "storageClassName": storage_class,
                     "resources": {"requests": {"storage": "100Gi"}}},
            "status": {"phase": phase, **({"accessModes": list(modes), "capacity": {"storage": "100Gi"}}
                                          if phase == "Bound" else {})}}


def make_backend(said: list[str] | None = None, *, verify_timeout: float = DEFAULT_VERIFY_TIMEOUT_S,
                 image_pull_timeout: float = DEFAULT_IMAGE_PULL_TIMEOUT_S, **settings: Any) -> KubernetesBackend:
    return KubernetesBackend(KubernetesSettings(**{"stager_image": STAGER, **settings}), verify_timeout=verify_timeout,
                             image_pull_timeout=image_pull_timeout, pod_poll_seconds=0.001,
                             say=(said if said is not None else []).append)


def store_in(tmp_path: Path) -> RecordStore:
    return RecordStore(tmp_path / "records")


def submit(tmp_path: Path, request: JobRequest, backend: KubernetesBackend,
           environ: dict[str, str] | None = None) -> verbs.Submitted:
    return verbs.submit(request, backend, store_in(tmp_path), staging_root=tmp_path / "work",
                           environ=ENV if environ is None else environ)


def launch_only(tmp_path: Path, request: JobRequest, backend: KubernetesBackend,
                environ: dict[str, str] | None = None) -> tuple[Submission, LaunchPlan]:
    """The pipeline's steps up to preflight and submit, without waiting for the verdict, so a test
    can look at the job at any step of its pods' script."""
    submission, plan, _ = launch_through_steps(request, backend, store_in(tmp_path), tmp_path / "work",
                                               ENV if environ is None else environ)
    return submission, plan


def ours(kube: KubeStandIn, kind: str) -> dict[str, dict[str, Any]]:
    return {name: obj for name, obj in kube.server.alive(kind, NAMESPACE).items()
            if obj["metadata"].get("labels", {}).get(MANAGED) == "tao-data-io"}


def every_object_of_ours(kube: KubeStandIn) -> list[dict[str, Any]]:
    """Every object of a job (the collective probe's remembered passes are the namespace's, kept)."""
    return [obj for kind in ("Secret", "ConfigMap", "Service", "Job") for obj in ours(kube, kind).values()
            if CACHE_LABEL not in obj["metadata"].get("labels", {})]


def validate(objects: list[dict[str, Any]]) -> None:
    """What the backend created, as the API server holds it after the ownerReferences patches."""
    assert objects
    for obj in objects:
        for version in ("1.29", "1.32"):
            kubernetes_validate.validate(json.loads(json.dumps(obj)), version, strict=True)


def creates(kube: KubeStandIn) -> list[str]:
    return [r for r in kube.requests() if r.startswith(("POST", "PATCH", "DELETE", "PUT")) and "dryRun" not in r
            and "selfsubjectaccessreviews" not in r]


def kube_key(kind: str, name: str) -> tuple[Any, str, str]:
    """Where the stand-in keeps an object of ours: its resource, our namespace, its name."""
    return RESOURCES[kind], NAMESPACE, name


def gate_case(kube: KubeStandIn, tmp_path: Path, request: JobRequest, backend: KubernetesBackend,
              fragment: str) -> str:
    with pytest.raises(UsageError) as info:
        submit(tmp_path, request, backend)
    message = str(info.value)
    assert fragment in message and "\n" not in message and "--" not in message, message
    assert creates(kube) == []
    return message
