"""What a cluster adds to a launch plan: namespace, claim, Secrets, images, TTL, scheduling.

Why a checked dataclass and not pydantic: every refusal must be a
:class:`~tao_data_io.errors.UsageError` naming the parameter, the value and the fix
(``namespace 'Tao' is not a DNS label: …``), which the CLI turns into flag names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ..errors import UsageError
from ..names import check_dns_label, check_dns_subdomain
from ..request import is_binary_quantity, quantity_bytes
from ..uris import parse_s3_url

DEFAULT_TTL_SECONDS = 3600
MAX_TTL_SECONDS = 604800
DEFAULT_RESYNC_SECONDS = 300
DEFAULT_RESULTS_BUDGET = "20Gi"
MAX_SHARDS = 1000
_LABEL_KEY = re.compile(r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                        r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
_TOLERATION_FIELDS = {"key", "operator", "value", "effect", "tolerationSeconds"}


def check_binary_quantity(value: str, *, what: str) -> str:
    if not is_binary_quantity(value):
        raise UsageError(f"{what} {value!r} is not a binary quantity: write a whole number with Ki, Mi, Gi or Ti, "
                         "such as 16Gi")
    return value


@dataclass(frozen=True)
class RenderSettings:
    namespace: str = "default"
    #: The PersistentVolumeClaim: tier B stages into its ``cache/``; pre-positioned mounts and
    #: results live on it. None: results live in the pod and persist only through an upload.
    pvc_claim: str | None = None
    #: A pre-created Secret holding the forwarded credentials; None: the per-job Secret
    #: ``<job>-credentials``, created with values at apply time.
    credential_secret: str | None = None
    image_pull_secret: str | None = None
    #: The image with this package and its CLI (docker/stager/Dockerfile); needed by tier B's
    #: stage Job, tier C's stager and every results sidecar.
    stager_image: str | None = None
    ttl_seconds: int = DEFAULT_TTL_SECONDS
    #: Overrides the plan's ``shm_size``.
    shm_size: str | None = None
    #: Tier B: pods of the stage Job (an Indexed Job when more than one; the claim must then be
    #: ReadWriteMany).
    shards: int = 1
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    #: ``TAO_DATA_IO_RECORDS`` for the stager and the sidecar: a shared record store (s3://…).
    records_url: str | None = None
    resync_seconds: int = DEFAULT_RESYNC_SECONDS
    #: The most results the final upload must move after training exits; sizes the pod's
    #: terminationGracePeriodSeconds (see README, "Results of a tier C pod").
    results_budget: str = DEFAULT_RESULTS_BUDGET

    def __post_init__(self) -> None:
        check_dns_label(self.namespace, what="namespace")
        for name in ("pvc_claim", "credential_secret", "image_pull_secret"):
            value = getattr(self, name)
            if value is not None:
                check_dns_subdomain(value, what=name)
        if self.stager_image is not None and (not self.stager_image or any(c.isspace() for c in self.stager_image)):
            raise UsageError(f"stager_image {self.stager_image!r} is not an image reference; give one such as "
                             "registry.example.com/tao-data-io-stager:0.1.0")
        if not 0 <= self.ttl_seconds <= MAX_TTL_SECONDS:
            raise UsageError(f"ttl_seconds {self.ttl_seconds!r} must be 0 to {MAX_TTL_SECONDS} (7 days); the Job and "
                             "its logs are deleted that long after it ends")
        if self.shm_size is not None:
            check_binary_quantity(self.shm_size, what="shm_size")
        check_binary_quantity(self.results_budget, what="results_budget")
        if not 1 <= self.shards <= MAX_SHARDS:
            raise UsageError(f"shards {self.shards!r} must be 1 to {MAX_SHARDS}")
        if not 10 <= self.resync_seconds <= 86400:
            raise UsageError(f"resync_seconds {self.resync_seconds!r} must be 10 to 86400")
        if self.records_url is not None:
            parse_s3_url(self.records_url, field="records_url")
        for key, value in self.node_selector.items():
            if not (_LABEL_KEY.fullmatch(key) and len(key.rpartition("/")[2]) <= 63):
                raise UsageError(f"node_selector key {key!r} is not a label key: [prefix/]name, the name at most 63 "
                                 "letters, digits, '-', '_' or '.'")
            if not isinstance(value, str) or not _LABEL_VALUE.fullmatch(value):
                raise UsageError(f"node_selector {key!r} value {value!r} is not a label value: at most 63 letters, "
                                 "digits, '-', '_' or '.', starting and ending with a letter or digit")
        for index, toleration in enumerate(self.tolerations):
            unknown = sorted(set(toleration) - _TOLERATION_FIELDS)
            if unknown:
                raise UsageError(f"tolerations[{index}] has unknown fields {unknown}; use "
                                 f"{sorted(_TOLERATION_FIELDS)}")

    @property
    def results_budget_bytes(self) -> int:
        return quantity_bytes(self.results_budget)
