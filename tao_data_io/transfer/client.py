"""The boto3 client for the S3 control plane (listing, HEAD), tuned once.

Why a factory: every client must use the same retry policy (botocore's ``adaptive`` mode:
exponential backoff with jitter on throttling, 5xx and connection resets, plus client-side
rate limiting when the server throttles), the same timeouts, and path-style addressing for
S3-compatible endpoints. Each engine builds its own session, so there is no process-global
state and engines in different threads never share a session.
"""

from __future__ import annotations

from typing import Any

import boto3
from botocore.config import Config

from ..credentials import S3Credentials

MAX_ATTEMPTS = 8


def make_s3_client(credentials: S3Credentials, *, max_pool_connections: int = 32) -> Any:
    config = Config(
        retries={"mode": "adaptive", "max_attempts": MAX_ATTEMPTS},
        connect_timeout=10,
        read_timeout=120,
        max_pool_connections=max_pool_connections,
        s3={"addressing_style": "path" if credentials.endpoint_url else "auto"},
        tcp_keepalive=True,
    )
    session = boto3.session.Session()
    return session.client("s3", config=config, **credentials.boto3_kwargs())
