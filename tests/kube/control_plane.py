"""The stand-in's control plane: what a test scripts (each Job's pods' steps, the probe's failures,
the volumes), and one look at a Job — Kueue's controllers, then the kubelet's step for each pod,
then the Job controller's verdict (:meth:`ControlPlane.advance`)."""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .job_controller import REPLACES, JobController
from .kubelet import GPU_UNSCHEDULABLE, PROBE_SCRIPT, STAGE_SCRIPT, TRAIN_SCRIPT, Kubelet
from .objects import JOB_NAME, JOBS, PODS, now
from .volumes import Volume

if TYPE_CHECKING:
    from .apiserver import ApiServer


@dataclass
class ControlPlane(JobController, Kubelet):
    """The Job controller, the scheduler and the kubelet of the stand-in, and what they know."""

    #: Job name → the steps its pods take, one each time the Job is read; the last one stays (by
    #: default a stage Job's, ``tao-data-io/step: stage``, or a training Job's).
    scripts: dict[str, list[str]] = field(default_factory=dict)
    #: Container path → why the verify probe fails there.
    verify_failures: dict[str, str] = field(default_factory=dict)
    #: Jobs whose pods the Job controller cannot create (a quota), with the event's message.
    refused: dict[str, str] = field(default_factory=dict)
    unschedulable_message: str = GPU_UNSCHEDULABLE
    #: Whether the scheduler's reason is on the pod's condition too, or only in an event.
    condition_messages: bool = True
    #: Image → the (uid, gid) its containers run as unless the pod says otherwise (else root).
    image_users: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: PersistentVolume name → its filesystem (made when a pod first mounts it; a test may seed
    #: one): see :mod:`.volumes`. A claim without a PersistentVolume is not modelled.
    volumes: dict[str, Volume] = field(default_factory=dict)
    #: Job name → the steps of the pods the Job controller makes to replace failed ones (default:
    #: the first pods' steps, so a failure that is the image's or the data's happens again).
    replacement_scripts: dict[str, list[str]] = field(default_factory=dict)
    #: (Job name, container) whose log a test wrote (:meth:`prints`): the kubelet keeps it as written.
    printed: set[tuple[str, str]] = field(default_factory=set)
    #: (Job name, container) → how many of the Job's pods have started that container.
    starts: Counter[tuple[str, str]] = field(default_factory=Counter)
    _position: dict[str, int] = field(default_factory=dict)
    #: Failed pods the Job controller has handled (replaced, or counted into the Job's failure).
    _handled: set[str] = field(default_factory=set)
    #: Pods deleted because their Job was suspended: never counted, never replaced.
    _uncounted: set[str] = field(default_factory=set)
    #: Pods mounted (fsGroup applied), containers started (subPaths made, a stage's writes done).
    _mounted: set[str] = field(default_factory=set)
    _started: set[tuple[str, str]] = field(default_factory=set)
    #: Pod → why its stage container exited 3 (what ``tao-data-io stage`` printed last: its write probe).
    _refusals: dict[str, str] = field(default_factory=dict)
    _events: itertools.count = field(default_factory=itertools.count)

    def advance(self, server: ApiServer, namespace: str, job: str) -> None:
        """One step for the pods of ``job``, and the Job's status after it. A terminating pod of a
        Job that exists takes a step of its grace (:meth:`_end_gracefully`); one whose Job is gone
        (canceled, its TTL passed) is the kubelet's to end: :meth:`ApiServer.end_terminating`."""
        key = (JOBS, namespace, job)
        if server.kueue is not None:
            server.kueue.reconcile(server, namespace, job)
        found = server.objects[key] if key in server.objects and not server.objects[key].deleted else None
        if found is None:
            return
        for (resource, ns, name), obj in list(server.objects.items()):
            # A pod a suspension stopped has no finalizer left: gone once it has stopped (and was seen so).
            if (resource == PODS and ns == namespace and name in self._uncounted and not obj.deleted
                    and obj.raw["status"].get("phase") in ("Failed", "Succeeded")):
                obj.delete()
        pods = [obj for (resource, ns, _), obj in server.objects.items() if resource == PODS and ns == namespace
                and not obj.deleted and obj.raw["metadata"]["labels"].get(JOB_NAME) == job
                and "deletionTimestamp" not in obj.raw["metadata"]]
        if found.raw["spec"].get("suspend"):
            # Suspended (again: Kueue took it back): manageJob's deleteJobPods removes each active
            # pod's tracking finalizer, then deletes it with its grace — so it is never counted
            # towards backoffLimit — yet getFailJobMessage still judges every pod that failed by
            # the podFailurePolicy (pkg/controller/job/job_controller.go): a FailJob rule that
            # matches how a stopped pod ended fails the suspended Job.
            for pod in pods:
                self._uncounted.add(pod.raw["metadata"]["name"])
                if server._terminate(pod, None) == 0:
                    pod.delete()
            self._end_gracefully(server, namespace, job)
            self._job_status(server, namespace, job, suspended=True)
            return
        ending = self._end_gracefully(server, namespace, job)
        if not pods:
            if "Suspended" in str(found.raw.get("status")):
                self._start_pods(server, found.raw)  # resumed: the Job controller makes its pods now
            elif ending:
                self._job_status(server, namespace, job)  # it sees the pods that stopped
            return
        step = pods[0].raw["metadata"]["labels"].get("tao-data-io/step")  # the pod template's, as the backend set it
        first = self.scripts.get(job) or {"stage": STAGE_SCRIPT, "probe": PROBE_SCRIPT}.get(step, TRAIN_SCRIPT)
        for pod in pods:
            name = pod.raw["metadata"]["name"]
            replacement = REPLACES in pod.raw["metadata"].get("annotations", {})
            script = self.replacement_scripts.get(job, first) if replacement else first
            position = self._position[name] = min(self._position.get(name, -1) + 1, len(script) - 1)
            self._apply(server, namespace, pod, script[position])
        self._job_status(server, namespace, job)

    def prints(self, server: ApiServer, namespace: str, job: str, container: str, text: str) -> None:
        """``container`` of each pod of ``job`` prints ``text``: its log grows by it (and each new
        line is stamped when first served), and the kubelet no longer writes stock lines there."""
        self.printed.add((job, container))
        for (resource, ns, name), obj in server.objects.items():
            if resource == PODS and ns == namespace and not obj.deleted and obj.raw["metadata"]["labels"].get(
                    JOB_NAME) == job:
                server.logs[namespace, name, container] = server.logs.get((namespace, name, container), "") + text

    def _event(self, server: ApiServer, namespace: str, kind: str, about: dict[str, Any], reason: str,
               message: str) -> None:
        number = next(self._events)
        server.store({"apiVersion": "v1", "kind": "Event", "metadata": {
            "name": f"{about['name']}.{number:016x}", "namespace": namespace},
            "involvedObject": {"kind": kind, "name": about["name"], "namespace": namespace, "uid": about.get("uid")},
            "reason": reason, "message": message, "type": "Warning", "count": 1, "firstTimestamp": now(),
            "lastTimestamp": now(),
            "source": {"component": "job-controller" if kind == "Job" else "default-scheduler"}})
