"""What a stopped pod reads as (issue 39, the attack pass on findings 10-16): a pod Kubernetes
stopped — a Kueue preemption or eviction, the kubelet evicting for local storage, the Job
controller ending a failed Job's pods — is judged as the Job controller will judge it
(``pkg/controller/job/job_controller.go``; the rendered ``podFailurePolicy``), never as the
command's failure, and never retried without bound; a sidecar that exits with the pod decides
nothing. Pure reads of ``pods.job_status`` and ``pods.failure_analysis`` over pod and Job objects
shaped as the API server returns them."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from tao_data_io.backends.kubernetes import pods
from tao_data_io.backends.kubernetes.render import failure_policy

NODE_LOST = "2020-01-01T00:00:00Z"


def _pod(init: dict[str, dict[str, Any]], train: dict[str, Any], phase: str = "Running", *, name: str = "p",
         index: int = 0, deleted: str | None = None, **status: Any) -> dict[str, Any]:
    """A tier C pod: its stager, results sidecar and verify probe, then train."""
    containers = [{"name": "stager", "image": "s"}, {"name": "results", "image": "s", "restartPolicy": "Always"},
                  {"name": "verify", "image": "t"}]
    meta: dict[str, Any] = {"name": name, "annotations": {pods.COMPLETION_INDEX: str(index)}}
    if deleted:
        meta["deletionTimestamp"] = deleted
    return {"metadata": meta, "spec": {"nodeName": "gpu-0", "initContainers": containers,
                                       "containers": [{"name": "train", "image": "t"}]},
            "status": {"phase": phase, "conditions": [{"type": "PodScheduled", "status": "True"}], **status,
                       "initContainerStatuses": [{"name": c["name"], "state": init.get(c["name"], _exited(0))}
                                                 for c in containers],
                       "containerStatuses": [{"name": "train", "state": train}]}}


def _exited(code: int) -> dict[str, Any]:
    return {"terminated": {"exitCode": code, "reason": "Error" if code else "Completed"}}


def _later(seconds: float) -> str:
    return (datetime.now(timezone.utc) + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _one_pod_job(failed: int = 0, **status: Any) -> dict[str, Any]:
    policy = failure_policy(_pod({}, {})["spec"])
    return {"metadata": {"name": "job-1"}, "spec": {"completions": 1, "backoffLimit": 2, "podFailurePolicy": policy},
            "status": {"active": 1, **({"failed": failed} if failed else {}), **status}}


def test_a_local_storage_eviction_is_counted_never_retried_without_bound() -> None:
    """The kubelet evicts for local storage with a one-second grace (``evictPod`` with
    ``immediateEvictionGracePeriodSeconds``; SIGTERM first, so training exits 143) and no
    DisruptionTarget: the policy must count it towards ``backoffLimit`` (an ignored failure is
    replaced forever, the results outgrowing the volume each time), and status says the eviction."""
    evicted = _pod({}, _exited(143), "Failed", reason="Evicted",
                   message='Usage of EmptyDir volume "results" exceeds the limit "20Gi". ')
    assert pods.policy_action(_one_pod_job(), evicted) == "Count"
    last = pods.job_status(_one_pod_job(failed=3, conditions=[
        {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "backoff"}]), [evicted])
    assert last.state == "ERROR" and last.err_class == "ERR_INFRA" and "evicted" in (last.message or ""), last


def test_a_stager_or_probe_stopped_by_a_kueue_eviction_does_not_fail_the_job() -> None:
    """waitForPodsReady evicts a tier C pod exactly while it stages: the stager, or the verify
    probe, exits 143 on SIGTERM, and a FailJob rule matching it would end the Job that Kueue
    meant to requeue (``getFailJobMessage`` judges the suspended Job's pods too)."""
    for stopped in ("stager", "verify"):
        pod = _pod({stopped: _exited(143), "results": {"waiting": {"reason": "PodInitializing"}}},
                   {"waiting": {"reason": "PodInitializing"}}, "Failed")
        assert pods.policy_action(_one_pod_job(), pod) != "FailJob", stopped


def test_a_training_failure_is_still_the_jobs_end_while_the_sidecars_are_stopped() -> None:
    """Once training exits non-zero the kubelet stops the native sidecars, which may exit 143:
    the failure is training's (FailJob), never taken for a stop."""
    failed = _pod({"results": _exited(143)}, _exited(2), "Failed")
    assert pods.policy_action(_one_pod_job(), failed) == "FailJob"


def test_a_pod_stuck_past_its_grace_ends_a_failed_job_instead_of_running_forever() -> None:
    """A Job its controller failed waits for its pods to stop (the final upload runs in their
    grace), but a pod past its deletionTimestamp — its node lost — will not say so: the job
    ends with the controller's reason, naming the pod that never stopped."""
    stuck = _pod({"results": {"running": {}}}, _exited(2), deleted=NODE_LOST)
    verdict = {"type": "FailureTarget", "status": "True", "reason": "PodFailurePolicy",
               "message": "Container train for pod tao/p failed with exit code 2 matching FailJob rule at index 2"}
    status = pods.job_status(_one_pod_job(conditions=[verdict]), [stuck])
    assert status.state == "ERROR", status
    waiting = pods.job_status(_one_pod_job(conditions=[verdict]), [_pod({"results": {"running": {}}}, _exited(2),
                                                                        deleted=_later(60))])
    assert waiting.state == "RUNNING" and "waiting for its pod to stop" in (waiting.message or ""), waiting


def test_a_multi_node_job_readmitted_while_its_preempted_ranks_still_stop_is_not_ended_by_them() -> None:
    """Kueue preempted a two-node Job (suspend: its pods deleted uncounted, training 143 while the
    sidecar uploads) and, once no pod is active, readmitted it; the Job controller makes the new
    ranks at once (no podFailurePolicy: podReplacementPolicy TerminatingOrFailed). The old ranks
    still stopping are not the job's end: only the Job controller's verdict would be."""
    job = {"metadata": {"name": "job-1"}, "spec": {"completions": 2, "completionMode": "Indexed", "backoffLimit": 0},
           "status": {"active": 2, "terminating": 2}}
    old = [_pod({"results": {"running": {}}}, _exited(143), name=f"old-{i}", index=i, deleted=_later(60))
           for i in range(2)]
    new = [_pod({"stager": {"running": {}}, "results": {"waiting": {"reason": "PodInitializing"}},
                 "verify": {"waiting": {"reason": "PodInitializing"}}}, {"waiting": {"reason": "PodInitializing"}},
                "Pending", name=f"new-{i}", index=i) for i in range(2)]
    status = pods.job_status(job, [*old, *new])
    assert status.state in ("PENDING", "RUNNING"), status


def test_a_one_pod_job_whose_training_was_stopped_is_being_replaced_while_retries_remain() -> None:
    """Training that Kubernetes stopped (exit 143: a deleted pod, a command whose own process
    group got the signal) is counted and replaced by the Job controller while retries remain:
    PENDING, saying so — not an ERROR the controller does not share."""
    stopped = _pod({}, _exited(143), "Failed")
    status = pods.job_status(_one_pod_job(failed=1), [stopped])
    assert status.state == "PENDING" and "replacement is being made" in (status.message or ""), status


def _plain_pod(init: dict[str, dict[str, Any]], main: dict[str, Any], phase: str = "Running",
               **status: Any) -> dict[str, Any]:
    """A pod with a stager, the results sidecar and the probe before ``train``, as :func:`_pod` without
    its completion index and node; ``init`` gives their states by name, ``main`` train's."""
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
    failed = _plain_pod({"results": {"terminated": {"exitCode": 1}}},
                        {"terminated": {"exitCode": 3, "reason": "Error"}}, phase="Failed")
    analysis = pods.failure_analysis(FAILED_JOB, [failed])
    assert analysis is not None and (analysis.err_class, analysis.reason) == ("ERR_PROGRAM", "the command exited 3")
    running = _plain_pod({"results": {"running": {}}}, {"running": {}})
    assert pods.where(running).phase == "running"


def test_an_evicted_pod_and_a_container_that_cannot_start_are_the_infrastructures() -> None:
    evicted = _plain_pod({}, {"waiting": {"reason": "ContainerCreating"}}, phase="Failed", reason="Evicted",
                         message="The node was low on resource: memory.")
    analysis = pods.failure_analysis(FAILED_JOB, [evicted])
    assert analysis is not None and analysis.err_class == "ERR_INFRA"
    assert analysis.reason == "the kubelet evicted the pod: The node was low on resource: memory."
    assert "the node ran short of a resource" in analysis.suggestion
    broken = _plain_pod({"verify": {"waiting": {"reason": "CreateContainerConfigError",
                                                "message": 'secret "job-1-credentials" not found'}}},
                        {"waiting": {"reason": "PodInitializing"}}, phase="Pending")
    status = pods.job_status({"spec": {}, "status": {"active": 1}}, [broken])
    assert (status.state, status.err_class) == ("ERROR", "ERR_INFRA")
    assert 'cannot start: CreateContainerConfigError: secret "job-1-credentials" not found' in status.message
