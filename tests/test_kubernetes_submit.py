"""A submit through the pipeline against the Kubernetes API stand-in (:mod:`tests.kube`, reached
through a kubeconfig as a user's would be): what a tier C, tier B and multi-node submit creates,
in which order, and what it asks the API server."""

from __future__ import annotations

from pathlib import Path

import pytest

from tao_data_io.errors import BackendError, UsageError
from tao_data_io.backends.kubernetes.backend import KubernetesBackend
from tao_data_io.backends.kubernetes.render import STAGING_MARGIN
from tao_data_io.backends import backend_for
from tao_data_io.launch.backend import Backend
from tao_data_io.backends.kubernetes.names import object_names
from tao_data_io.quantities import quantity_bytes

from . import kube_cluster
from .kube_cluster import (INPUT_OBJECTS, NAMESPACE, SECRETS, claim, creates, every_object_of_ours, job_request,
                           launch_only, make_backend, ours, store_in, submit, validate)
from .kube_helpers import STAGER
from .kube.apiserver import KubeStandIn

#: The stand-in cluster and the input bucket (pytest fixtures of tests/kube_cluster.py).
kube, input_bucket = kube_cluster.kube, kube_cluster.input_bucket


def test_a_single_node_submit_creates_secret_configmap_job_owned_by_the_job(kube: KubeStandIn, tmp_path: Path) -> None:
    said: list[str] = []
    backend = make_backend(said)
    assert isinstance(backend, Backend) and isinstance(backend_for("kubernetes", {"stager_image": STAGER}),
                                                      KubernetesBackend)
    done = submit(tmp_path, job_request(), backend)

    assert (done.backend_ref, done.tier, done.started, done.verdict.ok) == ("tao/job-1", "C", True, True)
    record = store_in(tmp_path).get("job-1")
    assert record.state == "RUNNING" and record.backend_ref == "tao/job-1"
    assert record.verify is not None and record.verify["ok"] is True
    assert [c["path"] for c in record.verify["checks"]] == ["/data", "/results", "/results"]  # type: ignore[index]
    job = ours(kube, "Job")["job-1"]
    secret, configmap = ours(kube, "Secret")["job-1-credentials"], ours(kube, "ConfigMap")["job-1-files"]
    assert secret["stringData"] == SECRETS and secret["type"] == "Opaque"  # the values reach the API server only
    for dependent in (secret, configmap):
        assert dependent["metadata"]["ownerReferences"] == [
            {"apiVersion": "batch/v1", "kind": "Job", "name": "job-1", "uid": job["metadata"]["uid"]}]
    assert sorted(ours(kube, "Service")) == []  # one node: no rendezvous Service
    validate(every_object_of_ours(kube))
    assert any("verify probe" in line for line in said) and any("pulling" in line for line in said)


def test_the_api_requests_of_a_single_node_submit(kube: KubeStandIn, tmp_path: Path) -> None:
    """The figure for docs/kubernetes.md: what a tier C single-node submit asks the API server, step by
    step (the verify polls depend on how fast the pod gets there: here four looks)."""
    submit(tmp_path, job_request(), make_backend())
    sent = kube.requests()
    facts, gates, dry_runs = sent[:4], sent[4:18], sent[18:22]
    applied, verify = sent[22:27], sent[27:]
    assert facts == ["GET /version/", "GET /api/v1/nodes", "GET /api/v1/namespaces/tao/persistentvolumeclaims",
                     "GET /apis/storage.k8s.io/v1/storageclasses"]
    assert gates[:1] == ["GET /api/v1/nodes"]  # the version is read once per connection
    assert gates[1:] == ["POST /apis/authorization.k8s.io/v1/selfsubjectaccessreviews"] * 13
    assert [r.split("?")[0] for r in dry_runs] == ["POST /api/v1/namespaces/tao/secrets",
                                                   "POST /api/v1/namespaces/tao/configmaps",
                                                   "POST /apis/batch/v1/namespaces/tao/jobs",
                                                   "POST /api/v1/namespaces/tao/pods"]  # admission's, of a pod
    assert applied == ["POST /api/v1/namespaces/tao/secrets", "POST /api/v1/namespaces/tao/configmaps",
                       "POST /apis/batch/v1/namespaces/tao/jobs",
                       "PATCH /api/v1/namespaces/tao/secrets/job-1-credentials",
                       "PATCH /api/v1/namespaces/tao/configmaps/job-1-files"]
    assert verify[0] == "GET /api/v1/namespaces/tao/configmaps/job-1-files"
    looks = verify[1:]
    assert len(looks) == 2 * 4 and all(r.startswith(("GET /apis/batch/v1/namespaces/tao/jobs/job-1",
                                                     "GET /api/v1/namespaces/tao/pods?")) for r in looks)
    assert len(sent) == 4 + 14 + 4 + 5 + 1 + 8


def test_tier_b_runs_the_stage_job_to_completion_before_the_training_job(kube: KubeStandIn, tmp_path: Path) -> None:
    kube.server.store(claim())
    done = submit(tmp_path, job_request(storage={"pvc_claim": "tao-data"}), make_backend(shards=2))
    assert done.tier == "B" and done.verdict.ok
    made = creates(kube)
    assert [r.split("?")[0] for r in made[:4]] == [
        "POST /api/v1/namespaces/tao/secrets", "POST /api/v1/namespaces/tao/configmaps",
        "POST /apis/batch/v1/namespaces/tao/jobs", "POST /apis/batch/v1/namespaces/tao/jobs"]
    sent = kube.requests()
    stage, train = [i for i, r in enumerate(sent) if r == "POST /apis/batch/v1/namespaces/tao/jobs"]
    (name,) = [n for n, o in ours(kube, "Job").items() if o["metadata"]["labels"]["tao-data-io/step"] == "stage"]
    assert f"GET /apis/batch/v1/namespaces/tao/jobs/{name}" in sent[stage:train]  # waited on before training
    stage = ours(kube, "Job")[name]
    assert stage["status"]["conditions"][-1]["type"] == "Complete" and stage["spec"]["completions"] == 2
    validate(every_object_of_ours(kube))


def test_a_failed_stage_job_is_deleted_and_nothing_trains(kube: KubeStandIn, tmp_path: Path) -> None:
    kube.server.store(claim())
    stage = object_names("job-1").stage
    kube.server.control.scripts[stage] = ["pulling", "failed"]
    with pytest.raises(BackendError, match=rf"the stage Job tao/{stage} failed: container stage exited 2") as info:
        submit(tmp_path, job_request(storage={"pvc_claim": "tao-data"}), make_backend())
    assert not info.value.retryable
    assert ours(kube, "Job") == {}
    # Nothing of the job is left behind: above all not the per-job Secret with the credential
    # values, which no Job owns yet (a later submit makes them again).
    assert every_object_of_ours(kube) == []
    record = store_in(tmp_path).get("job-1")  # why, and (a launch began) PENDING: a later submit stages again
    assert record.state == "PENDING" and record.backend_ref is None
    assert "container stage exited 2" in (record.message or "")


def test_tier_c_sizes_its_staging_volume_from_the_inputs_listing(kube: KubeStandIn, tmp_path: Path) -> None:
    """Tier C's inputs land in the pod's emptyDir: bounded from the bucket's listing before submit,
    that bound is the volume's sizeLimit and part of the training container's ephemeral-storage
    request — an app container's request holds for the pod's life, so the scheduler reserves the
    disk on the node it picks (core/v1 ResourceRequirements; the kubelet evicts a pod whose
    emptyDir outgrows its sizeLimit)."""
    assert submit(tmp_path, job_request(), make_backend()).tier == "C"
    pod = ours(kube, "Job")["job-1"]["spec"]["template"]["spec"]
    staging = next(v for v in pod["volumes"] if v["name"] == "staging")["emptyDir"]["sizeLimit"]
    # At least the bytes (and their blocks), and the margin; compared as sizes, not as text.
    assert quantity_bytes(staging) >= sum(INPUT_OBJECTS.values()) + STAGING_MARGIN
    results = next(v for v in pod["volumes"] if v["name"] == "results")["emptyDir"]["sizeLimit"]
    assert results == "20Gi"  # outputs.results_limit bounds the results volume on the node's disk too
    disk = quantity_bytes(pod["containers"][0]["resources"]["requests"]["ephemeral-storage"])
    assert disk == quantity_bytes(staging) + quantity_bytes(results)
    stager = next(c for c in pod["initContainers"] if c["name"] == "stager")
    assert "ephemeral-storage" not in stager["resources"]["requests"]
    validate(every_object_of_ours(kube))


def test_multi_node_creates_the_headless_service_and_waits_for_every_rank(kube: KubeStandIn, tmp_path: Path) -> None:
    done = submit(tmp_path, job_request(compute_shape={"gpus": 8, "nodes": 2}), make_backend())
    assert done.verdict.ok
    (service,) = ours(kube, "Service").values()
    assert service["metadata"]["ownerReferences"][0]["name"] == "job-1"
    pods = kube.server.alive("Pod", NAMESPACE)
    assert len(pods) == 2 and all(p["status"]["initContainerStatuses"][-1]["state"].get("terminated")
                                  for p in pods.values())
    validate(every_object_of_ours(kube))
    backend = make_backend()
    assert backend.logs(done.backend_ref) == ""  # verified, but the command has not started yet
    status = backend.status(done.backend_ref)
    assert (status.state, status.message) == ("RUNNING", "rank 0: train is running; rank 1: train is running")
    logs = backend.logs(done.backend_ref, tail=2)
    assert logs.splitlines() == ["[rank 0] train line 2", "[rank 0] train line 3", "[rank 1] train line 2",
                                 "[rank 1] train line 3"]


def test_preflight_and_submit_need_the_documents(kube: KubeStandIn, tmp_path: Path) -> None:
    _, plan = launch_only(tmp_path, job_request(), make_backend())
    with pytest.raises(UsageError, match="preflight and submit need documents"):
        make_backend().preflight(plan)
