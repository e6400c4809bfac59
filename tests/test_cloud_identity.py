"""S3 without static keys: a pod's cloud identity — IRSA's web-identity token (``AWS_ROLE_ARN``,
``AWS_WEB_IDENTITY_TOKEN_FILE``, exchanged at STS by ``AssumeRoleWithWebIdentity``) — read by
each of the three clients the way it reads it itself: boto3's credential chain (the control
plane), obstore through boto3's credentials (``Boto3CredentialProvider``: its own chain would
call STS over HTTPS only), and s5cmd's own chain, given the variables. moto serves S3 and STS over
real HTTP; it takes any token, so what is proved is the chain, not the cloud's trust policy."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tao_data_io.credentials import S3Credentials, s3_credentials_from_env
from tao_data_io.errors import CredentialError
from tao_data_io.transfer.client import make_s3_client
from tao_data_io.transfer.engine import TransferEngine
from tao_data_io.transfer.obstore_executor import LARGE_OBJECT_BYTES, ObstoreExecutor
from tao_data_io.transfer.s5cmd_executor import KEYS_CHILD_BYTES, S5cmdExecutor

from .helpers import tree_digest, write_tree

STATIC = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "ACCESS_KEY", "SECRET_KEY",
          "AWS_PROFILE", "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")


@pytest.fixture
def pod_identity(moto_credentials: S3Credentials, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A pod as IRSA leaves it: a role, a projected token file, no static key anywhere (no config
    or credentials file either); S3 and STS at the moto server. Yields a bucket holding data/."""
    client = make_s3_client(moto_credentials)
    bucket = "pod-identity"
    client.create_bucket(Bucket=bucket)
    for index in range(3):
        client.put_object(Bucket=bucket, Key=f"data/part-{index}.bin", Body=os.urandom(1024 + index))
    token = tmp_path / "token"
    token.write_text("eyJhbGciOiJSUzI1NiJ9.a-projected-service-account-token.sig")  # no newline: sent as is
    for name in STATIC:
        monkeypatch.delenv(name, raising=False)
    for name, value in {"AWS_ROLE_ARN": "arn:aws:iam::123456789012:role/tao-data-io",
                        "AWS_WEB_IDENTITY_TOKEN_FILE": str(token),
                        "AWS_ENDPOINT_URL": str(moto_credentials.endpoint_url),
                        "AWS_DEFAULT_REGION": "us-east-1", "AWS_CONFIG_FILE": str(tmp_path / "no-config"),
                        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-credentials")}.items():
        monkeypatch.setenv(name, value)
    yield bucket


def test_without_keys_but_with_a_pods_identity_the_credentials_are_the_pods(pod_identity: str) -> None:
    credentials = s3_credentials_from_env()
    assert credentials.source == "pod identity" and credentials.access_key_id is None
    assert "AWS_ROLE_ARN" in credentials.child_env() and "AWS_ACCESS_KEY_ID" not in credentials.child_env()


def test_without_keys_or_an_identity_the_error_names_both_ways(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*STATIC, "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(CredentialError, match="AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY.*or give the pod a cloud "
                                              "identity"):
        s3_credentials_from_env()


def test_the_control_plane_lists_through_the_pods_identity(pod_identity: str) -> None:
    client = make_s3_client(s3_credentials_from_env())
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=pod_identity)["Contents"]]
    assert keys == [f"data/part-{i}.bin" for i in range(3)]
    assert client._request_signer._credentials.method == "assume-role-with-web-identity"


@pytest.mark.parametrize("executor", ["obstore", "s5cmd"])
def test_each_byte_mover_reads_and_writes_through_the_pods_identity(pod_identity: str, tmp_path: Path,
                                                                    executor: str) -> None:
    credentials = s3_credentials_from_env()
    mover = ObstoreExecutor(credentials) if executor == "obstore" else S5cmdExecutor(credentials)
    with TransferEngine(credentials, executor=mover) as engine:
        down = engine.sync(f"s3://{pod_identity}/data/", str(tmp_path / "down"))
        assert down.ok and down.transferred_files == 3, down.failed
        write_tree(tmp_path / "up", {"model.pth": os.urandom(4096)})
        up = engine.sync(str(tmp_path / "up"), f"s3://{pod_identity}/results/{executor}/")
        assert up.ok and up.transferred_files == 1, up.failed
    again = tmp_path / "again"
    with TransferEngine(credentials) as engine:
        assert engine.sync(f"s3://{pod_identity}/results/{executor}/", str(again)).ok
    assert tree_digest(again) == tree_digest(tmp_path / "up")


class _PodIdentityAgent:
    """EKS Pod Identity's agent, as its API is: GET the full URI with the projected token (read
    from the token file) as the Authorization header → temporary keys. moto takes any keys."""

    def __init__(self, token: str) -> None:
        import json
        import threading
        from datetime import datetime, timedelta, timezone
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.calls = 0
        agent = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # the standard library's name
                if self.headers.get("Authorization") != token:
                    self.send_response(401)
                    self.end_headers()
                    return
                agent.calls += 1
                expiry = (datetime.now(timezone.utc) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
                body = json.dumps({"AccessKeyId": "ASIAPODIDENTITYTEST1", "SecretAccessKey": "pod-identity-secret-1",
                                   "Token": "pod-identity-session-1", "Expiration": expiry}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/credentials"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def eks_pod_identity(pod_identity: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[_PodIdentityAgent]:
    """The same pod under EKS Pod Identity instead of IRSA: no role, the agent's URI and token file."""
    token = "pod-identity-projected-token"
    (tmp_path / "pod-token").write_text(token)
    agent = _PodIdentityAgent(token)
    monkeypatch.delenv("AWS_ROLE_ARN")
    monkeypatch.delenv("AWS_WEB_IDENTITY_TOKEN_FILE")
    monkeypatch.setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", agent.url)
    monkeypatch.setenv("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", str(tmp_path / "pod-token"))
    yield agent
    agent.server.shutdown()


@pytest.mark.parametrize("executor", ["obstore", "s5cmd"])
def test_under_eks_pod_identity_each_byte_mover_gets_the_agents_credentials(
        pod_identity: str, eks_pod_identity: _PodIdentityAgent, tmp_path: Path, executor: str) -> None:
    """s5cmd's SDK cannot ask the agent itself (it takes a literal token and a loopback address
    only): it is handed the agent's current keys, never logged, and the child's environment holds
    no agent variable."""
    credentials = s3_credentials_from_env()
    assert credentials.source == "pod identity"
    mover = ObstoreExecutor(credentials) if executor == "obstore" else S5cmdExecutor(credentials)
    with TransferEngine(credentials, executor=mover) as engine:
        down = engine.sync(f"s3://{pod_identity}/data/", str(tmp_path / "down"))
    assert down.ok and down.transferred_files == 3, down.failed
    assert eks_pod_identity.calls >= 1
    if executor == "s5cmd":
        env = S5cmdExecutor(credentials).child_env()
        assert env["AWS_SESSION_TOKEN"] == "pod-identity-session-1"
        assert "AWS_CONTAINER_CREDENTIALS_FULL_URI" not in env and "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE" not in env


def test_under_eks_pod_identity_each_s5cmd_child_gets_fresh_keys_for_a_bounded_share(
        pod_identity: str, eks_pod_identity: _PodIdentityAgent, tmp_path: Path) -> None:
    """Keys handed to s5cmd expire (the agent's last an hour or so, and botocore hands out keys
    with as little as 15 minutes left), so no child may run on them for long: a batch is split
    into children of at most ``keys_child_bytes`` each, and each child's keys are fetched when it
    starts. An object larger than that share stays with obstore, whose provider refreshes."""
    credentials = s3_credentials_from_env()
    mover = S5cmdExecutor(credentials, keys_child_bytes=2100)  # the objects are 1,024–1,026 bytes
    assert mover.largest_object == 2100 and S5cmdExecutor(credentials).largest_object == KEYS_CHILD_BYTES
    before = eks_pod_identity.calls
    with TransferEngine(credentials, executor=mover) as engine:
        down = engine.sync(f"s3://{pod_identity}/data/", str(tmp_path / "down"))
    assert down.ok and down.transferred_files == 3, down.failed
    assert eks_pod_identity.calls - before >= 2  # two children: 1,024 + 1,025 bytes, then 1,026


def test_with_its_own_identity_chain_an_s5cmd_child_takes_any_share(pod_identity: str) -> None:
    """Under IRSA s5cmd's SDK reads the token file and refreshes the role's keys itself."""
    assert S5cmdExecutor(s3_credentials_from_env(), keys_child_bytes=1).largest_object is None


def test_under_eks_pod_identity_an_object_larger_than_a_childs_share_stays_with_obstore(
        pod_identity: str, eks_pod_identity: _PodIdentityAgent, moto_credentials: S3Credentials,
        tmp_path: Path) -> None:
    class NoChild(S5cmdExecutor):
        def run(self, batch: object, on_done: object) -> None:
            raise AssertionError("handed to s5cmd")

    make_s3_client(moto_credentials).put_object(Bucket=pod_identity, Key="big/checkpoint.pth",
                                                Body=os.urandom(LARGE_OBJECT_BYTES + 1))
    credentials = s3_credentials_from_env()
    mover = ObstoreExecutor(credentials, large=NoChild(credentials, keys_child_bytes=LARGE_OBJECT_BYTES))
    with TransferEngine(credentials, executor=mover) as engine:
        down = engine.sync(f"s3://{pod_identity}/big/", str(tmp_path / "big"))
    assert down.ok and (tmp_path / "big" / "checkpoint.pth").stat().st_size == LARGE_OBJECT_BYTES + 1, down.failed
