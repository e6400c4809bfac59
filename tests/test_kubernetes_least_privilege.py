"""Least privilege: the shipped Role (deployments/kubernetes-rbac.yaml) grants exactly the calls
the backend makes, against the API stand-in, which authorizes every request by it; the access
gate asks for every grant before anything is made and names what is missing."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tao_data_io import verbs
from tao_data_io.errors import BackendError
from tao_data_io.launch.backend import JobDocuments
from tao_data_io.backends.kubernetes.names import object_names

from . import kube_cluster
from .kube_cluster import (ENV, NAMESPACE, TIER_A, claim, gate_case, job_request, launch_only, make_backend, store_in,
                           submit)
from .kube.kueue import Kueue
from .kube.apiserver import KubeStandIn

#: The stand-in cluster and the input bucket (pytest fixtures of tests/kube_cluster.py).
kube, input_bucket = kube_cluster.kube, kube_cluster.input_bucket


#: Requests every authenticated identity may make (the API server's discovery and self-review).
_ALWAYS_ALLOWED = ("/version", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews")


def _access(request: str) -> tuple[str, str, str] | None:
    """(verb, API group, resource) RBAC checks for ``METHOD path?query``, as the API server's
    request-info resolver derives them (k8s.io/apiserver pkg/endpoints/request/requestinfo.go): a
    GET of a collection is ``list`` (``watch`` with ?watch), of a name ``get``; a subresource is
    ``resource/sub``. None for what needs no grant."""
    method, _, url = request.partition(" ")
    path, _, query = url.partition("?")
    if path.rstrip("/").startswith(_ALWAYS_ALLOWED):
        return None
    parts = path.strip("/").split("/")
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    if rest[:1] == ["namespaces"] and len(rest) > 2:
        rest = rest[2:]
    resource, named = rest[0], len(rest) > 1
    if len(rest) > 2:
        resource += "/" + rest[2]
    verb = {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}.get(method)
    if verb is None:
        verb = "get" if named else ("watch" if "watch=true" in query else "list")
    return verb, group, resource


def _granted() -> set[tuple[str, str, str]]:
    rbac = Path(__file__).resolve().parents[1] / "deployments" / "kubernetes-rbac.yaml"
    documents = yaml.safe_load_all(rbac.read_text())
    return {(verb, group, resource) for doc in documents if doc["kind"] in ("Role", "ClusterRole")
            for rule in doc["rules"] for group in rule["apiGroups"] for resource in rule["resources"]
            for verb in rule["verbs"]}


def test_gate_access_lists_every_refusal_in_one_line(kube: KubeStandIn, tmp_path: Path) -> None:
    kube.server.rbac.revoke("create", "batch", "jobs")
    kube.server.rbac.revoke("patch", "", "secrets")
    gate_case(kube, tmp_path, job_request(), make_backend(),
              "kubeconfig context 'stand-in' may not create jobs.batch, patch secrets in namespace 'tao': ask the "
              "cluster's admin for a Role granting them and a RoleBinding to this identity")


def test_status_of_a_pod_waiting_for_a_node_reads_its_events_under_the_shipped_role(kube: KubeStandIn,
                                                                                     tmp_path: Path) -> None:
    """Issue 39, finding 1: status reads the events of a pod that waits for a node or an image
    (the scheduler's FailedScheduling), and every job passes through that state. Under the
    shipped Role (the stand-in authorizes every request by it, as the RBAC authorizer of
    plugin/pkg/auth/authorizer/rbac/rbac.go does) that ``list events`` must be granted."""
    backend = make_backend()
    kube.server.control.scripts["job-1"] = ["unschedulable"]
    submission, _ = launch_only(tmp_path, job_request(), backend)
    found = backend.status(submission.backend_ref)
    assert found.state == "PENDING" and "Insufficient nvidia.com/gpu" in found.message, found


def test_the_access_gate_asks_for_the_events_that_status_reads(kube: KubeStandIn, tmp_path: Path) -> None:
    """A Role without ``list events`` would let a job start and then fail every status while a
    pod waits: the gate asks for it before anything is made, as for the rest of what status does."""
    kube.server.rbac.revoke("list", "", "events")
    gate_case(kube, tmp_path, job_request(), make_backend(), "may not list events in namespace 'tao'")


def test_a_claim_that_waits_for_its_first_consumer_is_read_with_get_on_its_storage_class(kube: KubeStandIn,
                                                                                       tmp_path: Path) -> None:
    """Issue 39, finding 2: the claim gate reads the Pending claim's StorageClass by name (a
    ``get``, requestinfo.go); the shipped ClusterRole must grant exactly that, and where an admin
    did not, the gate says which grant it needs instead of failing as the backend's own fault."""
    kube.server.store(claim(phase="Pending", storage_class="standard"))
    kube.server.rbac.revoke("get", "storage.k8s.io", "storageclasses")
    gate_case(kube, tmp_path, job_request(**TIER_A), make_backend(pvc_claim="tao-data"),
              "pvc_claim 'tao-data' is Pending and its StorageClass 'standard' cannot be read (this identity may not "
              "get storageclasses.storage.k8s.io)")


def test_the_role_grants_exactly_the_calls_the_backend_makes(kube: KubeStandIn, tmp_path: Path) -> None:
    """Every path of the backend once — a tier C submit that is followed, read and canceled; a
    multi-node tier B submit whose stage Job runs first; a later attempt that replaces an ended
    one; a queued one Kueue holds — and the RBAC file must grant each call it made, and nothing it never makes (a Role
    that lists Secrets can read every credential of the namespace)."""
    kube.server.control.scripts["job-1"] = ["pulling", "staging", "verifying", "verified", "running", "oomkilled"]
    backend = make_backend()
    done = submit(tmp_path, job_request(), backend)
    backend.follow_logs(done.backend_ref, None), backend.training_status(done.backend_ref)
    backend.logs(done.backend_ref, tail=10), backend.failure_analysis(done.backend_ref)
    assert verbs.collect("job-1", backend, store_in(tmp_path), poll_seconds=0.01).state == "ERROR"
    submit(tmp_path, job_request(), make_backend())  # attempt 2 replaces attempt 1's objects
    backend.cancel(done.backend_ref)
    kube.server.control.scripts["job-4"] = ["unschedulable"]  # status reads the events of a pod waiting for a node
    waiting, _ = launch_only(tmp_path / "four", job_request(job_id="job-4"), make_backend())
    assert backend.status(waiting.backend_ref).state == "PENDING"
    kube.server.store(claim(name="tao-late", phase="Pending"))  # the gate reads its class: WaitForFirstConsumer
    launch_only(tmp_path / "five", job_request(job_id="job-5", **TIER_A), make_backend(pvc_claim="tao-late"))
    kueue = Kueue(cluster_queues={"gpus": ("cpu", "memory", "nvidia.com/gpu", "ephemeral-storage")}, room=False)
    kube.run(lambda: (kueue.install(kube.server), kueue.local_queue(kube.server, NAMESPACE, "gpu-queue", "gpus")))
    queued, _ = launch_only(tmp_path / "six", job_request(job_id="job-6"),  # reads its LocalQueue, then its Workload
                            make_backend(capacity="queued", queue_name="gpu-queue", pending_timeout=60))
    assert backend.status(queued.backend_ref).state == "PENDING"
    kube.server.store(claim())
    multi = job_request(job_id="job-2", storage={"pvc_claim": "tao-data", "tier": "B"},
                        compute_shape={"gpus": 1, "nodes": 2})
    kube.server.control.scripts["job-2"] = ["pulling", "staging", "verifying", "verified", "running"]
    _, plan = launch_only(tmp_path / "two", multi, make_backend())
    documents = JobDocuments(multi, store_in(tmp_path / "two").get("job-2"))
    make_backend().submit(plan, environ=ENV, documents=documents)  # a retried launch: each create reads back
    kube.server.control.scripts[object_names("job-3").stage] = ["pulling", "failed"]
    with pytest.raises(BackendError):  # the stage fails: what submit made is swept, the Secret by its name
        submit(tmp_path / "three", job_request(job_id="job-3", storage={"pvc_claim": "tao-data"},
                                               compute_shape={"gpus": 1, "nodes": 2}), make_backend())
    made = {access for access in map(_access, kube.requests()) if access is not None}
    assert made == _granted(), (f"granted, never used: {sorted(_granted() - made)}; "
                                f"used, not granted: {sorted(made - _granted())}")
