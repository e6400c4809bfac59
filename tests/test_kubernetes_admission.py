"""The admission gate, against the API stand-in's admission (Pod Security, ResourceQuota,
LimitRanger, policies and webhooks): a pod of each Job is dry-run as the Job controller would
make it, and what admission would refuse or set is said before anything is created."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tao_data_io.backends.kubernetes.render import STEP_LABEL

from . import kube_cluster
from .kube_cluster import NAMESPACE, claim, gate_case, job_request, make_backend, submit
from .kube.apiserver import KubeStandIn

#: The stand-in cluster and the input bucket (pytest fixtures of tests/kube_cluster.py).
kube, input_bucket = kube_cluster.kube, kube_cluster.input_bucket


def test_a_namespace_enforcing_restricted_refuses_the_image_user_before_anything_is_created(
        kube: KubeStandIn, tmp_path: Path) -> None:
    """Pod Security admission judges pods, not Jobs: the Job's dry run passes, and created, its
    controller would loop on FailedCreate while verify waited 600 s. The gate dry-runs a Pod of the
    Job and names the level, the checks and the fix; a target running training as a non-root user
    passes, and so does the image's user where the level is baseline."""
    kube.server.pod_security = "restricted"
    message = gate_case(kube, tmp_path, job_request(), make_backend(),
                        "namespace 'tao' enforces the 'restricted' Pod Security level (latest)")
    assert 'allowPrivilegeEscalation != false (containers "verify", "train"' in message
    assert "training_security: restricted" in message
    done = submit(tmp_path / "strict", job_request(), make_backend(training_security="restricted",
                                                                    training_user=1000))
    assert done.verdict.ok
    kube.server.pod_security = "baseline"
    assert submit(tmp_path / "baseline", job_request(job_id="job-2"), make_backend()).verdict.ok


def test_a_namespace_quota_on_requests_refuses_only_what_the_request_leaves_unset(
        kube: KubeStandIn, tmp_path: Path) -> None:
    """A ResourceQuota on requests.cpu and requests.memory refuses a pod any of whose containers
    requests neither: ours always request both, the training container memory always; its cpu is
    the request's to give — left out, the admission gate names what is missing before anything
    is created."""
    kube.server.quota = {"requests.cpu", "requests.memory"}
    message = gate_case(kube, tmp_path, job_request(), make_backend(), "admission refuses the pods of Job job-1")
    assert "must specify requests.cpu" in message and "requests.memory" not in message
    assert "RoleBinding" not in message  # quota's refusal is not RBAC's: no advice to ask for a Role
    shaped = job_request(compute_shape={"gpus": 1, "cpu": "8"})
    assert submit(tmp_path / "shaped", shaped, make_backend()).verdict.ok


@pytest.mark.parametrize("storage", [{}, {"storage": {"pvc_claim": "tao-data", "tier": "B"}}], ids=["C", "B"])
def test_a_namespace_quota_on_limits_refuses_only_what_the_request_leaves_unset(
        kube: KubeStandIn, tmp_path: Path, storage: dict[str, Any]) -> None:
    """A ResourceQuota on limits.cpu and limits.memory refuses a pod any of whose containers, init
    containers included, sets no such limit (enforcePodContainerConstraints looks limits.* up in
    limits): ours — stager, results and status sidecars, verify, the stage Job's — set both, so
    the admission gate names only the training container's, which compute_shape.cpu and memory
    set; a shaped request then submits."""
    kube.server.store(claim())
    kube.server.quota = {"limits.cpu", "limits.memory"}
    message = gate_case(kube, tmp_path, job_request(**storage), make_backend(),
                        "admission refuses the pods of Job job-1: ")
    assert message.endswith("must specify limits.cpu for: train; limits.memory for: train"), message
    shaped = job_request(compute_shape={"gpus": 1, "cpu": "8", "memory": "64Gi"}, **storage)
    assert submit(tmp_path / "shaped", shaped, make_backend()).verdict.ok


@pytest.mark.parametrize("quota", [{"requests.cpu", "requests.memory"}, {"limits.cpu", "limits.memory"}],
                         ids=["requests", "limits"])
def test_the_collective_probe_is_never_why_a_quota_refuses_a_multi_node_job(kube: KubeStandIn, tmp_path: Path,
                                                                             quota: set[str]) -> None:
    """A multi-node GPU job's collective probe pods are dry-run by the admission gate first: a
    probe that set only its GPU would be refused by any quota on cpu or memory, whatever the
    request gives (and be BestEffort, evicted first). It sets both, so a request that sets
    what the quota needs submits."""
    kube.server.quota = quota
    shaped = job_request(compute_shape={"gpus": 1, "nodes": 2, "cpu": "8", "memory": "64Gi"})
    done = submit(tmp_path, shaped, make_backend())
    assert done.verdict.ok, done.verdict.describe()
    created = [r.data for r in kube.server if r.method.value == "POST" and "dryRun" not in r.url.path_qs]
    assert any(o.get("kind") == "Job" and o["metadata"]["labels"][STEP_LABEL] == "probe" for o in created)


def limit_range(**item: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "defaults", "namespace": NAMESPACE},
            "spec": {"limits": [{"type": "Container", **item}]}}


def test_what_a_limit_range_would_set_in_the_pods_is_said_before_anything_is_created(kube: KubeStandIn,
                                                                                      tmp_path: Path) -> None:
    """A LimitRange's defaults are set by admission in every container that leaves a resource
    unset (the stand-in's LimitRanger): a default cpu limit throttles training without a word.
    The admission gate's dry run answers the pod as admission made it, and the backend says,
    before anything is created, what the LimitRange set and how the request chooses instead."""
    kube.server.store(limit_range(default={"cpu": "1"}, defaultRequest={"cpu": "500m"}))
    said: list[str] = []
    assert submit(tmp_path, job_request(), make_backend(said)).verdict.ok
    (line,) = [line for line in said if "LimitRange" in line]
    assert 'container "train": limits.cpu=1, requests.cpu=500m' in line and "compute_shape.cpu" in line, line
    assert "stager" not in line  # ours request what they need; the request cannot change them
    chosen: list[str] = []
    shaped = job_request(job_id="job-2", compute_shape={"gpus": 1, "cpu": "8"})
    assert submit(tmp_path / "shaped", shaped, make_backend(chosen)).verdict.ok
    assert not any('container "train"' in line for line in chosen if "LimitRange" in line)


def test_a_policy_against_bare_pods_judges_the_pod_the_job_controller_would_make(kube: KubeStandIn,
                                                                                 tmp_path: Path) -> None:
    """Issue 39, finding 8: the admission gate dry-runs a pod of each Job, and policies judge a
    pod by what the Job controller's pods carry — Kyverno's "prevent bare pods" refuses a pod with
    no controller ownerReference. The gate's pod is the controller's: owned by its Job
    (``controller: true``; no ``blockOwnerDeletion``, which would ask for update on jobs/finalizers
    under OwnerReferencesPermissionEnforcement) and labelled as pkg/controller/job labels its pods."""
    kube.server.bare_pods_refused = True
    assert submit(tmp_path, job_request(), make_backend()).verdict.ok
    dry = [r for r in kube.requests() if r.startswith("POST /api/v1/namespaces/tao/pods") and "dryRun" in r]
    assert dry, kube.requests()


def test_a_webhook_that_refuses_the_pods_is_named_with_what_the_gate_sent(kube: KubeStandIn, tmp_path: Path) -> None:
    """A refusal that is a webhook's may depend on who asks: the gate's pod is sent by this
    identity, the Job's by the Job controller's — the refusal says so, so a policy exempting the
    controller is recognised."""
    kube.server.admission_webhook = "require-team-label: pods must carry the label team"
    message = gate_case(kube, tmp_path, job_request(), make_backend(), "admission refuses the pods of Job job-1")
    assert 'admission webhook "validate.kyverno.svc-fail" denied the request' in message
    assert "sent by this identity, not by the Job controller" in message


def test_what_a_limit_range_would_set_in_tao_data_ios_own_containers_is_said_too(kube: KubeStandIn,
                                                                                  tmp_path: Path) -> None:
    """Issue 39, finding 17: our containers set cpu and memory, not ephemeral-storage, so a
    LimitRange's default ephemeral-storage limit lands on the stager, the results sidecar and the
    rest (the LimitRanger defaults init containers too: plugin/pkg/admission/limitranger,
    ``mergePodResourceRequirements``), and the kubelet evicts a pod past the sum of its
    containers' limits (pkg/kubelet/eviction/eviction_manager.go, podEphemeralStorageLimitEviction):
    a final upload or a stage can end in an eviction nobody was told of. The admission gate says so
    before anything is created, naming our containers apart from the request's."""
    kube.server.store(limit_range(default={"ephemeral-storage": "2Gi"}))
    said: list[str] = []
    within = job_request(outputs={"results_limit": "1Gi"})  # training's disk (inputs, results) under the default
    assert submit(tmp_path, within, make_backend(said)).verdict.ok
    (line,) = [line for line in said if "tao-data-io's own containers" in line]
    assert 'container "stager": limits.ephemeral-storage=2Gi' in line, line
    assert 'container "results": limits.ephemeral-storage=2Gi' in line, line
    assert 'container "train"' not in line and "evicts the pod" in line, line


def test_a_limit_range_default_below_what_training_requests_is_refused_before_anything_is_created(
        kube: KubeStandIn, tmp_path: Path) -> None:
    """A default memory limit under the training container's memory request (at least its
    /dev/shm) makes the pod invalid after admission defaulted it (a request above its limit):
    the Job would loop on FailedCreate; the admission gate refuses with the server's reason."""
    kube.server.store(limit_range(default={"memory": "8Gi"}))
    message = gate_case(kube, tmp_path, job_request(), make_backend(), "admission refuses the pods of Job job-1")
    assert "must be less than or equal to memory limit of 8Gi" in message


def test_a_limit_range_maximum_below_tier_cs_staging_disk_is_refused_before_anything_is_created(
        kube: KubeStandIn, tmp_path: Path) -> None:
    """A LimitRange's max is also its default limit (SetDefaults_LimitRangeItem): the training
    container's ephemeral-storage request, which holds tier C's inputs, is then above its limit,
    and the pod is refused — before anything exists, by the admission gate."""
    kube.server.store(limit_range(max={"ephemeral-storage": "1Mi"}))
    message = gate_case(kube, tmp_path, job_request(), make_backend(), "admission refuses the pods of Job job-1")
    assert "ephemeral-storage limit of 1Mi" in message


def test_gate_a_dry_run_refusal_names_the_object_and_the_servers_reason(kube: KubeStandIn, tmp_path: Path) -> None:
    kube.server.admission["jobs"] = ('admission webhook "policy.example.com" denied the request: images must come '
                                     "from registry.example.com")
    gate_case(kube, tmp_path, job_request(), make_backend(),
              'a dry run of creating Job tao/job-1: the API server answered 422 Invalid: admission webhook '
              '"policy.example.com" denied the request: images must come from registry.example.com')
