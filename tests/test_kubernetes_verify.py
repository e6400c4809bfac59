"""The verify probe on Kubernetes, against the API stand-in: a failed verdict deletes the job, a
passing one survives the kubelet's cut of termination messages, a probe that never runs fails
verify, and image pulls have a patience of their own."""

from __future__ import annotations

from pathlib import Path

import pytest

from tao_data_io import steps
from tao_data_io.credentials import S3Credentials
from tao_data_io.transfer.client import make_s3_client

from . import kube_cluster
from .kube_cluster import (NAMESPACE, SECRETS, every_object_of_ours, job_request, launch_only, make_backend, ours,
                           store_in, submit)
from .kube.apiserver import KubeStandIn

#: The stand-in cluster and the input bucket (pytest fixtures of tests/kube_cluster.py).
kube, input_bucket = kube_cluster.kube, kube_cluster.input_bucket


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
