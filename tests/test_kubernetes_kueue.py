"""Jobs under Kueue (issue 39, findings 6, 12, 13 and 14), over the stand-in's Kueue
(:mod:`tests.kube.kueue`, each rule cited there from kubernetes-sigs/kueue): a queued job waits in
its queue with Kueue's own reason; what Kueue would never admit is said before anything is made;
a Job Kueue takes back is queued again, not ended; a Job tao-data-io made to run at once that
Kueue's webhook queued anyway is said to be Kueue's."""

from __future__ import annotations

from pathlib import Path

import pytest

from tao_data_io.errors import UsageError
from tao_data_io.backends.kubernetes.waiting import StageFailed
from tao_data_io.steps import VerifyFailed

from . import kube_cluster as cluster
from .kube.kueue import Kueue
from .kube.apiserver import KubeStandIn
from .kube_cluster import (
    NAMESPACE,
    TIER_B,
    claim,
    creates,
    job_request,
    make_backend,
    ours,
    store_in,
    submit,
)

#: The stand-in cluster and the input bucket (pytest fixtures of tests/kube_cluster.py).
kube, input_bucket = cluster.kube, cluster.input_bucket

QUEUED = {"capacity": "queued", "queue_name": "gpu-queue"}
#: What a GPU ClusterQueue of Kueue's own examples covers: no ephemeral-storage.
GPU_RESOURCES = ("cpu", "memory", "nvidia.com/gpu")


def _kueue(kube: KubeStandIn, covered: tuple[str, ...] = (*GPU_RESOURCES, "ephemeral-storage"), *,
           queue: str = "gpu-queue", **config: object) -> Kueue:
    kueue = Kueue(cluster_queues={"gpus": covered}, **config)  # type: ignore[arg-type]

    def install() -> None:
        kueue.install(kube.server)
        kueue.local_queue(kube.server, NAMESPACE, queue, "gpus")

    kube.run(install)
    return kueue


def test_a_queued_job_is_made_suspended_in_its_queue_and_runs_once_kueue_admits_it(kube: KubeStandIn,
                                                                                 tmp_path: Path) -> None:
    """Kueue owns ``suspend``: the Job is made suspended with the queue's label, reads PENDING in
    its queue until Kueue admits it, and runs once Kueue resumes it."""
    kueue = _kueue(kube, room=False)
    said: list[str] = []
    submission, plan = cluster.launch_only(tmp_path, job_request(compute_shape={"gpus": 16}),
                                       make_backend(said, priority_class="tao-high", **QUEUED))
    backend = make_backend(**QUEUED)
    message = backend.status(submission.backend_ref).message or ""
    assert message.startswith("suspended, waiting for Kueue to admit it from queue 'gpu-queue'"), message
    assert "insufficient unused quota" in message, message  # Kueue's reason, from the Workload
    job = ours(kube, "Job")["job-1"]
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue"
    assert job["spec"]["template"]["spec"]["priorityClassName"] == "tao-high"
    assert any("Kueue admits the job from queue 'gpu-queue'" in line for line in said), said
    kueue.room = True
    verdict = backend.verify(submission.backend_ref, plan)
    assert verdict.ok, verdict
    assert backend.status(submission.backend_ref).state == "RUNNING"


def test_a_queued_job_never_admitted_is_deleted_at_its_pending_timeout_saying_kueues_reason(
        kube: KubeStandIn, tmp_path: Path) -> None:
    _kueue(kube, room=False)
    with pytest.raises(VerifyFailed, match="more than pending_timeout.*insufficient unused quota"):
        submit(tmp_path, job_request(), make_backend(pending_timeout=0.05, **QUEUED))
    assert "job-1" not in ours(kube, "Job")


def test_a_resource_the_cluster_queue_does_not_cover_is_said_before_submit_and_while_it_waits(
        kube: KubeStandIn, tmp_path: Path) -> None:
    """Finding 6: tier C requests ephemeral-storage for its staging bound, and Kueue's flavor
    assigner never admits a pod set asking for a resource its ClusterQueue does not cover
    (``findFlavorForPodSets``). The LocalQueue's status names what is covered, so the preflight
    warns; the wait, and its end at pending_timeout, carry the Workload's reason."""
    _kueue(kube, GPU_RESOURCES)
    said: list[str] = []
    with pytest.raises(VerifyFailed) as info:
        submit(tmp_path, job_request(), make_backend(said, pending_timeout=0.05, **QUEUED))
    warning = next(line for line in said if "does not cover" in line)
    assert "requests ephemeral-storage, which LocalQueue tao/gpu-queue's ClusterQueue 'gpus' does not cover" in warning
    assert "excludeResourcePrefixes" in warning and "a job on a claim (tier A or B) requests none" in warning
    assert "resource ephemeral-storage unavailable in ClusterQueue" in str(info.value), info.value


def test_a_resource_kueue_is_configured_to_ignore_is_admitted_despite_the_warning(kube: KubeStandIn,
                                                                                 tmp_path: Path) -> None:
    _kueue(kube, GPU_RESOURCES, excluded_prefixes=("ephemeral-storage",))
    said: list[str] = []
    done = submit(tmp_path, job_request(), make_backend(said, pending_timeout=30, **QUEUED))
    assert done.started and any("does not cover" in line for line in said)


def test_a_queue_that_does_not_exist_is_refused_before_anything_is_made(kube: KubeStandIn, tmp_path: Path) -> None:
    """Kueue holds a Job of a missing LocalQueue suspended forever ("LocalQueue q doesn't exist",
    ``getQueueBlocker``); a cluster without Kueue never resumes it either."""
    with pytest.raises(UsageError, match="queue_name 'gpu-queue': no LocalQueue of that name in namespace 'tao'"):
        submit(tmp_path, job_request(), make_backend(**QUEUED))  # Kueue not installed
    _kueue(kube, queue="other-queue")
    with pytest.raises(UsageError, match="create the LocalQueue, or set queue_name to one that exists"):
        submit(tmp_path, job_request(), make_backend(**QUEUED))
    assert creates(kube) == []


def test_the_access_gate_asks_for_what_a_queued_job_reads_of_kueue(kube: KubeStandIn, tmp_path: Path) -> None:
    _kueue(kube)
    kube.server.rbac.revoke("list", "kueue.x-k8s.io", "workloads")
    with pytest.raises(UsageError, match="list workloads.kueue.x-k8s.io"):
        submit(tmp_path, job_request(), make_backend(**QUEUED))
    assert creates(kube) == []


def test_a_long_stage_under_kueues_readiness_timeout_is_warned(kube: KubeStandIn, tmp_path: Path) -> None:
    """Finding 13: Kueue evicts a Workload whose pods are not Ready within waitForPodsReady's
    timeout (30 min by default) and requeues it, and a tier C pod is not Ready until it has
    staged: a staging bound past that is warned of."""
    _kueue(kube)
    said: list[str] = []
    request = job_request(compute_shape={"gpus": 1, "ephemeral_storage": "40Gi"})
    cluster.launch_only(tmp_path, request, make_backend(said, pending_timeout=30, **QUEUED))
    warning = next(line for line in said if "waitForPodsReady" in line)
    assert "before it is Ready" in warning and "each requeue stages again" in warning


def test_a_job_kueue_takes_back_is_queued_again_not_ended(kube: KubeStandIn, tmp_path: Path) -> None:
    """Findings 12 and 13: an eviction (PodsReadyTimeout, a preemption) suspends the Job again;
    its pods are deleted and exit 143, which is not the command's failure: the job is PENDING,
    with Kueue's reason, and runs again once readmitted."""
    kueue = _kueue(kube)
    done = submit(tmp_path, job_request(), make_backend(pending_timeout=30, **QUEUED))
    backend = make_backend(**QUEUED)
    assert backend.status(done.backend_ref).state == "RUNNING"
    kube.run(lambda: kueue.evict(kube.server, NAMESPACE, "job-1", "PodsReadyTimeout",
                                 "Exceeded the PodsReady timeout tao/job-job-1"))
    status = backend.status(done.backend_ref)
    assert status.state == "PENDING", status
    assert "Kueue evicted it (PodsReadyTimeout): Exceeded the PodsReady timeout" in (status.message or "")
    kube.run(lambda: kueue.readmit(kube.server, NAMESPACE, "job-1"))
    backend.status(done.backend_ref)  # Kueue resumes it; the Job controller makes its pods
    assert backend.status(done.backend_ref).state in ("PENDING", "RUNNING")
    assert cluster.ours(kube, "Pod"), "the readmitted Job has pods again"


def test_a_stage_job_kueues_webhook_queues_waits_saying_it_is_kueues(kube: KubeStandIn, tmp_path: Path) -> None:
    """Finding 14: with a LocalQueue named ``default`` in the namespace, Kueue's webhook labels and
    suspends every Job (``ApplyDefaultLocalQueue``, ``ApplyDefaultForSuspend``) — the tier B
    stage Job too, which tao-data-io made to run at once. Its wait says so and names the way
    out; once Kueue admits it, staging goes on."""
    kueue = _kueue(kube, queue="default", room=False)
    kube.server.store(claim())
    with pytest.raises(StageFailed) as info:
        submit(tmp_path, job_request(**TIER_B), make_backend(verify_timeout=0.05))
    message = str(info.value)
    assert "suspended, waiting for Kueue to admit it from queue 'default'" in message, message
    assert "Kueue's webhook queued it" in message and "managedJobsNamespaceSelector" in message
    kueue.room = True
    done = submit(tmp_path / "again", job_request(job_id="job-2", **TIER_B), make_backend())
    assert done.started and store_in(tmp_path / "again").get("job-2").state == "RUNNING"


def test_a_kueue_preemption_of_a_one_pod_job_requeues_it_and_never_fails_it(kube: KubeStandIn,
                                                                          tmp_path: Path) -> None:
    """Finding 12: Kueue preempts by suspending the Job; the Job controller deletes its pods
    without a DisruptionTarget, and though it never counts them, ``getFailJobMessage`` still
    judges each by the podFailurePolicy (pkg/controller/job/job_controller.go). Training stopped
    by SIGTERM must not match a FailJob rule: the Job stays, suspended, and runs again once
    readmitted."""
    kueue = _kueue(kube)
    done = submit(tmp_path, job_request(), make_backend(pending_timeout=30, **QUEUED))
    backend = make_backend(**QUEUED)
    while "train is running" not in (backend.status(done.backend_ref).message or ""):
        pass  # a look at a time, until training runs
    kube.run(lambda: kueue.evict(kube.server, NAMESPACE, "job-1", "Preempted",
                                 "Preempted to accommodate a workload (UID: 1234) due to prioritization in the "
                                 "ClusterQueue"))
    for _ in range(4):  # the pods stop over a few looks: training first, then the sidecars
        status = backend.status(done.backend_ref)
    job = kube.server.alive("Job", NAMESPACE)["job-1"]
    assert not any(c["type"] in ("Failed", "FailureTarget") for c in job["status"].get("conditions", [])), job["status"]
    assert status.state == "PENDING" and "Kueue evicted it (Preempted)" in (status.message or ""), status
    kube.run(lambda: kueue.readmit(kube.server, NAMESPACE, "job-1"))
    backend.status(done.backend_ref)
    assert backend.status(done.backend_ref).state in ("PENDING", "RUNNING")


def test_a_job_suspended_by_hand_where_kueue_holds_nothing_is_not_said_to_be_kueues(kube: KubeStandIn,
                                                                                   tmp_path: Path) -> None:
    """A Job someone suspended (``kubectl patch … suspend: true``) on a cluster without Kueue has no
    Workload: its status says it is suspended and how to resume it, never Kueue's queue or the
    namespace selector of a Kueue that is not there."""
    done = submit(tmp_path, job_request(), make_backend())
    kube.run(lambda: kube.server.objects[cluster.kube_key("Job", "job-1")].raw["spec"].update(suspend=True))
    status = make_backend().status(done.backend_ref)
    assert status.state == "PENDING" and "Kueue" not in (status.message or ""), status
    assert '"suspend":false' in (status.message or "") and "cancel" in (status.message or ""), status


def test_what_kueue_says_is_cut_to_a_line_a_status_can_carry(kube: KubeStandIn, tmp_path: Path) -> None:
    kueue = _kueue(kube, room=False)
    submission, _ = cluster.launch_only(tmp_path, job_request(), make_backend(**QUEUED))
    kube.run(lambda: kueue.evict(kube.server, NAMESPACE, "job-1", "Preempted", "x" * 1_000_000))
    message = make_backend(**QUEUED).status(submission.backend_ref).message or ""
    assert "Kueue evicted it (Preempted)" in message and len(message) < 2000, len(message)
