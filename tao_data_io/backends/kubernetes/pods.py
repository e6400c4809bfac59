"""What a Job and its pods say, read from the objects as the API server returns them: pure
functions, so the status table and the failure classes are tested on plain dicts.

Why "where is the pod": every question the backend asks — is the verdict in, is the GPU idle
because an image is still being pulled, did the command start, why did it fail — is answered by
the first container of the pod that has not finished, in the order the kubelet runs them
(initContainers, a native sidecar counting as done once it runs, then the containers).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Literal, TypeVar

from ...launch.backend import FailureAnalysis, JobStatus

Obj = Mapping[str, Any]
ContainerState = Literal["waiting", "running", "terminated", "unknown"]
#: A pod as the caller holds it (a plain dict from the API, or a read-only view).
Pod = TypeVar("Pod", bound=Obj)
#: Waiting reasons of a container whose image is being fetched (or whose volumes are being set
#: up: the kubelet says ContainerCreating for both) — time that counts against the pull timeout.
PULLING = frozenset({"ContainerCreating", "PodInitializing", "ErrImagePull", "ImagePullBackOff"})
#: Waiting reasons that no amount of waiting fixes.
FATAL = frozenset({"InvalidImageName", "ErrImageNeverPull", "CreateContainerConfigError", "CreateContainerError",
                   "RunContainerError"})
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
VERIFY, STAGER, TRAIN = "verify", "stager", "train"
#: The native sidecar that follows TAO's status.json into its log (see tao_data_io.launch.agents.STATUS_SCRIPT).
STATUS = "status"
#: The emptyDirs that hold a pod's results (without a claim) and tier C's staged inputs on the
#: node's disk, as render.py names them: a kubelet eviction names the one that outgrew its limit.
RESULTS_VOLUME, STAGING_VOLUME = "results", "staging"
OOM_EXIT = 137
#: The exit of a container of ours, or of training (TRAIN_WRAPPER), that Kubernetes stopped:
#: 128 + SIGTERM.
STOPPED_EXIT = 143
#: The containers whose stop (``STOPPED_EXIT``) the failure policy counts and retries rather than
#: failing the Job (:func:`.render.failure_policy`).
STOPPABLE = (TRAIN, STAGER, VERIFY)
#: How long past the end of its grace a terminating pod is waited for.
OVERDUE = timedelta(minutes=1)
#: The reasons a kubelet gives a pod it rejects at admission (``admissionRejectionReasons``,
#: pkg/kubelet/kubelet.go), besides ``OutOf<resource>``.
KUBELET_REJECTIONS = frozenset({
    "InitContainerRestartPolicyForbidden", "PodOSSelectorNodeLabelDoesNotMatch", "PodOSNotSupported",
    "InvalidNodeInfo", "SupplementalGroupsPolicyNotSupported", "UnexpectedAdmissionError", "UnknownReason",
    "UnexpectedPredicateFailureType", "PodFeatureUnsupported", "NodeAffinity", "TaintToleration", "SysctlForbidden",
    "TopologyAffinityError", "NodeShutdown", "VolumeAttachmentLimitExceeded"})
#: What the kubelet's eviction manager says of a volume past its sizeLimit (emptyDirMessageFmt in
#: pkg/kubelet/eviction/helpers.go).
EMPTY_DIR_EVICTION = re.compile(r'Usage of EmptyDir volume "(?P<volume>[^"]*)" exceeds the limit "(?P<limit>[^"]*)"')

Phase = Literal["queue", "schedule", "pull", "stage", "probe", "running", "done", "failed", "fatal"]


@dataclass(frozen=True)
class Container:
    name: str
    image: str
    init: bool
    #: A native sidecar (an initContainer with restartPolicy Always): done once it runs.
    sidecar: bool
    state: ContainerState
    reason: str = ""
    message: str = ""
    exit_code: int | None = None


@dataclass(frozen=True)
class Where:
    """Where a pod is: its phase and a sentence for people; ``container`` is the one it is at."""

    phase: Phase
    text: str
    container: Container | None = None


def condition(obj: Obj, kind: str) -> Obj | None:
    """The ``kind`` condition when it holds. Never ``conditions[0]``: since 1.31 a failing Job
    lists FailureTarget before Failed, a finished one SuccessCriteriaMet before Complete."""
    conditions: list[Obj] = (obj.get("status") or {}).get("conditions") or []
    for item in conditions:
        if item.get("type") == kind and item.get("status") == "True":
            return item
    return None


def rank(pod: Obj) -> int:
    """The pod's completion index (its rank); 0 for a Job that is not Indexed."""
    metadata = pod.get("metadata") or {}
    value = (metadata.get("annotations") or {}).get(COMPLETION_INDEX) or (metadata.get("labels") or {}).get(
        COMPLETION_INDEX)
    return int(value) if value and str(value).isdigit() else 0


def by_rank(pods: Sequence[Pod]) -> list[Pod]:
    return sorted(pods, key=lambda pod: (rank(pod), (pod.get("metadata") or {}).get("name", "")))


def containers(pod: Obj) -> list[Container]:
    """Every container of the pod in the order the kubelet runs them, with its state."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    found = []
    for init, specs, statuses in ((True, spec.get("initContainers") or [], status.get("initContainerStatuses")),
                                  (False, spec.get("containers") or [], status.get("containerStatuses"))):
        states = {s.get("name"): s.get("state") or {} for s in statuses or []}
        for item in specs:
            state = states.get(item["name"]) or {}
            kinds: tuple[ContainerState, ...] = ("terminated", "running", "waiting")
            kind: ContainerState = next((k for k in kinds if state.get(k) is not None), "unknown")
            detail = state.get(kind) or {}
            sidecar = init and item.get("restartPolicy") == "Always"
            found.append(Container(name=item["name"], image=item.get("image", ""), init=init, sidecar=sidecar,
                                   state=kind, reason=detail.get("reason") or "",
                                   message=(detail.get("message") or "").strip(), exit_code=detail.get("exitCode")))
    return found


def container(pod: Obj, name: str) -> Container | None:
    return next((c for c in containers(pod) if c.name == name), None)


def unscheduled(pod: Obj) -> str | None:
    """Why the scheduler has not placed the pod (its PodScheduled condition), if it has not."""
    for item in (pod.get("status") or {}).get("conditions") or []:
        if item.get("type") == "PodScheduled" and item.get("status") == "False":
            return item.get("message") or item.get("reason") or "not scheduled yet"
    return None


def disruption(pod: Obj) -> str | None:
    """``reason: message`` of the pod's DisruptionTarget condition — it was preempted, evicted,
    its node drained or lost — when it has one (set by the scheduler, the eviction API, the
    taint manager, the pod GC or the kubelet; GA in 1.31)."""
    found = condition(pod, "DisruptionTarget")
    if found is None:
        return None
    return f"{found.get('reason') or 'DisruptionTarget'}" + (f": {found['message']}" if found.get("message") else "")


def _failed(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") == "Failed"


def terminating(pod: Obj) -> bool:
    """Deleted and not stopped yet: in its grace period (SIGTERM, then the sidecars' end)."""
    return bool((pod.get("metadata") or {}).get("deletionTimestamp")) and (pod.get("status") or {}).get(
        "phase") not in ("Succeeded", "Failed")


def job_failure(job: Obj) -> Obj | None:
    """The Job controller's verdict that the Job failed: ``Failed``, or from 1.31 the interim
    ``FailureTarget`` it sets first, with the same reason, while the Job's pods still terminate
    (pkg/controller/job/job_controller.go, ``delayTerminalCondition``)."""
    return condition(job, "Failed") or condition(job, "FailureTarget")


def kubelet_eviction(pod: Obj) -> str | None:
    """The kubelet's message when its eviction manager evicted the pod without a DisruptionTarget
    condition — for an emptyDir past its sizeLimit or a disk use past the ephemeral-storage
    limits (pkg/kubelet/eviction/eviction_manager.go, ``localStorageEviction``): the pod is
    Failed with reason Evicted and its containers were killed (exit 137, no OOM)."""
    status = pod.get("status") or {}
    if status.get("reason") != "Evicted" or disruption(pod) is not None:
        return None
    return (status.get("message") or "").strip() or "no message given"


def kubelet_rejection(pod: Obj) -> str | None:
    """Why the kubelet of the node the pod was bound to refused to run it, if it did: the pod is
    Failed before any container existed, with the kubelet's reason (``admissionRejectionReasons``
    in pkg/kubelet/kubelet.go; ``OutOf<resource>`` from pkg/kubelet/lifecycle/predicate.go)."""
    status = pod.get("status") or {}
    reason = str(status.get("reason") or "")
    if status.get("phase") != "Failed" or not (reason in KUBELET_REJECTIONS or reason.startswith("OutOf")):
        return None
    node = (pod.get("spec") or {}).get("nodeName") or "its node"
    return f"the kubelet of {node} refused the pod ({reason}): {status.get('message') or 'no message given'}"


def policy_action(job: Obj, pod: Obj) -> str:
    """What the Job's podFailurePolicy does with ``pod`` once it has failed: the action of the
    first rule it matches, ``Count`` when none does (pkg/controller/job/pod_failure_policy.go,
    ``matchPodFailurePolicy``: a condition of a pattern's type and status, or a container —
    init containers too, only ``containerName`` when set — that exited non-zero with a code the
    rule's operator admits)."""
    for rule in ((job.get("spec") or {}).get("podFailurePolicy") or {}).get("rules") or []:
        if any(_has_condition(pod, pattern) for pattern in rule.get("onPodConditions") or []) or _exits_match(
                pod, rule.get("onExitCodes")):
            return str(rule.get("action"))
    return "Count"


def _has_condition(pod: Obj, pattern: Obj) -> bool:
    return any(item.get("type") == pattern.get("type") and item.get("status") == pattern.get("status", "True")
               for item in (pod.get("status") or {}).get("conditions") or [])


def _exits_match(pod: Obj, codes: Obj | None) -> bool:
    if not codes:
        return False
    return any(item.state == "terminated" and item.exit_code and codes.get("containerName") in (None, item.name)
               and (item.exit_code in (codes.get("values") or [])) == (codes.get("operator") == "In")
               for item in containers(pod))


def _retried_for(pod: Obj) -> str | None:
    """Why a one-pod Job's pod stopped, when it is the cluster's doing and the failure policy
    counts it rather than failing the Job (:func:`.render.failure_policy`): a disruption, the
    kubelet's eviction for local storage, a container Kubernetes stopped (``STOPPED_EXIT``), or a
    delete whose pod has not stopped yet. None for anything else (the command's own exit, a
    kubelet's refusal at admission)."""
    said = disruption(pod)
    if said is not None:
        return f"the pod was disrupted ({said})"
    evicted = kubelet_eviction(pod)
    if evicted is not None:
        return f"the kubelet evicted the pod ({evicted})"
    stopped = [c.name for c in containers(pod) if c.state == "terminated" and c.exit_code == STOPPED_EXIT
               and c.name in STOPPABLE]
    if stopped:
        return f"Kubernetes stopped {stopped[0]} (exit {STOPPED_EXIT}: a preemption, an eviction or a delete)"
    if terminating(pod) and not any(c.state == "terminated" and c.exit_code for c in containers(pod)):
        return "the pod is being deleted"
    return None


def _replaced(job: Obj, pod: Obj) -> bool:
    """Whether the Job controller replaces this pod of a one-pod Job rather than fail the Job for
    it: the cluster stopped it (:func:`_retried_for`) and the policy ignores it, or counts it with
    a retry left. A pod in its grace is not decided on until it fails (a podFailurePolicy makes
    ``podReplacementPolicy`` Failed: pkg/apis/batch/v1/defaults.go); a failed one the controller
    has counted already (``status.failed``) and, with no verdict on the Job, replaces."""
    if not (_failed(pod) or terminating(pod)) or _retried_for(pod) is None:
        return False
    action = policy_action(job, pod)
    counted = int((job.get("status") or {}).get("failed") or 0)
    limit = int((job.get("spec") or {}).get("backoffLimit", 6))
    return action == "Ignore" or (action == "Count" and (counted <= limit if _failed(pod) else counted < limit))


def _replacing(job: Obj, pod: Obj) -> str:
    """What the job waits for while the Job controller replaces ``pod`` (:func:`_replaced`)."""
    why = _retried_for(pod)
    if _failed(pod):
        return f"{why}; its replacement is being made (compute_shape.disruption_retries)"
    retry = int((job.get("status") or {}).get("failed") or 0) + 1
    limit = int((job.get("spec") or {}).get("backoffLimit", 6))
    return (f"{why}; the Job controller replaces it once it has stopped (retry {retry} of {limit}: "
            "compute_shape.disruption_retries)")


def _overdue(pod: Obj) -> bool:
    """A pod still terminating a minute past its ``deletionTimestamp`` (the end of its grace): its
    node will not say it stopped (lost, or partitioned)."""
    stamp = (pod.get("metadata") or {}).get("deletionTimestamp")
    try:
        due = datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
    except ValueError:
        return False
    return datetime.now(timezone.utc) > due + OVERDUE


def where(pod: Obj) -> Where:
    """See the module docstring."""
    reason = unscheduled(pod)
    if reason is not None:
        return Where("schedule", f"waiting for a node: {reason}")
    status = pod.get("status") or {}
    refused = kubelet_rejection(pod)
    if refused is not None:  # said with its fix: a verify that meets it ends there
        return Where("failed", f"{refused}; {_rejection_fix(pod)}")
    if not status.get("conditions") and not status.get("containerStatuses"):
        return Where("schedule", "waiting to be scheduled")
    place = _first_unfinished(pod)
    if status.get("phase") == "Failed" and place.phase not in ("failed", "fatal"):  # evicted, or its node lost
        return Where("failed", f"the pod failed: {status.get('reason') or 'no reason given'}"
                     + (f": {status['message']}" if status.get("message") else ""))
    return place


def _first_unfinished(pod: Obj) -> Where:
    for item in containers(pod):
        if item.sidecar and item.state in ("running", "terminated"):
            continue  # running is all a sidecar must do; its exit (after the command's) decides nothing
        if item.state == "terminated":
            if item.exit_code == 0:
                continue
            return Where("failed", f"container {item.name} exited {item.exit_code}"
                         + (f" ({item.reason})" if item.reason else ""), item)
        if item.state == "running":
            if item.name == VERIFY:
                return Where("probe", "the verify probe is checking every input and the results directory", item)
            if item.init:
                return Where("stage", f"{item.name} is staging the inputs inside the pod", item)
            return Where("running", f"{item.name} is running", item)
        if item.reason in FATAL:
            return Where("fatal", f"container {item.name} cannot start: {item.reason}"
                         + (f": {item.message}" if item.message else ""), item)
        said = f"{item.reason}: {item.message}" if item.message else item.reason or "starting"
        return Where("pull", f"pulling {item.image} for {item.name} ({said})", item)
    return Where("done", "every container has finished")


def verify_result(pod: Obj) -> tuple[str, int] | None:
    """The verify container's termination message and exit code, once it has terminated."""
    found = container(pod, VERIFY)
    if found is None or found.state != "terminated":
        return None
    return found.message, int(found.exit_code or 0)


def _who(pod: Obj, nodes: int) -> str:
    return f"rank {rank(pod)}: " if nodes > 1 else ""


def job_status(job: Obj, pods: Sequence[Obj], events: Sequence[Obj] = ()) -> JobStatus:
    """The status table (docs/kubernetes.md): Complete → COMPLETE; Failed (or a failed pod: the Job has
    ``backoffLimit: 0``; or a container that can never start, such as an invalid image name) →
    ERROR, classified; a Job being deleted (canceled) → CANCELED; a container of ours
    running → RUNNING; nothing scheduled, or images still being pulled → PENDING, with the reason
    (the scheduler's, the kubelet's, or the newest warning event).

    A one-pod job whose disrupted pod the Job controller replaces (:func:`_replaced`) — also
    during the pod's grace, while training has exited 143 and the sidecars run on — is PENDING:
    the replacement starts over. A Job the controller failed (:func:`job_failure`) whose pods
    still terminate is RUNNING, with the controller's reason, not ERROR yet: an end is recorded
    once and collect reports it, while the results sidecar of each stopping pod is still making
    its final upload for the rest of the grace (and a next attempt would restore the results
    while they are still being written). From 1.31 the Job only gets Failed once no pod
    terminates; before, the terminating pods say so."""
    if condition(job, "Complete") is not None:
        return JobStatus(state="COMPLETE", message="the Job completed", exit_code=0)
    nodes = int((job.get("spec") or {}).get("completions") or 1)
    deleting = bool((job.get("metadata") or {}).get("deletionTimestamp"))
    verdict = job_failure(job)
    replaced = [pod for pod in pods if _replaced(job, pod)] if verdict is None and nodes == 1 else []
    if replaced:  # the Job controller is replacing it (disruption_retries): not the job's end
        pods = [pod for pod in pods if pod not in replaced]
        if not pods:
            return JobStatus(state="PENDING", message=_replacing(job, replaced[-1]))
    if verdict is None and nodes > 1:  # a deleted rank's end is the Job controller's to judge (it counts it,
        pods = [pod for pod in pods if not (pod.get("metadata") or {}).get("deletionTimestamp")]  # or Kueue took it)
    stopping = [pod for pod in pods if terminating(pod) and not _overdue(pod)]
    if verdict is not None and stopping and not deleting:
        who = "its pod" if len(stopping) == 1 else f"{len(stopping)} of its pods"
        return JobStatus(state="RUNNING", message=f"the Job controller failed it ({verdict.get('reason')}: "
                                                  f"{verdict.get('message')}); waiting for {who} to stop — the final "
                                                  "results upload runs in their grace — before it ends")
    failure = failure_analysis(job, pods)
    if failure is not None and (condition(job, "Failed") is not None or not deleting):
        trained = [c for pod in pods for c in containers(pod) if c.name == TRAIN and c.state == "terminated"]
        code = next((c.exit_code for c in trained if c.exit_code), None)
        return JobStatus(state="ERROR", message=failure.reason, exit_code=code, err_class=failure.err_class)
    if deleting:  # a cancel's SIGTERM fails the pods too: that is not the program's failure
        return JobStatus(state="CANCELED", message="the Job is being deleted before it finished")
    if not pods:
        said = newest_warning(events)  # a Job Kueue holds is the backend's to say (:mod:`.kueue`)
        return JobStatus(state="PENDING", message="no pod yet" + (f": {said}" if said else ""))
    places = [(pod, where(pod)) for pod in by_rank(pods)]
    started = [_who(pod, nodes) + w.text for pod, w in places if w.phase in ("stage", "probe", "running", "done")]
    details = "; ".join(_who(pod, nodes) + w.text for pod, w in places
                        if w.phase not in ("stage", "probe", "running", "done"))
    said = newest_warning(events)
    if said and said.split(": ", 1)[-1] not in details:
        details = f"{details} (newest event: {said})" if details else said
    if started:
        return JobStatus(state="RUNNING", message="; ".join(started) + (f"; {details}" if details else ""))
    return JobStatus(state="PENDING", message=details)


def newest_warning(events: Sequence[Obj]) -> str | None:
    """``Reason: message`` of the newest Warning event (the scheduler's FailedScheduling, the Job
    controller's FailedCreate, the kubelet's FailedMount…)."""
    warnings = [e for e in events if e.get("type") == "Warning"]
    if not warnings:
        return None
    newest = max(warnings, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
    return f"{newest.get('reason')}: {newest.get('message', '').strip()}"


def failure_analysis(job: Obj, pods: Sequence[Obj]) -> FailureAnalysis | None:
    """Why the Job failed, in TAO's classes: an input the probe could not read, a stager that
    could not fetch, an image that cannot start, an eviction or an OOM kill is the
    infrastructure's (ERR_INFRA); the command exiting non-zero is the program's (ERR_PROGRAM).
    None while nothing has failed."""
    nodes = int((job.get("spec") or {}).get("completions") or 1)
    failed = job_failure(job)
    if failed is not None and failed.get("reason") == "DeadlineExceeded":  # its pods were ended for it: first
        return FailureAnalysis.deadline_passed((job.get("spec") or {}).get("activeDeadlineSeconds"))
    for pod in sorted(by_rank(pods), key=_telling):
        place = where(pod)
        if place.phase not in ("failed", "fatal"):
            continue
        who, item = _who(pod, nodes), place.container
        refused = kubelet_rejection(pod)
        if refused is not None:
            return FailureAnalysis(err_class="ERR_INFRA", reason=who + refused, suggestion=_rejection_fix(pod))
        evicted = kubelet_eviction(pod)
        if evicted is not None:
            return FailureAnalysis(err_class="ERR_INFRA", reason=f"{who}the kubelet evicted the pod: {evicted}",
                                   suggestion=_eviction_fix(evicted))
        disrupted = disruption(pod)
        if disrupted is not None:
            retries = int((job.get("spec") or {}).get("backoffLimit") or 0)
            again = (f"it was started again {retries} times after disruptions (compute_shape.disruption_retries)"
                     if nodes == 1 and retries else
                     "a multi-node job is not started again: a replacement rank cannot rejoin the running "
                     "rendezvous" if nodes > 1 else "compute_shape.disruption_retries is 0")
            return FailureAnalysis(err_class="ERR_INFRA", reason=f"{who}the pod was disrupted — preempted, evicted "
                                   f"or its node drained — not failed by the command ({disrupted})",
                                   suggestion=f"{again}; submit again (its results so far are restored), or raise "
                                              "the job's priority or move it to nodes that are not preempted")
        if item is None:
            return FailureAnalysis(err_class="ERR_INFRA", reason=who + place.text,
                                   suggestion="the node or the cluster ended the pod: submit again under a new job id")
        if place.phase == "fatal":
            return FailureAnalysis(err_class="ERR_INFRA", reason=who + place.text,
                                   suggestion="fix the image reference, or the Secret or ConfigMap the container "
                                              "names, and submit again")
        if item.name == VERIFY:
            return FailureAnalysis(err_class="ERR_INFRA", reason=f"{who}the verify probe failed inside the pod "
                                   "before the command started" + (f": {_first_failure(item.message)}"
                                                                   if item.message else ""),
                                   suggestion="make every path the verdict names readable (stage the inputs again, "
                                              "fix the claim or the mount source, make the results directory "
                                              "writable) and submit again")
        if item.init:
            return FailureAnalysis(err_class="ERR_INFRA", reason=f"{who}{item.name} failed (exit {item.exit_code})"
                                   + (f": {item.message}" if item.message else ""),
                                   suggestion="read its log; check the forwarded credentials and that every input "
                                              "URI exists, then submit again")
        if item.reason == "OOMKilled" or item.exit_code == OOM_EXIT:
            return FailureAnalysis(err_class="ERR_INFRA", reason=f"{who}{item.name} was OOMKilled "
                                   f"(exit {item.exit_code})",
                                   suggestion="lower the batch size or the data loader workers, or give the pod a "
                                              "memory limit on a node with more memory")
        return FailureAnalysis(err_class="ERR_PROGRAM", reason=f"{who}the command exited {item.exit_code}"
                               + (f" ({item.reason})" if item.reason and item.reason != "Error" else ""),
                               suggestion="read the last lines of the job's log")
    if failed is not None:
        return FailureAnalysis(err_class="ERR_INFRA", reason=f"the Job failed ({failed.get('reason', 'no reason')}: "
                               f"{failed.get('message', '')}) and none of its pods is left to say why",
                               suggestion="submit again under a new job id; read the cluster's events if it recurs")
    return None


def _telling(pod: Obj) -> int:
    """How little a failed pod says of why the Job failed, for :func:`failure_analysis`: one that
    failed on its own says most; a disrupted one less (a replacement that then failed is why the
    Job ended, not the eviction before it); one deleted without a disruption least — the Job
    controller ended it because the Job had failed (exit 143 on SIGTERM), or a cancel did."""
    if disruption(pod) is not None:
        return 1
    return 2 if (pod.get("metadata") or {}).get("deletionTimestamp") else 0


def _rejection_fix(pod: Obj) -> str:
    """The fix for a kubelet's refusal (:func:`kubelet_rejection`)."""
    if (pod.get("status") or {}).get("reason") == "InitContainerRestartPolicyForbidden":
        return ("that node's kubelet is older than 1.29 and runs no native sidecar (the results upload): set the "
                "target's node_selector to nodes whose kubelets are 1.29 or newer (kubectl get nodes shows each "
                "VERSION), or keep results on a claim (pvc_claim, without S3_BUCKET_NAME)")
    return ("the node could not run the pod as it was bound to it: submit again; if its kubelet refuses again, ask "
            "the cluster's admins about the node")


def _eviction_fix(message: str) -> str:
    """The fix for a kubelet eviction (:func:`kubelet_eviction`), from its message."""
    volume = EMPTY_DIR_EVICTION.search(message)
    if volume is not None and volume["volume"] == RESULTS_VOLUME:
        return (f"the results directory outgrew its volume's {volume['limit']}, the request's outputs.results_limit "
                "(files upload_excludes leaves out count on the node's disk too): raise outputs.results_limit, or "
                "have the job keep fewer or smaller checkpoints")
    if volume is not None and volume["volume"] == STAGING_VOLUME:
        return (f"the staged inputs outgrew the staging volume's {volume['limit']}, bounded from their listing "
                "before submit: they grew since; submit again, which bounds them again")
    if volume is not None:
        return (f"volume {volume['volume']!r} passed its {volume['limit']}: submit again under a new job id; "
                "report it with the job's log if it recurs")
    if "ephemeral" in message:
        return ("the pod's disk use — the staged inputs, the results, and what its containers write outside their "
                "volumes, logs included — passed its ephemeral-storage limit: raise compute_shape.ephemeral_storage "
                "(the volumes' bounds are added to it)")
    return ("the node ran short of a resource and its kubelet evicted the pod: submit again under a new job id; ask "
            "the cluster's admins about the node if it recurs")


def _first_failure(message: str) -> str:
    """The first failed check of a verify termination message, as ``path: detail``."""
    for line in message.splitlines():
        parts = line.split("\t")
        if len(parts) == 5 and parts[1] == "fail":
            return f"{parts[3]}: {parts[4]}"
    return message.splitlines()[0] if message else ""
