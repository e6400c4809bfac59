"""Shared fixtures: one real S3-compatible server (SeaweedFS on 127.0.0.1) per test session,
a fresh bucket per test, and an environment holding that server's credentials; moto's S3 server
for keys SeaweedFS refuses to store."""

from __future__ import annotations

import itertools
import logging
import socket
from collections.abc import Iterator

import pytest

from tao_data_io.credentials import S3Credentials
from tao_data_io.embedded.s3 import EmbeddedS3
from tao_data_io.transfer.client import make_s3_client

_bucket_numbers = itertools.count()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedS3]:
    with EmbeddedS3(tmp_path_factory.mktemp("seaweedfs")) as server:
        yield server


@pytest.fixture(scope="module")
def moto_credentials() -> Iterator[S3Credentials]:
    """moto's S3 server: still real HTTP, but it stores what AWS stores — traversal keys (``..``,
    ``//``) and control characters, which SeaweedFS rejects."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield S3Credentials("moto-access-key", "moto-secret-key", endpoint_url=f"http://127.0.0.1:{port}")
    finally:
        server.stop()


@pytest.fixture
def s3_credentials(s3_server: EmbeddedS3) -> S3Credentials:
    return s3_server.credentials


@pytest.fixture
def s3_client(s3_credentials: S3Credentials):  # type: ignore[no-untyped-def]
    return make_s3_client(s3_credentials)


@pytest.fixture
def bucket(s3_server: EmbeddedS3, request: pytest.FixtureRequest) -> str:
    name = f"t{next(_bucket_numbers):04d}-{request.node.name[:40]}".lower()
    name = "".join(c if c.isalnum() or c == "-" else "-" for c in name).strip("-")[:60]
    s3_server.create_bucket(name)
    return name


@pytest.fixture
def s3_env(s3_server: EmbeddedS3, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The process environment as a user would have it: only the server's AWS_* credentials."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL",
                 "AWS_DEFAULT_REGION", "ACCESS_KEY", "SECRET_KEY", "S3_ENDPOINT_URL", "CLOUD_REGION"):
        monkeypatch.delenv(name, raising=False)
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    return s3_server.env()

