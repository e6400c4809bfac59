"""What Kueue says about a job: whether its LocalQueue can ever admit the training pod, and why a
Job it holds suspended waits.

Why read Kueue at all: a Job Kueue holds is only ``suspend: true`` with no pod, and the reason it
is not admitted lives on its Workload (kueue.x-k8s.io/v1beta1, named after the Job, labelled
``kueue.x-k8s.io/job-uid``), in the ``QuotaReserved`` condition's message. Some reasons never
pass by themselves: the flavor assigner refuses a pod set that requests a resource none of the
ClusterQueue's resource groups covers ("resource ephemeral-storage unavailable in ClusterQueue",
``pkg/scheduler/flavorassigner/flavorassigner.go``, ``findFlavorForPodSets``) unless the
controller's configuration excludes it (``resources.excludeResourcePrefixes``), and a tier C pod
requests ``ephemeral-storage`` for its staging bound. Without the Workload's word the job reads
"waiting for Kueue" until ``pending_timeout`` deletes it, the cause unread.

The LocalQueue's status lists, for every flavor of its ClusterQueue, each resource the
ClusterQueue covers (``flavorsReservation``, zero totals included: ``filterLocalQueueUsage`` in
``pkg/cache/scheduler/cache.go``), so the preflight can compare it with what the pod requests
without a cluster-scoped read of the ClusterQueue. Kueue's configuration is not readable from a
job's namespace, so an uncovered resource is a warning that names the exclusion, not a refusal.

Kueue can also take Jobs the project did not queue: its webhook labels a Job with the LocalQueue
``default`` when one exists in the namespace (``ApplyDefaultLocalQueue``) and suspends every Job
of a managed namespace when ``manageJobsWithoutQueueName`` is on (``ApplyDefaultForSuspend``,
both ``pkg/controller/jobframework/defaults.go``). A stage or probe Job then waits for admission
like a training Job, and the wait is said to be Kueue's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes.utils.quantity import parse_quantity

from ...errors import UsageError
from ...reporting import human_size
from ...tier import TIER_C_BYTES_PER_SECOND
from .api import Api, ApiError

GROUP, VERSION = "kueue.x-k8s.io", "v1beta1"
#: The label Kueue reads a Job's LocalQueue from (the renderer sets it; Kueue's webhook may default it).
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
#: The label Kueue puts on a Job's Workload: the Job's uid (``pkg/controller/constants``, JobUIDLabel).
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
#: How much of Kueue's word a status carries (a condition message may be 32 KiB).
REASON_CHARS = 500
#: Kueue's default ``waitForPodsReady.timeout`` (``DefaultWaitForPodsReadyTimeout``).
PODS_READY_MINUTES = 30


def queue_of(job: Mapping[str, Any]) -> str | None:
    return ((job.get("metadata") or {}).get("labels") or {}).get(QUEUE_LABEL)


def held(job: Mapping[str, Any]) -> bool:
    """Whether the Job is suspended: by Kueue until it admits the Job, or again after an eviction."""
    return bool((job.get("spec") or {}).get("suspend"))


def hold_text(api: Api, job: Mapping[str, Any], *, queued: bool) -> str:
    """What a suspended Job waits for, from its Workload when Kueue keeps one: Kueue's reason
    (``queued``: whether tao-data-io queued it — a Job it made to run at once that Kueue's webhook
    took anyway is said to be so, with the way out). No Workload and no queue label: someone else
    suspended it (by hand, or a render applied as is), and it waits for them."""
    meta = job.get("metadata") or {}
    queue, name = queue_of(job), meta.get("name", "")
    workload = _workload(api, job)
    if workload is None and queue is None:
        return (f"suspended (spec.suspend), and no queue holds it: resume it with kubectl patch job {name} "
                "-p '{\"spec\":{\"suspend\":false}}', or cancel it")
    text = (f"suspended, waiting for Kueue to admit it from queue {queue!r}" if queue else
            "suspended by Kueue (manageJobsWithoutQueueName), waiting for it to admit the Job")
    if workload is None:
        text += " (Kueue has made no Workload for it yet: if that lasts, Kueue is not installed or not managing it)"
    if not queued:
        text += (f" (tao-data-io made this Job to run at once; Kueue's webhook queued it, as it does every Job of a "
                 f"namespace with a LocalQueue named 'default' or under manageJobsWithoutQueueName: the wait counts "
                 f"against verify_timeout; ask the admin to leave namespace {meta.get('namespace', '')!r} out of "
                 "Kueue's managedJobsNamespaceSelector, or raise verify_timeout)")
    said = _reason(workload) if workload is not None else None
    return text + (f": {said}" if said else "")


def _workload(api: Api, job: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The Job's Workload (labelled with the Job's uid, ``JobUIDLabel``), or None: none yet, Kueue
    not installed (404), or a Role without the grant (403: the Job's own word stands)."""
    meta = job.get("metadata") or {}
    namespace, uid = meta.get("namespace", api.namespace), meta.get("uid")
    if not uid:
        return None
    try:
        found = api.call(f"listing the Workloads of Job {namespace}/{meta.get('name')}",
                         api.custom.list_namespaced_custom_object, GROUP, VERSION, namespace, "workloads",
                         label_selector=f"{JOB_UID_LABEL}={uid}")
    except ApiError as exc:
        if exc.status in (403, 404):
            return None
        raise
    items = found.get("items") if isinstance(found, Mapping) else None
    return next((item for item in items or [] if isinstance(item, Mapping)), None)


def _reason(workload: Mapping[str, Any]) -> str | None:
    """Why Kueue has not admitted the Job, or why it took it back, in Kueue's words, cut to a line:
    the Workload's Evicted message (preempted, not ready in time…) or its QuotaReserved=False one
    ("couldn't assign flavors…", "LocalQueue q doesn't exist")."""
    listed = (workload.get("status") or {}).get("conditions") if isinstance(workload.get("status"), Mapping) else None
    conditions = {c.get("type"): c for c in listed if isinstance(c, Mapping)} if isinstance(listed, list) else {}
    evicted, reserved = conditions.get("Evicted") or {}, conditions.get("QuotaReserved") or {}
    if evicted.get("status") == "True":
        said = f"Kueue evicted it ({evicted.get('reason')}): {evicted.get('message', '')}".rstrip(": ")
    elif reserved.get("status") == "False" and reserved.get("message"):
        said = f"Kueue: {reserved['message']}"
    else:
        return None
    if len(said) <= REASON_CHARS:
        return said
    return said[:REASON_CHARS] + f"… ({len(said) - REASON_CHARS} more characters)"


def check_queue(api: Api, queue: str, pod: Mapping[str, Any]) -> list[str]:
    """Refuse a LocalQueue that does not exist (Kueue would hold the Job suspended forever);
    warn of each resource the pod requests that the queue's ClusterQueue does not cover."""
    namespace = api.namespace
    try:
        local = api.call(f"reading LocalQueue {namespace}/{queue}", api.custom.get_namespaced_custom_object,
                         GROUP, VERSION, namespace, "localqueues", queue)
    except ApiError as exc:
        if exc.status == 403:
            raise UsageError(f"queue_name {queue!r}: this identity may not read LocalQueues in namespace "
                             f"{namespace!r}, which the preflight does to see what the queue admits; ask the "
                             "cluster's admin for get on localqueues.kueue.x-k8s.io (deployments/"
                             "kubernetes-rbac.yaml grants it)") from None
        if exc.status != 404:
            raise
        raise UsageError(f"queue_name {queue!r}: no LocalQueue of that name in namespace {namespace!r} (or Kueue is "
                         "not installed), so Kueue would hold the Job suspended forever; create the LocalQueue, or "
                         "set queue_name to one that exists (kubectl get localqueues)") from None
    status = local.get("status") or {}
    cluster_queue = (local.get("spec") or {}).get("clusterQueue", "?")
    inactive = next((c for c in status.get("conditions") or [] if c.get("type") == "Active"
                     and c.get("status") == "False"), None)
    if inactive is not None:
        return [f"LocalQueue {namespace}/{queue} is not active ({inactive.get('reason')}: "
                f"{inactive.get('message', '')}): Kueue admits nothing from it until its ClusterQueue "
                f"{cluster_queue!r} is"]
    asked = requested(pod)
    warnings = _readiness(asked.get("ephemeral-storage", 0.0))
    covered = {r.get("name") for flavor in status.get("flavorsReservation") or []
               for r in flavor.get("resources") or []}
    missing = sorted(set(asked) - covered) if covered else []  # none reported yet: the Workload will say
    if not missing:
        return warnings
    return [*warnings, f"the job's pod requests {', '.join(missing)}, which LocalQueue {namespace}/{queue}'s "
            f"ClusterQueue {cluster_queue!r} does not cover (it covers {', '.join(sorted(covered))}): Kueue leaves "
            f"such a workload pending ('resource {missing[0]} unavailable in ClusterQueue') unless its configuration's "
            "resources.excludeResourcePrefixes names it; ask the admin to cover it in the ClusterQueue or exclude "
            "it" + ("; a job on a claim (tier A or B) requests none unless compute_shape.ephemeral_storage sets it"
                    if "ephemeral-storage" in missing else "")]


def _readiness(staged: float) -> list[str]:
    """Kueue evicts a Workload whose pods are not all Ready within ``waitForPodsReady.timeout`` of
    admission (on by default, 30 minutes: ``apis/config/v1beta2/defaults.go``), then requeues it;
    a tier C pod is not Ready until its stager has fetched every input, and each requeue stages
    again from nothing, so a staging bound that takes longer than that never runs."""
    minutes = staged / TIER_C_BYTES_PER_SECOND / 60
    if minutes <= PODS_READY_MINUTES:
        return []
    return [f"the pod stages up to {human_size(int(staged))} before it is Ready, about {minutes:.0f} min at "
            f"{human_size(TIER_C_BYTES_PER_SECOND)}/s: Kueue evicts and requeues a workload whose pods are not Ready "
            f"within waitForPodsReady.timeout ({PODS_READY_MINUTES} min unless its configuration says otherwise), and "
            "each requeue stages again; ask the admin for a longer timeout, or put the inputs on a claim first "
            "(tier A: mounts from pvc_claim, no staging in the pod)"]


def requested(pod: Mapping[str, Any]) -> dict[str, float]:
    """What Kueue counts for one pod (``totalRequestsFromPodSets`` in ``pkg/workload/workload.go``,
    through ``k8s.io/component-helpers/resource`` ``PodRequests``): the containers' sum, sidecars
    included, or any init container's own when larger, per resource; a limit without a request
    counts as the request (Kueue's ``AdjustResources`` uses limits as missing requests)."""
    def asks(container: Mapping[str, Any]) -> dict[str, float]:
        resources = container.get("resources") or {}
        merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        return {name: float(parse_quantity(value)) for name, value in merged.items()}

    spec = pod.get("spec", pod)
    sidecars = [c for c in spec.get("initContainers") or [] if c.get("restartPolicy") == "Always"]
    total: dict[str, float] = {}
    for container in [*(spec.get("containers") or []), *sidecars]:
        for name, amount in asks(container).items():
            total[name] = total.get(name, 0.0) + amount
    for container in spec.get("initContainers") or []:
        if container.get("restartPolicy") != "Always":
            for name, amount in asks(container).items():
                total[name] = max(total.get(name, 0.0), amount)
    return {name: amount for name, amount in total.items() if amount > 0}
