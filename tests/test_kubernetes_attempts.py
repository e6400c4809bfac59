"""Submitting a job again on Kubernetes, against the API stand-in: after a fault on any call a
retry converges on one set of objects; an object under the job's names is taken as an earlier
attempt's only when it is this job's, and refused otherwise; a job that ran and failed launches
again as its next attempt, its results restored first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tao_data_io import verbs
from tao_data_io.errors import BackendError, UsageError
from tao_data_io.backends.kubernetes.render import ATTEMPT_ANNOTATION

from . import kube_cluster
from .kube_cluster import (MANAGED, NAMESPACE, creates, every_object_of_ours, job_request, launch_only, make_backend,
                           ours, seeded_cluster, store_in, submit, validate)
from .kube.apiserver import Fault, KubeStandIn

#: The stand-in cluster and the input bucket (pytest fixtures of tests/kube_cluster.py).
kube, input_bucket = kube_cluster.kube, kube_cluster.input_bucket


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
