"""The preflight gates: every check that can run before anything is created, in the order a
user fixes things, each failure one line naming what and the fix.

1. GPU capacity — without gang scheduling a Job larger than the cluster waits Pending forever,
   so it is refused: every pod must fit on some node (``gpus`` each), ``nodes`` pods in all.
2. Kubernetes version — 1.28 for a multi-node job (stable pod hostnames for rendezvous), 1.29
   for a pod with a native sidecar (the results upload).
3. Access — a SelfSubjectAccessReview for every verb and resource the submit and its verify use;
   all refusals are reported together, since one Role fixes them all.
4. The claim exists and is Bound (or waits for its first consumer), with the access modes the
   job's pods need; the image pull Secret and a pre-created credential Secret exist (the latter
   with every key the job forwards).
5. A server-side dry run of every object, which also finds a name taken by someone else.
6. A server-side dry run of a Pod of each Job: admission (Pod Security, webhooks, quotas)
   judges pods, not Jobs.
"""

from __future__ import annotations

import functools
import re

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes.utils.quantity import parse_quantity

from ...errors import UsageError
from ...launch.plan import LaunchPlan
from .api import Api, ApiError
from .apply import RESOURCES, create, step_of
from .facts import MULTI_NODE_VERSION, SIDECAR_VERSION, gpu_nodes, server_version
from .kueue import GROUP as KUEUE_GROUP
from .placement import HOSTNAME_LABEL, Node, barred
from .pods import TRAIN
from .render import SecretRef
from .settings import KubernetesSettings

PULL_SECRET_TYPES = frozenset({"kubernetes.io/dockerconfigjson", "kubernetes.io/dockercfg"})


@dataclass(frozen=True, order=True)
class Access:
    verb: str
    group: str
    resource: str

    def describe(self) -> str:
        return f"{self.verb} {self.resource}" + (f".{self.group}" if self.group else "")


def needed_access(objects: Sequence[Mapping[str, Any]], reads_secrets: bool, queued: bool = False) -> list[Access]:
    """What submit and verify do: create each kind (and read it back after a conflict), adopt the
    dependents (patch), follow the pods (list), delete the Job when its verdict fails — and
    what later verbs do, checked now so that none is the first to find it refused: cancel
    deletes the pods, status lists the events of a pod that waits for a node or an image and,
    for a job ``queued`` in Kueue, the Workload that says why it waits (the preflight reads its
    LocalQueue)."""
    found: set[Access] = {Access("list", "", "pods"), Access("create", "", "pods"),  # create: admission's dry run
                          Access("delete", "", "pods"), Access("list", "", "events")}
    if queued:
        found |= {Access("get", KUEUE_GROUP, "localqueues"), Access("list", KUEUE_GROUP, "workloads")}
    for obj in objects:
        group, resource = RESOURCES[obj["kind"]]
        found |= {Access("create", group, resource), Access("get", group, resource)}
        found.add(Access("delete" if obj["kind"] == "Job" else "patch", group, resource))
    if reads_secrets:
        found.add(Access("get", "", "secrets"))
    return sorted(found)


#: The cluster's nodes, listed at most once per preflight (the GPU gate and the kubelets' versions
#: read the same list); None when this identity may not list them.
NodeList = Callable[[], list[Node] | None]


def node_list(api: Api) -> NodeList:
    return functools.cache(lambda: gpu_nodes(api))


def check_gpus(nodes: NodeList, plan: LaunchPlan, settings: KubernetesSettings) -> list[str]:
    """Refuse a job the GPU nodes its pods may run on (:mod:`.placement`) cannot hold now — or,
    on an autoscaled pool, where no room now is normal, say so as a warning (returned)."""
    if plan.gpus == 0:
        return []
    need = plan.gpus * plan.nodes
    listed = nodes()
    if listed is None:
        raise UsageError("the GPU capacity gate cannot read the nodes' allocatable nvidia.com/gpu (this identity may "
                         "not list nodes): ask the cluster's admin for a ClusterRole granting list on nodes")
    why_not = {node.name: barred(node, settings.node_selector, settings.tolerations) for node in listed}
    usable = [node for node in listed if why_not[node.name] is None]
    fits = sum(node.gpus // plan.gpus for node in usable)
    if plan.nodes > 1 and settings.exclusive_topology:  # one rank per node (or zone…): its anti-affinity
        key = settings.exclusive_topology
        fits = len({node.labels.get(key, node.name if key == HOSTNAME_LABEL else None)
                    for node in usable if node.gpus >= plan.gpus} - {None})
    if fits >= plan.nodes:
        return []
    autoscaled = settings.capacity != "fixed"
    have = ", ".join(f"{node.name}: {node.gpus}" for node in sorted(usable, key=lambda n: n.name)) or "no such nodes"
    excluded = "; ".join(f"{node.name}: {why_not[node.name]}" for node in sorted(listed, key=lambda n: n.name)
                         if node.gpus and why_not[node.name])
    said = (f"compute_shape asks for {plan.nodes} pod(s) of {plan.gpus} nvidia.com/gpu each ({need} in all) but the "
            f"nodes the pods may run on can hold {fits} such pod(s){' now' if autoscaled else ''} (allocatable "
            f"{have}{f'; not for these pods: {excluded}' if excluded else ''})")
    if autoscaled:
        waits = ("the pool autoscales, so the pods wait for a node" if settings.capacity == "autoscaled" else
                 f"Kueue admits the job from queue {settings.queue_name!r} when its quota allows, and it waits")
        return [f"{said}; {waits} for up to pending_timeout ({settings.schedule_timeout:g}s)"]
    raise UsageError(f"{said}; without gang scheduling the Job would wait Pending forever: lower compute_shape.gpus "
                     "or nodes, add GPU nodes (with the NVIDIA GPU Operator or device plugin) or change the target's "
                     "node_selector or tolerations — or set its capacity to autoscaled if the pool grows on demand")


def check_version(api: Api, plan: LaunchPlan, training_job: Mapping[str, Any], settings: KubernetesSettings,
                  nodes: NodeList) -> list[str]:
    """Refuse what the cluster's versions cannot run; a warning (returned) where only some nodes can."""
    version = server_version(api)
    shown = f"{version[0]}.{version[1]}"
    if plan.nodes > 1 and version < MULTI_NODE_VERSION:
        raise UsageError(f"a multi-node job (compute_shape.nodes {plan.nodes}) needs Kubernetes 1.28 or newer for "
                         f"stable pod hostnames at rendezvous; the cluster runs {shown}: run it on one node, or on "
                         "a newer cluster")
    init = training_job["spec"]["template"]["spec"].get("initContainers", [])
    sidecars = [c["name"] for c in init if c.get("restartPolicy") == "Always"]
    if sidecars and version < SIDECAR_VERSION:
        raise UsageError(f"the job's pod runs the {', '.join(sidecars)} sidecar (results uploaded to S3 while it "
                         f"runs), which needs Kubernetes 1.29 or newer; the cluster runs {shown}: keep results on a "
                         "claim (pvc_claim, without S3_BUCKET_NAME), or use a newer cluster")
    return _sidecar_kubelets(nodes, plan, settings, sidecars, shown) if sidecars else []


def _sidecar_kubelets(nodes: NodeList, plan: LaunchPlan, settings: KubernetesSettings, sidecars: Sequence[str],
                      server: str) -> list[str]:
    """Kubelets may lag the API server by up to three minors (the version skew policy), and one
    older than 1.29 refuses a pod with a native sidecar at admission
    (pkg/kubelet/lifecycle/predicate.go, InitContainerRestartPolicyForbidden). Among the nodes the
    pods may run on (:mod:`.placement`, and enough GPUs): all too old is a refusal, some a warning.
    Nodes this identity may not list, or that report no version, are not judged."""
    usable = [node for node in nodes() or [] if barred(node, settings.node_selector, settings.tolerations) is None
              and node.gpus >= plan.gpus and node.kubelet is not None]
    old = sorted((node for node in usable if node.kubelet is not None and node.kubelet < SIDECAR_VERSION),
                 key=lambda node: node.name)
    if not old:
        return []
    shown = ", ".join(f"{node.name} ({node.kubelet[0]}.{node.kubelet[1]})" for node in old if node.kubelet)
    said = (f"the job's pod runs the {', '.join(sidecars)} sidecar, which needs kubelet 1.29 or newer on its node, "
            f"and the API server runs {server} but the kubelets of {shown} are older (a kubelet may lag the API "
            "server by three minors)")
    if len(old) == len(usable):
        raise UsageError(f"{said}: upgrade those nodes, or keep results on a claim (pvc_claim, without "
                         "S3_BUCKET_NAME) so the pod has no sidecar")
    return [f"{said}: a pod placed there is refused by its kubelet; set the target's node_selector to the newer "
            "nodes"]


def check_access(api: Api, needed: Sequence[Access]) -> None:
    denied = []
    for access in needed:
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                  "spec": {"resourceAttributes": {"namespace": api.namespace, "verb": access.verb,
                                                  "group": access.group, "resource": access.resource}}}
        answer = api.call(f"asking whether this identity may {access.describe()}",
                          api.authz.create_self_subject_access_review, review)
        if not (answer.get("status") or {}).get("allowed"):
            denied.append(access.describe())
    if denied:
        raise UsageError(f"{api.connection.origin} may not {', '.join(denied)} in namespace {api.namespace!r}: ask "
                         "the cluster's admin for a Role granting them and a RoleBinding to this identity")


def check_claim(api: Api, plan: LaunchPlan, settings: KubernetesSettings) -> None:
    claim = settings.pvc_claim
    if claim is None:
        return
    found = api.get(f"reading PersistentVolumeClaim {api.namespace}/{claim}",
                    api.core.read_namespaced_persistent_volume_claim, claim, api.namespace)
    if found is None:
        raise UsageError(f"pvc_claim {claim!r} does not exist in namespace {api.namespace!r}: create the "
                         "PersistentVolumeClaim there, or name one that exists")
    status = found.get("status") or {}
    phase = status.get("phase") or "Pending"
    if phase != "Bound" and not _binds_on_first_use(api, found):
        raise UsageError(f"pvc_claim {claim!r} is {phase}, not Bound: its volume is not provisioned (see the claim's "
                         "events), or it was released; fix or recreate the claim")
    modes = set(status.get("accessModes") or (found.get("spec") or {}).get("accessModes") or [])
    shared = "ReadWriteMany" in modes
    if settings.shards > 1 and not shared:
        raise UsageError(f"shards {settings.shards} run stage pods on several nodes at once, but pvc_claim {claim!r} "
                         f"is {sorted(modes)}, not ReadWriteMany: use shards 1, or a ReadWriteMany claim")
    if plan.nodes > 1 and not shared:
        raise UsageError(f"a job of {plan.nodes} nodes mounts pvc_claim {claim!r} on every node, but it is "
                         f"{sorted(modes)}, not ReadWriteMany: use a ReadWriteMany claim (NFS, Lustre, a CSI file "
                         "system), or route results to S3 without a claim")


def _binds_on_first_use(api: Api, claim: Mapping[str, Any]) -> bool:
    """Whether a Pending claim's StorageClass binds it when a pod first uses it (WaitForFirstConsumer,
    e.g. kind's and many clouds' defaults): then Pending is what it should be."""
    if (claim.get("status") or {}).get("phase") != "Pending":
        return False
    name = (claim.get("spec") or {}).get("storageClassName")
    if not name:
        return False
    try:
        found = api.get(f"reading StorageClass {name}", api.storage.read_storage_class, name)
    except UsageError:
        return False
    except ApiError as exc:
        if exc.status != 403:
            raise
        claim_name = (claim.get("metadata") or {}).get("name")
        raise UsageError(f"pvc_claim {claim_name!r} is Pending and its StorageClass {name!r} cannot be read (this "
                         "identity may not get storageclasses.storage.k8s.io), so the gate cannot tell whether it "
                         "binds on first use: ask the cluster's admin for the ClusterRole of "
                         "deployments/kubernetes-rbac.yaml, or bind the claim first") from None
    return found is not None and found.get("volumeBindingMode") == "WaitForFirstConsumer"


def check_secrets(api: Api, settings: KubernetesSettings, secret: SecretRef | None) -> None:
    """The image pull Secret and a pre-created credential Secret: there, of the right kind, with
    every key. Reads names and key names only."""
    for name in settings.image_pull_secrets:
        found = _secret(api, name)
        if found is None:
            raise UsageError(f"image_pull_secrets {name!r} does not exist in namespace {api.namespace!r}: create it "
                             "there (type kubernetes.io/dockerconfigjson, the registry's credentials), or drop it "
                             "from image_pull_secrets")
        if found.get("type") not in PULL_SECRET_TYPES:
            raise UsageError(f"image_pull_secrets {name!r} is of type {found.get('type')!r}, which the kubelet does "
                             "not use to pull: create it as kubernetes.io/dockerconfigjson")
    if secret is not None and not secret.per_job:
        found = _secret(api, secret.name)
        if found is None:
            raise UsageError(f"credential_secret {secret.name!r} does not exist in namespace {api.namespace!r}: create "
                             f"it with the keys {', '.join(secret.keys)}, or drop credential_secret to have one "
                             "made per job from this environment")
        keys = set(found.get("data") or {}) | set(found.get("stringData") or {})
        missing = [key for key in secret.keys if key not in keys]
        if missing:
            raise UsageError(f"credential_secret {secret.name!r} has no key {', '.join(missing)}, which forward_env "
                             "names: add them to the Secret, or remove them from forward_env")


def _secret(api: Api, name: str) -> dict[str, Any] | None:
    return api.get(f"reading Secret {api.namespace}/{name}", api.core.read_namespaced_secret, name, api.namespace)


def dry_run(api: Api, objects: Sequence[dict[str, Any]], job_id: str) -> None:
    """A server-side dry run of every object, in creation order; an object an earlier attempt
    of this job created passes, anyone else's is refused (see :func:`.apply.create`)."""
    for obj in objects:
        create(api, obj, job_id, dry_run=True)


#: What Pod Security admission says when it refuses a pod ("violates PodSecurity "LEVEL:VERSION": …").
_POD_SECURITY = re.compile(r'violates PodSecurity "(?P<level>[a-z]+):(?P<version>[^"]+)": (?P<why>.*)')


#: Quota admission's refusal of a pod that would take a resource past a ResourceQuota's hard limit
#: (apiserver pkg/admission/plugin/resourcequota/controller.go, CheckRequest).
_EXCEEDED = re.compile(r"exceeded quota: (?P<quota>[^,]+), requested: (?P<requested>\S*), used: (?P<used>\S*), "
                       r"limited: (?P<limited>[^\s;]*)")


def _quota_full(found: re.Match[str], job: str) -> str:
    """A quota only full now is a wait: the Job controller retries creating the pods (FailedCreate,
    requeued with backoff) until the namespace's other pods free it. A pod asking more than the
    quota's limit itself never fits: that is a refusal."""
    def amounts(text: str) -> dict[str, str]:
        return dict(item.split("=", 1) for item in text.split(",") if "=" in item)
    requested, limited = amounts(found["requested"]), amounts(found["limited"])
    never = [f"{name} {requested[name]} of {limited[name]}" for name in sorted(requested)
             if name in limited and parse_quantity(requested[name]) > parse_quantity(limited[name])]
    if never:
        raise UsageError(f"the pods of Job {job} ask for more than ResourceQuota {found['quota']} allows at all: "
                         f"{', '.join(never)}; lower compute_shape, or ask the namespace's admin to raise the quota")
    return (f"ResourceQuota {found['quota']} is full right now ({found[0]}): the Job controller creates the pods of "
            f"Job {job} once the namespace's other pods free it, and the job waits Pending until then (status says "
            "FailedCreate)")


def admit_pods(api: Api, objects: Sequence[dict[str, Any]]) -> list[str]:
    """A server-side dry run of a Pod made from each Job's template, before anything is created.
    Why: admission — Pod Security, policy webhooks, quotas, a LimitRange — judges pods, not Jobs,
    so the Job's own dry run passes and, created, its controller would loop on FailedCreate while
    verify waits for a pod that never comes. The pod is the one the Job controller would make —
    owned by its Job, with the controller's labels — since policies judge those (Kyverno's "prevent
    bare pods" refuses a pod no controller owns). A refusal names the level, the fields and the fix.
    Returns what the submit should say, one line per Job: what admission would change in the
    pods' resources (a LimitRange's defaults, set in every container that leaves a resource unset:
    a default cpu limit throttles training without a word), and a quota that is only full now."""
    changed = []
    for job in (obj for obj in objects if obj["kind"] == "Job"):
        template = job["spec"]["template"]
        name = job["metadata"]["name"]
        pod = {"apiVersion": "v1", "kind": "Pod", "spec": template["spec"],
               "metadata": {"name": f"{name}-admission-check", "namespace": api.namespace,
                            "labels": {**template["metadata"].get("labels", {}), **_controller_labels(name)},
                            "annotations": template["metadata"].get("annotations", {}),
                            "ownerReferences": [_owner(name)]}}
        try:
            admitted = api.call(f"a dry run of creating a pod of Job {api.namespace}/{name}",
                                api.core.create_namespaced_pod, api.namespace, pod, dry_run="All")
        except ApiError as exc:
            security = _POD_SECURITY.search(str(exc))
            if security is not None:
                raise UsageError(f"namespace {api.namespace!r} enforces the {security['level']!r} Pod Security level "
                                 f"({security['version']}), which refuses the pods of Job {name}: {security['why']}; "
                                 "run the training container as the level allows (the target's training_security: "
                                 "restricted with a non-root training_user), or use a namespace whose level admits "
                                 "the image's user") from None
            full = _EXCEEDED.search(str(exc)) if exc.status == 403 else None
            if full is not None:
                changed.append(_quota_full(full, name))
                continue
            if exc.status in (403, 422):
                webhook = (" (judged as a pod of the Job, sent by this identity, not by the Job controller that "
                           "makes the Job's pods: a policy keyed on who asks may judge those differently)"
                           if _WEBHOOK in str(exc) else "")
                raise UsageError(f"admission refuses the pods of Job {name}: {exc}{webhook}") from None
            raise
        sent, got = template["spec"], admitted.get("spec") or {}
        defaults = _defaulted_resources(sent, got, ours=False) if step_of(job) == "train" else ""
        if defaults:
            caps = (" a default limit caps the container (a cpu limit throttles training);" if "limits." in defaults
                    else "")
            changed.append(f"admission in namespace {api.namespace!r} (a LimitRange, or a mutating webhook) sets what "
                           f"the request leaves unset in the training pods of Job {name} — {defaults};{caps} give "
                           "compute_shape.cpu, memory and ephemeral_storage to choose them")
        own = _defaulted_resources(sent, got, ours=True)
        if own:
            changed.append(f"admission in namespace {api.namespace!r} (a LimitRange, or a mutating webhook) sets "
                           f"limits in tao-data-io's own containers of Job {name} — {own}: the kubelet kills a "
                           "container past its memory limit and evicts the pod past the sum of its containers' "
                           "ephemeral-storage limits (what the job stages and uploads counts), so a stage or the "
                           "final upload may end there; ask the namespace's admin for defaults that fit, or a "
                           "namespace without them")
    return changed


#: How the API server words a webhook's denial (apiserver pkg/admission/plugin/webhook/errors).
_WEBHOOK = "denied the request"
#: A uid no object has: a dry run stores nothing, and the API server only checks an owner's uid is set.
_NO_UID = "00000000-0000-0000-0000-000000000000"


def _controller_labels(job: str) -> dict[str, str]:
    """The labels the Job controller puts on its pods (pkg/controller/job, batch.kubernetes.io/
    job-name and controller-uid, and their legacy short forms), which policies may select on."""
    return {"batch.kubernetes.io/job-name": job, "job-name": job,
            "batch.kubernetes.io/controller-uid": _NO_UID, "controller-uid": _NO_UID}


def _owner(job: str) -> dict[str, Any]:
    """The Job as its pods' controller. No ``blockOwnerDeletion``: with it, the
    OwnerReferencesPermissionEnforcement plugin would ask for update on jobs/finalizers, which the
    Job controller has and this identity need not."""
    return {"apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": _NO_UID, "controller": True}


def _defaulted_resources(sent: Mapping[str, Any], admitted: Mapping[str, Any], *, ours: bool) -> str:
    """``container "train": limits.cpu=1, requests.cpu=500m; …`` — what admission added to the
    containers that were sent: the request's own (``train``), or tao-data-io's (``ours``: its
    stager, sidecars and probes, which set cpu and memory but may meet a default for anything
    else). Containers a webhook injects are its business."""
    found = []
    sent_containers = [*sent.get("initContainers", []), *sent.get("containers", [])]
    before = {c["name"]: c.get("resources") or {} for c in sent_containers if (c["name"] != TRAIN) == ours}
    for container in [*admitted.get("initContainers", []), *admitted.get("containers", [])]:
        if container["name"] not in before:
            continue
        asked = before[container["name"]]
        own_limits = asked.get("limits") or {}
        # A request the API server copied from the container's own limit (its defaulting of a
        # GPU's request) is not admission's.
        added = [f"{kind}.{resource}={value}" for kind in ("limits", "requests")
                 for resource, value in sorted(((container.get("resources") or {}).get(kind) or {}).items())
                 if resource not in (asked.get(kind) or {}) and not (kind == "requests" and resource in own_limits)]
        if added:
            found.append(f'container "{container["name"]}": {", ".join(added)}')
    return "; ".join(found)
