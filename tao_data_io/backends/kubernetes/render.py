"""Every manifest a job needs, from its launch plan: pure, deterministic, ``kubectl apply``-ready.

What comes out (:func:`render_job`), all labelled ``app.kubernetes.io/managed-by: tao-data-io``
and ``tao-data-io/job-id: <job name>`` (the training Job's name, which is the id; the id is also
the annotation of the same key), all named from the job id (:func:`.names.object_names`
says how, and why no two jobs share a name):

* a **ConfigMap** ``<id>-files``: the materialized config (mounted read-only at its path), the
  verify probe, its checklist and wrapper, and — when the pod stages or uploads — the request,
  the job record and the stager and sidecar scripts. Names and paths only;
* tier B: a **stage Job** ``<id>-stage…`` (stager image, no GPU, the claim mounted read-write)
  that fills the claim's ``cache/`` before the training Job exists; an Indexed Job of
  ``shards`` pods when asked;
* multi-node: a headless **Service** ``ranks-<id>``, the pods' subdomain, for rendezvous at
  ``<id>-0.ranks-<id>``;
* the training **Job** ``<id>``: one pod (or an Indexed Job of ``nodes`` pods), ``backoffLimit: 0``
  (one pod: as many replacements after a disruption as the request allows, and a failure policy
  that ends it at any other non-zero exit; see :func:`failure_policy`), ``restartPolicy: Never``,
  ``ttlSecondsAfterFinished``. Its initContainers, in order: the stager (tier C, or whenever
  results are uploaded), the results sidecar (a native sidecar, whenever results are uploaded),
  the status sidecar (a native sidecar on every tier, in the
  training image: it follows TAO's ``status.json`` into its log, for the collect run's progress
  artifacts), and last the **verify probe** in the training image with the training container's
  mounts and credentials; its verdict is the termination message and any failure stops the pod
  before training starts.

Credentials are ``secretKeyRef`` entries for exactly the plan's ``forward_env`` names, from the
per-job Secret (created with values at apply time) or a pre-created one; the output never holds
a value, and a final pass refuses it if any credential value of this environment appears in it.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ...credentials import AWS_TO_LEGACY
from ...redaction import Redactor
from ...errors import UNWRITABLE_EXIT, UsageError
from ...fs.confinement import check_relative
from ...frame import AGENT_ROOT
from ...launch.plan import PROBE_DIR, LaunchPlan, PlanMount, refuse_smuggled_secrets
from ...launch.probe import PROBE_SCRIPT, TOKEN_FILE, Check, checklist, checklist_text, termination_budget
from ...launch.rendezvous import MASTER_PORT, RENDEZVOUS_NAMES, rendezvous_env
from ...launch.training import STATUS_FILE
from ...names import check_env_name
from .names import object_names
from ...records import JobRecord
from ...quantities import quantity_bytes
from ...frame import check_container_path
from ...request import DEFAULT_RESULTS_LIMIT, JobRequest
from ...tier import TIER_C_BYTES_PER_SECOND
from ...launch.collective import DEFAULT_TIMEOUT_S, PROBE_PROGRAM
from .kueue import QUEUE_LABEL
from .placement import HOSTNAME_LABEL
from .pods import RESULTS_VOLUME, STAGING_VOLUME, STATUS, STOPPABLE, STOPPED_EXIT
from ...launch.agents import SIDECAR_SCRIPT, STAGER_SCRIPT, STATUS_SCRIPT, TRAIN_WRAPPER, VERIFY_SCRIPT
from .settings import MAX_GRACE_SECONDS, KubernetesSettings

MANAGED_BY = {"app.kubernetes.io/managed-by": "tao-data-io"}
JOB_ID_LABEL = "tao-data-io/job-id"
#: ``kubectl apply -l tao-data-io/step=stage`` applies what must run first (tier B).
STEP_LABEL = "tao-data-io/step"
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
TERMINATION_LOG = "/dev/termination-log"
#: Our own paths inside a pod; no declared target may use them.
FILES_DIR = f"{AGENT_ROOT}/files"
#: The container securityContext of the 'restricted' Pod Security Standard (pod-security-admission
#: policy: allowPrivilegeEscalation, capabilities, runAsNonRoot, seccompProfile), which our own
#: containers — the stager, the sidecars, the stage Job's — always run under: a namespace that
#: enforces it admits them, and none of them needs more.
RESTRICTED: dict[str, Any] = {"runAsNonRoot": True, "allowPrivilegeEscalation": False,
                              "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}
#: The stager image's user (docker/stager/Dockerfile): the stage pod's fsGroup, so a new claim's
#: root-owned directory is made writable for it where the volume applies fsGroup.
STAGER_UID = 1000
#: Who the status sidecar runs as in the training image, whose own user is root: it only reads.
NOBODY = 65534
#: What our own containers request and their limits. Why both: a ResourceQuota on cpu or memory
#: — requests.*, or limits.* — refuses a pod any of whose containers, init containers included,
#: leaves that one unset (pkg/quota/v1/evaluator/core/pods.go, Constraints and
#: enforcePodContainerConstraints), and ours must never be the reason a job's pod is refused.
#: Quota only needs them set, so the limits are bounds well above use, not the requests: a cpu
#: limit only throttles (a few cores for the transfers, and never training's to lose), but a
#: memory limit OOM-kills — the final upload, or a stage — so it sits far past what s5cmd's parts
#: in flight and the tool hold; the status sidecar is a ``tail``, verify a shell probe.
OWN_RESOURCES: dict[str, dict[str, Any]] = {
    "stage": {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"cpu": "2", "memory": "4Gi"}},
    "results": {"requests": {"cpu": "50m", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "4Gi"}},
    "status": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"cpu": "100m", "memory": "64Mi"}},
    "verify": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "512Mi"}},
}
#: The collective probe's container, one GPU besides: cpu and memory requested and limited for the
#: same quotas, and so it is not BestEffort (evicted first). ``import torch`` and a CUDA context
#: take a GiB or two of host memory; the limit leaves room, as an OOM kill would read as a failed
#: probe; a core or two keeps the import well inside the probe's deadline.
PROBE_RESOURCES: dict[str, dict[str, str]] = {"requests": {"cpu": "1", "memory": "2Gi"},
                                              "limits": {"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": "1"}}
#: What tier C's staging volume holds besides the inputs: the config and the stager's state.
STAGING_MARGIN = 256 * 2**20
#: Which attempt of the job made an object (``LaunchPlan.attempt``): a later attempt replaces an
#: ended earlier one's objects instead of being refused as another request.
ATTEMPT_ANNOTATION = "tao-data-io/attempt"
#: How often the status sidecar looks for status.json before the job has written it.
STATUS_WAIT_SECONDS = 5
STATE_DIR = f"{AGENT_ROOT}/state"
#: Where the verify probe marks that it passed (``passed``), for the results sidecar: a volume of
#: our containers only, so nothing the job does can make a failed pod look verified.
VERDICT_DIR = f"{AGENT_ROOT}/verdict"
#: How many nodes the collective probe spans (a two-node all-reduce: the least that crosses nodes) and how long
#: each of its ranks may take to join and all-reduce.
PROBE_NODES = 2
COLLECTIVE_TIMEOUT_S = DEFAULT_TIMEOUT_S
#: The label of what the backend keeps for a namespace rather than a job (a collective probe's
#: remembered pass): no job's label, so no cancel or TTL removes it.
CACHE_LABEL = "tao-data-io/cache"
#: The wrapper's $0, as ``ps`` in the training container shows it.
WRAPPER_NAME = "tao-train"
STAGING_DIR = f"{AGENT_ROOT}/staging"
VOLUME_ROOT = f"{AGENT_ROOT}/volume"
RESERVED = (AGENT_ROOT, PROBE_DIR, "/dev/shm")
#: Tier B stages into this directory of the claim (the stage cache, :mod:`tao_data_io.staging.cache`).
CACHE_DIR = "cache"
#: Each job's results on the claim are ``results/<job>``.
RESULTS_DIR = "results"
#: Each tier B job's staging maps on the claim are under ``jobs/<job>/``.
JOBS_DIR = "jobs"
#: The final upload's time: the budget at the measured rate, plus this much for start-up.
GRACE_MARGIN_SECONDS = 60


def failure_policy(pod: dict[str, Any]) -> dict[str, Any]:
    """A one-pod training Job's failure policy (rules in order, the first match wins):

    1. a pod that was disrupted — preempted, evicted, its node drained: the ``DisruptionTarget``
       condition — counts towards ``backoffLimit`` (the request's ``disruption_retries``) and is
       replaced; it comes first, since an evicted pod's containers exit non-zero too;
    2. training, the stager or the verify probe that Kubernetes stopped (``STOPPED_EXIT``) counts
       too. A Kueue preemption or eviction suspends the Job, whose controller deletes the pods
       with no condition and never counts them, yet still judges each by this policy
       (``getFailJobMessage``): failing them would end a Job Kueue meant to requeue. The kubelet's
       own evictions for local storage stop the pod the same way with no condition; counted, they
       are retried at most ``backoffLimit`` times, never forever. One rule per container: a rule
       without ``containerName`` would match a native sidecar the kubelet stops after training
       failed, and retry the failure;
    3. any other non-zero exit of any container (the command, an OOM kill at 137, the verify
       probe, the stager) fails the Job at once, since running it again gives the same.

    A ``containerName`` must name a container of the pod (batch validation), so the rules name
    only those this pod has. A multi-node Job keeps ``backoffLimit: 0`` and no policy: a
    replacement rank cannot rejoin the static rendezvous the others are in."""
    names = {c["name"] for c in [*pod.get("initContainers", []), *pod.get("containers", [])]}
    stops = [{"action": "Count", "onExitCodes": {"containerName": name, "operator": "In", "values": [STOPPED_EXIT]}}
             for name in STOPPABLE if name in names]
    return {"rules": [{"action": "Count", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
                      *stops, {"action": "FailJob", "onExitCodes": {"operator": "NotIn", "values": [0]}}]}


#: A ConfigMap holds at most 1 MiB.
CONFIGMAP_LIMIT = 1024 * 1024
#: Either family of S3 key names (forwarded names are projected as given: the per-job Secret's
#: values come from ``credentials.forwarded_values``, which maps the other family in memory).
_S3_KEYS = (("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"),
            (AWS_TO_LEGACY["AWS_ACCESS_KEY_ID"], AWS_TO_LEGACY["AWS_SECRET_ACCESS_KEY"]))


@dataclass(frozen=True)
class SecretRef:
    """The Secret the pods read credentials from: its name and the keys they expect. Whether
    the renderer's (``per_job``: created with values at apply time) or the user's."""

    name: str
    keys: list[str]
    per_job: bool


@dataclass
class RenderedJob:
    objects: list[dict[str, Any]]
    secret: SecretRef | None
    warnings: list[str] = field(default_factory=list)

    def to_yaml(self) -> str:
        """Multi-document YAML for ``kubectl apply -f -``. Comments name the Secret and say that a
        Job's pod template is immutable (pkg/apis/batch/validation ``ValidateJobSpecUpdate``):
        ``kubectl apply`` of a changed render under the same id would change the other objects
        and refuse the Job — a partial apply — so the Job is deleted first."""
        head = ""
        if self.secret is not None:
            owner = ("the per-job Secret, created with values from the submitting environment at apply time"
                     if self.secret.per_job else "pre-created; it must hold these keys")
            head = f"# Secret {self.secret.name} ({owner}): keys {', '.join(self.secret.keys)}\n"
        for job in (obj["metadata"]["name"] for obj in self.objects if obj["kind"] == "Job"):
            head += (f"# Job {job}: its pod template is immutable; to apply a changed render under this job id, "
                     f"kubectl delete job {job} first (apply alone changes the rest and refuses the Job)\n")
        return head + yaml.dump_all(self.objects, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=120)


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (scripts, the config) as ``|`` blocks, so the manifest reads as written;
    no anchors or aliases (``&id001``/``*id001`` where two containers share an env list or a
    securityContext): a GitOps diff, a reviewer and some tools read each object whole."""

    def ignore_aliases(self, data: object) -> bool:
        return True


_Dumper.add_representer(str, lambda dumper, text: dumper.represent_scalar(
    "tag:yaml.org,2002:str", text, style="|" if "\n" in text else None))


def read_config(plan: LaunchPlan) -> bytes | None:
    """The materialized config's bytes, from the staging root on this host (None without one)."""
    mount = next((m for m in plan.mounts if m.origin == "config"), None)
    if mount is None:
        return None
    path = Path(plan.staging_dir) / mount.source
    try:
        return path.read_bytes()
    except OSError as exc:
        raise UsageError(f"config {str(path)!r} cannot be read ({exc.strerror}); stage the request again") from None


def stager_in_pod(plan: LaunchPlan) -> bool:
    """Whether the training pods run the stager before the verify probe: tier C's stages the
    inputs there, and a job whose results are uploaded restores those uploaded so far (a later
    attempt, a replaced pod) and checks that it can upload."""
    return plan.tier == "C" or plan.route.route == "s3"


def probes_collectives(plan: LaunchPlan, settings: KubernetesSettings) -> bool:
    """A multi-node GPU job probes its collectives first (see :mod:`tao_data_io.launch.collective`)."""
    return plan.nodes > 1 and plan.gpus > 0 and settings.collective_probe


def render_job(plan: LaunchPlan, settings: KubernetesSettings, *, request: JobRequest, record: JobRecord,
               config: bytes | None, environ: Mapping[str, str] | None = None,
               status_sidecar: bool = True, suspend_training: bool = False) -> RenderedJob:
    """The objects for ``plan`` on the cluster ``settings`` describe (see the module docstring), in
    ``settings.namespace``, which must be set (the backend sets its connection's).

    ``request`` is what a pod's stager stages (tiers B and C); ``record`` the job's record, of
    which the pods get a copy with the plan's route; ``config`` the materialized config's bytes
    (:func:`read_config`), refused unless they match the digest in its name. ``environ``
    (default ``os.environ``) is only read to refuse any credential value found in the output.
    ``status_sidecar``: False on a cluster older than native sidecars (1.29), where an
    initContainer that never exits would keep the pod from starting: no progress is shown there.
    ``suspend_training``: tier B's training Job is rendered ``suspend: true`` (``render-job``, for
    a ``kubectl apply`` of everything at once): it starts only when resumed after the stage Job
    completed, so the kubelet never makes a missing subPath of the cache an empty directory.
    """
    refuse_smuggled_secrets(plan.env, environ)
    job = _Job(plan, settings, request, record, config, status_sidecar, suspend_training)
    rendered = job.render()
    _refuse_values(rendered, environ)
    return rendered


class _Job:
    """One render: the checks, then the objects. A class only to share the derived names."""

    def __init__(self, plan: LaunchPlan, settings: KubernetesSettings, request: JobRequest, record: JobRecord,
                 config: bytes | None, status_sidecar: bool = True, suspend_training: bool = False) -> None:
        if settings.namespace is None:
            raise UsageError("the objects are rendered into a namespace, and none was given: give namespace")
        self.plan, self.settings, self.request, self.record, self.config = plan, settings, request, record, config
        self.status_sidecar = status_sidecar
        self.suspend_training = suspend_training and plan.tier == "B"
        self.names = object_names(plan.job_id)
        self.labels = {**MANAGED_BY, JOB_ID_LABEL: self.names.job}
        self.multi = plan.nodes > 1
        #: Results persist on the claim when there is one; else only through an upload.
        self.results_on_claim = settings.pvc_claim is not None
        self.uploads = plan.route.route == "s3"
        self.stages_in_pod = plan.tier == "C"
        #: Tier C's staging volume, sized to hold what its stager writes (None: unknown, no limit).
        self.staging_bytes = (plan.staging_bytes + STAGING_MARGIN
                              if plan.staging_bytes is not None and self.stages_in_pod else None)
        self.needs_stager = stager_in_pod(plan)
        self.secret = self._secret()
        _check_plan(plan, settings)
        self.config_key = _check_config(plan, config)
        self._check_tier()
        self.checks = self._checks()

    # ----------------------------------------------------------------- checks
    def _secret(self) -> SecretRef | None:
        names = list(dict.fromkeys(self.plan.forward_env))
        if not names:
            if self.settings.credential_secret is not None:
                raise UsageError(f"credential_secret {self.settings.credential_secret!r} is given but the request "
                                 "forwards no credential (forward_env is empty); list the variables in forward_env, "
                                 "or drop credential_secret")
            return None
        for name in names:
            check_env_name(name, what="forward_env name")
        given = self.settings.credential_secret
        return SecretRef(given or self.names.credentials, names, per_job=given is None)

    def _check_tier(self) -> None:
        plan, settings = self.plan, self.settings
        staged = [m for m in plan.mounts if m.origin == "staged"]
        if plan.tier == "A" and staged:
            raise UsageError(f"the plan is tier A (pre-positioned) but {len(staged)} input(s) must be staged "
                             f"({staged[0].input}); plan it as tier B or C")
        if plan.tier == "B" and settings.pvc_claim is None:
            raise UsageError("tier B stages into a PersistentVolumeClaim: give pvc_claim (a Bound claim in the "
                             "namespace), or plan the job as tier C")
        if settings.shards > 1 and plan.tier != "B":
            raise UsageError(f"shards {settings.shards} applies to tier B's stage Job only; this plan is tier "
                             f"{plan.tier}")
        prepositioned = [m for m in plan.mounts if m.origin == "pre-positioned"]
        if prepositioned and settings.pvc_claim is None:
            raise UsageError(f"mount {prepositioned[0].source!r} is pre-positioned, which on Kubernetes is a path "
                             "inside the job's PVC: give pvc_claim")
        if plan.route.route == "mount" and settings.pvc_claim is None:
            raise UsageError(f"the output route is 'mount' ({plan.route.destination}) but results only persist on a "
                             "mount through a PVC here: give pvc_claim, or route results to S3 (S3_BUCKET_NAME)")
        if (plan.tier in ("B", "C") or self.uploads) and not settings.stager_image:
            why = {"B": "tier B's stage Job", "C": "tier C's in-pod stager"}.get(plan.tier, "the results sidecar")
            raise UsageError(f"stager_image is needed for {why}: build docker/stager/Dockerfile, push it where the "
                             "cluster pulls from, and pass its reference")
        uses_s3 = self.uploads or (plan.tier in ("B", "C") and any(
            m.input.startswith("s3://") for m in staged)) or any(i.annotation for i in self.request.inputs)
        forwarded = set(plan.forward_env)
        if uses_s3 and not settings.cloud_identity and not any(set(pair) <= forwarded for pair in _S3_KEYS):
            raise UsageError("this job reads or writes s3:// inside the cluster, so forward_env must name the S3 "
                             "credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or ACCESS_KEY and SECRET_KEY), "
                             "plus AWS_ENDPOINT_URL for a non-AWS endpoint — or the target's pods have cloud identity "
                             "(cloud_identity, service_account)")

    def _checks(self) -> list[Check]:
        token = hashlib.sha256(f"tao-data-io-verify:{self.plan.job_id}".encode()).hexdigest()[:32]
        checks, _ = checklist(self.plan, token, claim_paths(self.plan), within=VOLUME_ROOT)
        if self.uploads and not self.results_on_claim:
            checks.append(Check(kind="persistent", path=self.plan.results_dir, subject="results",
                                argument=f"{STATE_DIR}/upload-check"))
        return checks

    # ----------------------------------------------------------------- objects
    def render(self) -> RenderedJob:
        objects = [self._configmap()]
        warnings = []
        if self.plan.tier == "B":
            objects.append(self._stage_job())
        if self.probes_collectives:
            objects += self._probe_objects()
        if self.multi:
            objects.append(self._service())
        objects.append(self._training_job())
        if self.plan.route.route == "ephemeral" and not self.results_on_claim:
            warnings.append(f"results of job {self.plan.job_id} are ephemeral: nothing keeps them after the pod ends")
        elif self.plan.route.route == "ephemeral":  # nothing uploads them, but the claim keeps them
            warnings.append(f"results of job {self.plan.job_id} are not uploaded: they stay on claim "
                            f"{self.settings.pvc_claim!r} under results/{self.names.job}/")
        size = sum(len(v.encode()) for v in objects[0]["data"].values())
        if size > CONFIGMAP_LIMIT:
            raise UsageError(f"the job's files come to {size} bytes, more than a ConfigMap holds (1 MiB); shrink the "
                             "spec (config) or the request")
        return RenderedJob(objects, self.secret, warnings)

    def _meta(self, name: str, step: str) -> dict[str, Any]:
        return {"name": name, "namespace": self.settings.namespace, "labels": self._labels(step),
                "annotations": {**self.settings.annotations, JOB_ID_LABEL: self.plan.job_id,
                                ATTEMPT_ANNOTATION: str(self.plan.attempt)}}

    def _labels(self, step: str) -> dict[str, str]:
        """The target's labels, then ours (which the target may not set: the backend finds, cancels
        and routes the job's objects by them)."""
        ours = {**self.labels, STEP_LABEL: step}
        for key in self.settings.labels.keys() & {*ours, QUEUE_LABEL}:
            raise UsageError(f"labels key {key!r} is tao-data-io's own (it finds and cancels a job's objects by it): "
                             "remove it from the target's labels")
        for key in self.settings.annotations.keys() & {JOB_ID_LABEL, ATTEMPT_ANNOTATION}:
            raise UsageError(f"annotations key {key!r} is tao-data-io's own: remove it from the target's annotations")
        return {**self.settings.labels, **ours}

    def _configmap(self) -> dict[str, Any]:
        data = {"probe.sh": PROBE_SCRIPT, "verify.sh": VERIFY_SCRIPT, "checklist": checklist_text(self.checks),
                "status.sh": STATUS_SCRIPT}
        if self.config_key is not None:
            assert self.config is not None
            data[self.config_key] = self.config.decode()
        if self.needs_stager or self.plan.tier == "B":
            data["request.json"] = json.dumps(self.request.model_dump(mode="json", exclude_none=True), indent=2,
                                              sort_keys=True) + "\n"
            snapshot = self.record.model_copy(update={"output_route": self.plan.route})
            data["job-record.json"] = snapshot.model_dump_json(indent=2) + "\n"
            data["stager.sh"] = STAGER_SCRIPT
            data["sidecar.sh"] = SIDECAR_SCRIPT
        step = "stage" if self.plan.tier == "B" else "train"
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": self._meta(self.names.files, step), "data": data}

    @property
    def probes_collectives(self) -> bool:
        return probes_collectives(self.plan, self.settings)

    def _probe_objects(self) -> list[dict[str, Any]]:
        """The collective probe: a headless Service and an Indexed Job of two pods on two nodes,
        each with one GPU, the job's image, its environment (the NCCL settings a request gives
        apply) and the same placement, running :data:`PROBE_PROGRAM` under its own alarm."""
        name, service = self.names.probe, self.names.probe_service
        labels = self._labels("probe")
        rendezvous = rendezvous_env(nodes=PROBE_NODES, gpus_per_node=1,
                                    rank={"fieldRef": {"fieldPath": COMPLETION_INDEX}},
                                    master_addr=f"{name}-0.{service}")
        env = [{"name": k, "value": literal(v)} for k, v in sorted(self.plan.env.items()) if k not in rendezvous]
        env += _env_entries(rendezvous)
        env.append({"name": "TAO_DATA_IO_PROBE_TIMEOUT", "value": str(COLLECTIVE_TIMEOUT_S)})
        container: dict[str, Any] = {"name": "probe", "image": self.plan.image,
                                     "command": ["python3", "-c", PROBE_PROGRAM], "env": env,
                                     "resources": PROBE_RESOURCES}
        security = self._training_security()
        if security is not None:
            container["securityContext"] = security
        pod = {**self._pod_basics(), "containers": [container], "subdomain": service,
               "affinity": self._one_per(HOSTNAME_LABEL, "probe")}  # two nodes: the point of the probe
        job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": self._meta(name, "probe"),
               "spec": {"completionMode": "Indexed", "completions": PROBE_NODES, "parallelism": PROBE_NODES,
                        "backoffLimit": 0, "ttlSecondsAfterFinished": self.settings.ttl_seconds,
                        "template": {"metadata": {"labels": labels}, "spec": pod}}}
        headless = {"apiVersion": "v1", "kind": "Service", "metadata": self._meta(service, "probe"),
                    "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                             "selector": {"batch.kubernetes.io/job-name": name},
                             "ports": [{"name": "rendezvous", "port": MASTER_PORT, "targetPort": MASTER_PORT}]}}
        return [headless, job]

    def _one_per(self, topology_key: str, step: str) -> dict[str, Any]:
        """The affinity that keeps two of this job's ``step`` pods off one value of ``topology_key``."""
        return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
            "labelSelector": {"matchLabels": {JOB_ID_LABEL: self.names.job, STEP_LABEL: step}},
            "topologyKey": topology_key}]}}

    def _service(self) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Service", "metadata": self._meta(self.names.service, "train"),
                "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                         "selector": {"batch.kubernetes.io/job-name": self.names.job},
                         "ports": [{"name": "rendezvous", "port": MASTER_PORT, "targetPort": MASTER_PORT}]}}

    def _pod_basics(self) -> dict[str, Any]:
        # No pod of a job talks to the Kubernetes API (the stager and sidecars reach S3 only), so
        # none carries the namespace's service-account token a compromised job could use — unless
        # its cloud identity is that token (cloud_identity: IRSA and Pod Identity exchange it).
        spec: dict[str, Any] = {"restartPolicy": "Never", "enableServiceLinks": False,
                                "automountServiceAccountToken": self.settings.cloud_identity}
        if self.settings.service_account:
            spec["serviceAccountName"] = self.settings.service_account
        if self.settings.image_pull_secrets:
            spec["imagePullSecrets"] = [{"name": name} for name in self.settings.image_pull_secrets]
        if self.settings.node_selector:
            spec["nodeSelector"] = dict(sorted(self.settings.node_selector.items()))
        if self.settings.tolerations:
            spec["tolerations"] = [dict(t) for t in self.settings.tolerations]
        return spec

    def _stage_job(self) -> dict[str, Any]:
        """Tier B: fill the claim's cache before the training Job exists (no GPU held)."""
        shards = self.settings.shards
        name = self.names.stage
        command = ["tao-data-io", "stage", "--request", f"{FILES_DIR}/request.json", "--staging-dir",
                   f"{VOLUME_ROOT}/{CACHE_DIR}", "--cache", "--map"]
        env = [*self._secret_env(), {"name": "XDG_CACHE_HOME", "value": "/tmp/tao-data-io-cache"}]
        map_path = f"{VOLUME_ROOT}/{JOBS_DIR}/{self.names.job}/staging-map"
        if shards > 1:
            env.append({"name": "TAO_SHARD_INDEX", "valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX}}})
            command += [f"{map_path}.shard-$(TAO_SHARD_INDEX).json", "--shard", f"$(TAO_SHARD_INDEX)/{shards}"]
        else:
            command.append(f"{map_path}.json")
        container = {"name": "stage", "image": self.settings.stager_image, "command": command, "env": env,
                     "securityContext": RESTRICTED, "resources": OWN_RESOURCES["stage"],
                     "volumeMounts": [{"name": "data", "mountPath": VOLUME_ROOT},
                                      {"name": "files", "mountPath": FILES_DIR, "readOnly": True}],
                     "terminationMessagePolicy": "FallbackToLogsOnError"}
        pod = {**self._pod_basics(), "containers": [container],
               "securityContext": {"fsGroup": STAGER_UID, "fsGroupChangePolicy": "OnRootMismatch"},
               "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": self.settings.pvc_claim}},
                           {"name": "files", "configMap": {"name": self.names.files}}]}
        # A stage that cannot write its volume (its write probe) fails the same way again: the Job
        # ends at once instead of spending its retries on it. Every other failure is retried.
        refused = {"action": "FailJob", "onExitCodes": {"containerName": "stage", "operator": "In",
                                                        "values": [UNWRITABLE_EXIT]}}
        spec: dict[str, Any] = {"backoffLimit": 2 * shards, "ttlSecondsAfterFinished": self.settings.ttl_seconds,
                                "podFailurePolicy": {"rules": [refused]},
                                "template": {"metadata": {"labels": self._labels("stage")}, "spec": pod}}
        if shards > 1:
            spec.update(completionMode="Indexed", completions=shards, parallelism=shards)
        return {"apiVersion": "batch/v1", "kind": "Job", "metadata": self._meta(name, "stage"), "spec": spec}

    def _training_job(self) -> dict[str, Any]:
        plan = self.plan
        mounts, volumes = self._mounts_and_volumes()
        env = self._env()
        # The command runs under TRAIN_WRAPPER, its PID 1, so SIGTERM reaches it; its words are the
        # wrapper's arguments, never parsed by a shell.
        train = {"name": "train", "image": plan.image, "command": ["/bin/sh", "-c", TRAIN_WRAPPER, WRAPPER_NAME],
                 "args": [literal(arg) for arg in plan.argv], "env": env,
                 "volumeMounts": mounts, "resources": self._resources()}
        located = claim_paths(plan)  # pre-positioned inputs, read from above: see claim_paths
        probe_mounts = [m for m in mounts if m["mountPath"] not in located] + inspection_mounts(located)
        verify: dict[str, Any] = {"name": "verify", "image": plan.image,
                  "command": ["/bin/sh", f"{PROBE_DIR}/verify.sh", f"{PROBE_DIR}/probe.sh", f"{PROBE_DIR}/checklist",
                              TERMINATION_LOG],
                  "env": env, "terminationMessagePath": TERMINATION_LOG, "terminationMessagePolicy": "File",
                  "resources": OWN_RESOURCES["verify"],
                  "volumeMounts": [*probe_mounts, {"name": "files", "mountPath": PROBE_DIR, "readOnly": True}]}
        training_security = self._training_security()
        if training_security is not None:  # the probe proves what training can read: as the same user
            train["securityContext"] = verify["securityContext"] = training_security
        init: list[dict[str, Any]] = []
        pod = self._pod_basics()
        if self.needs_stager:
            init.append(self._stager(env))
            verify["volumeMounts"].append({"name": "state", "mountPath": STATE_DIR, "readOnly": True})
        if self.uploads:  # the probe's pass, where only our containers see it: the sidecar uploads after it only
            verify["env"] = [*env, {"name": "TAO_DATA_IO_VERDICT", "value": VERDICT_DIR}]
            verify["volumeMounts"].append({"name": "verdict", "mountPath": VERDICT_DIR})
            init.append(self._sidecar(env))
            pod["terminationGracePeriodSeconds"] = self.grace_seconds()
        if self.status_sidecar:
            init.append(self._status_sidecar())
        init.append(verify)
        pod.update(initContainers=init, containers=[train], volumes=volumes)
        # verify.sh cuts its verdict to what the kubelet keeps of it here: 12 KiB shared by all the pod's containers
        verify["command"].append(str(termination_budget(len(init) + len(pod["containers"]))))
        if self.multi:
            pod["subdomain"] = self.names.service
        if self.settings.priority_class:
            pod["priorityClassName"] = self.settings.priority_class
        if self.multi and self.settings.exclusive_topology:  # one rank per node (or zone, rack…): never two
            pod["affinity"] = self._one_per(self.settings.exclusive_topology, "train")
        template_meta = {"labels": self._labels("train"), **({"annotations": dict(self.settings.annotations)}
                                                             if self.settings.annotations else {})}
        spec: dict[str, Any] = {"backoffLimit": 0, "ttlSecondsAfterFinished": self.settings.ttl_seconds,
                                "template": {"metadata": template_meta, "spec": pod}}
        if not self.multi:
            spec.update(backoffLimit=plan.disruption_retries, podFailurePolicy=failure_policy(pod))
        if plan.deadline_seconds is not None:
            spec["activeDeadlineSeconds"] = plan.deadline_seconds
        if self.multi:
            spec.update(completionMode="Indexed", completions=plan.nodes, parallelism=plan.nodes)
        meta = self._meta(self.names.job, "train")
        if self.settings.queue_name is not None:  # made suspended: Kueue resumes it once admitted, and owns suspend
            if self.suspend_training:
                raise UsageError(f"tier B with queue_name {self.settings.queue_name!r}: Kueue would resume the "
                                 "training Job before its stage Job filled the cache; let tao-data-io submit it "
                                 "(it makes the training Job only once staging is done), or drop the queue")
            meta["labels"][QUEUE_LABEL] = self.settings.queue_name
            spec["suspend"] = True
        if self.suspend_training:
            spec["suspend"] = True
        return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": spec}

    def _training_security(self) -> dict[str, Any] | None:
        """The training container's (and the probe's) securityContext: the target's choice. TAO
        images run as root, which only a namespace at the 'baseline' or 'privileged' level admits;
        'restricted' runs them as the target's non-root user."""
        if self.settings.training_security == "image":
            return None
        user = self.settings.training_user
        return {**RESTRICTED, **({"runAsUser": user} if user is not None else {})}

    def _resources(self) -> dict[str, Any]:
        """The training container's requests and limits: never BestEffort (evicted first, given a
        LimitRange's defaults, refused by a quota on requests), so memory is always requested —
        what the request says, else the /dev/shm it takes from the pod's memory; what the request
        sets is also the limit (a GPU is a limit only: the API server makes it the request)."""
        plan = self.plan
        shm = self.settings.shm_size or plan.shm_size
        if plan.memory is not None and quantity_bytes(plan.memory) < quantity_bytes(shm):
            raise UsageError(f"compute_shape.memory {plan.memory!r} is less than the target's shm_size {shm!r}, which "
                             "a memory-backed /dev/shm takes from it: raise memory or lower the target's shm_size")
        requests: dict[str, str] = {"memory": plan.memory or shm}
        limits: dict[str, str] = {"nvidia.com/gpu": str(plan.gpus)} if plan.gpus else {}
        for name, value in (("cpu", plan.cpu), ("memory", plan.memory), ("ephemeral-storage", plan.ephemeral_storage)):
            if value is not None:
                requests[name] = limits[name] = value
        if self.volumes_on_disk:
            # Tier C's inputs, and the results without a claim, stay on the node's disk while
            # training runs: the scheduler reserves them with training's own (an app container's
            # request counts for the pod's whole life, an init container's does not add to it),
            # and a pod whose containers have ephemeral-storage limits is evicted past their sum,
            # which its emptyDirs' usage counts toward — so both grow by their bounds.
            own = quantity_bytes(plan.ephemeral_storage) if plan.ephemeral_storage is not None else 0
            requests["ephemeral-storage"] = mebibytes(own + self.volumes_on_disk)
            if plan.ephemeral_storage is not None:
                limits["ephemeral-storage"] = requests["ephemeral-storage"]
        return {"requests": requests, **({"limits": limits} if limits else {})}

    @property
    def results_limit(self) -> str:
        """The most the job's results may take: the request's ``outputs.results_limit``, as its
        record keeps it (the default for a record older than the field). It also bounds the
        results emptyDir (its ``sizeLimit``): an upload never leaves more than this under the
        job's prefix, so results past it could not be uploaded anyway — and an unbounded volume
        would fill the node's disk until the kubelet evicts pods for its pressure, this one or
        others. What ``upload_excludes`` leaves out is on that disk too and counts: the analysis
        of such an eviction says so (:func:`.pods.failure_analysis`)."""
        return self.record.results_limit or DEFAULT_RESULTS_LIMIT

    @property
    def volumes_on_disk(self) -> int:
        """What the pod's emptyDirs on the node's disk may hold, by their sizeLimits: tier C's
        staged inputs (when their size is known) and the results without a claim."""
        results = 0 if self.results_on_claim else quantity_bytes(self.results_limit)
        return (self.staging_bytes or 0) + results

    def grace_seconds(self) -> int:
        """Time for the final upload after training exits: the results budget at the measured
        staging rate, plus a margin. Past it the kubelet kills the upload (docs/kubernetes.md)."""
        limit = quantity_bytes(self.results_limit)
        return min(GRACE_MARGIN_SECONDS + -(-limit // TIER_C_BYTES_PER_SECOND), MAX_GRACE_SECONDS)

    def _tool_env(self, env: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The stager's and the sidecar's environment: the pod's, plus where their state lives."""
        own = [{"name": "TAO_DATA_IO_FILES", "value": FILES_DIR}, {"name": "TAO_DATA_IO_STATE", "value": STATE_DIR},
               {"name": "TAO_DATA_IO_JOBS_DIR", "value": f"{STATE_DIR}/records"},
               {"name": "XDG_CACHE_HOME", "value": f"{STATE_DIR}/cache"}]
        if self.settings.records_url:
            own.append({"name": "TAO_DATA_IO_RECORDS", "value": self.settings.records_url})
        return [*env, *own]

    @property
    def restore_from(self) -> str | None:
        """Where the pod's stager restores the results from before the command starts: a later
        attempt's earlier uploads — and, for a one-pod job that may be started again after a
        disruption, its own route, so a replacement pod resumes from what the pod before it
        uploaded (the first pod finds the prefix empty: one listing) rather than from epoch 0."""
        plan = self.plan
        if plan.restore_from is not None:
            return plan.restore_from
        if not self.multi and plan.disruption_retries and self.uploads and plan.route.route == "s3":
            return plan.route.destination
        return None

    def _stager(self, env: list[dict[str, Any]]) -> dict[str, Any]:
        extra = []
        if self.uploads and not self.results_on_claim:
            extra.append({"name": "TAO_DATA_IO_UPLOAD_CHECK", "value": f"{STATE_DIR}/upload-check"})
        mounts = [{"name": "files", "mountPath": FILES_DIR, "readOnly": True},
                  {"name": "state", "mountPath": STATE_DIR}]
        if self.stages_in_pod:
            extra.append({"name": "TAO_DATA_IO_STAGING_DIR", "value": STAGING_DIR})
            mounts.append({"name": STAGING_VOLUME, "mountPath": STAGING_DIR})
        restore = self.restore_from
        if restore is not None:  # the results uploaded so far come back first
            extra.append({"name": "TAO_DATA_IO_RESTORE_FROM", "value": restore})
            mounts.append(self._results_mount())
        return {"name": "stager", "image": self.settings.stager_image, "command": ["/bin/sh", f"{FILES_DIR}/stager.sh"],
                "securityContext": RESTRICTED, "resources": OWN_RESOURCES["stage"],
                "env": [*self._tool_env(env), *extra], "volumeMounts": mounts,
                "terminationMessagePolicy": "FallbackToLogsOnError"}

    def _sidecar(self, env: list[dict[str, Any]]) -> dict[str, Any]:
        extra = [{"name": "TAO_DATA_IO_RESYNC_SECONDS", "value": str(self.settings.resync_seconds)},
                 {"name": "TAO_DATA_IO_VERIFY_FILE", "value": TOKEN_FILE},
                 {"name": "TAO_DATA_IO_VERDICT", "value": VERDICT_DIR}]
        return {"name": "results", "image": self.settings.stager_image, "restartPolicy": "Always",
                "securityContext": RESTRICTED, "resources": OWN_RESOURCES["results"],
                "command": ["/bin/sh", f"{FILES_DIR}/sidecar.sh"], "env": [*self._tool_env(env), *extra],
                "volumeMounts": [{"name": "files", "mountPath": FILES_DIR, "readOnly": True},
                                 {"name": "state", "mountPath": STATE_DIR}, self._results_mount(read_only=True),
                                 {"name": "verdict", "mountPath": VERDICT_DIR, "readOnly": True}]}

    def _status_sidecar(self) -> dict[str, Any]:
        """No credential and no config: the results, read-only, and the script."""
        env = [{"name": "TAO_RESULTS_DIR", "value": self.plan.results_dir},
               {"name": "TAO_DATA_IO_STATUS_FILE", "value": STATUS_FILE},
               {"name": "TAO_DATA_IO_STATUS_SECONDS", "value": str(STATUS_WAIT_SECONDS)}]
        return {"name": STATUS, "image": self.plan.image, "restartPolicy": "Always",
                "securityContext": {**RESTRICTED, "runAsUser": NOBODY}, "resources": OWN_RESOURCES["status"],
                "command": ["/bin/sh", f"{PROBE_DIR}/status.sh"], "env": env,
                "volumeMounts": [{"name": "files", "mountPath": PROBE_DIR, "readOnly": True},
                                 self._results_mount(read_only=True)]}

    # ----------------------------------------------------------------- env and mounts
    def _secret_env(self) -> list[dict[str, Any]]:
        if self.secret is None:
            return []
        return [{"name": name, "valueFrom": {"secretKeyRef": {"name": self.secret.name, "key": name}}}
                for name in self.secret.keys]

    def _env(self) -> list[dict[str, Any]]:
        plan = self.plan
        env: list[dict[str, Any]] = [{"name": k, "value": literal(v)} for k, v in sorted(plan.env.items())]
        if self.multi:
            # Each pod's rank is its completion index, which the Job controller annotates it with;
            # rank 0's host is <job>-0 in the headless Service's subdomain.
            rendezvous = rendezvous_env(nodes=plan.nodes, gpus_per_node=plan.gpus,
                                        rank={"fieldRef": {"fieldPath": COMPLETION_INDEX}},
                                        master_addr=f"{self.names.job}-0.{self.names.service}")
            env += _env_entries(rendezvous)
        return env + self._secret_env()

    def _results_mount(self, *, read_only: bool = False) -> dict[str, Any]:
        mount: dict[str, Any] = {"name": "data" if self.results_on_claim else RESULTS_VOLUME,
                                 "mountPath": self.plan.results_dir}
        if self.results_on_claim:
            mount["subPath"] = f"{RESULTS_DIR}/{self.names.job}"
        if read_only:
            mount["readOnly"] = True
        return mount

    def _mounts_and_volumes(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """One ``subPath`` mount per declared target; one subPath per source, never shared."""
        plan, settings = self.plan, self.settings
        mounts: list[dict[str, Any]] = []
        owners: dict[tuple[str, str], PlanMount] = {}
        seen: set[str] = set()
        for mount in plan.mounts:
            if mount.target in seen:
                continue
            seen.add(mount.target)
            volume, sub_path = self._source_of(mount)
            other = owners.setdefault((volume, sub_path), mount)
            if other.input != mount.input:  # a hand-edited staging map: pre-positioned ones never meet the cache
                raise UsageError(f"subPath {sub_path!r} would serve two sources, {other.input!r} and {mount.input!r}; "
                                 "each source needs its own sub_path in the staging map: stage the request again")
            mounts.append({"name": volume, "mountPath": mount.target, "subPath": sub_path, "readOnly": mount.read_only})
        mounts.append(self._results_mount())
        mounts.append({"name": "shm", "mountPath": "/dev/shm"})
        volumes: list[dict[str, Any]] = [
            {"name": "files", "configMap": {"name": self.names.files}},
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": settings.shm_size or plan.shm_size}}]
        if settings.pvc_claim is not None:
            volumes.append({"name": "data", "persistentVolumeClaim": {"claimName": settings.pvc_claim}})
        else:
            volumes.append({"name": RESULTS_VOLUME, "emptyDir": {"sizeLimit": self.results_limit}})
        if self.stages_in_pod:
            volumes.append({"name": STAGING_VOLUME, "emptyDir": {} if self.staging_bytes is None
                            else {"sizeLimit": mebibytes(self.staging_bytes)}})
        if self.needs_stager:
            volumes.append({"name": "state", "emptyDir": {}})
        if self.uploads:
            volumes.append({"name": "verdict", "emptyDir": {"sizeLimit": "1Mi"}})
        return mounts, volumes

    def _source_of(self, mount: PlanMount) -> tuple[str, str]:
        """(volume, subPath) serving ``mount``."""
        if mount.origin == "config":
            assert self.config_key is not None
            return "files", self.config_key
        on_claim = claim_sub_path(self.plan, mount)
        if on_claim is not None:
            return "data", on_claim
        return STAGING_VOLUME, check_relative(mount.source, what=f"staging map sub_path of {mount.input!r}")


def mebibytes(size: int) -> str:
    """``size`` bytes as a quantity in whole MiB, rounded up."""
    return f"{-(-size // 2**20)}Mi"


def claim_sub_path(plan: LaunchPlan, mount: PlanMount) -> str | None:
    """Where on the claim ``mount``'s input is (its subPath), or None when the claim does not serve it."""
    if mount.origin == "pre-positioned":
        relative = check_relative(mount.source.lstrip("/"), what=f"pre-positioned mount source {mount.source!r} as "
                                                                 "subPath")
        _refuse_our_state(relative, mount)
        return relative
    if mount.origin == "staged" and plan.tier == "B":
        return f"{CACHE_DIR}/{check_relative(mount.source, what=f'staging map sub_path of {mount.input!r}')}"
    return None


def _refuse_our_state(sub_path: str, mount: PlanMount) -> None:
    """The claim's stage cache, staging maps and results are tao-data-io's, whatever a request
    names: a pre-positioned mount may read another job's results (``results/<job>``: a pipeline's
    next step reads them), never write them, never hold every job's, and never reach the stage
    cache or the staging maps (their layout and markers are ours, and what the cache holds was
    staged for other jobs)."""
    top, _, below = sub_path.partition("/")
    if top in (CACHE_DIR, JOBS_DIR):
        what = "stage cache" if top == CACHE_DIR else "staging maps"
        problem = (f"lies in the claim's {what} ({top}/), which is tao-data-io's: mount the pre-positioned data from "
                   "another path of the claim")
    elif top == RESULTS_DIR and not below:
        problem = f"holds every job's results ({RESULTS_DIR}/): mount one job's, {RESULTS_DIR}/<job id>, read-only"
    elif top == RESULTS_DIR and not mount.read_only:
        problem = (f"lies in the claim's results ({RESULTS_DIR}/), which hold other jobs' results: another job's are "
                   "an input, never a place to write; mount it read-only")
    else:
        return
    raise UsageError(f"pre-positioned mount source {mount.source!r} (target {mount.target}) {problem}")


def _env_entries(values: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A container's env entries: a text as its value, anything else (a field reference) as its source."""
    return [{"name": name, "value": value} if isinstance(value, str) else {"name": name, "valueFrom": value}
            for name, value in values.items()]


def probe_key(probe_job: Mapping[str, Any]) -> str:
    """What a collective probe's pass holds for: the image (its NCCL), where the pods go (node
    selector, tolerations) and the NCCL settings they are given — a digest of them."""
    pod = probe_job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    nccl = sorted((e["name"], e.get("value")) for e in container.get("env", []) if e["name"].startswith("NCCL_"))
    basis = {"image": container["image"], "nodeSelector": pod.get("nodeSelector"),
             "tolerations": pod.get("tolerations"), "nccl": nccl}
    return hashlib.sha256(json.dumps(basis, sort_keys=True).encode()).hexdigest()[:16]


def claim_paths(plan: LaunchPlan) -> dict[str, str]:
    """Target → where the verify probe reads each pre-positioned input: below the claim's root
    (:data:`VOLUME_ROOT`), never through the subPath the training container mounts. The kubelet
    creates a missing subPath — an empty root-owned directory — when a container that mounts it
    starts (pkg/kubelet/kubelet_pods.go makeMounts): a probe that mounted it would make a tier A
    source that is not there an empty dataset on the shared claim. Read from above, a missing
    source fails the probe, and the training container, the only one mounting it by subPath,
    never starts. (A staged input needs none of this: its entry exists once the stage ran, and
    the training Job exists only then — or, rendered, waits suspended.)"""
    return {mount.target: f"{VOLUME_ROOT}/{claim_sub_path(plan, mount)}" for mount in plan.mounts
            if mount.origin == "pre-positioned"}


def inspection_mounts(located: Mapping[str, str]) -> list[dict[str, Any]]:
    """The probe's read-only view of the claim for :func:`claim_paths`: each top-level directory
    that holds a source, by subPath — not the whole claim, whose other jobs' results and state
    the training image has no business reading — or the claim's root when a source is itself
    top-level (mounting it by subPath would create it)."""
    tops = sorted({path[len(VOLUME_ROOT) + 1:].split("/")[0] for path in located.values()})
    if any("/" not in path[len(VOLUME_ROOT) + 1:] for path in located.values()):
        return [{"name": "data", "mountPath": VOLUME_ROOT, "readOnly": True}]
    return [{"name": "data", "mountPath": f"{VOLUME_ROOT}/{top}", "subPath": top, "readOnly": True} for top in tops]


def literal(text: str) -> str:
    """``text`` as Kubernetes must pass it on: the kubelet expands ``$(VAR)`` in a container's
    command, args and env values (``$(AWS_SECRET_ACCESS_KEY)`` in an argument would become the
    secret), and ``$$`` is its escape for ``$`` — so every ``$`` of the request is doubled."""
    return text.replace("$", "$$")


def _check_plan(plan: LaunchPlan, settings: KubernetesSettings) -> None:
    """Paths absolute and normalised, none of ours taken, env names valid and never doubled."""
    for what, path in [("results_dir", plan.results_dir), *(("mount target", m.target) for m in plan.mounts)]:
        try:
            check_container_path(path, what=what)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        for reserved in RESERVED:
            if path == reserved or path.startswith(reserved + "/") or reserved.startswith(path + "/"):
                raise UsageError(f"{what} {path!r} collides with {reserved}, which the job's pod uses itself; choose "
                                 "another path")
    targets = {m.target for m in plan.mounts}
    if plan.results_dir in targets:
        raise UsageError(f"results_dir {plan.results_dir!r} is also an input's target; write results elsewhere")
    for name in plan.env:
        check_env_name(name, what="environment name")
    doubled = sorted(set(plan.env) & set(plan.forward_env))
    if doubled:
        raise UsageError(f"forward_env names {doubled} are also in environment; a credential is forwarded by name "
                         "only: remove them from environment")
    ours = sorted(set(plan.env) & RENDEZVOUS_NAMES) if plan.nodes > 1 else []
    if ours:
        raise UsageError(f"environment sets {ours}, which a multi-node job's rendezvous sets itself; remove them")


def _check_config(plan: LaunchPlan, config: bytes | None) -> str | None:
    """The ConfigMap key of the config, after proving its bytes are the ones its name promises."""
    mount = next((m for m in plan.mounts if m.origin == "config"), None)
    if mount is None:
        if config is not None:
            raise UsageError("a config was given but the plan mounts none")
        return None
    if config is None:
        raise UsageError(f"the plan mounts the config {mount.target} but its bytes were not given; stage the request")
    name = posixpath.basename(mount.source)
    digest = hashlib.sha256(config).hexdigest()
    if f"-{digest}." not in name or f"-{digest}." not in posixpath.basename(mount.target):
        raise UsageError(f"config {mount.source!r} does not hold the bytes its name promises (their SHA-256 is "
                         f"{digest}); it was modified after it was materialized: stage the request again")
    try:
        config.decode()
    except UnicodeDecodeError:
        raise UsageError(f"config {mount.source!r} is not UTF-8 text") from None
    return posixpath.basename(mount.target)


def _refuse_values(rendered: RenderedJob, environ: Mapping[str, str] | None) -> None:
    """No credential value of this environment anywhere in the output; the message names the
    object and the credential, never the value."""
    redact = Redactor(environ)
    for obj in rendered.objects:
        text = json.dumps(obj)
        masked = redact(text)
        if masked != text:
            names = sorted({part.split("***")[0] for part in masked.split("***")[1::2]})
            raise UsageError(f"{obj['kind']} {obj['metadata']['name']} would hold the value of {', '.join(names)}; "
                             "credentials reach the pod by name only (forward_env): remove the value from the "
                             "request's spec or environment")
