"""The storage tier decision: pure, from what the compute side offers and what the request asks.

* **A** — pre-positioned: every input is already on storage the frame mounts (a PVC, a host
  path); no bytes move. The only tier when air-gapped.
* **B** — a durable volume filled by a stage step (a stage Job on the cluster, or the submitting
  host's staging root for a backend that stages on the host) before the job starts, so no GPU
  idles while bytes move, and a second job on the same inputs moves nothing.
* **C** — ephemeral: the pod fetches its inputs into an ``emptyDir`` and uploads its results
  before it ends. Needs no volume, but holds the GPU idle while it downloads.

Why pure: the decision and its reason go into the job record before launch, the CLI's ``plan``
prints it, and a table of facts → decision is the test. Facts come from a backend's ``facts()``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .errors import UsageError
from .reporting import human_size
from .request import JobRequest
from .schema import Strict

Tier = Literal["A", "B", "C"]
#: Above this many input bytes, tier C gets the idle-GPU warning (docs/kubernetes.md: Storage tiers).
DEFAULT_TIER_C_WARN_BYTES = 2 * 1024**3
#: Throughput of an in-pod fetch, used when the tier C warning converts bytes into idle GPU time
#: and to size the results sidecar's grace period: the engine staging 2,000 × 16 KiB through
#: 20 ms/request measured 10.6 MB/s (17.2 direct); bench/mount.py, bench/README.md. Small
#: files at real latency are the slow case, so this errs towards warning early.
TIER_C_BYTES_PER_SECOND = 10 * 1024**2


class VolumeFacts(Strict):
    """A PersistentVolumeClaim (or, locally, the staging directory) the job could use."""

    name: str
    phase: str = "Bound"
    access_modes: list[str] = Field(default_factory=lambda: ["ReadWriteOnce"])
    capacity_bytes: int | None = None
    #: Whether its stage cache already holds every input of this request (a stage marker per source).
    holds_inputs: bool = False


class Capabilities(Strict):
    """What a backend can do, as the tier decision reads it — never the backend's name, so a new
    backend gets the decision its abilities call for. A backend declares the most it can do
    (:attr:`~tao_data_io.launch.declaration.Declaration.capabilities`); its ``facts()`` may say less for
    the cluster at hand (Kubernetes older than 1.29 cannot run the upload sidecar)."""

    #: A stage step on the submitting host fills a directory the frame mounts (tier B needs no volume).
    stages_on_host: bool = False
    #: The frame can fetch its own inputs and upload its results (tier C): network in the frame and,
    #: on Kubernetes, native sidecars (1.29+).
    fetches_in_frame: bool = False
    #: The frame mounts named volumes (``storage.pvc_claim``): tier B stages into a Bound one, and
    #: none is ever picked on a guess (it could be someone else's).
    binds_claims: bool = False
    #: A job may span several nodes (``compute_shape.nodes`` above 1), its ranks meeting at a rendezvous.
    multi_node: bool = False
    #: A pod lost to a disruption (an eviction, a node drain) is replaced (``compute_shape.disruption_retries``).
    replaces_disrupted: bool = False


def refuse_unsupported(request: JobRequest, backend: str, capabilities: Capabilities) -> None:
    """Refuse, once and before anything is written, what ``backend`` cannot honour of ``request``:
    the field, the backend and the alternative — never a request that runs as if the field were
    not there (a claim ignored, one node of two, a retry that never comes)."""
    claim = request.storage.pvc_claim
    if claim is not None and not capabilities.binds_claims:
        raise UsageError(f"storage.pvc_claim {claim!r} names a volume claim, which the {backend} backend does not "
                         "mount: drop storage.pvc_claim (the inputs are staged or pre-positioned as this backend "
                         "does), or submit to a backend that mounts claims")
    nodes = request.compute_shape.nodes
    if nodes > 1 and not capabilities.multi_node:
        raise UsageError(f"compute_shape.nodes {nodes} asks for {nodes} nodes, and the {backend} backend runs a job "
                         "on one: set compute_shape.nodes to 1, or submit to a backend that runs multi-node jobs")
    retries = request.compute_shape.disruption_retries
    if retries and not capabilities.replaces_disrupted:
        raise UsageError(f"compute_shape.disruption_retries {retries} asks for a lost pod to be replaced, which the "
                         f"{backend} backend never does: leave compute_shape.disruption_retries empty, or submit to a "
                         "backend that replaces disrupted pods")


class ClusterFacts(Strict):
    """What the compute side offers, as the tier decision needs it."""

    #: The backend's name, for people (``plan``, the record's reason); the decision reads ``capabilities``.
    backend: str
    capabilities: Capabilities = Field(default_factory=Capabilities)
    volumes: list[VolumeFacts] = Field(default_factory=list)
    #: StorageClasses that can provision a new volume (dynamic provisioning).
    storage_classes: list[str] = Field(default_factory=list)
    air_gapped: bool = False
    #: Total bytes of the request's inputs, when known (None: unknown).
    input_bytes: int | None = None
    #: ``major.minor`` of the Kubernetes API server (None elsewhere). Reported for people and for
    #: ``plan --facts``; the decision reads only ``capabilities.fetches_in_frame``, which follows from it.
    server_version: str | None = None
    #: Allocatable ``nvidia.com/gpu`` per node, when the backend may list nodes (None: unknown).
    #: Reported, not decided on: the capacity gate is the launch's preflight.
    allocatable_gpus: dict[str, int] | None = None


class TierDecision(Strict):
    tier: Tier
    reason: str
    warnings: list[str] = Field(default_factory=list)
    #: The volume tier B stages into (or tier A reads from), when one is used.
    volume: str | None = None

    def to_dict(self) -> dict[str, object]:
        return self.model_dump(mode="json")

    def describe(self) -> str:
        return f"tier {self.tier}: {self.reason}" + "".join(f" (warning: {w})" for w in self.warnings)


def choose_tier(request: JobRequest, facts: ClusterFacts, *,
                tier_c_warn_bytes: int = DEFAULT_TIER_C_WARN_BYTES) -> TierDecision:
    """Decide the tier (see the module docstring). An explicit ``storage.tier`` is honoured unless
    impossible, which is an error saying why."""
    remote = [uri for uri, _ in request.remote_references()]
    wanted = request.storage.tier
    air_gapped = request.storage.air_gapped or facts.air_gapped
    if air_gapped:
        if remote:
            raise UsageError("the job is air-gapped (storage.air_gapped or the backend), so only tier A is possible "
                             "and nothing may be fetched; pre-position these and reference their mount paths: "
                             + ", ".join(remote))
        if wanted not in (None, "A"):
            raise UsageError(f"storage.tier {wanted!r} is impossible air-gapped: only tier A (pre-positioned) is")
        return TierDecision(tier="A", reason="air-gapped: tier A is the only tier; every input is pre-positioned")
    if not remote:
        if wanted not in (None, "A"):
            return TierDecision(tier="A", reason=f"storage.tier {wanted!r} was asked, but every input is "
                                                 "pre-positioned, so nothing moves: tier A")
        return TierDecision(tier="A", reason="every input is pre-positioned: no bytes move")
    volume = _usable_volume(request, facts)
    if wanted == "A":
        raise UsageError(f"storage.tier 'A' (pre-positioned) is impossible: {len(remote)} input(s) are remote "
                         f"({', '.join(remote[:3])}{', …' if len(remote) > 3 else ''}); pre-position them, or let "
                         "the tier be chosen")
    if wanted == "B":
        if not facts.capabilities.stages_on_host and volume is None:
            if not facts.capabilities.binds_claims:
                raise UsageError(f"storage.tier 'B' is impossible on {facts.backend}: it neither stages on this host "
                                 "nor mounts a claim to stage into; let the tier be chosen")
            raise UsageError("storage.tier 'B' needs a Bound PersistentVolumeClaim to stage into: "
                             + _no_volume_reason(request, facts))
        return TierDecision(tier="B", reason="storage.tier 'B' was asked: a stage step fills a durable volume "
                                             "before the job starts", volume=volume)
    if wanted == "C":
        if not facts.capabilities.fetches_in_frame:
            raise UsageError(f"storage.tier 'C' is impossible on {facts.backend}: the compute frame cannot fetch its "
                             "own inputs (no network in the frame, or Kubernetes older than 1.29 for the upload "
                             "sidecar); let the tier be chosen, or ask for 'B'")
        return TierDecision(tier="C", reason="storage.tier 'C' was asked: the pod fetches its inputs and uploads "
                                             "its results", warnings=_tier_c_warnings(facts, tier_c_warn_bytes))
    # Nothing asked: prefer a volume (no idle GPU, reusable), else in-frame fetch.
    if facts.capabilities.stages_on_host:
        return TierDecision(tier="B", reason=f"{facts.backend} stages every input into the staging root on this host "
                                             "before the job starts; the job reads it through read-only mounts")
    if volume is not None:
        held = next(v for v in facts.volumes if v.name == volume).holds_inputs
        reason = (f"PVC {volume!r} already holds every input (stage cache): nothing moves" if held else
                  f"PVC {volume!r} is Bound: a stage Job fills it before the GPU is requested")
        return TierDecision(tier="B", reason=reason, volume=volume)
    if facts.capabilities.fetches_in_frame:
        return TierDecision(tier="C", reason="no usable PVC (" + _no_volume_reason(request, facts) + "): the pod "
                                             "fetches its inputs into an emptyDir",
                            warnings=_tier_c_warnings(facts, tier_c_warn_bytes))
    raise UsageError("no tier is possible: inputs are remote, there is no usable PVC ("
                     + _no_volume_reason(request, facts) + ") and the pod cannot fetch them itself; name a Bound "
                     "claim in storage.pvc_claim, or pre-position the inputs")


def _usable_volume(request: JobRequest, facts: ClusterFacts) -> str | None:
    candidates = [v for v in facts.volumes if v.phase == "Bound"]
    if request.storage.pvc_claim is not None:
        candidates = [v for v in candidates if v.name == request.storage.pvc_claim]
    elif facts.capabilities.binds_claims:
        return None  # never pick someone else's claim on a guess
    return candidates[0].name if candidates else None


def _no_volume_reason(request: JobRequest, facts: ClusterFacts) -> str:
    claim = request.storage.pvc_claim
    if claim is None:
        return "storage.pvc_claim names none"
    found = next((v for v in facts.volumes if v.name == claim), None)
    if found is None:
        return f"PVC {claim!r} does not exist in the namespace"
    return f"PVC {claim!r} is {found.phase}, not Bound"


def _tier_c_warnings(facts: ClusterFacts, threshold: int) -> list[str]:
    if facts.input_bytes is None or facts.input_bytes < threshold:
        return []
    idle = facts.input_bytes / TIER_C_BYTES_PER_SECOND
    return [f"tier C downloads {human_size(facts.input_bytes)} inside the pod while it holds its GPUs: about "
            f"{idle / 60:.0f} min of idle GPU time at {human_size(TIER_C_BYTES_PER_SECOND)}/s; prefer tier B "
            "(a PVC) for inputs this large"]
