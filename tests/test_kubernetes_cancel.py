"""Cancel on Kubernetes, against the API stand-in: the Job deleted in the foreground, its pods given
the cancel's grace, only the pods tao-data-io made ended, and what a submit that never made its
Job left removed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tao_data_io import verbs
from tao_data_io.errors import BackendError
from tao_data_io.backends.kubernetes.render import JOB_ID_LABEL
from tao_data_io.backends.kubernetes.settings import DEFAULT_CANCEL_GRACE_SECONDS

from . import kube_cluster
from .kube_cluster import NAMESPACE, every_object_of_ours, job_request, make_backend, ours, store_in, submit
from .kube.apiserver import Fault, KubeStandIn

#: The stand-in cluster and the input bucket (pytest fixtures of tests/kube_cluster.py).
kube, input_bucket = kube_cluster.kube, kube_cluster.input_bucket


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
