"""What the Kubernetes backend is built from and adds to a launch plan: the namespace, the
kubeconfig context's name, the claim, Secret names, images, TTL, scheduling.

Declared once: :class:`~tao_data_io.backends.kubernetes.backend.KubernetesBackend` is built from it, the
renderer reads it, the ``tao-kubernetes-target`` block embeds it, the CLI fills it from its
flags, and a job record keeps its dump. The renderer's rules are its validators, and each
refusal is a :class:`~tao_data_io.errors.UsageError` naming the field, the value and the fix
(``namespace 'Tao' is not a DNS label: …``), which the CLI turns into flag names. Names only:
the kubeconfig, its path and every Secret's contents stay where they are.
"""

from __future__ import annotations

import re
from typing import Any, Literal, ClassVar

from pydantic import Field, ValidationInfo, field_validator, model_validator

from ...errors import UsageError
from ...launch.backend import BackendSettings
from .names import check_dns_label, check_dns_subdomain
from ...quantities import checked_quantity
from ...uris import parse_s3_url
from .placement import HOSTNAME_LABEL

DEFAULT_TTL_SECONDS = 3600
MAX_TTL_SECONDS = 604800
DEFAULT_RESYNC_SECONDS = 300
#: A cancel's grace for the job's pods: enough for a final upload of what changed since the last
#: resync at the measured rate (a checkpoint of about half a gigabyte), not the whole results
#: budget the pods' own grace is sized for, which holds the GPUs for up to two hours.
DEFAULT_CANCEL_GRACE_SECONDS = 60
RESYNC_SECONDS_BOUNDS = (10, 86400)
MAX_SHARDS = 1000
#: The longest a pod may stay Terminating for its final upload, whatever the request's
#: results_limit says (a stalled upload must not hold a node for days): two hours.
MAX_GRACE_SECONDS = 7200
#: How long a pod may wait for a node of an autoscaled pool unless the target says: a GPU node
#: from zero takes minutes (cloud capacity, the driver and device plugin), not an hour.
DEFAULT_PENDING_TIMEOUT_S = 1800.0
#: Labels the Job controller puts on a Job's pods and selects them by (pkg/registry/batch/job/strategy.go).
_CONTROLLER_LABELS = frozenset({"job-name", "controller-uid"})
#: The most an object's annotations may hold (apimachinery's TotalAnnotationSizeLimitB).
ANNOTATIONS_LIMIT = 256 * 1024
#: A day: longer than that is a queue's job (Kueue), not a pod's Pending.
MAX_PENDING_TIMEOUT_S = 86400.0
_LABEL_KEY = re.compile(r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                        r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
_TOLERATION_FIELDS = {"key", "operator", "value", "effect", "tolerationSeconds"}


def _toleration_problem(toleration: dict[str, Any]) -> str | None:
    """Why the API server refuses ``toleration`` (upstream ``ValidateTolerations``), if it does."""
    key, operator = toleration.get("key") or "", toleration.get("operator") or "Equal"
    value, effect = toleration.get("value") or "", toleration.get("effect") or ""
    if operator not in ("Equal", "Exists"):
        return f"operator {operator!r} is not Equal or Exists (spelled so)"
    if not key and operator != "Exists":
        return "a toleration without a key matches every taint, so its operator must be Exists"
    if key and not _LABEL_KEY.fullmatch(key):
        return f"key {key!r} is not a taint key ([prefix/]name)"
    if operator == "Exists" and value:
        return "operator Exists matches any value: give no value"
    if operator == "Equal" and not _LABEL_VALUE.fullmatch(value):
        return f"value {value!r} is not a taint value (at most 63 letters, digits, '-', '_' or '.')"
    if effect not in ("", "NoSchedule", "PreferNoSchedule", "NoExecute"):
        return f"effect {effect!r} is not NoSchedule, PreferNoSchedule or NoExecute"
    if toleration.get("tolerationSeconds") is not None and effect != "NoExecute":
        return "tolerationSeconds applies to the NoExecute effect only: set effect NoExecute or drop it"
    return None


def _kubernetes_own(key: str) -> bool:
    """A label key Kubernetes sets or reserves: the Job controller's, or under kubernetes.io/ or
    k8s.io/ (app.kubernetes.io/, the recommended labels, is the users')."""
    prefix = key.partition("/")[0] if "/" in key else ""
    reserved = prefix in ("kubernetes.io", "k8s.io") or prefix.endswith((".kubernetes.io", ".k8s.io"))
    return key in _CONTROLLER_LABELS or (reserved and prefix != "app.kubernetes.io")


def _check_label_key(key: str, *, what: str) -> str:
    """A label (or annotation) key: ``[prefix/]name``, the name at most 63 characters."""
    if not (_LABEL_KEY.fullmatch(key) and len(key.rpartition("/")[2]) <= 63):
        raise UsageError(f"{what} {key!r} is not a label key: [prefix/]name, the name at most 63 letters, digits, '-', "
                         "'_' or '.'")
    return key


class KubernetesSettings(BackendSettings):
    """Where on a cluster each job runs, and what its pods get besides the launch plan."""

    name: ClassVar[str] = "kubernetes"

    namespace: str | None = Field(
        None, title="Namespace",
        description="The namespace the job's objects live in. Empty: $TAO_K8S_NAMESPACE, else the kubeconfig "
                    "context's, else the pod's service account's, else default.")
    context: str | None = Field(
        None, title="Kubeconfig context",
        description="The NAME of a context in the kubeconfig ($KUBECONFIG or ~/.kube/config) of the machine that "
                    "runs the verb. Empty: $TAO_K8S_CONTEXT, else the kubeconfig's current context, else (no "
                    "kubeconfig, inside a pod) the pod's service account.")
    pvc_claim: str | None = Field(
        None, title="PersistentVolumeClaim",
        description="A Bound claim: tier B stages into its cache/, pre-positioned inputs and results live on it. "
                    "Empty: the request's storage.pvc_claim, else none (tier C: the pod fetches its inputs, and "
                    "results persist only through an upload).")
    credential_secret: str | None = Field(
        None, title="Credential Secret",
        description="The NAME of a pre-created Secret in the namespace holding the request's forward_env keys. "
                    "Empty: a per-job Secret <job>-credentials, created with the values at submit and deleted with "
                    "the Job.")
    image_pull_secrets: list[str] = Field(
        default_factory=list, title="Image pull Secrets",
        description="The NAMES of Secrets in the namespace for pulling images — nvcr.io's for TAO, a private "
                    "registry's for the stager; their contents stay in the cluster.")
    stager_image: str | None = Field(
        None, title="Stager image",
        description="The image with tao-data-io and its CLI (docker/stager/Dockerfile): tier B's stage Job, tier C's "
                    "stager and the results sidecar run it.")
    ttl_seconds: int = Field(
        DEFAULT_TTL_SECONDS, title="TTL after finished (s)",
        description=f"How long a finished Job and its logs stay (0 to {MAX_TTL_SECONDS}, 7 days); the job record "
                    "outlives it.")
    shm_size: str | None = Field(
        None, title="/dev/shm size", description="Overrides the request's compute_shape.shm_size, e.g. 16Gi.")
    shards: int = Field(
        1, title="Stage shards",
        description=f"Tier B: pods of the stage Job (1 to {MAX_SHARDS}); more than one makes it an Indexed Job, and "
                    "the claim must then be ReadWriteMany.")
    node_selector: dict[str, str] = Field(
        default_factory=dict, title="Node selector",
        description="Labels a node must have to run the job's pods (the pod spec's nodeSelector).")
    tolerations: list[dict[str, Any]] = Field(
        default_factory=list, title="Tolerations",
        description="The pods' tolerations, each with key, operator, value, effect and tolerationSeconds as the pod "
                    "spec has them (e.g. for tainted GPU nodes).")
    service_account: str | None = Field(
        None, title="Service account",
        description="The NAME of the service account the job's pods run as; with cloud_identity, the one bound to a "
                    "cloud role (IRSA's eks.amazonaws.com/role-arn annotation, an EKS Pod Identity association, GKE "
                    "Workload Identity). Empty: the namespace's default, and no token in the pods.")
    cloud_identity: bool = Field(
        False, title="Pods have cloud identity",
        description="The pods reach S3 with their service account's cloud identity instead of static keys: "
                    "forward_env need not name S3 keys, no Secret carries any, and the pods keep their service "
                    "account token (IRSA and Pod Identity exchange it for a role's credentials).")
    collective_probe: bool = Field(
        True, title="Probe multi-node collectives",
        description="Before a multi-node GPU job's pods take their GPUs, two pods on two nodes all-reduce over NCCL "
                    "with a deadline; a hang fails the submit naming the NCCL settings to try, and a pass is "
                    "remembered for this image, node selector, tolerations and NCCL settings, so later jobs skip it.")
    capacity: Literal["fixed", "autoscaled", "queued"] = Field(
        "fixed", title="GPU capacity",
        description="fixed: a job the GPU nodes its pods may run on cannot hold now is refused before anything is "
                    "made; autoscaled: the node pool grows when pods ask (a pool scaled to zero has no GPU node "
                    "until then), so that is a warning, and a pod may wait for a node up to pending_timeout; queued: "
                    "Kueue admits each Job from queue_name when its quota allows (the Job is made suspended and Kueue "
                    "resumes it), a warning too, waiting up to pending_timeout.")
    pending_timeout: float | None = Field(
        None, title="Pending timeout (s)",
        description=f"With autoscaled or queued: how long a job may wait to be admitted and scheduled before its "
                    f"Job is deleted, the reason recorded; empty: {DEFAULT_PENDING_TIMEOUT_S:g}.")
    queue_name: str | None = Field(
        None, title="Kueue LocalQueue",
        description="With queued: the NAME of the LocalQueue in the namespace the Jobs go to (their "
                    "kueue.x-k8s.io/queue-name label).")
    priority_class: str | None = Field(
        None, title="Priority class",
        description="The NAME of a PriorityClass for the pods (priorityClassName): which jobs preempt which, and "
                    "Kueue's order within a queue.")
    exclusive_topology: str | None = Field(
        HOSTNAME_LABEL, title="Exclusive placement",
        description="Multi-node jobs: a node label key no two of the job's pods may share a value of (the pods' "
                    "required anti-affinity) — kubernetes.io/hostname puts one pod on each node; empty: none.")
    labels: dict[str, str] = Field(
        default_factory=dict, title="Labels",
        description="Labels the job's Jobs and pods carry besides tao-data-io's own (cost centre, team, a "
                    "scheduler's), each a label key and value.")
    annotations: dict[str, str] = Field(
        default_factory=dict, title="Annotations",
        description="Annotations the job's Jobs and pods carry besides tao-data-io's own.")
    training_security: Literal["image", "restricted"] = Field(
        "image", title="Training container security",
        description="image: the training image's own user (TAO images run as root), for namespaces whose Pod "
                    "Security level allows it; restricted: the 'restricted' Pod Security Standard for the training "
                    "container and the verify probe too (the image must run as a non-root user, or set training_user).")
    training_user: int | None = Field(
        None, ge=1, le=2**31 - 1, title="Training user",
        description="With restricted: the UID the training container and the probe run as (runAsUser).")
    records_url: str | None = Field(
        None, title="Shared job records",
        description="TAO_DATA_IO_RECORDS for the pods' stager and results sidecar: a shared record store "
                    "(s3://BUCKET/PREFIX/) they report into. Empty: the pods report nothing into a record.")
    cancel_grace_seconds: int = Field(
        DEFAULT_CANCEL_GRACE_SECONDS, ge=1, le=MAX_GRACE_SECONDS, title="Cancel grace (s)",
        description="On cancel, how long the job's pods have between SIGTERM and SIGKILL: the results sidecar's "
                    "final upload of what the last resync did not send. 1 kills them at once (no final upload; 0 "
                    "would be a force delete, which removes the pod object while its containers may still run, so "
                    "its GPUs look free before they are); never more than the pods' own grace, which is sized for "
                    "the whole results budget.")
    resync_seconds: int = Field(
        DEFAULT_RESYNC_SECONDS, title="Results resync interval (s)",
        description=f"How often the results sidecar uploads what the job wrote so far ({RESYNC_SECONDS_BOUNDS[0]} "
                    f"to {RESYNC_SECONDS_BOUNDS[1]}).")

    @model_validator(mode="before")
    @classmethod
    def _retired_fields(cls, data: Any) -> Any:
        """``results_budget`` moved to the request (``outputs.results_limit``: one owner for the
        results' size); a target saved before still holds it, and still loads without it."""
        if isinstance(data, dict) and "results_budget" in data:
            data = {name: value for name, value in data.items() if name != "results_budget"}
        return data

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str | None) -> str | None:
        return value if value is None else check_dns_label(value, what="namespace")

    @field_validator("pvc_claim", "credential_secret", "queue_name", "priority_class", "service_account")
    @classmethod
    def _object_name(cls, value: str | None, info: ValidationInfo) -> str | None:
        return value if value is None else check_dns_subdomain(value, what=str(info.field_name))

    @field_validator("queue_name")
    @classmethod
    def _queue_label(cls, value: str | None) -> str | None:
        """The name becomes the Jobs' ``kueue.x-k8s.io/queue-name`` label, and a label value is at
        most 63 characters (apimachinery IsValidLabelValue), though a LocalQueue's own name may be longer."""
        if value is not None and len(value) > 63:
            raise UsageError(f"queue_name {value!r} is {len(value)} characters: it becomes the Jobs' "
                             "kueue.x-k8s.io/queue-name label, whose value is at most 63; name a LocalQueue with a "
                             "shorter name")
        return value

    @field_validator("stager_image")
    @classmethod
    def _stager_image(cls, value: str | None) -> str | None:
        if value is not None and (not value or any(c.isspace() for c in value)):
            raise UsageError(f"stager_image {value!r} is not an image reference; give one such as "
                             "registry.example.com/tao-data-io-stager:0.1.0")
        return value

    @field_validator("ttl_seconds")
    @classmethod
    def _ttl_seconds(cls, value: int) -> int:
        if not 0 <= value <= MAX_TTL_SECONDS:
            raise UsageError(f"ttl_seconds {value!r} must be 0 to {MAX_TTL_SECONDS} (7 days); the Job and its logs "
                             "are deleted that long after it ends")
        return value

    @field_validator("shm_size")
    @classmethod
    def _quantity(cls, value: str | None, info: ValidationInfo) -> str | None:
        return value if value is None else checked_quantity(value, str(info.field_name))

    @field_validator("shards")
    @classmethod
    def _shards(cls, value: int) -> int:
        if not 1 <= value <= MAX_SHARDS:
            raise UsageError(f"shards {value!r} must be 1 to {MAX_SHARDS}")
        return value

    @field_validator("resync_seconds")
    @classmethod
    def _resync_seconds(cls, value: int) -> int:
        low, high = RESYNC_SECONDS_BOUNDS
        if not low <= value <= high:
            raise UsageError(f"resync_seconds {value!r} must be {low} to {high}")
        return value

    @field_validator("records_url")
    @classmethod
    def _records_url(cls, value: str | None) -> str | None:
        if value is not None:
            parse_s3_url(value, field="records_url")
        return value

    @model_validator(mode="before")
    @classmethod
    def _one_pull_secret_becomes_a_list(cls, data: Any) -> Any:
        """Settings recorded (or blocks saved) with one ``image_pull_secret`` load with it listed."""
        if not isinstance(data, dict) or "image_pull_secret" not in data:
            return data
        data = dict(data)
        single = data.pop("image_pull_secret")
        if single is not None and data.get("image_pull_secrets"):
            raise UsageError("image_pull_secret and image_pull_secrets are both given: list every Secret in "
                             "image_pull_secrets")
        if single is not None:
            data["image_pull_secrets"] = [single]
        return data

    @field_validator("image_pull_secrets")
    @classmethod
    def _pull_secrets(cls, value: list[str]) -> list[str]:
        for name in value:
            check_dns_subdomain(name, what="image_pull_secrets name")
        if len(set(value)) != len(value):
            raise UsageError(f"image_pull_secrets {value!r} names a Secret twice: name each once")
        return value

    @model_validator(mode="after")
    def _identity_has_an_account(self) -> KubernetesSettings:
        if self.cloud_identity and self.service_account is None:
            raise UsageError("cloud_identity needs service_account: the NAME of the service account bound to the "
                             "cloud role (a namespace's default account rarely is)")
        return self

    @model_validator(mode="after")
    def _pending_timeout(self) -> KubernetesSettings:
        if self.pending_timeout is not None and self.capacity == "fixed":
            raise UsageError("pending_timeout applies to capacity 'autoscaled' or 'queued' only (this target's is "
                             "'fixed': a job its nodes cannot hold is refused before it waits)")
        if (self.queue_name is None) == (self.capacity == "queued"):
            raise UsageError(f"queue_name {self.queue_name!r} with capacity {self.capacity!r}: a queued target names "
                             "the LocalQueue its Jobs go to, and only a queued one does — set both or neither")
        if self.pending_timeout is not None and not 0 < self.pending_timeout <= MAX_PENDING_TIMEOUT_S:
            raise UsageError(f"pending_timeout {self.pending_timeout!r} must be more than 0 and at most "
                             f"{MAX_PENDING_TIMEOUT_S:g} seconds")
        return self

    @property
    def schedule_timeout(self) -> float | None:
        """How long a job may wait to be admitted and placed on an autoscaled pool or a queue; None:
        the verify budget counts it."""
        if self.capacity == "fixed":
            return None
        return DEFAULT_PENDING_TIMEOUT_S if self.pending_timeout is None else self.pending_timeout

    @field_validator("node_selector", "labels")
    @classmethod
    def _label_pairs(cls, value: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        for key, label in value.items():
            _check_label_key(key, what=f"{info.field_name} key")
            if info.field_name == "labels" and _kubernetes_own(key):
                raise UsageError(f"labels key {key!r} is Kubernetes' own (the Job controller selects a Job's pods by "
                                 "job-name and controller-uid, and kubernetes.io/ and k8s.io/ are reserved): remove it")
            if not _LABEL_VALUE.fullmatch(label):
                raise UsageError(f"{info.field_name} {key!r} value {label!r} is not a label value: at most 63 "
                                 "letters, digits, '-', '_' or '.', starting and ending with a letter or digit")
        return value

    @field_validator("annotations")
    @classmethod
    def _annotations(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            _check_label_key(key, what="annotations key")
        if sum(len(k) + len(v) for k, v in value.items()) > ANNOTATIONS_LIMIT // 2:
            raise UsageError(f"annotations hold more than {ANNOTATIONS_LIMIT // 2} bytes; an object's annotations are "
                             f"at most {ANNOTATIONS_LIMIT} in all, and tao-data-io's own need room: keep them short")
        return value

    @field_validator("exclusive_topology")
    @classmethod
    def _exclusive_topology(cls, value: str | None) -> str | None:
        return None if value is None else _check_label_key(value, what="exclusive_topology")

    @field_validator("tolerations")
    @classmethod
    def _tolerations(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for index, toleration in enumerate(value):
            unknown = sorted(set(toleration) - _TOLERATION_FIELDS)
            if unknown:
                raise UsageError(f"tolerations[{index}] has unknown fields {unknown}; use "
                                 f"{sorted(_TOLERATION_FIELDS)}")
            problem = _toleration_problem(toleration)
            if problem is not None:
                raise UsageError(f"tolerations[{index}] {toleration!r}: {problem}")
        return value
