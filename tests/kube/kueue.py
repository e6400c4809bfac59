"""The stand-in's Kueue: its Job webhook, the Workload it keeps for each Job it holds, its
admission and its eviction, as kubernetes-sigs/kueue does them — enough for the backend's reads of
a LocalQueue and of a Workload to meet what a cluster with Kueue answers.

* **Webhook** (``pkg/controller/jobframework/defaults.go``): a Job with no queue label gets the
  LocalQueue ``default`` when one exists in its namespace (``ApplyDefaultLocalQueue``); a Job
  with a queue label — or any Job, under ``manageJobsWithoutQueueName`` — is made suspended
  (``ApplyDefaultForSuspend``).
* **Workload** (``pkg/controller/jobframework/reconciler.go``): named after the Job, labelled
  ``kueue.x-k8s.io/job-uid``, owned by the Job, one pod set ``main`` of ``completions`` pods.
* **Admission**: a missing LocalQueue leaves ``QuotaReserved`` False, "LocalQueue q doesn't
  exist" (``getQueueBlocker``, ``pkg/controller/core/workload_controller.go``); a requested
  resource no resource group of the ClusterQueue covers, and no ``excludeResourcePrefixes`` entry
  drops, leaves it False with "couldn't assign flavors to pod set main: resource R unavailable in
  ClusterQueue" (``findFlavorForPodSets``, ``pkg/scheduler/flavorassigner/flavorassigner.go``);
  otherwise, when the quota has room, ``QuotaReserved`` and ``Admitted`` hold and the Job is
  resumed.
* **Eviction** (``pkg/controller/core/workload_controller.go``; PodsReadyTimeout, preemption):
  the Workload gets ``Evicted`` and loses its admission, the Job is suspended again (its pods
  are the Job controller's to delete), and ``requeueState.count`` grows.
* **LocalQueue status** (``filterLocalQueueUsage``, ``pkg/cache/scheduler/cache.go``): every
  covered resource of every flavor, with its reserved total.

A cluster without Kueue is one where :meth:`Kueue.install` was never called: its resources 404.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import kmock
from kubernetes.utils.quantity import parse_quantity

LOCAL_QUEUES = kmock.resource("kueue.x-k8s.io", "v1beta1", "localqueues")
WORKLOADS = kmock.resource("kueue.x-k8s.io", "v1beta1", "workloads")
JOBS = kmock.resource("batch", "v1", "jobs")
#: The pod set name Kueue's batch/Job integration gives a Job's pods.
POD_SET = "main"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"  # pkg/controller/constants: QueueLabel
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"  # JobUIDLabel


@dataclass
class Kueue:
    #: ClusterQueue name → the resources its resource groups cover (one flavor, ``default-flavor``).
    cluster_queues: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: The controller configuration's ``resources.excludeResourcePrefixes``.
    excluded_prefixes: tuple[str, ...] = ()
    #: The configuration's ``manageJobsWithoutQueueName`` (every namespace is managed here).
    manage_jobs_without_queue_name: bool = False
    #: Whether the quota has room now: a Workload that can be admitted is, when its Job is next read.
    room: bool = True

    def install(self, server: Any) -> None:
        """The CRDs and the controller: from now on LocalQueues and Workloads are served."""
        server.resources[LOCAL_QUEUES] = {}
        server.resources[WORKLOADS] = {}
        server.kueue = self

    def local_queue(self, server: Any, namespace: str, name: str, cluster_queue: str) -> None:
        covered = self.cluster_queues.get(cluster_queue)
        status: dict[str, Any] = {"pendingWorkloads": 0, "reservingWorkloads": 0, "admittedWorkloads": 0}
        if covered is None:
            status["conditions"] = [{"type": "Active", "status": "False", "reason": "ClusterQueueDoesNotExist",
                                     "message": "Can't submit new workloads to clusterQueue"}]
        else:
            status["conditions"] = [{"type": "Active", "status": "True", "reason": "Ready",
                                     "message": "Can submit new workloads to localQueue"}]
            status["flavorsReservation"] = [{"name": "default-flavor", "resources": [
                {"name": resource, "total": "0"} for resource in sorted(covered)]}]
        server.store({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue",
                      "metadata": {"name": name, "namespace": namespace},
                      "spec": {"clusterQueue": cluster_queue}, "status": status}, LOCAL_QUEUES)

    # ----------------------------------------------------------------- the webhook
    def default(self, server: Any, namespace: str, job: dict[str, Any]) -> None:
        """Kueue's mutating webhook for batch/v1 Jobs, on create."""
        labels = job.setdefault("metadata", {}).setdefault("labels", {})
        if QUEUE_LABEL not in labels and _local_queue(server, namespace, "default") is not None:
            labels[QUEUE_LABEL] = "default"
        if QUEUE_LABEL in labels or self.manage_jobs_without_queue_name:
            job.setdefault("spec", {})["suspend"] = True

    # ----------------------------------------------------------------- the controllers
    def reconcile(self, server: Any, namespace: str, name: str) -> None:
        """A look at one Job: its Workload made or judged, and the Job resumed once admitted."""
        key = (JOBS, namespace, name)
        if key not in server.objects or server.objects[key].deleted:
            return
        job = server.objects[key].raw
        queue = job["metadata"].get("labels", {}).get(QUEUE_LABEL)
        if queue is None and not self.manage_jobs_without_queue_name:
            return
        workload = self._workload(server, job, queue)
        if not job["spec"].get("suspend") or _holds(workload, "Evicted"):
            return
        blocker = self._blocker(server, namespace, queue, job)
        if blocker is not None:
            _set(workload, "QuotaReserved", "False", *blocker)
        elif self.room:
            _set(workload, "QuotaReserved", "True", "QuotaReserved", "Quota reserved in ClusterQueue")
            _set(workload, "Admitted", "True", "Admitted", "The workload is admitted")
            job["spec"]["suspend"] = False
        else:
            _set(workload, "QuotaReserved", "False", "Pending", "couldn't assign flavors to pod set main: "
                 "insufficient unused quota in cohort")

    def evict(self, server: Any, namespace: str, name: str, reason: str, message: str) -> None:
        """Kueue takes an admitted Job back: suspended again, its Workload evicted and requeued."""
        job = server.objects[JOBS, namespace, name].raw
        workload = self._workload(server, job, job["metadata"].get("labels", {}).get(QUEUE_LABEL))
        _set(workload, "Evicted", "True", reason, message)
        _set(workload, "QuotaReserved", "False", "Pending", message)
        _set(workload, "Admitted", "False", "NoReservation", "The workload has no reservation")
        requeue = workload["status"].setdefault("requeueState", {"count": 0})
        requeue["count"] += 1
        job["spec"]["suspend"] = True

    def readmit(self, server: Any, namespace: str, name: str) -> None:
        """The requeued Workload's backoff ended: it competes for admission again."""
        job = server.objects[JOBS, namespace, name].raw
        workload = self._workload(server, job, job["metadata"].get("labels", {}).get(QUEUE_LABEL))
        workload["status"]["conditions"] = [c for c in workload["status"]["conditions"] if c["type"] != "Evicted"]

    def _workload(self, server: Any, job: dict[str, Any], queue: str | None) -> dict[str, Any]:
        meta = job["metadata"]
        name = f"job-{meta['name']}-{hashlib.sha256(meta['uid'].encode()).hexdigest()[:5]}"
        key = (WORKLOADS, meta["namespace"], name)
        if key not in server.objects or server.objects[key].deleted:
            server.store({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload", "metadata": {
                "name": name, "namespace": meta["namespace"], "labels": {JOB_UID_LABEL: meta["uid"]},
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"], "uid": meta["uid"],
                                     "controller": True, "blockOwnerDeletion": True}]},
                "spec": {"queueName": queue or "", "podSets": [{
                    "name": POD_SET, "count": int(job["spec"].get("completions") or 1),
                    "template": job["spec"]["template"]}]},
                "status": {"conditions": []}}, WORKLOADS)
        return server.objects[key].raw

    def _blocker(self, server: Any, namespace: str, queue: str | None,
                 job: dict[str, Any]) -> tuple[str, str] | None:
        local = _local_queue(server, namespace, queue or "")
        if local is None:
            return "Inadmissible", f"LocalQueue {queue} doesn't exist"
        covered = self.cluster_queues.get(local["spec"]["clusterQueue"])
        if covered is None:
            return "Inadmissible", f"ClusterQueue {local['spec']['clusterQueue']} doesn't exist"
        for resource in sorted(pod_requests(job["spec"]["template"])):
            if resource not in covered and not resource.startswith(self.excluded_prefixes or ("\0",)):
                return "Pending", (f"couldn't assign flavors to pod set {POD_SET}: resource {resource} unavailable "
                                   "in ClusterQueue")
        return None


def pod_requests(template: dict[str, Any]) -> set[str]:
    """The resources a pod set asks for, as ``k8s.io/component-helpers/resource`` ``PodRequests``
    sums them (containers and sidecars, or an init container's own), limits standing in for
    missing requests (Kueue's ``UseLimitsAsMissingRequestsInPod``): only which are non-zero matters here."""
    spec = template["spec"]
    names: set[str] = set()
    for container in [*spec.get("containers", []), *spec.get("initContainers", [])]:
        resources = container.get("resources") or {}
        for name, value in {**(resources.get("limits") or {}), **(resources.get("requests") or {})}.items():
            if parse_quantity(value) > 0:
                names.add(name)
    return names


def _local_queue(server: Any, namespace: str, name: str) -> dict[str, Any] | None:
    key = (LOCAL_QUEUES, namespace, name)
    return server.objects[key].raw if key in server.objects and not server.objects[key].deleted else None


def _holds(workload: dict[str, Any], kind: str) -> bool:
    return any(c["type"] == kind and c["status"] == "True" for c in workload["status"]["conditions"])


def _set(workload: dict[str, Any], kind: str, status: str, reason: str, message: str) -> None:
    conditions = [c for c in workload["status"]["conditions"] if c["type"] != kind]
    workload["status"]["conditions"] = [*conditions, {"type": kind, "status": status, "reason": reason,
                                                      "message": message}]
