"""What every part of the stand-in shares: the resources it serves (kmock's addresses), the time
as the API server stamps it, and quantities read as ``k8s.io/apimachinery/pkg/api/resource``
reads them."""

from __future__ import annotations

import re
from datetime import datetime, timezone

import kmock

JOBS = kmock.resource("batch", "v1", "jobs")
PODS = kmock.resource("", "v1", "pods")
RESOURCES = {kind: kmock.resource(*parts) for kind, parts in {
    "Secret": ("", "v1", "secrets"), "ConfigMap": ("", "v1", "configmaps"), "Service": ("", "v1", "services"),
    "Job": ("batch", "v1", "jobs"), "Pod": ("", "v1", "pods"), "Event": ("", "v1", "events"),
    "Node": ("", "v1", "nodes"), "PersistentVolumeClaim": ("", "v1", "persistentvolumeclaims"),
    "PersistentVolume": ("", "v1", "persistentvolumes"), "StorageClass": ("storage.k8s.io", "v1", "storageclasses"),
    "CSIDriver": ("storage.k8s.io", "v1", "csidrivers"), "LimitRange": ("", "v1", "limitranges")}.items()}
#: The label the Job controller puts on each pod of a Job: the Job's name.
JOB_NAME = "batch.kubernetes.io/job-name"
#: Resource plural → kind, for the kinds the backend creates (what :func:`invalid` checks).
KINDS = {"secrets": "Secret", "configmaps": "ConfigMap", "services": "Service", "jobs": "Job"}


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


_QUANTITY_SUFFIXES = {"m": 1e-3, "": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10, "Mi": 2**20,
                      "Gi": 2**30, "Ti": 2**40}


def quantity(text: str) -> float:
    """A resource quantity's value (k8s.io/apimachinery/pkg/api/resource: decimal and binary SI)."""
    number = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", str(text))
    assert number is not None and number[2] in _QUANTITY_SUFFIXES, text
    return float(number[1]) * _QUANTITY_SUFFIXES[number[2]]


# ----------------------------------------------------------------------------- the control plane
