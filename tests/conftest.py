"""Shared fixtures: one real S3-compatible server (SeaweedFS on 127.0.0.1) per test session,
a fresh bucket per test, and an environment holding that server's credentials; moto's S3 server
for keys SeaweedFS refuses to store; one Prefect test server per session for the flow tests."""

from __future__ import annotations

import inspect
import itertools
import logging
import os
import shutil
import signal
import socket
import tempfile
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tao_data_io.credentials import S3Credentials
from tao_data_io.embedded.s3 import EmbeddedS3
from tao_data_io.transfer.client import make_s3_client

# Prefect reads these when it is first imported (a flow test module imports it at collection):
# no telemetry (without internet it only logs failures, and its writes lock the test database),
# and a PREFECT_HOME of this session's own, so results and settings never touch ~/.prefect.
PREFECT_HOME = Path(tempfile.gettempdir()) / f"tao-data-io-tests-prefect-{os.getpid()}"
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ["PREFECT_HOME"] = str(PREFECT_HOME)

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


@pytest.fixture(scope="session")
def shared_bucket(s3_server: EmbeddedS3) -> str:
    """One bucket for the tests that only need a prefix of their own. SeaweedFS gives every
    bucket a volume of its own and a machine has room for one volume per GiB of free disk, so a
    bucket per test would exhaust a small disk."""
    s3_server.create_bucket("tao-shared")
    return "tao-shared"


@pytest.fixture
def s3_prefix(shared_bucket: str, request: pytest.FixtureRequest) -> str:
    """A fresh ``s3://tao-shared/<test>/`` prefix in the shared bucket."""
    name = "".join(c if c.isalnum() else "-" for c in request.node.name.lower())[:60].strip("-")
    return f"s3://{shared_bucket}/{next(_bucket_numbers):04d}-{name}/"


@pytest.fixture
def s3_env(s3_server: EmbeddedS3, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The process environment as a user would have it: only the server's AWS_* credentials."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL",
                 "AWS_DEFAULT_REGION", "ACCESS_KEY", "SECRET_KEY", "S3_ENDPOINT_URL", "CLOUD_REGION"):
        monkeypatch.delenv(name, raising=False)
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    return s3_server.env()


@pytest.fixture
def env(s3_env: dict[str, str], bucket: str, s3_client: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A flow worker's environment (this process's, as the flow tests run their flows in it): the S3
    server's credentials and a results bucket holding inputs (``data/part-N.bin``,
    ``models/model.bin``)."""
    monkeypatch.setenv("S3_BUCKET_NAME", bucket)
    for monkey in ("AWS_MAX_ATTEMPTS", "TAO_RESULTS_ROOT", "TAO_DATA_IO_RECORDS", "HF_TOKEN", "NGC_KEY"):
        monkeypatch.delenv(monkey, raising=False)
    for index in range(3):
        s3_client.put_object(Bucket=bucket, Key=f"data/part-{index}.bin", Body=os.urandom(2048))
    s3_client.put_object(Bucket=bucket, Key="models/model.bin", Body=b"model weights")
    return {**s3_env, "S3_BUCKET_NAME": bucket}


@pytest.fixture
def cli_env(s3_server: EmbeddedS3, bucket: str, s3_client: Any, tmp_path: Path) -> dict[str, str]:
    """The environment a user runs the CLI in (:func:`tests.helpers.run_cli`): the S3 server's
    credentials, a results bucket holding ``ds/input.txt``, and a record store, staging root and
    home of the test's own."""
    s3_client.put_object(Bucket=bucket, Key="ds/input.txt", Body=b"version-1\n")
    return {**s3_server.env(), "S3_BUCKET_NAME": bucket, "TAO_DATA_IO_RECORDS": str(tmp_path / "jobs"),
            "TAO_DATA_IO_WORKDIR": str(tmp_path / "work"), "HOME": str(tmp_path)}


@pytest.fixture
def no_cloud(monkeypatch: pytest.MonkeyPatch) -> None:
    """No results bucket, results mount, shared record store or attempt limit from this process's
    environment reaches the test."""
    for variable in ("S3_BUCKET_NAME", "TAO_RESULTS_ROOT", "TAO_DATA_IO_RECORDS", "AWS_MAX_ATTEMPTS"):
        monkeypatch.delenv(variable, raising=False)


@pytest.fixture(scope="session")
def sandbox() -> None:
    """The local compute frame works here: bubblewrap is installed (missing is a failure, not a
    skip: ``make test`` installs it) and the kernel grants it user namespaces (else skip, in
    bubblewrap's own words)."""
    from tao_data_io.errors import UsageError
    from tao_data_io.backends.local.preflight import check_sandbox
    from tao_data_io.launch.run_as import run_as
    from tao_data_io.launch.sandbox import Host, host_system_dirs
    from tao_data_io.launch.tools import BWRAP_INSTALL, find_tool

    bwrap = find_tool("bwrap", BWRAP_INSTALL)
    try:
        check_sandbox(Host(bwrap=bwrap, system=host_system_dirs(), run_as=run_as(None, None)))
    except UsageError as exc:
        pytest.skip(f"this kernel refuses bubblewrap the user namespaces it needs: {exc}")


@pytest.fixture
def local_backend(tmp_path: Path, sandbox: None) -> Iterator[Any]:
    """A local backend whose run root is the test's; nothing a failed test started outlives it."""
    from tao_data_io.backends.local.backend import LocalBackend
    from tao_data_io.backends.local.settings import LocalSettings

    backend = LocalBackend(LocalSettings(run_root=str(tmp_path / "local")))
    yield backend
    for run in backend.run_root.glob("*/run"):
        backend.cancel(f"local/{run.parent.name}")


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    """One Prefect API server (SQLite in a temporary directory) for every flow test of the
    session; sync flows skip the heartbeat thread that costs each of them a second at exit."""
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=60):
        with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
            yield


def pytest_sessionstart(session: pytest.Session) -> None:
    """Ctrl-C reaches the processes under test even when the suite was started in the background:
    a non-interactive shell starts background jobs with SIGINT ignored, Python keeps an inherited
    SIG_IGN, and every interrupt test would then wait for an interrupt that never comes. A
    handled signal is reset to the default at exec, so the verbs the tests start get it too."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_sessionfinish(session: pytest.Session) -> None:
    shutil.rmtree(PREFECT_HOME, ignore_errors=True)


# ----------------------------------------------------------------- markers
#: A test that names one of these — in its body, a fixture it uses, or a helper of the test package
#: they call — talks to a server (S3, moto, the fake registries) or runs the CLI as a process.
_HTTP_NAMES = frozenset({"EmbeddedS3", "ThreadedMotoServer", "FakeRegistries", "run_cli", "subprocess"})
#: A test that names one of these talks to a Kubernetes API server: the stand-in, or a real cluster.
_KUBE_NAMES = frozenset({"KubeStandIn", "RealCluster"})
#: A test that names this starts a SLURM cluster of its own (tests/slurm_cluster.py), without the fixture.
_SLURM_NAMES = frozenset({"SlurmCluster"})
#: Tiers a test is put in by hand (a contract adapter's param, which takes its fixture by
#: ``getfixturevalue``); such a test gets neither ``unit`` nor ``http``.
_MANUAL_TIERS = ("kube", "docker", "slurm")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test ``flows``, ``docker``, ``slurm``, ``kube``, ``http`` or ``unit`` from what it
    uses, so ``pytest -m unit`` is the fast loop without anyone remembering to mark a test (and a
    mark that drifts from the code cannot exist): a test that needs the Prefect server (the
    ``prefect_harness`` fixture, directly or through another fixture) is ``flows``, one that needs
    the session's dockerd (the ``docker_daemon`` fixture of tests/docker_daemon.py) is ``docker``,
    one that needs the session's SLURM cluster (the ``slurm_cluster`` fixture of
    tests/slurm_cluster.py, or a cluster of its own) is ``slurm``; otherwise tier follows from the
    servers and children a test actually needs."""
    for item in items:
        if not isinstance(item, pytest.Function) or any(item.get_closest_marker(tier) for tier in _MANUAL_TIERS):
            continue
        if "prefect_harness" in item.fixturenames:
            item.add_marker(pytest.mark.flows)
            continue
        if "docker_daemon" in item.fixturenames:
            item.add_marker(pytest.mark.docker)
            continue
        if "slurm_cluster" in item.fixturenames:
            item.add_marker(pytest.mark.slurm)
            continue
        used = _names_used([item.function, *_fixture_functions(item)])
        item.add_marker(pytest.mark.slurm if used & _SLURM_NAMES else pytest.mark.kube if used & _KUBE_NAMES else
                        pytest.mark.http if used & _HTTP_NAMES else pytest.mark.unit)


#: The type of what ``@pytest.fixture`` makes of a function (pytest exports no name for it).
_FIXTURE = type(pytest.fixture(lambda: None))


def _fixture_functions(item: pytest.Function) -> list[Callable[..., object]]:
    """The functions of the fixtures ``item`` uses, directly or through another fixture
    (``item.fixturenames``), each where pytest finds it for this test: the test's class, its
    module (a fixture defined or imported there), then the conftest.py files above it, nearest
    first. Fixtures of plugins (pytest's own, kmock's, Prefect's) are none of the test package's."""
    conftests = sorted((plugin for plugin in item.config.pluginmanager.get_plugins()
                        if isinstance(plugin, types.ModuleType) and Path(plugin.__file__ or "").name == "conftest.py"
                        and item.path.is_relative_to(Path(plugin.__file__ or "").parent)),
                       key=lambda module: len(Path(module.__file__ or "").parts), reverse=True)
    found = []
    for name in item.fixturenames:
        for scope in (item.cls, item.module, *conftests):
            fixture = inspect.getattr_static(scope, name, None) if scope is not None else None
            if isinstance(fixture, _FIXTURE):
                found.append(inspect.unwrap(fixture))
                break
    return found


def _names_used(functions: list[Callable[..., object]]) -> set[str]:
    """Global and attribute names the code of ``functions`` refers to, following the test package's
    own module-level functions they call (nested functions and lambdas included)."""
    names: set[str] = set()
    seen: set[types.CodeType] = set()
    pending = [inspect.unwrap(fn) for fn in functions]
    while pending:
        fn = pending.pop()
        code = getattr(fn, "__code__", None)
        if code is None or code in seen:
            continue
        codes = [code]
        while codes:
            current = codes.pop()
            seen.add(current)
            names.update(current.co_names)
            codes += [const for const in current.co_consts if isinstance(const, types.CodeType)]
        module_globals = getattr(fn, "__globals__", {})
        pending += [inspect.unwrap(value) for name in names  # a @contextmanager helper: its generator's code
                    if isinstance(value := module_globals.get(name), types.FunctionType)
                    and value.__module__.split(".")[0] == __name__.split(".")[0]]
    return names
