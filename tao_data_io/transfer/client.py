"""The boto3 client for the S3 control plane (listing, HEAD), tuned once.

Why a factory: every client must use the same retry policy (botocore's ``adaptive`` mode:
exponential backoff with jitter on throttling, 5xx and connection resets, plus client-side
rate limiting when the server throttles; :data:`MAX_ATTEMPTS` unless ``AWS_MAX_ATTEMPTS`` says),
the same timeouts, and path-style addressing for S3-compatible endpoints. Each engine builds its
own session, so engines in different threads never share a session; the only thing shared is the
read-only cache of parsed service models.

botocore is imported when the first client is built, not with this module: importing it costs
~90 ms, and a command that never needs a client (``--help``, a sync whose listing went through
:mod:`signed_list`) must not pay for it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

from ..credentials import S3Credentials
from ..redaction import mask_userinfo
from ..errors import CredentialError

#: Retries after the first attempt (botocore's ``max_attempts``).
MAX_ATTEMPTS = 8


@cache
def _service_models() -> Any:
    """botocore's loader of service models (read-only JSON, cached once parsed). Sharing it is the
    one thing engines share: it turns each new client from ~55 ms into ~8 ms, which is a fifth of
    a 4 × 128 MiB download on loopback. Sessions and clients stay per engine."""
    from botocore.loaders import create_loader

    return create_loader()


def make_s3_client(credentials: S3Credentials, *, max_pool_connections: int = 32) -> Any:
    """A boto3 S3 client with the project's retry policy, timeouts and addressing."""
    import boto3.session
    import botocore.session
    from botocore.config import Config

    config = Config(
        # botocore's ``max_attempts`` counts retries; AWS_MAX_ATTEMPTS counts attempts, the first included.
        retries=({"mode": "adaptive", "max_attempts": MAX_ATTEMPTS} if credentials.max_attempts is None
                 else {"mode": "adaptive", "total_max_attempts": credentials.max_attempts}),
        connect_timeout=10,
        read_timeout=120,
        max_pool_connections=max_pool_connections,
        s3={"addressing_style": "path" if credentials.endpoint_url else "auto"},
        tcp_keepalive=True,
    )
    core = botocore.session.Session()
    core.register_component("data_loader", _service_models())
    session = boto3.session.Session(botocore_session=core)
    # We never read LastModified (change detection is by content), and parsing it with dateutil
    # is ~40% of a 1,000-key ListObjectsV2 page's CPU: keep timestamps as the raw strings.
    # This is a per-session setting of our own session, not global state.
    core.get_component("response_parser_factory").set_parser_defaults(timestamp_parser=str)
    return session.client("s3", config=config, **credentials.boto3_kwargs())


def resolved_keys() -> dict[str, str]:
    """The process's cloud identity as keys, by boto3's chain, under the variables a child reads:
    for a client that cannot read the identity itself. They expire (an hour, typically): hand
    them to one short-lived child only."""
    import boto3

    found = boto3.Session().get_credentials()
    frozen = None if found is None else found.get_frozen_credentials()
    if frozen is None or frozen.access_key is None or frozen.secret_key is None:
        raise CredentialError("this process has no S3 credentials and its cloud identity gave none: check the pod's "
                              "service account and its role")
    keys = {"AWS_ACCESS_KEY_ID": frozen.access_key, "AWS_SECRET_ACCESS_KEY": frozen.secret_key}
    return {**keys, **({"AWS_SESSION_TOKEN": frozen.token} if frozen.token else {})}


def explain(exc: Exception, *, bucket: str, endpoint_url: str | None) -> Exception:
    """Turn a botocore failure of the control plane into an error that says what to fix.

    Configuration mistakes (wrong bucket, wrong keys, unreachable endpoint) are usage errors:
    retrying cannot help and the user needs to know which setting to change.
    """
    from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

    from ..errors import CredentialError, UsageError

    where = mask_userinfo(endpoint_url) if endpoint_url else "AWS S3"
    if isinstance(exc, EndpointConnectionError):
        return UsageError(f"cannot reach the S3 endpoint {where}: "
                          "check AWS_ENDPOINT_URL (or S3_ENDPOINT_URL) and the network")
    if isinstance(exc, NoCredentialsError):
        return CredentialError("no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
    if isinstance(exc, ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code == "NoSuchBucket":
            return UsageError(f"bucket {bucket!r} does not exist at {where}: check the s3:// URL")
        if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken"):
            return CredentialError(
                f"S3 rejected the credentials ({code}) at {where}: check AWS_ACCESS_KEY_ID / "
                "AWS_SECRET_ACCESS_KEY (or ACCESS_KEY / SECRET_KEY) and AWS_SESSION_TOKEN"
            )
        if code in ("AccessDenied", "403", "AllAccessDisabled"):
            return CredentialError(f"access denied to bucket {bucket!r} at {where}: the credentials lack permission")
    return exc


@contextmanager
def explained(bucket: str, endpoint_url: str | None) -> Iterator[None]:
    """Re-raise control-plane configuration failures (bucket, keys, endpoint) as errors naming
    the fix; anything else passes through unchanged."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        yield
    except (BotoCoreError, ClientError) as exc:
        better = explain(exc, bucket=bucket, endpoint_url=endpoint_url)
        if better is exc:
            raise
        raise better from exc


def head_or_none(client: Any, bucket: str, key: str) -> dict[str, Any] | None:
    """HEAD one object: its headers, or None when it does not exist (404)."""
    return _unless_missing(client, bucket, client.head_object, Key=key)


def get_or_none(client: Any, bucket: str, key: str) -> dict[str, Any] | None:
    """GET one object: the answer (``Body`` still to read), or None when it does not exist."""
    return _unless_missing(client, bucket, client.get_object, Key=key)


def _unless_missing(client: Any, bucket: str, call: Any, **params: Any) -> dict[str, Any] | None:
    with explained(bucket, client.meta.endpoint_url):
        try:
            return dict(call(Bucket=bucket, **params))
        except client.exceptions.ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise
