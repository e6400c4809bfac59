"""Name rules: job ids, Kubernetes DNS labels and subdomains, environment variable names, and the
Kubernetes object names derived from a job id.

Why one module: a job id becomes a record's file name (so its rule is the store's confinement),
a Kubernetes Job name, a label value and part of an S3 key; the renderer, the record store, the
request and the CLI must all agree on what is valid, and every refusal must say the rule.
Checks raise :class:`~tao_data_io.errors.UsageError` naming ``what``, the value and the rule.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from datetime import datetime, timezone

from .errors import UsageError

#: The longest Kubernetes name we derive from a job id: Job pods are named ``<job>-<index>-<5>``
#: and the pod hostname of an Indexed Job ``<job>-<index>`` must stay a DNS label (63).
MAX_K8S_JOB_NAME = 52
_JOB_ID = re.compile(r"[a-z0-9]([a-z0-9-]{0,50}[a-z0-9])?")
JOB_ID_RULE = ("use 1-52 lowercase letters, digits or '-', starting and ending with a letter or digit "
               "(it becomes the Kubernetes Job name and the record's file name)")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
DNS_LABEL_RULE = "at most 63 lowercase letters, digits or '-', starting and ending with a letter or digit"
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
DNS_SUBDOMAIN_RULE = ("at most 253 lowercase letters, digits, '-' or '.', each dot-separated part starting and "
                      "ending with a letter or digit")
_DNS_SUBDOMAIN_MAX = 253
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ENV_NAME_RULE = "letters, digits and '_', not starting with a digit ([A-Za-z_][A-Za-z0-9_]*)"
#: How many hex digits of a job id's SHA-256 end a derived name, so two ids never share one.
_HASH_DIGITS = 10


def is_job_id(value: str) -> bool:
    return bool(_JOB_ID.fullmatch(value))


def check_job_id(value: str, *, what: str = "job id") -> str:
    """Return ``value`` if it is a valid job id; else raise naming ``what``, the value and the rule."""
    if not is_job_id(value):
        raise UsageError(f"{what} {value!r} is not a valid job id: {JOB_ID_RULE}")
    return value


def mint_job_id(now: datetime | None = None) -> str:
    """A fresh id, ``tao-YYYYMMDD-<10 hex>``: sortable by day, 40 random bits within a day."""
    return f"tao-{(now or datetime.now(timezone.utc)):%Y%m%d}-{secrets.token_hex(5)}"


def check_dns_label(value: str, *, what: str) -> str:
    """A Kubernetes DNS-1123 label (namespaces, Service names)."""
    if not _DNS_LABEL.fullmatch(value):
        raise UsageError(f"{what} {value!r} is not a DNS label: {DNS_LABEL_RULE}")
    return value


def check_dns_subdomain(value: str, *, what: str) -> str:
    """A Kubernetes DNS-1123 subdomain (claims, Secrets, ConfigMaps, Job names)."""
    if not (_DNS_SUBDOMAIN.fullmatch(value) and len(value) <= _DNS_SUBDOMAIN_MAX):
        raise UsageError(f"{what} {value!r} is not a DNS subdomain: {DNS_SUBDOMAIN_RULE}")
    return value


def is_env_name(value: str) -> bool:
    return bool(_ENV_NAME.fullmatch(value))


def check_env_name(value: str, *, what: str) -> str:
    if not is_env_name(value):
        raise UsageError(f"{what} {value!r} is not a valid variable name: {ENV_NAME_RULE}")
    return value


def check_backend_ref(value: str, *, what: str = "backend_ref") -> str:
    """``NAMESPACE/NAME`` as Kubernetes spells them (the record's pointer to the backend object)."""
    namespace, slash, name = value.partition("/")
    if not (slash and _DNS_LABEL.fullmatch(namespace) and _DNS_SUBDOMAIN.fullmatch(name)
            and len(name) <= _DNS_SUBDOMAIN_MAX):
        raise UsageError(f"{what} {value!r} must be NAMESPACE/NAME: a namespace of {DNS_LABEL_RULE} and a name of "
                         f"{DNS_SUBDOMAIN_RULE}")
    return value


def k8s_name_for(job_id: str, suffix: str = "") -> str:
    """The deterministic Kubernetes name for ``job_id`` (plus ``-suffix``), at most 52 characters.

    An id that is already a DNS label short enough is used as is (a reader finds the Job by its
    record id); otherwise a slug of it plus the first 10 hex digits of its SHA-256, so two ids
    never map to one name.
    """
    tail = f"-{suffix}" if suffix else ""
    plain = f"{job_id}{tail}"
    if _DNS_LABEL.fullmatch(plain) and len(plain) <= MAX_K8S_JOB_NAME:
        return plain
    digest = hashlib.sha256(job_id.encode()).hexdigest()[:_HASH_DIGITS]
    slug = re.sub(r"[^a-z0-9-]+", "-", job_id.lower()).strip("-")
    room = MAX_K8S_JOB_NAME - len(tail) - len(digest) - 1
    slug = slug[:room].rstrip("-") or "job"
    return f"{slug}-{digest}{tail}"
