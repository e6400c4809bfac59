"""The stand-in's scheduler and kubelet: each time the backend reads a Job, each of its pods takes
one step of its script (:data:`STEPS`: pulling → staging → verifying → verified → running → …),
as the kubelet would move it — containers in the kubelet's order, native sidecars running on
(KEP-753), termination messages cut as ``pkg/kubelet/status/status_manager.go`` cuts them
(:func:`kubelet_message`), evictions for local storage as ``pkg/kubelet/eviction`` words them, a
graceful stop one step a look (``kuberuntime_termination_order.go``); volumes as
:mod:`.volumes` has them. The verify container's verdict is built from the checklist in the
job's own ConfigMap, so what the backend parses is what the pod was told to check. No step
depends on time.

:class:`Kubelet` holds its part of :class:`.control_plane.ControlPlane`: the methods read and
write the control plane's fields."""

from __future__ import annotations

import posixpath
import stat
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tao_data_io.errors import UNWRITABLE_EXIT
from tao_data_io.launch.probe import CheckResult, Verdict
from tao_data_io.staging.writable import unwritable_message

from .objects import JOB_NAME, PODS, RESOURCES, now
from .volumes import Volume, identity_of, supports_fs_group

if TYPE_CHECKING:
    from .apiserver import ApiServer


GPU_UNSCHEDULABLE = ("0/2 nodes are available: 2 Insufficient nvidia.com/gpu. preemption: 0/2 nodes are available: "
                     "2 No preemption victims found for incoming pod.")


def _waiting(reason: str, message: str | None = None) -> dict[str, Any]:
    return {"waiting": {"reason": reason, **({"message": message} if message else {})}}


def _running() -> dict[str, Any]:
    return {"running": {"startedAt": now()}}


def _terminated(code: int, reason: str, message: str | None = None) -> dict[str, Any]:
    return {"terminated": {"exitCode": code, "reason": reason, "startedAt": now(), "finishedAt": now(),
                           **({"message": message} if message else {})}}


def kubelet_message(written: str, pod_spec: dict[str, Any]) -> str:
    """What the API server shows of a termination message a container wrote. The kubelet reads
    at most the file's *last* 4096 bytes (``MaxContainerTerminationMessageLength``,
    ``getTerminationMessage`` in pkg/kubelet/kuberuntime/kuberuntime_container.go), then
    ``normalizeStatus`` (pkg/kubelet/status/status_manager.go) keeps the *first*
    ``MaxPodTerminationMessageLogLength`` (12 KiB) / (containers + initContainers) bytes of every
    container's message — a byte cut, which Go's JSON encoding shows as U+FFFD mid-character."""
    containers = len(pod_spec.get("containers", [])) + len(pod_spec.get("initContainers", []))
    return written.encode()[-4096:][:12288 // max(containers, 1)].decode(errors="replace")


#: Each step: (the container it is about — a name, "first" or "main" —, that container's state,
#: the pod's phase). Containers before it have finished (a native sidecar runs), later ones wait.
STEPS: dict[str, tuple[str, Callable[[dict[str, Any]], dict[str, Any]], str]] = {
    "pulling": ("first", lambda c: _waiting("ContainerCreating"), "Pending"),
    "staging": ("stager", lambda c: _running(), "Pending"),
    "verifying": ("verify", lambda c: _running(), "Pending"),
    "image-pull-backoff": ("verify", lambda c: _waiting("ImagePullBackOff", f'Back-off pulling image "{c["image"]}"'),
                           "Pending"),
    "verified": ("main", lambda c: _waiting("ContainerCreating"), "Pending"),
    "running": ("main", lambda c: _running(), "Running"),
    "succeeded": ("main", lambda c: _terminated(0, "Completed"), "Succeeded"),
    "failed": ("main", lambda c: _terminated(2, "Error"), "Failed"),
    "oomkilled": ("main", lambda c: _terminated(137, "OOMKilled"), "Failed"),
    # Evicted (the Eviction API, a drain): the kubelet kills the containers — exit 137 after the
    # grace period — and the pod gets the DisruptionTarget condition (GA in 1.31).
    "disrupted": ("main", lambda c: _terminated(137, "Error"), "Failed"),
    "disrupted-while-staging": ("stager", lambda c: _terminated(137, "Error"), "Failed"),
    # The Eviction API (pkg/registry/core/pod/storage/eviction.go, addConditionAndDeletePod): the
    # DisruptionTarget condition first, then a graceful delete; the kubelet ends the pod over the
    # next looks (ControlPlane._end_gracefully), and only then does the Job controller see it fail.
    "evicting": ("main", lambda c: _running(), "Running"),
    # The kubelet's own evictions for local storage (LOCAL_STORAGE_EVICTIONS): killed at once.
    "results-evicted": ("main", lambda c: _terminated(137, "Error"), "Failed"),
    "storage-evicted": ("main", lambda c: _terminated(137, "Error"), "Failed"),
    # The collective probe's rank stuck in its rendezvous: its own alarm ends it (HANG_EXIT).
    "probe-hang": ("main", lambda c: _terminated(124, "Error"), "Failed"),
    "verify-failed": ("verify", lambda c: _terminated(1, "Error"), "Failed"),
    # Training ended, then the results sidecar's final upload failed (it exits non-zero once the
    # kubelet signals it, pkg/kubelet/kuberuntime: sidecars are stopped after the main containers).
    "upload-failed": ("main", lambda c: _terminated(0, "Completed"), "Failed"),
    "stager-failed": ("stager", lambda c: _terminated(1, "Error", "stage: s3://bkt-1/data/: AccessDenied"), "Failed"),
}
#: What the kubelet's eviction manager says when it evicts a pod for its local storage
#: (pkg/kubelet/eviction/eviction_manager.go: emptyDirLimitEviction, podEphemeralStorageLimitEviction;
#: the messages are helpers.go's emptyDirMessageFmt and podEphemeralStorageMessageFmt): the pod is
#: killed with no grace (its containers exit 137), Failed with reason Evicted — and evictPod is
#: given no condition on this path, so no DisruptionTarget, unlike a node-pressure eviction.
LOCAL_STORAGE_EVICTIONS: dict[str, Callable[[dict[str, Any]], str]] = {
    "results-evicted": lambda spec: 'Usage of EmptyDir volume "results" exceeds the limit "{}". '.format(
        next(v for v in spec["volumes"] if v["name"] == "results")["emptyDir"].get("sizeLimit")),
    "storage-evicted": lambda spec: "Pod ephemeral local storage usage exceeds the total limit of containers "
                                    f"{spec['containers'][0]['resources']['limits']['ephemeral-storage']}. ",
}
TRAIN_SCRIPT = ["pulling", "staging", "verifying", "verified", "running"]
STAGE_SCRIPT = ["pulling", "running", "succeeded"]
#: The collective probe's pods: they pull the job's image, all-reduce, and end.
PROBE_SCRIPT = ["pulling", "running", "succeeded"]


def exited(code: int) -> str:
    """The step in which the training container's command exits ``code``: 128 + N is a command
    ended by signal N, as the container runtime reports it (reason Error; an OOM kill is the
    ``oomkilled`` step, whose reason is the kubelet's OOMKilled)."""
    return f"exited {code}"


def _step(step: str) -> tuple[str, Callable[[dict[str, Any]], dict[str, Any]], str]:
    """What :data:`STEPS` says of ``step``, or of an :func:`exited` step."""
    if step in STEPS:
        return STEPS[step]
    code = int(step.removeprefix("exited "))
    return ("main", lambda c: _terminated(code, "Completed" if code == 0 else "Error"),
            "Succeeded" if code == 0 else "Failed")


def admission_refusal(server: ApiServer, spec: dict[str, Any]) -> tuple[str, str] | None:
    """The kubelet's pod admission on the node the pod was bound to: a kubelet older than 1.29
    runs no native sidecar, and rejects a pod with an init container that sets ``restartPolicy``
    (``canAdmitPod`` in pkg/kubelet/kubelet.go with SidecarContainers off, its default in 1.28;
    reason ``InitContainerRestartPolicyForbidden`` of pkg/kubelet/lifecycle/predicate.go)."""
    node = server.alive("Node").get(spec["nodeName"])
    version = ((node or {}).get("status") or {}).get("nodeInfo", {}).get("kubeletVersion")
    if version is None:
        return None
    minor = int(version.lstrip("v").split(".")[1])
    sidecar = next((c["name"] for c in spec.get("initContainers", []) if c.get("restartPolicy")), None)
    if minor >= 29 or sidecar is None:
        return None
    return ("InitContainerRestartPolicyForbidden",
            f'Init container "{sidecar}" may not have a non-default restartPolicy')


class Kubelet:
    """The kubelet's and the scheduler's side of :class:`.control_plane.ControlPlane`."""

    @staticmethod
    def _bind(server: ApiServer, raw: dict[str, Any]) -> str:
        """The scheduler's choice of node: among the GPU nodes whose labels the pod's nodeSelector
        selects, by name, one per completion index (no node knows its kubelet's version here, as
        no scheduler plugin does); ``node-N`` where no node is modelled."""
        index = int(raw["metadata"].get("annotations", {}).get("batch.kubernetes.io/job-completion-index", "0"))
        wanted = raw["spec"].get("nodeSelector") or {}
        nodes = sorted(name for name, node in server.alive("Node").items()
                       if ((node.get("status") or {}).get("allocatable") or {}).get("nvidia.com/gpu", "0") != "0"
                       and wanted.items() <= ((node.get("metadata") or {}).get("labels") or {}).items())
        return nodes[index % len(nodes)] if nodes else f"node-{index}"

    def _volume(self, server: ApiServer, namespace: str, pod_spec: dict[str, Any], name: str) -> Volume | None:
        """The modelled filesystem behind the pod's volume ``name`` (a claim bound to a PersistentVolume)."""
        source = next((v for v in pod_spec.get("volumes", []) if v["name"] == name), {})
        claim_name = (source.get("persistentVolumeClaim") or {}).get("claimName")
        claim = server.alive("PersistentVolumeClaim", namespace).get(claim_name or "") or {}
        pv = server.alive("PersistentVolume").get((claim.get("spec") or {}).get("volumeName") or "")
        if pv is None:
            return None
        volume_name = pv["metadata"]["name"]
        if volume_name not in self.volumes:
            self.volumes[volume_name] = Volume(ownership=supports_fs_group(pv, server.alive("CSIDriver")))
        return self.volumes[volume_name]

    def _mount(self, server: ApiServer, namespace: str, raw: dict[str, Any]) -> None:
        """The kubelet sets a pod's volumes up once, before its first container: fsGroup."""
        name, spec = raw["metadata"]["name"], raw["spec"]
        if name in self._mounted:
            return
        self._mounted.add(name)
        context = spec.get("securityContext") or {}
        for source in spec.get("volumes", []):
            volume = self._volume(server, namespace, spec, source["name"])
            if volume is not None and "fsGroup" in context:
                volume.apply_fs_group(context["fsGroup"], context.get("fsGroupChangePolicy"))

    def _start(self, server: ApiServer, namespace: str, raw: dict[str, Any], container: dict[str, Any]) -> None:
        """A container starts: the kubelet makes its missing subPaths; a stage container makes
        the directories its command names (``--workdir``, the ``--map``'s), as its user may."""
        name, spec = raw["metadata"]["name"], raw["spec"]
        if (name, container["name"]) in self._started:
            return
        self._started.add((name, container["name"]))
        self.starts[raw["metadata"]["labels"].get(JOB_NAME), container["name"]] += 1
        for mount in container.get("volumeMounts", []):
            volume = self._volume(server, namespace, spec, mount["name"])
            if volume is not None and mount.get("subPath"):
                volume.make_subpath(mount["subPath"])
        if container["name"] != "stage":
            return
        command = container.get("command", [])
        wanted = [command[command.index("--staging-dir") + 1], posixpath.dirname(command[command.index("--map") + 1])]
        who = identity_of(spec, container, self.image_users)
        for path in wanted:
            mount, volume = self._mount_of(server, namespace, spec, container, path)
            if volume is None:
                continue
            inside = posixpath.relpath(path, mount["mountPath"])
            on_volume = posixpath.join(mount.get("subPath", ""), inside)
            refused = volume.make_dirs(on_volume, who)
            if refused is not None:
                blocker = volume.tree[refused]
                what = "the staging directory" if path == wanted[0] else "the staging map's directory"
                in_pod = posixpath.join(mount["mountPath"], refused).rstrip("/")
                below = on_volume[len(refused):].lstrip("/").split("/")[0] if on_volume != refused else ""
                self._refusals[name] = "error: " + unwritable_message(
                    what=what, directory=path, blocker=in_pod, missing=f"{in_pod}/{below}" if below else None,
                    owner=(blocker.uid, blocker.gid), mode=stat.S_IMODE(blocker.mode), uid=who.uid,
                    groups=list(dict.fromkeys([who.gid, *sorted(who.groups)]))) + "\n"
                return

    def _mount_of(self, server: ApiServer, namespace: str, spec: dict[str, Any], container: dict[str, Any],
                  path: str) -> tuple[dict[str, Any], Volume | None]:
        """The container's mount ``path`` lies under (the deepest), and its modelled volume."""
        under = [m for m in container.get("volumeMounts", [])
                 if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")]
        if not under:
            return {}, None
        mount = max(under, key=lambda m: len(m["mountPath"]))
        return mount, self._volume(server, namespace, spec, mount["name"])

    def _apply(self, server: ApiServer, namespace: str, pod: Any, step: str) -> None:
        raw = pod.raw
        name, spec = raw["metadata"]["name"], raw["spec"]
        if raw["status"].get("phase") == "Failed" and not raw["status"].get("containerStatuses"):
            return  # the kubelet rejected it at admission: it never runs
        if step == "unschedulable":
            condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                         **({"message": self.unschedulable_message} if self.condition_messages else {})}
            pod["status"] = {"phase": "Pending", "conditions": [condition]}
            self._event(server, namespace, "Pod", raw["metadata"], "FailedScheduling", self.unschedulable_message)
            return
        if not spec.get("nodeName"):  # the scheduler binds the pod to a node before anything else
            pod["spec"] = spec = {**spec, "nodeName": self._bind(server, raw)}
            refused = admission_refusal(server, spec)
            if refused is not None:  # the kubelet rejects it before any container exists
                pod["status"] = {"phase": "Failed", "reason": refused[0], "message": refused[1]}
                return
        target, state_of, phase = _step(step)
        init, main = spec.get("initContainers", []), spec["containers"]
        order = [c["name"] for c in [*init, *main]]
        if target == "first":
            target = order[0]
        if target not in order:  # no stager (tier A), or "main": the next container that is there
            target = "verify" if target == "stager" and "verify" in order else main[0]["name"]
        current = order.index(target)
        verify_at = order.index("verify") if "verify" in order else None
        if verify_at is not None and current > verify_at and not self._verdict(server, namespace, spec).ok:
            # verify.sh exits 1 on a failed verdict: the pod fails there, and no later container starts
            current, phase, state_of = verify_at, "Failed", (lambda c: _terminated(1, "Error"))
        if step != "pulling":
            self._mount(server, namespace, raw)
            for container in [*init, *main][:current + 1]:
                self._start(server, namespace, raw, container)
        if name in self._refusals:  # the stage could not write its volume: it exited 3 at once
            state_of, phase = (lambda c: _terminated(UNWRITABLE_EXIT, "Error", self._refusals[name])), "Failed"
        # verify.sh cuts its verdict to its 4th argument (after /bin/sh and the script), else 4 KiB
        verify_argv = next((c["command"] for c in init if c["name"] == "verify"), [])
        limit = int(verify_argv[5]) if len(verify_argv) > 5 else 4096
        statuses = []
        for position, container in enumerate([*init, *main]):
            sidecar = container.get("restartPolicy") == "Always"
            if position < current:
                state = _running() if sidecar and phase in ("Pending", "Running") else _terminated(
                    0, "Completed",
                    self._verdict(server, namespace, spec).termination_message(limit) if container["name"] == "verify"
                    else None)
            elif position == current:
                state = state_of(container)
                if container["name"] == "verify" and "terminated" in state:
                    state["terminated"]["message"] = self._verdict(server, namespace, spec).termination_message(limit)
            else:
                state = _waiting("PodInitializing")
            statuses.append({"name": container["name"], "image": container["image"], "imageID": "", "ready": False,
                             "restartCount": 0, "started": "running" in state, "state": state})
            self._logs(server, namespace, raw, container["name"], state)
            if "message" in state.get("terminated", {}):  # the log has what was written, the status the kubelet's cut
                state["terminated"]["message"] = kubelet_message(state["terminated"]["message"], spec)
        if name in self._refusals:
            server.logs[namespace, name, "stage"] = self._refusals[name]
        if step == "upload-failed":
            for status in statuses:
                if status["name"] == "results":
                    status["state"] = _terminated(1, "Error")
                    server.logs[namespace, name, "results"] = "upload: s3://bkt-1/results/: AccessDenied\n"
        conditions = [{"type": "PodScheduled", "status": "True"}]
        if step.startswith("disrupted") or step == "evicting":
            conditions.append({"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
                               "message": "Eviction API: evicting"})
        pod["status"] = {"phase": phase, "conditions": conditions,
                         "initContainerStatuses": statuses[:len(init)], "containerStatuses": statuses[len(init):],
                         **({"reason": "Evicted", "message": LOCAL_STORAGE_EVICTIONS[step](spec)}
                            if step in LOCAL_STORAGE_EVICTIONS else {})}
        if step == "evicting":
            server._terminate(pod, None)

    def _end_gracefully(self, server: ApiServer, namespace: str, job: str) -> bool:
        """The kubelet, one step a look, for each pod of ``job`` deleted with a grace period (an
        eviction, the Job controller ending the pods of a Job that failed): first SIGTERM ends
        the running containers — training exits 143, TRAIN_WRAPPER passes the signal on — while
        native sidecars run on, since the kubelet stops them only after the regular containers
        (KEP-753, pkg/kubelet/kuberuntime/kuberuntime_termination_order.go): the phase stays what
        it was; at the next look the sidecars have ended (the results sidecar's final upload) and
        the pod is Failed. Whether any pod of ``job`` was terminating."""
        found = False
        for (resource, ns, _), obj in server.objects.items():
            if resource != PODS or ns != namespace or obj.deleted:
                continue
            raw = obj.raw
            if ("deletionTimestamp" not in raw["metadata"] or raw["status"].get("phase") in ("Succeeded", "Failed")
                    or raw["metadata"]["labels"].get(JOB_NAME) != job):
                continue
            found = True
            status = raw["status"]
            init, main = status.get("initContainerStatuses", []), status.get("containerStatuses", [])
            sidecars = {c["name"] for c in raw["spec"].get("initContainers", []) if c.get("restartPolicy") == "Always"}
            signalled = [{**c, "state": _terminated(143, "Error")} if "running" in c["state"]
                         and c["name"] not in sidecars else c for c in [*init, *main]]
            phase = status.get("phase")
            if signalled == [*init, *main]:  # nothing but sidecars left running: they end, and so does the pod
                signalled = [{**c, "state": _terminated(0, "Completed")} if "running" in c["state"] else c
                             for c in signalled]
                phase = "Failed"
            obj["status"] = {**status, "phase": phase, "initContainerStatuses": signalled[:len(init)],
                             "containerStatuses": signalled[len(init):]}
        return found

    def _verdict(self, server: ApiServer, namespace: str, spec: dict[str, Any]) -> Verdict:
        """The verify container's verdict on the checklist in the job's ConfigMap: what a test said
        fails (``verify_failures``), and an input missing from a volume whose contents are modelled."""
        files = next(v["configMap"]["name"] for v in spec["volumes"] if v["name"] == "files")
        checklist = server.objects[RESOURCES["ConfigMap"], namespace, files].raw["data"]["checklist"]
        verify = next(c for c in spec.get("initContainers", []) if c["name"] == "verify")
        results = []
        for line in checklist.splitlines():
            kind, path, _ = line.split("\t")
            failure = self.verify_failures.get(path)
            mount, volume = self._mount_of(server, namespace, spec, verify, path)
            if failure is None and volume is not None and volume.contents and kind != "results-writable":
                on_volume = posixpath.join(mount.get("subPath", ""), posixpath.relpath(path, mount["mountPath"]))
                failure = None if volume.exists(on_volume) else "does not exist"
            results.append(CheckResult(kind=kind, path=path, ok=failure is None, detail=failure or "readable"))  # type: ignore[arg-type]
        return Verdict(ok=not any(not r.ok for r in results), checks=results)

    def _logs(self, server: ApiServer, namespace: str, raw: dict[str, Any], container: str,
              state: dict[str, Any]) -> None:
        """The container's log as the kubelet has it once it started: what a test made it print
        (:meth:`.control_plane.ControlPlane.prints`), else stock lines for its state."""
        key = (namespace, raw["metadata"]["name"], container)
        if "waiting" in state or (raw["metadata"]["labels"].get(JOB_NAME), container) in self.printed:
            return
        if container == "status":  # the status sidecar prints status.json's lines: none until the job writes one
            server.logs.setdefault(key, "")
        elif container == "verify":
            server.logs[key] = state.get("terminated", {}).get("message") or "TAO-VERIFY probe running\n"
        elif container == "probe":  # what PROBE_PROGRAM prints, as far as its rank got
            code = state.get("terminated", {}).get("exitCode")
            server.logs[key] = {0: "TAO-COLLECTIVE\tok\tnccl\t2\t0.84\n",
                                124: "TAO-COLLECTIVE\thang\trendezvous\tno progress in 180s\n"}.get(code, "")
        elif "terminated" in state and state["terminated"]["reason"] == "OOMKilled":
            server.logs[key] = "epoch 1\nKilled\n"
        elif "terminated" in state and state["terminated"]["exitCode"]:
            server.logs[key] = "epoch 1\nTraceback (most recent call last):\nRuntimeError: loss is nan\n"
        else:
            server.logs[key] = "".join(f"{container} line {i}\n" for i in range(1, 4))
