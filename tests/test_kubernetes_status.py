"""What a Kubernetes job's status, failure analysis and collect say, against the API stand-in: the
reference status table with its reasons, a job that is gone, and collect after an error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tao_data_io import steps, verbs
from tao_data_io.errors import UsageError

from . import kube_cluster
from .kube_cluster import (NAMESPACE, kube_key, every_object_of_ours, job_request, launch_only, make_backend, store_in,
                           submit)
from .kube_helpers import STAGER
from .kube.apiserver import KubeStandIn

#: The stand-in cluster and the input bucket (pytest fixtures of tests/kube_cluster.py).
kube, input_bucket = kube_cluster.kube, kube_cluster.input_bucket


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


def test_collect_after_an_error_returns_the_log_tail_and_the_analysis(kube: KubeStandIn, tmp_path: Path) -> None:
    kube.server.control.scripts["job-1"] = ["pulling", "staging", "verifying", "verified", "running", "oomkilled"]
    backend = make_backend()
    submit(tmp_path, job_request(), backend)
    collected = verbs.collect("job-1", backend, store_in(tmp_path), poll_seconds=0.01)
    assert collected.state == "ERROR" and collected.upload is None  # results left through the pod's sidecar
    assert collected.failure is not None and collected.failure.err_class == "ERR_INFRA"
    assert collected.logs_tail == "epoch 1\nKilled\n"
    assert store_in(tmp_path).get("job-1").state == "ERROR"
