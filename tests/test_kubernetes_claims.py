"""A job on a PersistentVolumeClaim (tiers A and B), against the API stand-in: the claim gate, the
stage pod's fsGroup on volumes that apply it and on those that ignore it (what the kubelet does
on each is in tests/kube/volumes.py), and a pre-positioned input missing on the claim."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from tao_data_io import steps
from tao_data_io.errors import BackendError

from . import kube_cluster
from .kube_cluster import TIER_A, TIER_B, claim, gate_case, job_request, make_backend, ours, store_in, submit
from .kube_helpers import STAGER
from .kube.apiserver import KubeStandIn
from .kube.volumes import Inode, Volume

#: The stand-in cluster and the input bucket (pytest fixtures of tests/kube_cluster.py).
kube, input_bucket = kube_cluster.kube, kube_cluster.input_bucket


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
