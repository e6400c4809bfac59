"""A pod that was disrupted — preempted, evicted, its node drained — is the cluster's doing, not
the command's: classified by its ``DisruptionTarget`` condition before its exit code (an evicted
pod's containers exit 137, which reads as an OOM kill), replaced as often as the request allows
for a one-pod job, and the end of a multi-node job (a replacement rank cannot rejoin a static
rendezvous). The stand-in's Job controller applies the Job's ``podFailurePolicy`` as upstream's
does (``pkg/controller/job/pod_failure_policy.go``: rules in order, first match wins, none:
counted towards ``backoffLimit``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tao_data_io import verbs
from tao_data_io.errors import UsageError
from tao_data_io.request import JobRequest

from .kube.apiserver import KubeStandIn
from .kube.job_controller import REPLACES
from .kube.kubelet import TRAIN_SCRIPT
from .kube.objects import RESOURCES
from . import kube_cluster as cluster
from .kube_cluster import job_request, launch_only, make_backend, ours, store_in, submit

#: The stand-in cluster and the input bucket (pytest fixtures of tests/kube_cluster.py).
kube, input_bucket = cluster.kube, cluster.input_bucket

EVICTED = [*TRAIN_SCRIPT, "disrupted"]


def _pods(kube: KubeStandIn) -> dict[str, dict]:
    return kube.server.alive("Pod", "tao")


def test_an_evicted_pod_is_reported_as_a_disruption_never_as_an_oom_kill(kube: KubeStandIn, tmp_path: Path) -> None:
    kube.server.control.scripts["job-1"] = EVICTED
    backend = make_backend()
    submit(tmp_path, job_request(compute_shape={"gpus": 1, "disruption_retries": 0}), backend)
    collected = verbs.collect("job-1", backend, store_in(tmp_path), poll_seconds=0.01)
    assert collected.state == "ERROR" and collected.failure is not None
    assert collected.failure.err_class == "ERR_INFRA"
    assert "the pod was disrupted" in collected.failure.reason and "EvictionByEvictionAPI" in collected.failure.reason
    assert "OOMKilled" not in collected.failure.reason and "batch size" not in collected.failure.suggestion


def test_a_one_pod_job_whose_pod_was_disrupted_is_started_again_and_completes(kube: KubeStandIn,
                                                                            tmp_path: Path) -> None:
    kube.server.control.scripts["job-1"] = EVICTED
    kube.server.control.replacement_scripts["job-1"] = [*TRAIN_SCRIPT, "succeeded"]
    backend = make_backend()
    submit(tmp_path, job_request(), backend)
    collected = verbs.collect("job-1", backend, store_in(tmp_path), poll_seconds=0.01)
    assert collected.state == "COMPLETE", collected
    pods = _pods(kube)
    assert len(pods) == 2 and sum(REPLACES in pod["metadata"].get("annotations", {}) for pod in pods.values()) == 1


def test_disruptions_past_the_requests_retries_end_the_job_saying_so(kube: KubeStandIn, tmp_path: Path) -> None:
    kube.server.control.scripts["job-1"] = EVICTED
    backend = make_backend()
    submit(tmp_path, job_request(compute_shape={"gpus": 1, "disruption_retries": 1}), backend)
    collected = verbs.collect("job-1", backend, store_in(tmp_path), poll_seconds=0.01)
    assert collected.state == "ERROR" and collected.failure is not None
    assert "started again 1 times after disruptions" in collected.failure.suggestion
    assert len(_pods(kube)) == 2  # the first pod and one replacement, no more


@pytest.mark.parametrize("step", ["failed", "oomkilled", "verify-failed"])
def test_a_failure_of_the_command_or_of_our_containers_is_never_retried(kube: KubeStandIn, tmp_path: Path,
                                                                       step: str) -> None:
    """Running it again gives the same: the Job fails at the first non-zero exit (FailJob),
    though the request allows disruption retries."""
    kube.server.control.scripts["job-1"] = [step]
    if step == "verify-failed":
        kube.server.control.verify_failures["/data"] = "does not exist"
    backend = make_backend()
    submission, _ = launch_only(tmp_path, job_request(), backend)
    status = backend.status(submission.backend_ref)
    assert status.state == "ERROR" and "disrupted" not in status.message
    job = ours(kube, "Job")["job-1"]
    assert {c["reason"] for c in job["status"]["conditions"]} == {"PodFailurePolicy"} and len(_pods(kube)) == 1


def test_a_multi_node_job_ends_when_one_of_its_pods_is_disrupted(kube: KubeStandIn, tmp_path: Path) -> None:
    kube.server.control.scripts["job-1"] = EVICTED
    backend = make_backend()
    submit(tmp_path, job_request(compute_shape={"gpus": 8, "nodes": 2}), backend)
    job = ours(kube, "Job")["job-1"]
    assert job["spec"]["backoffLimit"] == 0 and "podFailurePolicy" not in job["spec"]
    collected = verbs.collect("job-1", backend, store_in(tmp_path), poll_seconds=0.01)
    assert collected.state == "ERROR" and collected.failure is not None
    assert collected.failure.reason.startswith("rank 0: the pod was disrupted")
    assert "a replacement rank cannot rejoin the running rendezvous" in collected.failure.suggestion
    assert len(_pods(kube)) == 2  # no replacement


def test_disruption_retries_for_a_multi_node_job_are_refused_naming_why() -> None:
    with pytest.raises(ValueError, match="disruption_retries 2 with nodes 2: a replacement pod cannot rejoin"):
        JobRequest.model_validate({**job_request().model_dump(), "compute_shape": {
            "gpus": 8, "nodes": 2, "disruption_retries": 2}})
    assert job_request(compute_shape={"gpus": 8, "nodes": 2}).compute_shape.retries_after_disruption == 0
    assert job_request().compute_shape.retries_after_disruption == 2


def test_the_rendered_policy_counts_disruptions_before_it_fails_the_job_on_any_exit_code(
        kube: KubeStandIn, tmp_path: Path) -> None:
    """The order is the point: an evicted pod's containers exit non-zero too, so the disruption
    rule must match first; training, the stager or the probe that Kubernetes stopped (a Kueue
    preemption deletes the pods with no condition) is counted, each by name, before any other exit
    fails the Job."""
    kube.server.control.scripts["job-1"] = ["pulling"]
    launch_only(tmp_path, job_request(compute_shape={"gpus": 1, "disruption_retries": 3}), make_backend())
    spec = ours(kube, "Job")["job-1"]["spec"]
    assert spec["backoffLimit"] == 3
    rules = spec["podFailurePolicy"]["rules"]
    assert [rule["action"] for rule in rules] == ["Count", "Count", "Count", "Count", "FailJob"]
    assert [rule["onExitCodes"] for rule in rules[1:4]] == [
        {"containerName": name, "operator": "In", "values": [143]} for name in ("train", "stager", "verify")]
    assert spec["podFailurePolicy"]["rules"][0]["onPodConditions"] == [{"type": "DisruptionTarget", "status": "True"}]


@pytest.mark.parametrize("minor", [30, 31])
def test_a_job_past_its_deadline_says_the_job_controllers_reason_and_ends_once_its_pods_stopped(
        kube: KubeStandIn, tmp_path: Path, minor: int) -> None:
    """Finding 11. Past activeDeadlineSeconds the Job controller deletes the Job's active pods
    (``deleteActivePods``): training exits 143 on SIGTERM while the results sidecar makes its
    final upload for the rest of the grace. Before 1.31 the Job is Failed at once; from 1.31 it
    gets FailureTarget at once and Failed only once no pod terminates
    (pkg/controller/job/job_controller.go: ``delayTerminalCondition``, ``enactJobFinished``;
    kubernetes/kubernetes#125510). On both, the status names the controller's reason, never the
    143 of the pods it is ending, and the job ends only once they stopped: what collect reports
    must not still be uploading. (That a deadline's end reads as one, whatever the backend, is the
    conformance suite's promise: tests/test_backend_contract.py.)"""
    kube.server.minor = minor
    backend = make_backend()
    done = submit(tmp_path, job_request(compute_shape={"gpus": 1, "deadline_seconds": 60}), backend)
    assert ours(kube, "Job")["job-1"]["spec"]["activeDeadlineSeconds"] == 60  # compute_shape.deadline_seconds
    kube.run(lambda: _started_long_ago(kube))
    ending = backend.status(done.backend_ref)
    conditions = [c["type"] for c in ours(kube, "Job")["job-1"]["status"]["conditions"]]
    assert conditions == (["FailureTarget"] if minor >= 31 else ["FailureTarget", "Failed"])
    assert not ending.terminal and "DeadlineExceeded: Job was active longer than specified deadline" in ending.message
    said: list[str] = []
    collected = verbs.collect("job-1", backend, store_in(tmp_path), poll_seconds=0.01, say=said.append)
    assert collected.state == "ERROR" and collected.failure is not None, collected
    assert "ran longer than its compute_shape.deadline_seconds (60 s)" in collected.failure.reason
    assert not [line for line in said if "143" in line], said
    assert {pod["status"]["phase"] for pod in _pods(kube).values()} == {"Failed"}  # every pod had stopped
    assert [c["type"] for c in ours(kube, "Job")["job-1"]["status"]["conditions"]] == ["FailureTarget", "Failed"]


def _started_long_ago(kube: KubeStandIn) -> None:
    found = kube.server.objects[cluster.kube_key("Job", "job-1")]
    found["status"] = {**found.raw["status"], "startTime": "2020-01-01T00:00:00Z"}


# ----------------------------------------------------------------------------- an eviction's grace
def test_a_pod_in_its_eviction_grace_is_being_replaced_not_the_end_of_the_job(kube: KubeStandIn,
                                                                              tmp_path: Path) -> None:
    """Finding 10. The Eviction API sets DisruptionTarget, then deletes the pod gracefully
    (pkg/registry/core/pod/storage/eviction.go, ``addConditionAndDeletePod``): training exits 143
    on SIGTERM while the native sidecars run on, and the phase stays Running. The Job controller
    acts only once the pod is Failed (a Job with a podFailurePolicy defaults podReplacementPolicy
    to Failed, pkg/apis/batch/v1/defaults.go), and the policy's first rule then counts it
    (pkg/controller/job/pod_failure_policy.go): a one-pod job with retries left is being
    replaced all that time, and the wait goes on to the replacement's end."""
    kube.server.control.scripts["job-1"] = [*TRAIN_SCRIPT, "evicting"]
    kube.server.control.replacement_scripts["job-1"] = [*TRAIN_SCRIPT, "succeeded"]
    backend = make_backend()
    submit(tmp_path, job_request(), backend)
    said: list[str] = []
    collected = verbs.collect("job-1", backend, store_in(tmp_path), poll_seconds=0.01, say=said.append)
    assert collected.state == "COMPLETE", collected
    grace = [line for line in said if "once it has stopped" in line]
    assert grace and "the pod was disrupted (EvictionByEvictionAPI" in grace[0] and "replaces it" in grace[0], said
    assert len(_pods(kube)) == 2


@pytest.mark.parametrize(("shape", "replacement", "why"), [
    ({"gpus": 1, "disruption_retries": 1}, [*TRAIN_SCRIPT, "evicting"], "started again 1 times after disruptions"),
    ({"gpus": 8, "nodes": 2}, None, "a replacement rank cannot rejoin the running rendezvous")],
    ids=["retries-spent", "multi-node"])
def test_an_eviction_grace_with_no_replacement_to_come_ends_the_job(kube: KubeStandIn, tmp_path: Path,
                                                                    shape: dict, replacement: list[str] | None,
                                                                    why: str) -> None:
    """Finding 10: the grace of a pod the Job controller will not replace — the retries are
    spent (``backoffLimit``), or a rank of a multi-node job — is still the job's end."""
    kube.server.control.scripts["job-1"] = [*TRAIN_SCRIPT, "evicting"]
    if replacement is not None:
        kube.server.control.replacement_scripts["job-1"] = replacement
    backend = make_backend()
    submit(tmp_path, job_request(compute_shape=shape), backend)
    collected = verbs.collect("job-1", backend, store_in(tmp_path), poll_seconds=0.01)
    assert collected.state == "ERROR" and collected.failure is not None, collected
    assert "the pod was disrupted" in collected.failure.reason and why in collected.failure.suggestion
    assert len(_pods(kube)) == 2


# ----------------------------------------------------------------------------- the kubelet's own evictions
@pytest.mark.parametrize(("step", "shape", "said", "fix"), [
    ("results-evicted", {"gpus": 1}, 'Usage of EmptyDir volume "results" exceeds the limit "20Gi"',
     "raise outputs.results_limit"),
    ("storage-evicted", {"gpus": 1, "ephemeral_storage": "10Gi"},
     "Pod ephemeral local storage usage exceeds the total limit of containers",
     "raise compute_shape.ephemeral_storage")],
    ids=["results-volume", "pod-disk"])
def test_a_kubelet_eviction_for_local_storage_is_the_infrastructures_never_an_oom_kill(
        kube: KubeStandIn, tmp_path: Path, step: str, shape: dict, said: str, fix: str) -> None:
    """Finding 16. The kubelet evicts a pod whose emptyDir passes its sizeLimit, or whose disk use
    passes its containers' ephemeral-storage limits, with no grace
    (pkg/kubelet/eviction/eviction_manager.go: ``emptyDirLimitEviction``,
    ``podEphemeralStorageLimitEviction``): its containers exit 137, which reads as an OOM kill;
    the pod is Failed, reason Evicted, with the kubelet's message — and no DisruptionTarget
    (``evictPod`` is given no condition there), so nothing runs it again either. The results
    volume's limit is the request's results_limit (20Gi by default)."""
    kube.server.control.scripts["job-1"] = [*TRAIN_SCRIPT, step]
    backend = make_backend()
    submit(tmp_path, job_request(compute_shape=shape), backend)
    collected = verbs.collect("job-1", backend, store_in(tmp_path), poll_seconds=0.01)
    assert collected.state == "ERROR" and collected.failure is not None, collected
    failure = collected.failure
    assert failure.err_class == "ERR_INFRA" and "the kubelet evicted the pod" in failure.reason, failure
    assert said in failure.reason and fix in failure.suggestion
    assert "OOMKilled" not in failure.reason and "batch size" not in failure.suggestion
    assert len(_pods(kube)) == 1


# ----------------------------------------------------------------------------- the collective probe
def _probe_jobs(kube: KubeStandIn) -> list[str]:
    """Every collective probe Job the backend made, the deleted ones too."""
    return [name for (resource, _, name), _ in kube.server.objects.items()
            if resource == RESOURCES["Job"] and "-probe-" in name]


def test_a_multi_node_gpu_job_probes_its_collectives_first_and_later_jobs_skip_a_passed_probe(
        kube: KubeStandIn, tmp_path: Path) -> None:
    """Two pods on two nodes all-reduce before the training Job exists (no GPU of it held); the
    probe's objects are deleted, and its pass is remembered for this image and placement."""
    said: list[str] = []
    submit(tmp_path, job_request(compute_shape={"gpus": 8, "nodes": 2}), make_backend(said))
    assert len(_probe_jobs(kube)) == 1 and any("the collective probe passed: 2 nodes all-reduced over nccl" in line
                                               for line in said), said
    assert not [name for name in kube.server.alive("Job", "tao") if "probe" in name]
    assert "probe-job-1" not in kube.server.alive("Service", "tao")
    cached = [name for name in kube.server.alive("ConfigMap", "tao") if name.startswith("tao-data-io-probe-")]
    assert len(cached) == 1
    submit(tmp_path / "second", job_request(job_id="job-2", compute_shape={"gpus": 8, "nodes": 2}), make_backend(said))
    assert len(_probe_jobs(kube)) == 1 and any("passed before" in line for line in said)
    nccl = job_request(job_id="job-3", compute_shape={"gpus": 8, "nodes": 2},
                       environment={"NCCL_SOCKET_IFNAME": "eth1"})
    submit(tmp_path / "third", nccl, make_backend())
    assert len(_probe_jobs(kube)) == 2  # other NCCL settings: probed again


def test_a_hanging_collective_probe_refuses_the_submit_naming_the_nccl_settings_to_try(kube: KubeStandIn,
                                                                                     tmp_path: Path) -> None:
    from tao_data_io.backends.kubernetes.names import object_names

    kube.server.control.scripts[object_names("job-1").probe] = ["pulling", "running", "probe-hang"]
    with pytest.raises(UsageError, match="rank 0 hung in the rendezvous.*NCCL_SOCKET_IFNAME.*NCCL_IB_DISABLE=1"):
        submit(tmp_path, job_request(compute_shape={"gpus": 8, "nodes": 2}), make_backend())
    assert "job-1" not in ours(kube, "Job") and not [n for n in kube.server.alive("Job", "tao") if "probe" in n]
    assert not [n for n in kube.server.alive("ConfigMap", "tao") if n.startswith("tao-data-io-probe-")]


def test_no_collective_probe_without_gpus_one_node_or_when_the_target_turns_it_off(kube: KubeStandIn,
                                                                                  tmp_path: Path) -> None:
    submit(tmp_path / "a", job_request(job_id="one-node"), make_backend())
    submit(tmp_path / "b", job_request(job_id="cpu", compute_shape={"gpus": 0, "nodes": 2}), make_backend())
    submit(tmp_path / "c", job_request(job_id="off", compute_shape={"gpus": 8, "nodes": 2}),
           make_backend(collective_probe=False))
    assert _probe_jobs(kube) == []


def test_a_pod_disrupted_before_its_verdict_is_replaced_not_taken_for_a_failed_verify(kube: KubeStandIn,
                                                                                   tmp_path: Path) -> None:
    """Preemption is likeliest while the pod stages its inputs (hours in tier C): the verify wait
    must leave a disrupted pod to the Job controller, which replaces it."""
    kube.server.control.scripts["job-1"] = ["pulling", "staging", "disrupted-while-staging"]
    kube.server.control.replacement_scripts["job-1"] = [*TRAIN_SCRIPT, "succeeded"]
    done = submit(tmp_path, job_request(), make_backend())
    assert done.verdict.ok and store_in(tmp_path).get("job-1").state == "RUNNING"
    assert len(_pods(kube)) == 2
