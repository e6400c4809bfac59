"""The stand-in's Job controller (``pkg/controller/job/job_controller.go``): a created Job gets its
pods, one per completion index; each failed pod is judged by the Job's ``podFailurePolicy``
(:func:`pod_failure_action`, ``pod_failure_policy.go``); a Job that fails has its active pods
deleted with their grace, and from 1.31 it is Failed only once none terminates (the delayed
terminal condition); a suspended Job's pods are deleted uncounted yet still judged.

:class:`JobController` holds its part of :class:`.control_plane.ControlPlane`: the methods read
and write the control plane's fields."""

from __future__ import annotations

import copy
import hashlib
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from .objects import JOBS, PODS, now

if TYPE_CHECKING:
    from .apiserver import ApiServer


#: The annotation the stand-in's Job controller puts on a pod it made to replace a failed one.
REPLACES = "standin.tao-data-io/replaces"


def pod_failure_action(policy: dict[str, Any] | None, pod: dict[str, Any]) -> tuple[str, str]:
    """What the Job controller does with a failed pod, and why (upstream
    ``pkg/controller/job/pod_failure_policy.go``, the API's ``PodFailurePolicy`` documentation):
    the rules in order, the first match wins, and without one the failure is counted. An
    ``onExitCodes`` requirement looks at every terminated container, init containers included —
    those of ``containerName`` only, when it is set — and never at an exit code of 0; an
    ``onPodConditions`` pattern matches a condition of its type and status."""
    status = pod.get("status", {})
    where = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
    for position, rule in enumerate((policy or {}).get("rules", [])):
        codes = rule.get("onExitCodes")
        for container in [*status.get("initContainerStatuses", []), *status.get("containerStatuses", [])]:
            terminated = container.get("state", {}).get("terminated")
            if codes is None or not terminated or terminated["exitCode"] == 0:
                continue
            if codes.get("containerName") not in (None, container["name"]):
                continue
            if (terminated["exitCode"] in codes["values"]) == (codes["operator"] == "In"):
                return rule["action"], (f"Container {container['name']} for pod {where} failed with exit code "
                                        f"{terminated['exitCode']} matching {rule['action']} rule at index {position}")
        for pattern in rule.get("onPodConditions") or []:
            if any(c.get("type") == pattern["type"] and c.get("status") == pattern.get("status", "True")
                   for c in status.get("conditions", [])):
                return rule["action"], (f"Pod {where} has condition {pattern['type']} matching {rule['action']} "
                                        f"rule at index {position}")
    return "Count", "no rule matched"


class JobController:
    """The Job controller's side of :class:`.control_plane.ControlPlane`."""

    def created(self, server: ApiServer, job: dict[str, Any]) -> None:
        meta = job["metadata"]
        name, namespace = meta["name"], meta["namespace"]
        if name in self.refused:
            self._event(server, namespace, "Job", meta, "FailedCreate", self.refused[name])
            return
        if job["spec"].get("suspend"):  # no pods until resumed (Kueue's admission, or an operator's patch)
            server.objects[JOBS, namespace, name]["status"] = {"conditions": [
                {"type": "Suspended", "status": "True", "reason": "JobSuspended", "message": "Job suspended"}]}
            return
        self._start_pods(server, job)

    def _start_pods(self, server: ApiServer, job: dict[str, Any]) -> None:
        meta, spec = job["metadata"], job["spec"]
        for index in range(int(spec.get("completions") or 1)):
            self._new_pod(server, job, index)
        server.objects[JOBS, meta["namespace"], meta["name"]]["status"] = {
            "active": int(spec.get("completions") or 1), "startTime": now()}

    def _new_pod(self, server: ApiServer, job: dict[str, Any], index: int, replacing: str | None = None) -> None:
        meta, spec = job["metadata"], job["spec"]
        name, namespace = meta["name"], meta["namespace"]
        indexed = spec.get("completionMode") == "Indexed"
        suffix = hashlib.sha256(f"{meta['uid']}{index}{replacing or ''}".encode()).hexdigest()[:5]
        pod_name = f"{name}-{index}-{suffix}" if indexed else f"{name}-{suffix}"
        while (PODS, namespace, pod_name) in server.objects:  # never a name used before (a suspended Job's pods)
            suffix = hashlib.sha256(suffix.encode()).hexdigest()[:5]
            pod_name = f"{name}-{index}-{suffix}" if indexed else f"{name}-{suffix}"
        template = copy.deepcopy(spec["template"])
        labels = {**template["metadata"].get("labels", {}), "batch.kubernetes.io/job-name": name, "job-name": name,
                  "batch.kubernetes.io/controller-uid": meta["uid"], "controller-uid": meta["uid"]}
        annotations = {"batch.kubernetes.io/job-completion-index": str(index)} if indexed else {}
        if replacing:
            annotations[REPLACES] = replacing
        server.store({"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": pod_name, "namespace": namespace, "labels": labels, "annotations": annotations,
            "creationTimestamp": now(),
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": meta["uid"],
                                 "controller": True, "blockOwnerDeletion": True}]},
            "spec": template["spec"], "status": {"phase": "Pending"}})

    def _job_status(self, server: ApiServer, namespace: str, name: str, *, suspended: bool = False) -> None:
        """The Job controller's verdict on the Job's pods: each failed pod is handled once, by the
        Job's ``podFailurePolicy`` (:func:`pod_failure_action`); FailJob fails the Job, a counted
        failure beyond ``backoffLimit`` fails it, so does a passed ``activeDeadlineSeconds``, and
        any other failed pod is replaced (upstream ``pkg/controller/job/job_controller.go``: a pod
        of an Indexed Job keeps its index).

        A Job that fails has its active pods deleted, each with its own grace (``deleteActivePods``;
        the kubelet ends them: :meth:`_end_gracefully`). Before 1.31 it is Failed at once. From
        1.31 (kubernetes/kubernetes#125510: ``delayTerminalCondition``, on with JobManagedBy or
        JobPodReplacementPolicy) it gets the interim FailureTarget at once and Failed, with the
        same reason, only once none of its pods is terminating (``enactJobFinished``); a
        FailureTarget once set is the verdict (``newFailedConditionForFailureTarget``). A
        ``suspended`` Job makes no pod, and the pods its suspension deleted count for nothing but
        a FailJob rule."""
        job = server.objects[JOBS, namespace, name]
        spec = job.raw["spec"]
        objs = [obj for (resource, ns, _), obj in server.objects.items() if resource == PODS and ns == namespace
                and not obj.deleted and obj.raw["metadata"]["labels"].get("batch.kubernetes.io/job-name") == name]
        pods = [obj.raw for obj in objs]
        phases = [pod["status"].get("phase") for pod in pods]
        failed = sum(1 for pod in pods if pod["status"].get("phase") == "Failed"
                     and pod["metadata"]["name"] not in self._uncounted)
        succeeded = phases.count("Succeeded")
        status: dict[str, Any] = {"startTime": job.raw.get("status", {}).get("startTime", now())}
        counted = 0
        target = next((c for c in job.raw.get("status", {}).get("conditions", []) if c["type"] == "FailureTarget"),
                      None)
        verdict: tuple[str, str] | None = (target["reason"], target["message"]) if target else None
        for pod in pods:
            if pod["status"].get("phase") != "Failed":
                continue
            action, why = pod_failure_action(spec.get("podFailurePolicy"), pod)
            if action == "FailJob":
                verdict = verdict or ("PodFailurePolicy", why)
            elif action == "Count" and pod["metadata"]["name"] not in self._uncounted:
                counted += 1
        if verdict is None and counted > int(spec.get("backoffLimit", 6)):
            verdict = ("BackoffLimitExceeded", "Job has reached the specified backoff limit")
        deadline = spec.get("activeDeadlineSeconds")
        started = datetime.fromisoformat(str(status["startTime"]).replace("Z", "+00:00"))
        if (verdict is None and deadline is not None and not suspended  # pastActiveDeadline: never while suspended
                and (datetime.now(timezone.utc) - started).total_seconds() > deadline):
            verdict = ("DeadlineExceeded", "Job was active longer than specified deadline")
        if verdict is None and not suspended:
            for pod in pods:
                pod_name = pod["metadata"]["name"]
                if (pod["status"].get("phase") == "Failed" and pod_name not in self._handled
                        and pod_name not in self._uncounted):
                    self._handled.add(pod_name)
                    index = int(pod["metadata"].get("annotations", {}).get(
                        "batch.kubernetes.io/job-completion-index", 0))
                    self._new_pod(server, job.raw, index, replacing=pod_name)
        if verdict is not None:
            terminating = self._end_active(server, objs)
            reached = ["FailureTarget", *(["Failed"] if server.minor < 31 or not terminating else [])]
            status.update(failed=failed, conditions=[
                {"type": kind, "status": "True", "reason": verdict[0], "message": verdict[1]} for kind in reached])
        elif suspended:
            status.update(active=0, conditions=[{"type": "Suspended", "status": "True", "reason": "JobSuspended",
                                                 "message": "Job suspended"}])
        elif succeeded == int(spec.get("completions") or 1):
            # Set once, as the Job controller does (a later look at a finished Job changes nothing).
            completed = job.raw.get("status", {}).get("completionTime") or now()
            status.update(succeeded=succeeded, failed=failed, completionTime=completed, conditions=[
                {"type": "SuccessCriteriaMet", "status": "True"}, {"type": "Complete", "status": "True"}])
        else:
            # A terminating pod is not active (controller.FilterActivePods).
            active = [pod for pod in pods if "deletionTimestamp" not in pod["metadata"]
                      and pod["status"].get("phase") not in ("Succeeded", "Failed")]
            status.update(active=len(active), ready=phases.count("Running"), **({"failed": failed} if failed else {}))
        job["status"] = status

    @staticmethod
    def _end_active(server: ApiServer, pods: list[Any]) -> int:
        """``deleteActivePods``: each pod of a failed Job that is still active is deleted with its
        own grace period (at once where no node runs it); how many of its pods still terminate."""
        for obj in pods:
            raw = obj.raw
            active = (raw["status"].get("phase") not in ("Succeeded", "Failed")
                      and "deletionTimestamp" not in raw["metadata"])
            if active and server._terminate(obj, None) == 0:
                obj.delete()
        return sum(1 for obj in pods if not obj.deleted and "deletionTimestamp" in obj.raw["metadata"]
                   and obj.raw["status"].get("phase") not in ("Succeeded", "Failed"))
