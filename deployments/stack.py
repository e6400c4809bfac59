"""The demo's embedded stack: Prefect's server (SQLite, 127.0.0.1), a process worker, the model
hub stand-in — started as children, recorded in ``<home>/stack.json``, and stopped in the right
order (the worker before the server it talks to), now or later from another process.

Why a record on disk: with ``KEEP=1`` the demo leaves everything running for the user to browse
the UI, and ``make demo-stop`` must end exactly what the demo started — by process id, each
checked against the command line it was started with, never by name.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

#: Stop order: what talks to another service goes first.
STOP_ORDER = ("worker", "prefect-server", "model-hub", "s3")
STOP_GRACE_S = 15.0
#: Where ``deployments`` is found (the server is started as ``python -m deployments.server``).
_CHECKOUT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Service:
    name: str
    pid: int
    #: A word of its command line, checked before it is signalled (a recycled pid is left alone).
    marker: str
    log: str


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(what: str, ready: Callable[[], bool], timeout: float, process: subprocess.Popen[bytes] | None = None,
               log: Path | None = None) -> None:
    """Poll ``ready()`` until true; fail saying what did not come up, with its log's end."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        if process is not None and process.poll() is not None:
            break
        time.sleep(0.2)
    tail = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
    raise RuntimeError(f"{what} did not come up within {timeout:g}s" + (f"; its log ends:\n{tail}" if tail else ""))


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


class Stack:
    def __init__(self, home: Path) -> None:
        self.home = home
        self.record = home / "stack.json"

    def services(self) -> list[Service]:
        if not self.record.exists():
            return []
        return [Service(**item) for item in json.loads(self.record.read_text())]

    def remember(self, service: Service) -> None:
        services = [s for s in self.services() if s.name != service.name] + [service]
        self.record.write_text(json.dumps([asdict(s) for s in services], indent=2) + "\n")

    def start(self, name: str, argv: Sequence[str], env: Mapping[str, str], *, marker: str,
              cwd: Path | None = None) -> subprocess.Popen[bytes]:
        """Start ``argv`` in its own session (a Ctrl-C in the terminal reaches the demo, which
        stops it in order) with its output in ``<home>/<name>.log``."""
        log = self.home / f"{name}.log"
        with open(log, "ab") as out:
            process = subprocess.Popen(list(argv), env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL, stdout=out,
                                       stderr=subprocess.STDOUT, start_new_session=True)
        self.remember(Service(name, process.pid, marker, str(log)))
        return process

    def start_prefect_server(self, env: Mapping[str, str], port: int) -> str:
        """Prefect's API and UI on 127.0.0.1:``port``; returns the API URL once healthy. Prefect's
        own server, started by :mod:`deployments.server` so that it refuses a credential pasted
        into a credential block's field (Prefect stores what it is given)."""
        process = self.start("prefect-server", [sys.executable, "-m", "deployments.server", "start", "--host",
                                                "127.0.0.1", "--port", str(port)], env, marker="deployments.server",
                             cwd=_CHECKOUT)
        api = f"http://127.0.0.1:{port}/api"
        wait_until("Prefect's server", lambda: answers(f"{api}/health"), 120, process, self.home / "prefect-server.log")
        return api

    def start_worker(self, env: Mapping[str, str], pool: str, cwd: Path) -> None:
        process = self.start("worker", [sys.executable, "-m", "prefect", "worker", "start", "--pool", pool, "--name",
                                        "demo-worker"], env, marker="worker", cwd=cwd)
        log = self.home / "worker.log"
        wait_until("the Prefect worker", lambda: "started" in log.read_text(errors="replace"), 120, process, log)

    def start_model_hub(self, env: Mapping[str, str], repos: Mapping[str, Path]) -> str:
        port_file = self.home / "model-hub.port"
        port_file.unlink(missing_ok=True)
        argv = [sys.executable, "-m", "deployments.model_hub", "--port-file", str(port_file)]
        argv += [f"--repo={repo}={path}" for repo, path in repos.items()]
        process = self.start("model-hub", argv, env, marker="deployments.model_hub", cwd=Path.cwd())
        wait_until("the model hub stand-in", port_file.exists, 60, process, self.home / "model-hub.log")
        return f"http://127.0.0.1:{port_file.read_text().strip()}"

    def stop(self) -> list[str]:
        """Stop every recorded service, in :data:`STOP_ORDER`; returns what was stopped."""
        stopped = []
        for service in sorted(self.services(), key=lambda s: STOP_ORDER.index(s.name)):
            if _is(service):
                started = time.monotonic()
                _terminate(service.pid)
                stopped.append(f"{service.name} (pid {service.pid}, {time.monotonic() - started:.1f}s)")
        self.record.unlink(missing_ok=True)
        return stopped


def _is(service: Service) -> bool:
    try:
        argv = Path(f"/proc/{service.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return service.marker in argv


def _terminate(pid: int) -> None:
    """SIGTERM, then SIGKILL after :data:`STOP_GRACE_S`; reaps it when it is our child."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < deadline:
        if _gone(pid):
            return
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    _gone(pid)


def _gone(pid: int) -> bool:
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            return True
    except ChildProcessError:
        pass  # not our child (a stop from another process): look at /proc
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"
