"""Name rules: job ids, Kubernetes DNS labels and subdomains, environment variable names, and the
Kubernetes object names derived from a job id.

Why one module: a job id becomes a record's file name (so its rule is the store's confinement),
a Kubernetes Job name, a label value and part of an S3 key; the renderer, the record store, the
request and the CLI must all agree on what is valid, and every refusal must say the rule.
Checks raise :class:`~tao_data_io.errors.UsageError` naming ``what``, the value and the rule.

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
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timezone

from .errors import UsageError

#: The longest job id: the id is its training Job's name, and an Indexed Job's pod hostname
#: ``<job>-<index>`` must stay a DNS label (63).
MAX_JOB_ID = 52
_JOB_ID = re.compile(rf"[a-z0-9]([a-z0-9-]{{0,{MAX_JOB_ID - 2}}}[a-z0-9])?")
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
#: The rendezvous Service's prefix: a letter first (DNS-1035), whatever the id begins with.
SERVICE_PREFIX = "ranks-"
#: The collective probe's Service's prefix: a letter first too, and never a training Service's.
PROBE_SERVICE_PREFIX = "probe-"


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


def job_id_for_run(run_id: str) -> str:
    """The id of the job a run (a Prefect flow run: its root's id) submits when its request names
    none: ``tao-<16 hex>``, the same for every retry of that run — a retried run resumes its job
    rather than minting a second one and orphaning the first — and starting with a letter, which a
    raw UUID (a digit first 10 times in 16) would not, and a Kubernetes Service name needs."""
    return f"tao-{hashlib.sha256(run_id.encode()).hexdigest()[:16]}"


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


def is_env_name(value: str) -> bool:
    return bool(_ENV_NAME.fullmatch(value))


def check_env_name(value: str, *, what: str) -> str:
    if not is_env_name(value):
        raise UsageError(f"{what} {value!r} is not a valid variable name: {ENV_NAME_RULE}")
    return value


#: Variables that steer how programs run — which are found, what they load, what a shell runs
#: first — rather than hold a credential. Named as a credential (a block's variable, a request's
#: forward_env), a worker's value would be put into the job's environment and decide what runs.
PROCESS_CONTROLS = frozenset({"PATH", "IFS", "ENV", "BASH_ENV", "PS4", "SHELLOPTS", "BASHOPTS", "PYTHONPATH",
                              "PYTHONHOME", "PYTHONSTARTUP", "PYTHONINSPECT", "NODE_OPTIONS", "NODE_PATH", "PERL5LIB",
                              "PERL5OPT", "RUBYLIB", "RUBYOPT", "GCONV_PATH", "LOCPATH", "HOSTALIASES"})


def process_control_problem(name: str) -> str | None:
    """Why ``name`` may not name a credential (see :data:`PROCESS_CONTROLS`; every ``LD_*``, the
    dynamic loader's), or None."""
    if name in PROCESS_CONTROLS or name.startswith("LD_"):
        return ("controls how programs run (which are found, what they load), not a credential: name the variable "
                "that holds the credential")
    return None


def check_credential_name(value: str, *, what: str) -> str:
    """A variable name that may name a credential: valid, and not a process control."""
    check_env_name(value, what=what)
    problem = process_control_problem(value)
    if problem is not None:
        raise UsageError(f"{what} {value!r} {problem}")
    return value


def check_backend_ref(value: str, *, what: str = "backend_ref") -> str:
    """``NAMESPACE/NAME`` as Kubernetes spells them (the record's pointer to the backend object)."""
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
