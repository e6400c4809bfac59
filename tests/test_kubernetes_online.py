"""The Kubernetes backend against an API server over HTTP: the kmock stand-in of
:mod:`tests.kube` (objects, selectors, dry-run, access reviews, logs, garbage collection,
and a control plane that moves pods along a script), reached through a kubeconfig as a user's
would be. Pipelines run with a RecordStore in tmp_path. The last section runs against a real
cluster when TAO_E2E_KUBECONFIG names one."""

from __future__ import annotations

import copy
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from tao_data_io import steps, verbs
from tao_data_io.errors import BackendError, CredentialError, UsageError
from tao_data_io.backends.kubernetes.api import Api, ApiError, connect
from tao_data_io.backends.kubernetes.follow import new_lines
from tao_data_io.backends.kubernetes.apply import kinds
from tao_data_io.backends.kubernetes import pods as pod_reading
from tao_data_io.backends.kubernetes.backend import KubernetesBackend
from tao_data_io.backends.kubernetes.render import ATTEMPT_ANNOTATION, JOB_ID_LABEL, STAGING_MARGIN, STEP_LABEL
from tao_data_io.backends.kubernetes.settings import DEFAULT_CANCEL_GRACE_SECONDS, KubernetesSettings
from tao_data_io.backends import backend_for
from tao_data_io.launch.backend import Backend, JobDocuments
from tao_data_io.backends.kubernetes.names import object_names
from tao_data_io.credentials import S3Credentials
from tao_data_io.quantities import quantity_bytes
from tao_data_io.request import JobRequest
from tao_data_io.transfer.client import make_s3_client

from . import kube_cluster
from .kube_cluster import (ENV, INPUT_OBJECTS, MANAGED, NAMESPACE, SECRETS, TIER_A, TIER_B, claim, kube_key, creates,
                           every_object_of_ours, job_request, launch_only, make_backend, ours, seeded_cluster, store_in,
                           submit, validate, write_kubeconfig)
from .kube_helpers import DNS_1035, ITS_CREDENTIALS_BASE, ITS_FILES_BASE, LONG_ID, STAGER
from .kube.kueue import Kueue
from .kube.apiserver import Fault, KubeStandIn
from .kube.volumes import Inode, Volume

#: The stand-in cluster and the input bucket (pytest fixtures of tests/kube_cluster.py).
kube, input_bucket = kube_cluster.kube, kube_cluster.input_bucket


# ----------------------------------------------------------------------------- submit
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


#: A PersistentVolume's source by kind, for :func:`bound_claim`; what the kubelet does with a
#: pod's fsGroup on each is in tests/kube/volumes.py.
VOLUME_SOURCES: dict[str, dict[str, Any]] = {
    "nfs": {"nfs": {"server": "nfs.example.com", "path": "/exports/tao"}},
    "hostPath": {"hostPath": {"path": "/srv/tao"}},
    "csi-file": {"csi": {"driver": "file.csi.example.com", "volumeHandle": "v-1"}},
    "csi-none": {"csi": {"driver": "none.csi.example.com", "volumeHandle": "v-1"}},
    "csi-default-rwx": {"csi": {"driver": "block.csi.example.com", "volumeHandle": "v-1", "fsType": "ext4"}},
    "csi-default-rwo": {"csi": {"driver": "block.csi.example.com", "volumeHandle": "v-1", "fsType": "ext4"}},
}
DRIVER_POLICIES = {"file.csi.example.com": "File", "none.csi.example.com": "None", "block.csi.example.com": None}


def bound_claim(kube: KubeStandIn, kind: str, name: str = "tao-data") -> str:
    """A claim bound to a fresh PersistentVolume of ``kind`` (its root ``root:root 0755``), with
    the CSIDriver objects that say what each driver does with fsGroup; the stager image runs as
    its Dockerfile's user, 1000."""
    modes = ("ReadWriteOnce",) if kind.endswith("-rwo") else ("ReadWriteMany",)
    volume = f"pv-{name}"
    for driver, policy in DRIVER_POLICIES.items():
        kube.server.store({"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver", "metadata": {"name": driver},
                           "spec": {**({"fsGroupPolicy": policy} if policy else {})}})
    kube.server.store({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": volume},
                       "spec": {"accessModes": list(modes), "capacity": {"storage": "100Gi"}, **VOLUME_SOURCES[kind]}})
    bound = claim(name, modes=modes)
    bound["spec"]["volumeName"] = volume
    kube.server.store(bound)
    kube.server.control.image_users[STAGER] = (1000, 1000)
    return volume


@pytest.mark.parametrize("kind", ["csi-file", "csi-default-rwo"])
def test_a_fresh_volume_that_applies_fs_group_is_written_through_the_stage_pods_fs_group(
        kube: KubeStandIn, tmp_path: Path, kind: str) -> None:
    volume = bound_claim(kube, kind)
    done = submit(tmp_path, job_request(storage={"pvc_claim": "tao-data"}), make_backend())
    assert done.tier == "B" and done.verdict.ok
    tree = kube.server.control.volumes[volume].tree
    assert tree[""].gid == 1000 and tree[""].mode & 0o2070 == 0o2070  # the kubelet applied fsGroup 1000
    assert tree["cache"].uid == 1000 and tree["jobs/job-1"].gid == 1000


@pytest.mark.parametrize("kind", ["nfs", "hostPath", "csi-none", "csi-default-rwx"])
def test_a_claim_whose_volume_ignores_fs_group_refuses_the_stage_with_the_fix(kube: KubeStandIn, tmp_path: Path,
                                                                               kind: str) -> None:
    volume = bound_claim(kube, kind)
    with pytest.raises(BackendError) as info:
        submit(tmp_path, job_request(storage={"pvc_claim": "tao-data"}), make_backend())
    said = str(info.value)
    assert "container stage exited 3" in said and not info.value.retryable
    assert ("the staging directory /tao-data-io/volume/cache cannot be written by this stage (uid 1000, groups 1000)"
            in said), said
    assert "/tao-data-io/volume is owned by 0:0 with mode 0755" in said
    assert "pre-create /tao-data-io/volume/cache on the volume" in said
    assert "chmod 2775 /tao-data-io/volume/cache`" in said
    assert "the stage pod mounts claim 'tao-data' at /tao-data-io/volume" in said
    assert set(kube.server.control.volumes[volume].tree) == {""}  # nothing was written
    assert ours(kube, "Job") == {}
    assert "cannot be written by this stage" in (store_in(tmp_path).get("job-1").message or "")


def test_the_first_stage_on_a_claim_regroups_everything_on_it_unless_its_root_already_has_the_group(
        kube: KubeStandIn, tmp_path: Path) -> None:
    """Issue 39, finding 18: the stage pod's fsGroup walks the whole volume the first time
    (pkg/volume/volume_linux.go ``SetVolumeOwnership``: every file's group becomes 1000, g+rw):
    on a claim shared with other data, another team's files are regrouped and opened to group
    1000. ``OnRootMismatch`` skips the walk when the root already has the group and its bits —
    the documented way to stage on a shared claim without it."""
    volume = bound_claim(kube, "csi-file")
    theirs = {"": Inode(0, 0, 0o755), "other-team": Inode(2000, 2000, 0o750),
              "other-team/model.pth": Inode(2000, 2000, 0o640, directory=False)}
    kube.server.control.volumes[volume] = Volume(ownership=True, tree=copy.deepcopy(theirs))
    submit(tmp_path, job_request(storage={"pvc_claim": "tao-data"}), make_backend())
    regrouped = kube.server.control.volumes[volume].tree["other-team/model.pth"]
    assert (regrouped.gid, regrouped.mode & 0o777) == (1000, 0o660)  # the walk reached another team's file
    prepared = {**theirs, "": Inode(0, 1000, 0o2775)}  # chgrp 1000; chmod 2775 the root, beforehand
    kube.server.control.volumes[volume] = Volume(ownership=True, tree=copy.deepcopy(prepared))
    submit(tmp_path / "again", job_request(job_id="job-2", storage={"pvc_claim": "tao-data"}), make_backend())
    kept = kube.server.control.volumes[volume].tree["other-team/model.pth"]
    assert (kept.gid, kept.mode & 0o777) == (2000, 0o640)


def test_a_pre_created_group_writable_cache_and_jobs_on_an_nfs_export_is_the_fix(kube: KubeStandIn,
                                                                                 tmp_path: Path) -> None:
    volume = bound_claim(kube, "nfs")
    tree = kube.server.control.volumes.setdefault(volume, Volume(ownership=False)).tree
    for directory in ("cache", "jobs"):  # what the refusal says to run on the export
        tree[directory] = Inode(0, 1000, 0o2775)
    done = submit(tmp_path, job_request(storage={"pvc_claim": "tao-data"}), make_backend())
    assert done.tier == "B" and done.verdict.ok
    assert tree[""].gid == 0  # NFS: the kubelet changed nothing
    assert tree["jobs/job-1"].gid == 1000  # the setgid directory handed its group on


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


def test_credential_values_go_only_to_the_api_server(kube: KubeStandIn, tmp_path: Path) -> None:
    said: list[str] = []
    submit(tmp_path, job_request(), make_backend(said))
    carried = [r for r in kube.server if any(v in r.text for v in SECRETS.values())]
    assert [f"{r.method.value} {r.url.path}" for r in carried] == ["POST /api/v1/namespaces/tao/secrets"]
    record_text = (tmp_path / "records").rglob("*.json")
    assert not any(v in path.read_text() for path in record_text for v in SECRETS.values())
    assert not any(v in line for line in said for v in SECRETS.values())
    dry_run = next(r for r in kube.server if r.url.path.endswith("/secrets") and r.params.get("dryRun"))
    assert set(dry_run.data["stringData"].values()) == {"dry-run"}  # preflight reads no credential


def test_a_refusal_that_echoes_a_credential_value_is_masked(kube: KubeStandIn, tmp_path: Path) -> None:
    value = SECRETS["AWS_SECRET_ACCESS_KEY"]
    kube.server.fault = Fault(at=0, kind="500", request="POST /api/v1/namespaces/tao/secrets")
    kube.server.fault_message = f'Secret "job-1-credentials" is invalid: data[AWS_SECRET_ACCESS_KEY]: "{value}"'
    with pytest.raises(BackendError) as info:
        submit(tmp_path, job_request(), make_backend())
    assert value not in str(info.value) and "***AWS_SECRET_ACCESS_KEY***" in str(info.value)


def test_a_missing_forwarded_credential_creates_nothing(kube: KubeStandIn, tmp_path: Path) -> None:
    with pytest.raises(CredentialError, match="AWS_SECRET_ACCESS_KEY"):
        submit(tmp_path, job_request(), make_backend(), environ={"AWS_ACCESS_KEY_ID": SECRETS["AWS_ACCESS_KEY_ID"],
                                                                 "S3_BUCKET_NAME": "tao-results"})
    assert creates(kube) == [] and every_object_of_ours(kube) == []


# ----------------------------------------------------------------------------- faults and retries
def test_a_fault_on_any_one_call_of_a_submit_then_a_retry_converges(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    input_bucket: str) -> None:
    """A 500 (not applied) or a dropped connection (applied, the reply lost) on each request of a
    submit in turn; a second submit then leaves exactly one set of objects and one RUNNING."""
    with seeded_cluster(tmp_path, monkeypatch, input_bucket) as clean:
        submit(tmp_path / "clean", job_request(), make_backend())
        total = len(clean.requests())
    for kind in ("500", "drop"):
        for at in range(total):
            run = tmp_path / f"{kind}-{at}"
            run.mkdir()
            with seeded_cluster(run, monkeypatch, input_bucket) as kube:
                kube.server.fault = fault = Fault(at=at, kind=kind)
                try:
                    submit(run, job_request(), make_backend())
                    failed = False
                except BackendError as exc:
                    assert exc.retryable, (fault.hit, str(exc))
                    failed = True
                assert fault.hit is not None
                # A lost reply to a GET is retried by the client itself; not so a create or a patch.
                assert failed == (kind == "500" or fault.hit.startswith(("POST", "PATCH"))), fault.hit
                done = submit(run, job_request(), make_backend())
                assert done.verdict.ok, fault.hit
                assert {k: sorted(ours(kube, k)) for k in ("Secret", "ConfigMap", "Service", "Job")} == {
                    "Secret": ["job-1-credentials"], "ConfigMap": ["job-1-files"], "Service": [], "Job": ["job-1"]}, \
                    fault.hit
                uid = ours(kube, "Job")["job-1"]["metadata"]["uid"]
                for dependent in (*ours(kube, "Secret").values(), *ours(kube, "ConfigMap").values()):
                    assert [ref["uid"] for ref in dependent["metadata"]["ownerReferences"]] == [uid], fault.hit
                assert len(kube.server.alive("Pod", NAMESPACE)) == 1, fault.hit
                history = store_in(run).get("job-1").history
                assert [t.state for t in history].count("RUNNING") == 1, fault.hit
                assert not any(r.startswith("DELETE") for r in kube.requests()), fault.hit


def test_a_foreign_object_under_our_name_is_a_clear_error_and_nothing_is_deleted(kube: KubeStandIn,
                                                                                 tmp_path: Path) -> None:
    foreign = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "job-1-files", "namespace": NAMESPACE,
                                                                      "labels": {"team": "vision"}},
               "data": {"keep": "me"}}
    kube.server.store(foreign)
    with pytest.raises(UsageError, match=r"ConfigMap tao/job-1-files already exists and is not job 'job-1''s "
                                         r"\(its labels: \{'team': 'vision'\}\); nothing was changed or deleted"):
        submit(tmp_path, job_request(), make_backend())
    assert creates(kube) == []  # refused by the dry run, before anything was created
    assert kube.server.alive("ConfigMap", NAMESPACE)["job-1-files"]["data"] == {"keep": "me"}
    assert store_in(tmp_path).get("job-1").state == "ERROR"  # and why: a later submit, once it is gone, reopens it


@pytest.mark.parametrize(("claims", "other"), [
    ({"labels": {"tao-data-io/job-id": "other-job"}, "annotations": {"tao-data-io/job-id": "other-job"}}, "other-job"),
    ({"labels": {"tao-data-io/job-id": "other-job"}}, "other-job"),
    ({"labels": {"tao-data-io/job-id": "other-job"}, "annotations": {"tao-data-io/job-id": "job-1"}}, "other-job"),
    ({"labels": {"tao-data-io/job-id": "job-1"}, "annotations": {"tao-data-io/job-id": "other-job"}}, "other-job"),
], ids=["labelled-and-annotated", "labelled", "labelled-only-for-another", "annotated-for-another"])
def test_an_object_of_another_job_under_our_name_is_refused_naming_both_jobs(
        kube: KubeStandIn, tmp_path: Path, claims: dict[str, Any], other: str) -> None:
    """Get-or-create takes an existing object as an earlier attempt's only when its label and its
    annotation both name this job: an object another job made (or an older version named alike)
    is refused, naming that job and this one, and is left as it was."""
    metadata = {"name": "job-1-files", "namespace": NAMESPACE, **claims}
    metadata["labels"] = {MANAGED: "tao-data-io", **metadata["labels"]}
    kube.server.store({"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": {"keep": "me"}})
    with pytest.raises(UsageError, match=rf"ConfigMap tao/job-1-files already exists and belongs to job '{other}', "
                                         r"not job 'job-1'.*nothing was changed or deleted"):
        submit(tmp_path, job_request(), make_backend())
    assert creates(kube) == []
    assert kube.server.alive("ConfigMap", NAMESPACE)["job-1-files"]["data"] == {"keep": "me"}


def test_a_job_that_exists_with_another_pod_spec_is_refused(kube: KubeStandIn, tmp_path: Path) -> None:
    launch_only(tmp_path, job_request(), make_backend())
    # The same record store refuses another request under the job id at open already...
    with pytest.raises(UsageError, match="already names a different job \\(its request differs\\).* was launched"):
        launch_only(tmp_path, job_request(args=["--epochs", "2"]), make_backend())
    # ...and the cluster refuses it from another store (another machine's records).
    with pytest.raises(UsageError, match="Job tao/job-1 already runs job 'job-1' with another pod spec"):
        launch_only(tmp_path / "elsewhere", job_request(args=["--epochs", "2"]), make_backend())


# ----------------------------------------------------------------------------- names the API server takes
def named(kind: str, name: str, **extra: Any) -> dict[str, Any]:
    """A minimal object of ``kind`` (a Job: one container, restartPolicy Never)."""
    obj: dict[str, Any] = {"apiVersion": "batch/v1" if kind == "Job" else "v1", "kind": kind,
                           "metadata": {"name": name, "namespace": NAMESPACE}}
    if kind == "Job":
        obj["spec"] = {"template": {"metadata": {}, "spec": {"restartPolicy": "Never",
                                                           "containers": [{"name": "c", "image": "i"}]}}}
    elif kind == "Service":
        obj["spec"] = {"clusterIP": "None", "ports": [{"port": 29500}]}
    for path, value in extra.items():  # "spec.completions": 3
        *parents, last = path.split(".")
        target = obj
        for part in parents:
            target = target.setdefault(part, {})
        target[last] = value
    return obj


SUBDOMAIN_253 = ".".join(["a" * 63] * 3 + ["b" * 61])  # 253 characters, each part a label
NAME_CASES = [
    # pkg/apis/core/validation.ValidateService: ValidateServiceName = NameIsDNS1035Label
    (named("Service", "2x8-torchrun"), "a DNS-1035 label must consist of lower case alphanumeric characters or '-', "
     "start with an alphabetic character"),
    (named("Service", "s" * 64), "must be no more than 63 characters"),
    (named("Service", "s" * 63), None),
    # ValidateConfigMap / ValidateSecret: ValidateConfigMapName / ValidateSecretName = NameIsDNSSubdomain
    (named("ConfigMap", "Job_1-files"), "a lowercase RFC 1123 subdomain must consist of"),
    (named("ConfigMap", SUBDOMAIN_253 + "c"), "must be no more than 253 characters"),
    (named("ConfigMap", SUBDOMAIN_253), None),
    (named("Secret", "-job-1-credentials"), "a lowercase RFC 1123 subdomain must consist of"),
    (named("Secret", "2x8-torchrun-credentials"), None),
    # pkg/apis/batch/validation.ValidateJob: a DNS-1123 subdomain, and (strategy.go generateSelector
    # labels the pod template job-name=<name>) a label value of at most 63 characters
    (named("Job", "j" * 64), "spec.template.metadata.labels: Invalid value: '" + "j" * 64 + "': must be no more than "
     "63 characters"),
    (named("Job", "2x8-torchrun"), None),
    # ValidateJob: an Indexed Job's last pod hostname <name>-<completions-1> is a DNS-1123 label
    (named("Job", "j" * 62, **{"spec.completionMode": "Indexed", "spec.completions": 10}),
     "will not able to create pod with invalid DNS label: " + "j" * 62 + "-9"),
    (named("Job", "j" * 61, **{"spec.completionMode": "Indexed", "spec.completions": 11}),
     "will not able to create pod with invalid DNS label: " + "j" * 61 + "-10"),
    (named("Job", "j" * 61, **{"spec.completionMode": "Indexed", "spec.completions": 10}), None),
    # ValidatePodSpec: the subdomain is a DNS-1123 label
    (named("Job", "job-1", **{"spec.template.spec.subdomain": "Job-1"}), "spec.template.spec.subdomain: Invalid value"),
    # apimachinery/pkg/apis/meta/v1/validation.ValidateLabels: IsValidLabelValue, at most 63
    (named("ConfigMap", "job-1-files", **{"metadata.labels": {"tao-data-io/job-id": "x" * 64}}),
     "metadata.labels: Invalid value: '" + "x" * 64 + "': must be no more than 63 characters"),
    (named("ConfigMap", "job-1-files", **{"metadata.labels": {"tao-data-io/job-id": "-x"}}), "a valid label must be"),
]


@pytest.mark.parametrize(("obj", "refusal"), NAME_CASES,
                         ids=[f"{o['kind']}-{i}-{'refused' if r else 'taken'}" for i, (o, r) in enumerate(NAME_CASES)])
def test_the_stand_in_refuses_the_names_the_api_server_refuses(kube: KubeStandIn, obj: dict[str, Any],
                                                              refusal: str | None) -> None:
    """The stand-in validates names as the API server does, citing its rules:
    k8s.io/apimachinery/pkg/util/validation (IsDNS1035Label, IsDNS1123Label, IsDNS1123Subdomain,
    IsValidLabelValue) as pkg/apis/core/validation (ValidateService → ValidateServiceName,
    ValidateConfigMap, ValidateSecret, ValidatePodSpec) and pkg/apis/batch/validation.ValidateJob
    apply them — a dry run and a create alike; and a name at the edge of a rule is taken."""
    api = Api(connect())
    kind = kinds(api)[obj["kind"]]
    for dry_run in ({"dry_run": "All"}, {}):
        if refusal is None:
            api.call("creating", kind.create, NAMESPACE, obj, **dry_run)
            continue
        with pytest.raises(ApiError) as info:
            api.call("creating", kind.create, NAMESPACE, obj, **dry_run)
        assert (info.value.status, info.value.reason) == (422, "Invalid") and refusal in str(info.value), info.value
    assert (obj["metadata"]["name"] in kube.server.alive(obj["kind"], NAMESPACE)) == (refusal is None)


def test_a_multi_node_job_whose_id_begins_with_a_digit_finds_rank_0(kube: KubeStandIn, tmp_path: Path) -> None:
    """A job id may begin with a digit, a Service name may not (DNS-1035): the rendezvous Service,
    the pods' subdomain and MASTER_ADDR take a name that begins with a letter, and the Job — which
    names the pods' hostnames and backend_ref — keeps the id."""
    done = submit(tmp_path, job_request(job_id="2x8-torchrun", compute_shape={"gpus": 8, "nodes": 2}), make_backend())
    assert done.verdict.ok and done.backend_ref == "tao/2x8-torchrun"
    (service,) = ours(kube, "Service").values()
    name = service["metadata"]["name"]
    assert DNS_1035.fullmatch(name)
    pod = ours(kube, "Job")["2x8-torchrun"]["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert pod["subdomain"] == name and env["MASTER_ADDR"] == env["PET_MASTER_ADDR"] == f"2x8-torchrun-0.{name}"
    validate(every_object_of_ours(kube))


def test_jobs_whose_ids_look_like_each_others_names_run_side_by_side(kube: KubeStandIn, tmp_path: Path) -> None:
    """Names derived from job ids never meet: L, a 52-character id, and M and M2, ids equal to
    what a hash-truncating scheme made of L's names, all run in one namespace, each with its own
    Secret, ConfigMap and Job; L's ConfigMap still holds L's record and checklist."""
    ids = [LONG_ID, ITS_FILES_BASE, ITS_CREDENTIALS_BASE]
    for job_id in ids:
        done = submit(tmp_path, job_request(job_id=job_id), make_backend())
        assert done.verdict.ok and done.backend_ref == f"tao/{job_id}"
    for kind in ("Secret", "ConfigMap", "Job"):
        owners = sorted(o["metadata"]["annotations"]["tao-data-io/job-id"] for o in ours(kube, kind).values())
        assert owners == sorted(ids), kind
    for configmap in ours(kube, "ConfigMap").values():
        job_id = configmap["metadata"]["annotations"]["tao-data-io/job-id"]
        assert json.loads(configmap["data"]["job-record.json"])["job_id"] == job_id
    validate(every_object_of_ours(kube))


def test_a_job_id_ending_in_stage_never_meets_another_jobs_stage_job(kube: KubeStandIn, tmp_path: Path) -> None:
    """Job names of two roles: job ``foo``'s tier B stage Job and job ``foo-stage``'s training Job
    are two Jobs."""
    kube.server.store(claim())
    first = submit(tmp_path, job_request(job_id="foo", storage={"pvc_claim": "tao-data"}), make_backend())
    second = submit(tmp_path, job_request(job_id="foo-stage"), make_backend())
    assert first.verdict.ok and second.verdict.ok and (first.tier, second.tier) == ("B", "C")
    jobs = {name: (o["metadata"]["annotations"]["tao-data-io/job-id"], o["metadata"]["labels"]["tao-data-io/step"])
            for name, o in ours(kube, "Job").items()}
    assert sorted(jobs.values()) == [("foo", "stage"), ("foo", "train"), ("foo-stage", "train")]
    assert (jobs["foo"], jobs["foo-stage"]) == (("foo", "train"), ("foo-stage", "train"))  # backend_ref's names


# ----------------------------------------------------------------------------- verify
def test_a_failed_verify_deletes_the_job_and_the_record_says_error(kube: KubeStandIn, tmp_path: Path) -> None:
    kube.server.control.verify_failures["/data"] = "does not exist"
    said: list[str] = []
    with pytest.raises(steps.VerifyFailed, match="/data: does not exist"):
        submit(tmp_path, job_request(), make_backend(said))
    record = store_in(tmp_path).get("job-1")
    assert record.state == "ERROR" and record.backend_ref == "tao/job-1"
    assert record.verify is not None and record.verify["ok"] is False
    checks = {c["path"] + ":" + c["kind"]: (c["ok"], c["detail"]) for c in record.verify["checks"]}  # type: ignore[index, union-attr]
    assert checks["/data:dir-nonempty"] == (False, "does not exist") and checks["/results:results-writable"][0]
    deleted = [r for r in kube.requests() if r.startswith("DELETE")]
    assert deleted == ["DELETE /apis/batch/v1/namespaces/tao/jobs/job-1?propagationPolicy=Foreground"]
    assert every_object_of_ours(kube) == [] and kube.server.alive("Pod", NAMESPACE) == {}  # GPU freed, GC'd
    assert any("frees its GPUs" in line for line in said)
    status = steps.observe_and_record(record, make_backend(), store_in(tmp_path))
    assert status.state == "ERROR" and "the record says ERROR" in status.message


def test_a_passing_verdict_of_many_checks_survives_the_kubelets_cut(kube: KubeStandIn, tmp_path: Path,
                                                                     input_bucket: str) -> None:
    """The kubelet keeps 12 KiB of termination messages per pod, shared by its containers
    (normalizeStatus, pkg/kubelet/status/status_manager.go): tier C's five (stager, results and
    status sidecars, verify, train) leave the verdict 2457 bytes. A passing verdict of 33 checks
    is longer than that, and must still read as passed — not as a probe that stopped mid-way,
    whose job the backend would delete."""
    client = make_s3_client(S3Credentials(SECRETS["AWS_ACCESS_KEY_ID"], SECRETS["AWS_SECRET_ACCESS_KEY"],
                                          endpoint_url=input_bucket))
    for i in range(31):
        client.put_object(Bucket="bkt-1", Key=f"shards/{i:03d}/0001.jpg", Body=b"x")
    inputs = [{"source": f"s3://bkt-1/shards/{i:03d}/", "target": f"/workspace/datasets/coco-2017/train-shard-{i:03d}"}
              for i in range(31)]
    done = submit(tmp_path, job_request(inputs=inputs), make_backend())
    assert done.tier == "C" and done.verdict.ok, done.verdict.describe()
    assert len(done.verdict.checks) == 33 and "job-1" in ours(kube, "Job")
    assert any(c.detail.startswith("passed (not shown") for c in done.verdict.checks)  # it was cut, honestly
    pod = next(iter(kube.server.alive("Pod", NAMESPACE).values()))
    verify = next(c for c in pod["status"]["initContainerStatuses"] if c["name"] == "verify")
    assert len(verify["state"]["terminated"]["message"].encode()) <= 12288 // 5


@pytest.mark.parametrize(("script", "fragment", "patience"), [
    # the stager's failure must be what ends it: no budget runs out first on a loaded machine
    (["pulling", "stager-failed"], "container stager exited 1 (Error): stage: s3://bkt-1/data/: AccessDenied", 3600),
    (["image-pull-backoff"], "spent", 0.05),
    (["unschedulable"], "waited", 0.05),
], ids=["stager", "pull-timeout", "schedule-timeout"])
def test_verify_fails_and_deletes_the_job_when_the_probe_never_runs(kube: KubeStandIn, tmp_path: Path,
                                                                    script: list[str], fragment: str,
                                                                    patience: float) -> None:
    kube.server.control.scripts["job-1"] = script
    backend = make_backend(image_pull_timeout=patience)
    submission, plan = launch_only(tmp_path, job_request(), backend)
    verdict = backend.verify(submission.backend_ref, plan, timeout=patience)
    assert not verdict.ok and verdict.error is not None and fragment in verdict.error
    assert "job-1" not in ours(kube, "Job")


def test_a_timeout_counts_image_pulls_apart(kube: KubeStandIn, tmp_path: Path) -> None:
    """Pulling for a while is fine when image_pull_timeout allows it: it counts apart from verify's."""
    kube.server.control.scripts["job-1"] = ["pulling"] * 30 + ["verifying", "verified"]
    backend = make_backend(image_pull_timeout=3600)
    submission, plan = launch_only(tmp_path, job_request(), backend)
    assert backend.verify(submission.backend_ref, plan, timeout=3600).ok


# ----------------------------------------------------------------------------- status, analysis, logs
#: The reference's status table up to the command's end: how an end is classified (an exit code, a
#: signal, an OOM kill, the deadline) is the conformance suite's (tests/test_backend_contract.py).
STATUS_TABLE = [
    ("unschedulable", {}, "PENDING", None,
     "waiting for a node: 0/2 nodes are available: 2 Insufficient nvidia.com/gpu"),
    ("unschedulable", {"condition_messages": False}, "PENDING", None,
     "FailedScheduling: 0/2 nodes are available: 2 Insufficient nvidia.com/gpu"),
    ("unschedulable", {"unschedulable_message": '0/2 nodes are available: persistentvolumeclaim "tao-data" not found.'},
     "PENDING", None, 'persistentvolumeclaim "tao-data" not found'),
    ("refused", {}, "PENDING", None, "no pod yet: FailedCreate: pods \"job-1-x\" is forbidden: exceeded quota"),
    ("pulling", {}, "PENDING", None, f"pulling {STAGER} for stager (ContainerCreating)"),
    ("image-pull-backoff", {}, "PENDING", None, 'ImagePullBackOff: Back-off pulling image "nvcr.io/nvidia/tao'),
    ("staging", {}, "RUNNING", None, "stager is staging the inputs inside the pod"),
    ("verifying", {}, "RUNNING", None, "the verify probe is checking"),
    ("running", {}, "RUNNING", None, "train is running"),
    ("verify-failed", {}, "ERROR", "ERR_INFRA", ("the verify probe failed inside the pod before the command started: "
                                                "/data: does not exist")),
    ("stager-failed", {}, "ERROR", "ERR_INFRA", "stager failed (exit 1): stage: s3://bkt-1/data/: AccessDenied"),
]


@pytest.mark.parametrize(("step", "control", "state", "err_class", "fragment"), STATUS_TABLE,
                         ids=[f"{row[0]}-{i}" for i, row in enumerate(STATUS_TABLE)])
def test_status_maps_the_reference_table_with_the_reason(kube: KubeStandIn, tmp_path: Path, step: str,
                                                         control: dict[str, Any], state: str, err_class: str | None,
                                                         fragment: str) -> None:
    plane = kube.server.control
    for name, value in control.items():
        setattr(plane, name, value)
    if step == "refused":
        plane.refused["job-1"] = ('pods "job-1-x" is forbidden: exceeded quota: gpu-quota, requested: '
                                  "requests.nvidia.com/gpu=1, used: requests.nvidia.com/gpu=8")
    plane.scripts["job-1"] = [step]
    if step == "verify-failed":  # a failed verdict ends the pod there: no later step could be reached
        plane.verify_failures["/data"] = "does not exist"
    backend = make_backend()
    submission, _ = launch_only(tmp_path, job_request(), backend)
    status = backend.status(submission.backend_ref)
    assert (status.state, status.err_class) == (state, err_class) and fragment in status.message, status
    analysis = backend.failure_analysis(submission.backend_ref)
    if state == "ERROR":
        assert analysis is not None and analysis.err_class == err_class and fragment in analysis.reason
        assert analysis.suggestion
    else:
        assert analysis is None


def test_a_job_that_is_gone_reads_unknown_and_ttl_takes_its_objects(kube: KubeStandIn, tmp_path: Path) -> None:
    done = submit(tmp_path, job_request(), make_backend())
    kube.run(lambda: kube.server.objects[kube_key("Job", "job-1")].delete())  # the TTL controller
    kube.run(kube.server.collect_garbage)  # the garbage collector, by ownerReferences
    kube.run(kube.server.end_terminating)  # and the kubelet, at the end of the pod's grace
    backend = make_backend()
    status = backend.status(done.backend_ref)
    assert status.state == "UNKNOWN" and "the job record says how it ended" in status.message
    assert every_object_of_ours(kube) == [] and kube.server.alive("Pod", NAMESPACE) == {}
    store = store_in(tmp_path)
    # Never PENDING forever, never an end recorded from nothing: the record (RUNNING) stays, and the
    # wait says what happened and how to close it.
    with pytest.raises(UsageError, match="marking its record ERROR closes it"):
        steps.wait_for_end("job-1", backend, store, poll_seconds=0.01)
    assert store.get("job-1").state == "RUNNING"
    assert backend.failure_analysis(done.backend_ref) is None and backend.logs(done.backend_ref) == ""


def test_logs_show_the_verify_probe_when_it_failed(kube: KubeStandIn, tmp_path: Path) -> None:
    kube.server.control.scripts["job-1"] = ["verify-failed"]
    kube.server.control.verify_failures["/data"] = "is empty"
    backend = make_backend()
    submission, _ = launch_only(tmp_path, job_request(), backend)
    assert backend.status(submission.backend_ref).state == "ERROR"
    logs = backend.logs(submission.backend_ref, tail=50)
    assert logs.startswith("TAO-VERIFY\tfail\tdir-nonempty\t/data\tis empty\n") and "[rank" not in logs


def test_cancel_deletes_the_job_in_the_foreground_and_keeps_a_pre_created_secret(kube: KubeStandIn,
                                                                                  tmp_path: Path) -> None:
    kube.server.store({"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": {
        "name": "team-s3", "namespace": NAMESPACE},
        "data": {"AWS_ACCESS_KEY_ID": "eA==", "AWS_SECRET_ACCESS_KEY": "eA=="}})
    backend = make_backend(credential_secret="team-s3")
    done = submit(tmp_path, job_request(compute_shape={"gpus": 8, "nodes": 2}), backend)
    assert done.verdict.ok and "team-s3" not in ours(kube, "Secret") and ours(kube, "Service")
    before = len(kube.requests())  # the collective probe's objects were deleted by submit already
    assert verbs.cancel("job-1", backend, store_in(tmp_path)).record.state == "CANCELED"
    deleted = [r for r in kube.requests()[before:] if r.startswith("DELETE")]
    # The Service and ConfigMap are the Job's dependents: its foreground delete takes them first.
    assert deleted[0] == "DELETE /apis/batch/v1/namespaces/tao/jobs/job-1?propagationPolicy=Foreground"
    assert every_object_of_ours(kube) == []
    ended = kube.run(kube.server.end_terminating)  # the two ranks, each given the cancel's grace
    assert sorted(ended.values()) == [DEFAULT_CANCEL_GRACE_SECONDS] * 2 and kube.server.alive("Pod", NAMESPACE) == {}
    assert "team-s3" in kube.server.alive("Secret", NAMESPACE)
    assert store_in(tmp_path).get("job-1").state == "CANCELED"
    assert backend.cancel(done.backend_ref) is False and backend.status(done.backend_ref).state == "UNKNOWN"


@pytest.mark.parametrize(("cancel_grace", "given"), [(None, DEFAULT_CANCEL_GRACE_SECONDS), (1, 1), (7200, "own")])
def test_cancel_gives_the_pods_the_cancel_grace_not_their_own(kube: KubeStandIn, tmp_path: Path,
                                                              cancel_grace: int | None, given: int | str) -> None:
    """The garbage collector deletes a Job's pods with no grace period of its own, so each gets its
    ``terminationGracePeriodSeconds`` — sized for the whole results budget's final upload, over
    half an hour — and a grace given to the Job's delete never reaches them. Cancel deletes the
    pods too, with ``cancel_grace_seconds``: shorter, so the GPUs are free sooner (1 at the least:
    0 is a force delete); a longer one leaves the pods' own, as the API server only ever shortens
    a grace (apiserver ``rest.BeforeDelete``)."""
    settings = {} if cancel_grace is None else {"cancel_grace_seconds": cancel_grace}
    backend = make_backend(**settings)
    done = submit(tmp_path, job_request(), backend)
    own = ours(kube, "Job")["job-1"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert own > DEFAULT_CANCEL_GRACE_SECONDS
    assert backend.cancel(done.backend_ref) is True
    terminating = {name: pod["metadata"].get("deletionGracePeriodSeconds")
                   for name, pod in kube.server.alive("Pod", NAMESPACE).items()}
    expected = own if given == "own" else given
    assert len(terminating) == 1 and set(terminating.values()) == {expected}
    kube.run(kube.server.end_terminating)
    assert kube.server.alive("Pod", NAMESPACE) == {} and every_object_of_ours(kube) == []


def test_a_cancel_refused_delete_on_pods_still_cancels_and_leaves_them_their_own_grace(
        kube: KubeStandIn, tmp_path: Path) -> None:
    """A Role from before delete on pods was granted: the Job is deleted, so the job is canceled
    (a retried cancel must not find it refused forever); its pods keep the grace the garbage
    collector gives them, and the cancel says so."""
    said: list[str] = []
    backend = make_backend(said)
    done = submit(tmp_path, job_request(), backend)
    kube.server.rbac.revoke("delete", "", "pods")
    assert verbs.cancel("job-1", backend, store_in(tmp_path)).record.state == "CANCELED"
    assert any("end within their own grace period" in line for line in said), said
    assert ours(kube, "Job") == {} and backend.cancel(done.backend_ref) is False


def test_cancel_ends_only_the_pods_tao_data_io_made(kube: KubeStandIn, tmp_path: Path) -> None:
    backend = make_backend()
    done = submit(tmp_path, job_request(), backend)
    kube.server.store({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "someone-elses", "namespace": NAMESPACE, "labels": {JOB_ID_LABEL: "job-1"}},
        "spec": {"nodeName": "node-9", "containers": [{"name": "c", "image": "busybox"}]},
        "status": {"phase": "Running"}})
    assert backend.cancel(done.backend_ref) is True
    assert "deletionTimestamp" not in kube.server.alive("Pod", NAMESPACE)["someone-elses"]["metadata"]


def test_cancel_removes_what_a_submit_that_never_made_its_job_left(kube: KubeStandIn, tmp_path: Path) -> None:
    kube.server.fault = Fault(at=0, kind="500", request="POST /apis/batch/v1/namespaces/tao/jobs")
    backend = make_backend()
    with pytest.raises(BackendError, match="creating Job tao/job-1: the API server answered 500"):
        submit(tmp_path, job_request(), backend)
    assert (sorted(ours(kube, "Secret")), sorted(ours(kube, "ConfigMap")), ours(kube, "Job")) == (
        ["job-1-credentials"], ["job-1-files"], {})
    assert store_in(tmp_path).get("job-1").backend_ref is None
    assert backend.cancel("tao/job-1") is False
    assert every_object_of_ours(kube) == []
    assert [r for r in kube.requests() if r.startswith("DELETE")] == [
        "DELETE /api/v1/namespaces/tao/configmaps/job-1-files?propagationPolicy=Foreground",
        "DELETE /api/v1/namespaces/tao/secrets/job-1-credentials?propagationPolicy=Foreground"]


def test_collect_after_an_error_returns_the_log_tail_and_the_analysis(kube: KubeStandIn, tmp_path: Path) -> None:
    kube.server.control.scripts["job-1"] = ["pulling", "staging", "verifying", "verified", "running", "oomkilled"]
    backend = make_backend()
    submit(tmp_path, job_request(), backend)
    collected = verbs.collect("job-1", backend, store_in(tmp_path), poll_seconds=0.01)
    assert collected.state == "ERROR" and collected.upload is None  # results left through the pod's sidecar
    assert collected.failure is not None and collected.failure.err_class == "ERR_INFRA"
    assert collected.logs_tail == "epoch 1\nKilled\n"
    assert store_in(tmp_path).get("job-1").state == "ERROR"


def test_a_job_that_ran_and_failed_launches_again_as_its_next_attempt_with_its_results_restored_first(
        kube: KubeStandIn, tmp_path: Path) -> None:
    """Submitting again a job whose pod ran and failed: the ended Job of attempt 1 (a Job cannot
    start again) and its objects are replaced by attempt 2's, whose stager restores the results
    attempt 1 uploaded into the new pod's empty results directory before anything else runs."""
    kube.server.control.scripts["job-1"] = ["pulling", "staging", "verifying", "verified", "running", "oomkilled"]
    backend = make_backend()
    first = submit(tmp_path, job_request(), backend)
    assert verbs.collect("job-1", backend, store_in(tmp_path), poll_seconds=0.01).state == "ERROR"
    old_uid = ours(kube, "Job")["job-1"]["metadata"]["uid"]
    again = submit(tmp_path, job_request(), make_backend())
    assert (again.backend_ref, again.started) == (first.backend_ref, True)
    job = ours(kube, "Job")["job-1"]
    assert job["metadata"]["uid"] != old_uid and job["metadata"]["annotations"][ATTEMPT_ANNOTATION] == "2"
    stager = job["spec"]["template"]["spec"]["initContainers"][0]
    env = {item["name"]: item.get("value") for item in stager["env"]}
    assert stager["name"] == "stager" and env["TAO_DATA_IO_RESTORE_FROM"] == "s3://tao-results/results/job-1/"
    assert {m["mountPath"]: m.get("readOnly") for m in stager["volumeMounts"]}["/results"] is None  # writable
    record = store_in(tmp_path).get("job-1")
    assert [(a.number, a.state) for a in record.attempts] == [(1, "ERROR"), (2, None)]
    assert record.state == "RUNNING" and "s3://tao-results/results/job-1/" in str(record.attempts[1].restored)
    validate(every_object_of_ours(kube))


def test_a_followed_line_cut_by_the_byte_limit_waits_for_the_next_look() -> None:
    text = "2026-12-01T10:00:00.5Z one\n2026-12-01T10:00:01Z two\n2026-12-01T10:00:02.000000001Z thr"
    assert new_lines(text, None) == (["one", "two"], "2026-12-01T10:00:01Z")
    # Trailing zeros are dropped by the kubelet, so times compare as times, not as text.
    assert new_lines("2026-12-01T10:00:00.5Z old\n2026-12-01T10:00:00.50001Z new\n", "2026-12-01T10:00:00.5Z") == (
        ["new"], "2026-12-01T10:00:00.50001Z")
    # Lines written in the same instant are all new after an older cursor.
    same = "2026-12-01T10:00:03Z a\n2026-12-01T10:00:03Z b\n2026-12-01T10:00:04Z c\n"
    assert new_lines(same, "2026-12-01T10:00:02Z") == (["a", "b", "c"], "2026-12-01T10:00:04Z")


def test_a_followed_line_longer_than_a_look_is_passed_over_not_waited_for_forever() -> None:
    """A look reads at most ``limitBytes`` from the start of its window, and the window starts
    before the last line shown (the margin): a line that does not fit comes back cut every time,
    and waiting for its end held back every line after it for good. It is passed over, said, and
    never shown in part (a part could be half a secret no mask knows)."""
    seen = "2026-12-01T10:00:04Z shown before\n"
    look = (seen + "2026-12-01T10:00:05Z " + "A" * 100)[:120]
    lines, newest = new_lines(look, "2026-12-01T10:00:04Z", limit=120)
    assert newest == "2026-12-01T10:00:05Z" and lines == [
        "[tao-data-io: a line too long for one look (120 bytes with the lines before it) was not shown]"]
    assert new_lines(look, "2026-12-01T10:00:05Z", limit=120) == ([], "2026-12-01T10:00:05Z")  # passed over once
    assert new_lines(look[:80], "2026-12-01T10:00:04Z", limit=120) == ([], "2026-12-01T10:00:04Z")  # not full: wait
    whole = seen + "2026-12-01T10:00:05Z new\n2026-12-01T10:00:06Z " + "B" * 100
    assert new_lines(whole[:120], "2026-12-01T10:00:04Z", limit=120) == (["new"], "2026-12-01T10:00:05Z")


def test_following_a_chatty_pod_keeps_showing_its_newest_lines(kube: KubeStandIn, tmp_path: Path) -> None:
    """A pod printing more between two looks than one read returns: the newest lines are shown
    and the cursor moves on (a read of the oldest part of the window would never catch up). Encodes
    PodLogOptions as the kubelet applies it: tailLines and sinceSeconds together give the newest
    lines of the window, and limitBytes cuts the answer."""
    kube.server.control.scripts["job-1"] = ["pulling", "staging", "verifying", "verified", "running"]
    backend = make_backend()
    done = submit(tmp_path, job_request(), backend)
    pod = next(iter(ours(kube, "Pod")))
    kube.server.logs[NAMESPACE, pod, "train"] = "start\n"
    first = backend.follow_logs(done.backend_ref, None)
    kube.server.logs[NAMESPACE, pod, "train"] += "".join(f"progress {i:06d} {'=' * 80}\n" for i in range(5000))
    looks = [backend.follow_logs(done.backend_ref, first.cursor)]
    looks.append(backend.follow_logs(done.backend_ref, looks[-1].cursor))
    assert "progress 004999" in looks[0].text and looks[0].cursor != first.cursor
    assert looks[1].text == ""


# ----------------------------------------------------------------------------- reading pods (no server)
def pod(init: dict[str, dict[str, Any]], main: dict[str, Any], phase: str = "Running",
        **status: Any) -> dict[str, Any]:
    """A pod with a stager, the results sidecar and the probe before ``train``; ``init`` gives
    their states by name, ``main`` train's."""
    specs = [{"name": "stager", "image": "s"}, {"name": "results", "image": "s", "restartPolicy": "Always"},
             {"name": "verify", "image": "t"}]
    return {"metadata": {"name": "p"},
            "spec": {"initContainers": specs, "containers": [{"name": "train", "image": "t"}]},
            "status": {"phase": phase, "conditions": [{"type": "PodScheduled", "status": "True"}], **status,
                       "initContainerStatuses": [{"name": n, "state": init.get(n, {"terminated": {"exitCode": 0}})}
                                                 for n in ("stager", "results", "verify")],
                       "containerStatuses": [{"name": "train", "state": main}]}}


FAILED_JOB = {"spec": {"completions": 1}, "status": {"conditions": [{"type": "Failed", "status": "True"}]}}


def test_a_sidecar_that_exits_with_the_pod_decides_nothing() -> None:
    failed = pod({"results": {"terminated": {"exitCode": 1}}}, {"terminated": {"exitCode": 3, "reason": "Error"}},
                 phase="Failed")
    analysis = pod_reading.failure_analysis(FAILED_JOB, [failed])
    assert analysis is not None and (analysis.err_class, analysis.reason) == ("ERR_PROGRAM", "the command exited 3")
    running = pod({"results": {"running": {}}}, {"running": {}})
    assert pod_reading.where(running).phase == "running"


def test_an_evicted_pod_and_a_container_that_cannot_start_are_the_infrastructures() -> None:
    evicted = pod({}, {"waiting": {"reason": "ContainerCreating"}}, phase="Failed", reason="Evicted",
                  message="The node was low on resource: memory.")
    analysis = pod_reading.failure_analysis(FAILED_JOB, [evicted])
    assert analysis is not None and analysis.err_class == "ERR_INFRA"
    assert analysis.reason == "the kubelet evicted the pod: The node was low on resource: memory."
    assert "the node ran short of a resource" in analysis.suggestion
    broken = pod({"verify": {"waiting": {"reason": "CreateContainerConfigError",
                                         "message": 'secret "job-1-credentials" not found'}}},
                 {"waiting": {"reason": "PodInitializing"}}, phase="Pending")
    status = pod_reading.job_status({"spec": {}, "status": {"active": 1}}, [broken])
    assert (status.state, status.err_class) == ("ERROR", "ERR_INFRA")
    assert 'cannot start: CreateContainerConfigError: secret "job-1-credentials" not found' in status.message


# ----------------------------------------------------------------------------- gates
def gate_case(kube: KubeStandIn, tmp_path: Path, request: JobRequest, backend: KubernetesBackend,
              fragment: str) -> str:
    with pytest.raises(UsageError) as info:
        submit(tmp_path, request, backend)
    message = str(info.value)
    assert fragment in message and "\n" not in message and "--" not in message, message
    assert creates(kube) == []
    return message


def test_gate_gpu_capacity_refuses_a_job_no_node_can_hold(kube: KubeStandIn, tmp_path: Path) -> None:
    message = gate_case(kube, tmp_path, job_request(compute_shape={"gpus": 16}), make_backend(),
                        "compute_shape asks for 1 pod(s) of 16 nvidia.com/gpu each (16 in all) but the nodes the pods "
                        "may run on can hold 0 such pod(s) (allocatable gpu-0: 8, gpu-1: 8)")
    assert "lower compute_shape.gpus" in message
    assert not any("selfsubjectaccessreviews" in r for r in kube.requests())  # the first gate


def test_gate_gpu_capacity_is_skipped_for_a_job_without_gpus(kube: KubeStandIn, tmp_path: Path) -> None:
    for index in range(2):  # no node has a GPU to give
        kube.server.store({"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"gpu-{index}"},
                           "status": {"allocatable": {"cpu": "64"}}})
    assert submit(tmp_path, job_request(compute_shape={"gpus": 0}), make_backend()).verdict.ok
    preflight = kube.requests()[4:]
    assert preflight.count("GET /api/v1/nodes") <= 1  # read once, for the kubelets' versions (the sidecar)


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


def test_gate_access_lists_every_refusal_in_one_line(kube: KubeStandIn, tmp_path: Path) -> None:
    kube.server.rbac.revoke("create", "batch", "jobs")
    kube.server.rbac.revoke("patch", "", "secrets")
    gate_case(kube, tmp_path, job_request(), make_backend(),
              "kubeconfig context 'stand-in' may not create jobs.batch, patch secrets in namespace 'tao': ask the "
              "cluster's admin for a Role granting them and a RoleBinding to this identity")


@pytest.mark.parametrize(("seeded", "settings", "fields", "fragment"), [
    (None, {}, TIER_A, "pvc_claim 'tao-data' does not exist in namespace 'tao': create the PersistentVolumeClaim"),
    (claim(phase="Lost"), {}, TIER_A, "pvc_claim 'tao-data' is Lost, not Bound"),
    (claim(phase="Pending", storage_class="fast"), {}, TIER_A, "pvc_claim 'tao-data' is Pending, not Bound"),
    (claim(modes=("ReadWriteOnce",)), {"shards": 2}, TIER_B,
     ("shards 2 run stage pods on several nodes at once, but pvc_claim 'tao-data' is ['ReadWriteOnce'], not "
     "ReadWriteMany")),
    (claim(modes=("ReadWriteOnce",)), {}, {**TIER_A, "compute_shape": {"gpus": 1, "nodes": 2}},
     "a job of 2 nodes mounts pvc_claim 'tao-data' on every node"),
], ids=["missing", "lost", "pending", "rwo-shards", "rwo-multi-node"])
def test_gate_the_claim(kube: KubeStandIn, tmp_path: Path, seeded: dict[str, Any] | None, settings: dict[str, Any],
                        fields: dict[str, Any], fragment: str) -> None:
    if seeded is not None:
        kube.server.store(seeded)
    gate_case(kube, tmp_path, job_request(**fields), make_backend(pvc_claim="tao-data", **settings), fragment)


def test_an_input_missing_on_the_claim_fails_verify_and_is_never_made_an_empty_directory(kube: KubeStandIn,
                                                                                         tmp_path: Path) -> None:
    """The kubelet creates a missing subPath, root-owned and empty, when a container that mounts it
    starts (pkg/kubelet/kubelet_pods.go makeMounts; tests/kube/volumes.py). The probe reads each
    claim input through the claim's root, so a pre-positioned source that is not there fails
    verify, and nothing mounts it by subPath: the claim is left as it was."""
    volume = bound_claim(kube, "csi-file")
    seeded = kube.server.control.volumes[volume] = Volume(ownership=True, contents=True)
    seeded.tree.update({"datasets": Inode(), "datasets/coco": Inode(), "datasets/coco/a.jpg": Inode(directory=False)})
    before = set(seeded.tree)
    mounts = [{"source": "/datasets/coco", "target": "/data", "read_only": True},
              {"source": "/datasets/coco-annotations.json", "target": "/ann.json", "read_only": True}]
    with pytest.raises(steps.VerifyFailed, match="datasets/coco-annotations.json: does not exist") as info:
        submit(tmp_path, job_request(inputs=[], mounts=mounts), make_backend(pvc_claim="tao-data"))
    assert "/tao-data-io/volume/datasets/coco:" not in str(info.value)  # the one that is there passed
    # No empty directory where the annotation file was expected; only the job's own results
    # directory was made (the probe mounts it by subPath to prove it persists).
    assert set(seeded.tree) - before == {"results", "results/job-1"}
    checks = {c["path"]: c for c in store_in(tmp_path).get("job-1").verify["checks"]}  # type: ignore[index, union-attr]
    assert checks["/tao-data-io/volume/datasets/coco"]["subject"] == "/datasets/coco"


def test_gate_a_claim_that_waits_for_its_first_consumer_passes(kube: KubeStandIn, tmp_path: Path) -> None:
    kube.server.store(claim(phase="Pending", storage_class="standard"))  # WaitForFirstConsumer
    done = submit(tmp_path, job_request(**TIER_A), make_backend(pvc_claim="tao-data"))
    assert done.tier == "A" and done.verdict.ok


@pytest.mark.parametrize(("seeded", "settings", "fragment"), [
    (None, {"image_pull_secrets": ["ngc-pull"]}, ("image_pull_secrets 'ngc-pull' does not exist in namespace 'tao': "
                                                 "create it there (type kubernetes.io/dockerconfigjson")),
    ({"name": "ngc-pull", "type": "Opaque"}, {"image_pull_secrets": ["ngc-pull"]},
     "image_pull_secrets 'ngc-pull' is of type 'Opaque'"),
    (None, {"credential_secret": "team-s3"}, "credential_secret 'team-s3' does not exist in namespace 'tao'"),
    ({"name": "team-s3", "type": "Opaque", "data": {"AWS_ACCESS_KEY_ID": "eA=="}}, {"credential_secret": "team-s3"},
     "credential_secret 'team-s3' has no key AWS_SECRET_ACCESS_KEY, which forward_env names"),
], ids=["pull-missing", "pull-type", "credentials-missing", "credentials-key"])
def test_gate_secrets(kube: KubeStandIn, tmp_path: Path, seeded: dict[str, Any] | None, settings: dict[str, Any],
                      fragment: str) -> None:
    if seeded is not None:
        name, kind = seeded.pop("name"), seeded.pop("type")
        kube.server.store({"apiVersion": "v1", "kind": "Secret", "type": kind,
                           "metadata": {"name": name, "namespace": NAMESPACE}, **seeded})
    message = gate_case(kube, tmp_path, job_request(), make_backend(**settings), fragment)
    assert "eA==" not in message


def test_gate_a_dry_run_refusal_names_the_object_and_the_servers_reason(kube: KubeStandIn, tmp_path: Path) -> None:
    kube.server.admission["jobs"] = ('admission webhook "policy.example.com" denied the request: images must come '
                                     "from registry.example.com")
    gate_case(kube, tmp_path, job_request(), make_backend(),
              'a dry run of creating Job tao/job-1: the API server answered 422 Invalid: admission webhook '
              '"policy.example.com" denied the request: images must come from registry.example.com')


# ----------------------------------------------------------------------------- connection
def test_the_namespace_comes_from_the_parameter_the_variable_or_the_context(kube: KubeStandIn,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    assert connect().namespace == NAMESPACE
    monkeypatch.setenv("TAO_K8S_NAMESPACE", "from-env")
    assert connect().namespace == "from-env" and connect(namespace="given").namespace == "given"
    with pytest.raises(UsageError, match=r"context 'nope' is not in the kubeconfig \(it has \['stand-in'\]\); set "
                                         "TAO_K8S_CONTEXT to one of them"):
        connect(context="nope")
    with pytest.raises(UsageError, match="namespace 'Bad_NS' is not a DNS label"):
        connect(namespace="Bad_NS")


def test_no_kubeconfig_and_no_service_account_is_one_clear_line(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("TAO_K8S_CONTEXT", raising=False)
    with pytest.raises(UsageError, match="no cluster is configured but there is no kubeconfig at .*absent: set "
                                         "KUBECONFIG"):
        make_backend().facts()


def test_the_service_account_is_used_inside_a_pod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tao_data_io.backends.kubernetes import api

    (tmp_path / "token").write_text("service-account-token")
    (tmp_path / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")  # read when a call is made, not here
    (tmp_path / "namespace").write_text("tao-jobs\n")
    for name, file in (("SERVICE_TOKEN_FILENAME", "token"), ("SERVICE_CERT_FILENAME", "ca.crt"),
                       ("SERVICE_ACCOUNT_NAMESPACE", "namespace")):
        monkeypatch.setattr(api, name, str(tmp_path / file) if name != "SERVICE_ACCOUNT_NAMESPACE"
                            else tmp_path / file)
    env = {"KUBECONFIG": str(tmp_path / "absent"), "KUBERNETES_SERVICE_HOST": "10.0.0.1",
           "KUBERNETES_SERVICE_PORT": "443"}
    connection = connect(environ=env)
    assert (connection.namespace, connection.origin) == ("tao-jobs", "the pod's service account")


def test_an_unreachable_api_server_is_retryable_and_names_no_address(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    with KubeStandIn() as gone:
        url = gone.url
    write_kubeconfig(tmp_path / "kubeconfig", url)
    before = (tmp_path / "kubeconfig").read_bytes()
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    with pytest.raises(BackendError) as info:
        make_backend().facts()
    assert info.value.retryable and "refused the connection" in str(info.value)
    port = url.rsplit(":", 1)[1]
    assert port not in str(info.value) and "127.0.0.1" not in str(info.value) and "t0ken" not in str(info.value)
    assert (tmp_path / "kubeconfig").read_bytes() == before  # never written back


def test_preflight_and_submit_need_the_documents(kube: KubeStandIn, tmp_path: Path) -> None:
    _, plan = launch_only(tmp_path, job_request(), make_backend())
    with pytest.raises(UsageError, match="preflight and submit need documents"):
        make_backend().preflight(plan)


def test_facts_report_claims_classes_version_and_gpus(kube: KubeStandIn) -> None:
    kube.server.store(claim())
    facts = make_backend().facts()
    assert facts.backend == "kubernetes" and facts.server_version == "1.30" and facts.capabilities.fetches_in_frame
    assert facts.allocatable_gpus == {"gpu-0": 8, "gpu-1": 8} and facts.storage_classes == ["standard"]
    assert [(v.name, v.phase, v.access_modes, v.capacity_bytes, v.holds_inputs) for v in facts.volumes] == [
        ("tao-data", "Bound", ["ReadWriteMany"], 100 * 1024**3, False)]
    kube.server.minor = 28
    assert not make_backend().facts().capabilities.fetches_in_frame


# ----------------------------------------------------------------------------- a real cluster (opt-in)
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


# ----------------------------------------------------------------------------- least privilege
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
