"""Environment → credentials: the one place that reads the credential variables.

Why this module exists: credentials must come from the environment only, and must never be
written to disk, argv, logs, manifests or the Prefect database. Everything that needs an S3
client or a child process environment goes through here, so there is exactly one place that
reads the variables. Keeping their values out of every output is :mod:`tao_data_io.redaction`'s.

``AWS_MAX_ATTEMPTS`` (the AWS SDKs' own variable) bounds the attempts of every S3 request when it
is set; otherwise each client keeps its tuned default.

Precedence: the official AWS names (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_SESSION_TOKEN``, ``AWS_ENDPOINT_URL``, ``AWS_DEFAULT_REGION``) win. When a session only
has the legacy TAO names (``ACCESS_KEY``, ``SECRET_KEY``, ``S3_ENDPOINT_URL``,
``CLOUD_REGION``) they are mapped *in memory* into the client's arguments or the child's
environment — ``os.environ`` is never modified.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import CredentialError, UsageError
from .redaction import mask_userinfo
# Under the name it had when redaction lived here: a flow whose run failed with it has it stored by
# that name (Prefect's JSON result serializer keeps an exception as its qualified name,
# tao_data_io.credentials.MaskedError, and rebuilds it from there).
from .redaction import MaskedError as MaskedError  # re-exported: see above

#: (official AWS name, legacy TAO name) for each S3 setting.
AWS_TO_LEGACY: dict[str, str] = {
    "AWS_ACCESS_KEY_ID": "ACCESS_KEY",
    "AWS_SECRET_ACCESS_KEY": "SECRET_KEY",
    "AWS_ENDPOINT_URL": "S3_ENDPOINT_URL",
    "AWS_DEFAULT_REGION": "CLOUD_REGION",
}

DEFAULT_REGION = "us-east-1"
MAX_ATTEMPTS_VARIABLE = "AWS_MAX_ATTEMPTS"


@dataclass(frozen=True)
class S3Credentials:
    """What an S3 client needs, resolved once from the environment.

    The secret fields are excluded from ``repr`` so an accidental log of this object shows
    no value. Instances are never persisted: blocks and models hold variable *names*.
    """

    #: None for both: the process's cloud identity (:data:`POD_IDENTITY_VARIABLES`), which each
    #: client resolves itself and refreshes.
    access_key_id: str | None = field(repr=False)
    secret_access_key: str | None = field(repr=False)
    session_token: str | None = field(default=None, repr=False)
    endpoint_url: str | None = field(default=None, repr=False)
    region: str = DEFAULT_REGION
    #: "aws" or "legacy": which family of variable names supplied the keys; "pod identity": none
    #: did, the process has a cloud identity instead.
    source: str = "aws"
    #: ``AWS_MAX_ATTEMPTS``: the most attempts of one request, first try included, for every
    #: client (boto3, obstore, s5cmd); None keeps each client's tuned default. A retrying
    #: orchestrator sets it low so a fault surfaces to its own, slower retry sooner.
    max_attempts: int | None = None

    def __repr__(self) -> str:
        endpoint = None if self.endpoint_url is None else mask_userinfo(self.endpoint_url)
        return f"S3Credentials(endpoint_url={endpoint!r}, region={self.region!r}, source={self.source!r})"

    def settings(self, names: Mapping[str, str]) -> dict[str, str]:
        """The settings that are set, under the names a client wants: ``names`` maps each of
        ``access_key_id``, ``secret_access_key``, ``session_token``, ``region`` and
        ``endpoint_url`` to the client's word for it. One place decides what a client is given."""
        values = {"access_key_id": self.access_key_id, "secret_access_key": self.secret_access_key,
                  "session_token": self.session_token, "region": self.region, "endpoint_url": self.endpoint_url}
        return {names[field]: value for field, value in values.items() if value}

    @property
    def pod_identity(self) -> bool:
        """No keys: the process's cloud identity, resolved by each client's own credential chain."""
        return self.access_key_id is None

    def boto3_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``boto3.client("s3", **kwargs)``."""
        return self.settings({"access_key_id": "aws_access_key_id", "secret_access_key": "aws_secret_access_key",
                              "session_token": "aws_session_token", "region": "region_name",
                              "endpoint_url": "endpoint_url"})

    def child_env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """An environment for a child process (s5cmd) carrying these credentials.

        Credentials travel to children through the environment only — never argv. ``base``
        defaults to a minimal environment (PATH, HOME, locale, proxies) so that unrelated
        secrets of the parent are not handed to the child.
        """
        source = os.environ if base is None else base
        keep = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY",
                "http_proxy", "https_proxy", "no_proxy", "AWS_CA_BUNDLE", "SSL_CERT_FILE")
        env = {name: source[name] for name in keep if name in source}
        if self.pod_identity:  # the child's own chain reads (and refreshes) the identity
            env.update({name: source[name] for name in POD_IDENTITY_VARIABLES if name in source})
        else:
            env["AWS_ACCESS_KEY_ID"] = str(self.access_key_id)
            env["AWS_SECRET_ACCESS_KEY"] = str(self.secret_access_key)
        env["AWS_REGION"] = self.region
        env["AWS_DEFAULT_REGION"] = self.region
        if self.session_token:
            env["AWS_SESSION_TOKEN"] = self.session_token
        if self.endpoint_url:
            env["AWS_ENDPOINT_URL"] = self.endpoint_url
            env["S3_ENDPOINT_URL"] = self.endpoint_url  # s5cmd's name for it (its --endpoint-url would be argv)
        return env


def _lookup(environ: Mapping[str, str], aws_name: str) -> tuple[str | None, str | None]:
    """Return (value, the variable it came from), AWS name first, then the legacy name."""
    value = environ.get(aws_name)
    if value:
        return value, aws_name
    legacy = AWS_TO_LEGACY.get(aws_name)
    if legacy and environ.get(legacy):
        return environ[legacy], legacy
    return None, None


def s3_credentials_from_env(environ: Mapping[str, str] | None = None) -> S3Credentials:
    """Resolve S3 credentials from ``environ`` (default ``os.environ``) without modifying it.

    Raises :class:`CredentialError` naming exactly the variable(s) to set.
    """
    env = os.environ if environ is None else environ
    key_id, key_from = _lookup(env, "AWS_ACCESS_KEY_ID")
    secret, secret_from = _lookup(env, "AWS_SECRET_ACCESS_KEY")
    source = "legacy" if key_from == "ACCESS_KEY" else "aws"
    if key_id is None and secret is None and has_pod_identity(env):
        source = "pod identity"
    elif key_id is None and secret is None:
        raise CredentialError(
            "S3 credentials are missing: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the "
            "environment (or the legacy TAO names ACCESS_KEY and SECRET_KEY), or give the pod a cloud identity "
            "(IRSA or EKS Pod Identity: AWS_ROLE_ARN with AWS_WEB_IDENTITY_TOKEN_FILE, or "
            "AWS_CONTAINER_CREDENTIALS_FULL_URI). "
            "Export them or `set -a; source .env; set +a`; never pass them as arguments."
        )
    elif key_id is None:
        raise CredentialError(
            f"S3 credentials are incomplete: {secret_from} is set but AWS_ACCESS_KEY_ID "
            "(or the legacy ACCESS_KEY) is not; set it in the environment."
        )
    elif secret is None:
        raise CredentialError(
            f"S3 credentials are incomplete: {key_from} is set but AWS_SECRET_ACCESS_KEY "
            "(or the legacy SECRET_KEY) is not; set it in the environment."
        )
    endpoint, _ = _lookup(env, "AWS_ENDPOINT_URL")
    region, _ = _lookup(env, "AWS_DEFAULT_REGION")
    return S3Credentials(
        access_key_id=key_id,
        secret_access_key=secret,
        session_token=env.get("AWS_SESSION_TOKEN") or None,
        endpoint_url=endpoint or env.get("AWS_ENDPOINT_URL_S3") or None,
        region=region or env.get("AWS_REGION") or DEFAULT_REGION,
        source=source,
        max_attempts=_max_attempts(env),
    )


#: What a cloud identity puts in a pod's environment, as boto3, obstore (through boto3) and
#: s5cmd read it: IRSA's role and projected token (exchanged at STS), EKS Pod Identity's agent.
#: GKE and AKS workload identity reach S3-compatible stores the same ways or not at all.
POD_IDENTITY_VARIABLES = ("AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_SESSION_NAME",
                          "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                          "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", "AWS_STS_REGIONAL_ENDPOINTS")


def has_pod_identity(environ: Mapping[str, str]) -> bool:
    """Whether ``environ`` carries a cloud identity a client can turn into credentials."""
    web_identity = bool(environ.get("AWS_ROLE_ARN") and environ.get("AWS_WEB_IDENTITY_TOKEN_FILE"))
    return web_identity or bool(environ.get("AWS_CONTAINER_CREDENTIALS_FULL_URI")
                                or environ.get("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"))


def _max_attempts(env: Mapping[str, str]) -> int | None:
    value = env.get(MAX_ATTEMPTS_VARIABLE)
    if not value:
        return None
    if not value.isdigit() or not 1 <= int(value) <= 100:
        raise UsageError(f"{MAX_ATTEMPTS_VARIABLE} {value!r} is not a number of attempts: give a whole number from 1 "
                         "(no retry) to 100, or unset it for the default")
    return int(value)


def forwarded_values(names: Iterable[str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The values to hand a job for the credential variables it forwards, read from ``environ``.

    Each name gets its own value, or — for the S3 settings — the other family's (a job that
    forwards ``AWS_ACCESS_KEY_ID`` from a session that only has ``ACCESS_KEY`` gets that value
    under the name it asked for, and the other way round), mapped in memory as everywhere else.
    For the per-job Kubernetes Secret and the local sandbox's environment; the result is never
    logged or stored. A name with no value anywhere is a :class:`CredentialError` naming it.
    """
    env = os.environ if environ is None else environ
    legacy_to_aws = {legacy: aws for aws, legacy in AWS_TO_LEGACY.items()}
    values: dict[str, str] = {}
    missing = []
    for name in dict.fromkeys(names):
        other = AWS_TO_LEGACY.get(name) or legacy_to_aws.get(name)
        value = env.get(name) or (env.get(other) if other else None)
        if value:
            values[name] = value
        else:
            missing.append(name + (f" (or {other})" if other else ""))
    if missing:
        raise CredentialError(f"forward_env names variables that are not set here: {', '.join(missing)}; export "
                              "them in the environment that submits the job, or remove them from forward_env")
    return values


def require_env(name: str, purpose: str, environ: Mapping[str, str] | None = None) -> str:
    """Return the value of a single credential variable, or say which variable to set and why."""
    env = os.environ if environ is None else environ
    value = env.get(name)
    if not value:
        raise CredentialError(f"{name} is not set: it is needed to {purpose}. Export {name} in the environment.")
    return value
