"""Name rules: job ids, environment variable names, credential variable names, and what a
record keeps as its pointer to the backend's job.

Why one module: a job id becomes a record's file name (so its rule is the store's confinement),
a backend's object name (a Kubernetes Job name, a label value) and part of an S3 key; the record
store, the request, the backends and the CLI must all agree on what is valid, and every refusal
must say the rule. Checks raise :class:`~tao_data_io.errors.UsageError` naming ``what``, the
value and the rule. A backend's own names (Kubernetes' DNS rules and object names) live in its
package.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from datetime import datetime, timezone

from .errors import UsageError

#: The longest job id: the id is its training Job's name, and an Indexed Job's pod hostname
#: ``<job>-<index>`` must stay a DNS label (63).
MAX_JOB_ID = 52
_JOB_ID = re.compile(rf"[a-z0-9]([a-z0-9-]{{0,{MAX_JOB_ID - 2}}}[a-z0-9])?")
JOB_ID_RULE = ("use 1-52 lowercase letters, digits or '-', starting and ending with a letter or digit "
               "(it becomes the Kubernetes Job name and the record's file name)")
#: A variable's name, as a JSON schema pattern too (a form checks a field that holds one by it).
ENV_NAME_PATTERN = "^[A-Za-z_][A-Za-z0-9_]*$"
_ENV_NAME = re.compile(ENV_NAME_PATTERN.strip("^$"))
ENV_NAME_RULE = "letters, digits and '_', not starting with a digit ([A-Za-z_][A-Za-z0-9_]*)"


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


#: The most a record keeps of a backend's pointer to its job (``backend_ref``).
MAX_BACKEND_REF = 512


def check_backend_ref(value: str, *, what: str = "backend_ref") -> str:
    """What a record keeps as its pointer to the backend's job: the backend's own text, which
    each backend parses itself; here only printable, one line, and bounded, because a record is
    shown and stored wherever it is read."""
    if not value or len(value) > MAX_BACKEND_REF or not value.isprintable():
        raise UsageError(f"{what} {value[:80]!r} must be 1-{MAX_BACKEND_REF} printable characters on one line (the "
                         "backend's own reference to the job)")
    if value != value.strip():  # a ref is matched as text: " job" would never find "job" again
        raise UsageError(f"{what} {value[:80]!r} must be 1-{MAX_BACKEND_REF} printable characters, not blank nor "
                         "padded with spaces (the backend's own reference to the job, as it gave it)")
    return value
