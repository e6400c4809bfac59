"""Issue 39, finding 15: native sidecars are init containers (an initContainer with
``restartPolicy: Always``, KEP-753), so "the first init container that ended non-zero" can be
the results sidecar, whose final upload failed after training ended, or one killed at the end
of its grace. What a user asks for with ``logs`` is training's output whenever training started;
an init container's log only when the pod stopped before training (the stager, the probe)."""

from __future__ import annotations

from pathlib import Path

from . import kube_cluster as cluster
from .kube.apiserver import KubeStandIn
from .kube_cluster import job_request, launch_only, make_backend

#: The stand-in cluster and the input bucket (pytest fixtures of tests/kube_cluster.py).
kube, input_bucket = cluster.kube, cluster.input_bucket


def test_logs_show_training_when_the_results_sidecar_failed_after_it(kube: KubeStandIn, tmp_path: Path) -> None:
    kube.server.control.scripts["job-1"] = ["upload-failed"]
    backend = make_backend()
    submission, _ = launch_only(tmp_path, job_request(), backend)
    backend.status(submission.backend_ref)  # the pod takes its step
    text = backend.logs(submission.backend_ref)
    assert "train line 1" in text and "AccessDenied" not in text, text


def test_logs_show_the_stager_when_the_pod_stopped_before_training(kube: KubeStandIn, tmp_path: Path) -> None:
    kube.server.control.scripts["job-1"] = ["stager-failed"]
    backend = make_backend()
    submission, _ = launch_only(tmp_path, job_request(), backend)
    backend.status(submission.backend_ref)
    text = backend.logs(submission.backend_ref)
    assert "RuntimeError" in text, text  # what the stand-in's stager printed as it failed; train never ran


def test_logs_show_the_verify_probe_when_it_failed(kube: KubeStandIn, tmp_path: Path) -> None:
    kube.server.control.scripts["job-1"] = ["verify-failed"]
    kube.server.control.verify_failures["/data"] = "is empty"
    backend = make_backend()
    submission, _ = launch_only(tmp_path, job_request(), backend)
    assert backend.status(submission.backend_ref).state == "ERROR"
    logs = backend.logs(submission.backend_ref, tail=50)
    assert logs.startswith("TAO-VERIFY\tfail\tdir-nonempty\t/data\tis empty\n") and "[rank" not in logs
