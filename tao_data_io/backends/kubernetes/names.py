"""Kubernetes' own names: DNS labels and subdomains, a job's object names, and the backend ref.

**Object names** (:func:`object_names`). Each is a name the API server takes, and no two valid
job ids — nor two roles of one id — get one name within a kind: otherwise applying one job's
objects would replace another's (its config and verify probe, its credentials, its Job). A job
id is 1-52 lowercase letters, digits and '-', a letter or digit at each end (it may begin with a
digit), so:

* the training **Job** is ``<id>``: a record's ``backend_ref`` names it, and its pods' hostnames
  ``<id>-<index>`` (up to 56 characters) stay DNS labels;
* the tier B stage **Job** is ``<id>-stage``, lengthened to 54 characters with ``-`` and hex
  digits of the id's SHA-256 when it would be 52 or shorter. Longer than any id, it is never a
  training Job's name; the id is read back from it (a name ends in ``stage`` or in hex after
  ``-stage-``, and ``stage`` is not hex), so two ids never share one; the digest only fills. At
  most 58 characters, so its pods' hostnames ``<name>-<index>`` of up to 1,000 shards stay DNS
  labels;
* the headless **Service** is ``ranks-<id>``: a Service name is a DNS-1035 label, which begins
  with a letter, and a prefix on every id gives every id its own. It is the pods' ``subdomain``,
  so rank 0 is ``<id>-0.ranks-<id>``;
* the **ConfigMap** ``<id>-files`` and the per-job **Secret** ``<id>-credentials``: DNS-1123
  subdomains (253 characters), so a suffix on every id, never truncated.

Labels hold the training Job's name, which is the id (a label value holds 63 characters).

A record's ``backend_ref`` is ``<namespace>/<Job name>`` (:func:`check_ref`): the Kubernetes
backend's own reference, which it alone parses.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from ...errors import UsageError
from ...names import MAX_JOB_ID, check_job_id

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
DNS_LABEL_RULE = "at most 63 lowercase letters, digits or '-', starting and ending with a letter or digit"
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
DNS_SUBDOMAIN_RULE = ("at most 253 lowercase letters, digits, '-' or '.', each dot-separated part starting and "
                      "ending with a letter or digit")
_DNS_SUBDOMAIN_MAX = 253
#: The rendezvous Service's prefix: a letter first (DNS-1035), whatever the id begins with.
SERVICE_PREFIX = "ranks-"
#: The collective probe's Service's prefix: a letter first too, and never a training Service's.
PROBE_SERVICE_PREFIX = "probe-"


def check_dns_label(value: str, *, what: str) -> str:
    """A Kubernetes DNS-1123 label (namespaces)."""
    if not _DNS_LABEL.fullmatch(value):
        raise UsageError(f"{what} {value!r} is not a DNS label: {DNS_LABEL_RULE}")
    return value


def check_dns_subdomain(value: str, *, what: str) -> str:
    """A Kubernetes DNS-1123 subdomain (claims, Secrets, ConfigMaps, Job names)."""
    if not (_DNS_SUBDOMAIN.fullmatch(value) and len(value) <= _DNS_SUBDOMAIN_MAX):
        raise UsageError(f"{what} {value!r} is not a DNS subdomain: {DNS_SUBDOMAIN_RULE}")
    return value


def check_ref(value: str, *, what: str = "backend_ref") -> str:
    """``NAMESPACE/NAME`` as Kubernetes spells them: the Kubernetes backend's ref to its Job."""
    namespace, slash, name = value.partition("/")
    if not (slash and _DNS_LABEL.fullmatch(namespace) and _DNS_SUBDOMAIN.fullmatch(name)
            and len(name) <= _DNS_SUBDOMAIN_MAX):
        raise UsageError(f"{what} {value!r} must be NAMESPACE/NAME: a namespace of {DNS_LABEL_RULE} and a name of "
                         f"{DNS_SUBDOMAIN_RULE}")
    return value


@dataclass(frozen=True)
class ObjectNames:
    """The Kubernetes names of one job's objects (see the module docstring for the scheme)."""

    job: str
    stage: str
    service: str
    files: str
    credentials: str
    #: The multi-node collective probe's Indexed Job and its headless Service.
    probe: str
    probe_service: str


def _own_job_name(job_id: str, word: str) -> str:
    """``<job id>-<word>``, padded with a digest to more than any job id's length, so no job's id
    is ever another job's stage or probe Job name."""
    name = f"{job_id}-{word}"
    if len(name) <= MAX_JOB_ID:
        name = f"{name}-{hashlib.sha256(job_id.encode()).hexdigest()[:MAX_JOB_ID + 1 - len(name)]}"
    return name


def object_names(job_id: str) -> ObjectNames:
    """The names of ``job_id``'s objects; an invalid id is refused with the rule."""
    check_job_id(job_id)
    return ObjectNames(job=job_id, stage=_own_job_name(job_id, "stage"), service=f"{SERVICE_PREFIX}{job_id}",
                       files=f"{job_id}-files", credentials=f"{job_id}-credentials",
                       probe=_own_job_name(job_id, "probe"), probe_service=f"{PROBE_SERVICE_PREFIX}{job_id}")
