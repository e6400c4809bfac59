"""A real Docker daemon for the test session, of the session's own: ``dockerd`` with its own data
root, exec root, pidfile and socket under a short temporary directory (a unix socket's path is
limited to 107 bytes), no bridge and no iptables rules (a job's frame needs no network), and the
containerd it starts itself. Nothing can be pulled here, so the test image is imported from a root
filesystem made of busybox-static and its applet links. A module of its own, so test modules share
the fixture without importing each other (``from . import docker_daemon as harness`` and
``docker_daemon = harness.docker_daemon`` in a test module, as tests/kube_cluster.py's are).

One daemon serves the whole session however many modules take the fixture: pytest makes a fixture
definition per module that names it, so the daemon is counted out to them and stopped when the
last lets go. It is stopped by the pid it was started as (SIGTERM, then SIGKILL after a grace); the
directory is removed after what remains mounted under it is unmounted. A killed session's daemon
gets SIGTERM as it goes (``setpriv --pdeathsig``), and the next session removes the directory it
left. A daemon that does not start fails the tests with its log's last lines: the project tests on
real engines, never skips them."""

from __future__ import annotations

import ctypes
import hashlib
import io
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import tarfile
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import docker
import pytest
import requests

from .session_service import Shared

#: The image every Docker test runs, imported at the daemon's start.
IMAGE = "tao-data-io-test:busybox"
BUSYBOX = Path("/bin/busybox")
#: The user a job runs as in the tests (``user="1000:1000"``); root and nobody are there too.
PASSWD = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n" \
         "user:x:1000:1000:user:/home/user:/bin/sh\n"
GROUP = "root:x:0:\nnogroup:x:65534:\nuser:x:1000:\n"
READY_S = 30.0
#: How long dockerd has to stop after SIGTERM; it stops the containers still running first.
STOP_GRACE_S = 20.0
LOG_LINES = 40
#: Where dockerd, and the containerd, runc and docker-init it runs, are looked for after $PATH.
_SEARCH_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_PREFIX = "tao-dockerd-"
_SOCKET_MAX = 107
_MNT_DETACH = 2


@dataclass(frozen=True)
class DockerDaemon:
    """The session's daemon: ``host`` is what DOCKER_HOST names (``unix://…``), ``data_root`` its
    --data-root, ``client`` a :class:`docker.DockerClient` on it, ``image`` the tag of the test
    image; ``pid`` the dockerd the session started, ``directory`` what it owns (socket, data and
    exec roots, pidfile), ``log`` its output."""

    host: str
    data_root: Path
    client: docker.DockerClient
    image: str
    pid: int
    directory: Path
    log: Path

    def environ(self) -> dict[str, str]:
        """What a process needs in its environment to reach this daemon (and no other)."""
        return {"DOCKER_HOST": self.host}

    def log_tail(self, lines: int = LOG_LINES) -> str:
        return _tail(self.log, lines)

    @contextmanager
    def runtimes(self, runtimes: dict[str, str]) -> Iterator[None]:
        """The daemon with these extra runtimes (name → the program's path) while the block runs:
        added to its own config file and reloaded (SIGHUP: ``runtimes`` is a setting dockerd
        reloads), then the file put back as it was. So one test can give the daemon an ``nvidia``
        runtime (runc under that name: the daemon takes a GPU request at create and fails it at
        start, as a host with a broken toolkit does) while every other test meets the daemon as it
        started. A runtime the daemon starts with belongs in that file too, never in an
        ``--add-runtime`` flag: dockerd refuses a setting given both ways."""
        config = _paths(self.directory)["config"]
        before = json.loads(config.read_text())
        kept = dict(before.get("runtimes") or {})
        try:
            self._reload(config, {**before, "runtimes": {**kept, **{name: {"path": path}
                                                                    for name, path in runtimes.items()}}},
                         lambda found: set(runtimes) <= set(found))
            yield
        finally:
            # A reload changes only what the file names: the runtimes are named, as they were.
            self._reload(config, {**before, "runtimes": kept},
                         lambda found: not (set(runtimes) - set(kept)) & set(found))

    def _reload(self, config: Path, settings: dict[str, object], done: Callable[[dict[str, object]], bool]) -> None:
        _write_config(config, settings)
        os.kill(self.pid, signal.SIGHUP)
        deadline = time.monotonic() + READY_S
        while not done(self.client.info().get("Runtimes") or {}):
            if time.monotonic() > deadline:
                raise AssertionError(f"dockerd did not reload {config} within {READY_S:g}s:\n{self.log_tail()}")
            time.sleep(0.05)


# ---------------------------------------------------------------- the fixture
@pytest.fixture(scope="session")
def docker_daemon() -> Iterator[DockerDaemon]:
    """The session's own dockerd and its test image (see the module's docstring)."""
    running = _SHARED.acquire()
    try:
        assert running.daemon is not None
        yield running.daemon
    finally:
        _SHARED.release()


class _StartFailed(Exception):
    pass


class _Running:
    """A started dockerd: the process we started, the directory it owns."""

    def __init__(self, process: subprocess.Popen[bytes], directory: Path) -> None:
        self.process = process
        self.directory = directory
        self.daemon: DockerDaemon | None = None

    @classmethod
    def start(cls) -> _Running:
        dockerd = _require_host()
        directory = _short_directory()
        paths = _paths(directory)
        namespace = containerd_namespace(directory)
        # A killed session's daemon had a socket of its own (this name is new), and ended with it.
        setpriv = shutil.which("setpriv", path=_SEARCH_PATH)
        argv = [*([setpriv, "--pdeathsig", "TERM", "--"] if setpriv else []), dockerd,
                "--host", f"unix://{paths['socket']}", "--data-root", str(paths["data"]),
                "--exec-root", str(paths["exec"]), "--pidfile", str(paths["pidfile"]),
                # Its own config file (never the host's /etc/docker/daemon.json), which
                # DockerDaemon.runtimes rewrites and has reloaded.
                "--config-file", str(paths["config"]),
                "--bridge=none", "--iptables=false", "--ip-masq=false", "--ip6tables=false",
                "--userland-proxy=false",
                # Our containers stay out of a system containerd's namespace (dockerd uses one that
                # runs instead of its own); its own containerd takes the name too.
                f"--containerd-namespace={namespace}", f"--containerd-plugins-namespace={namespace}-plugins"]
        _write_config(paths["config"], {})
        environ = {name: value for name, value in os.environ.items()
                   if not name.startswith("DOCKER_") and name != "NOTIFY_SOCKET"}
        environ["PATH"] = f"{environ.get('PATH', '')}:{_SEARCH_PATH}".lstrip(":")
        try:
            with paths["log"].open("wb") as log:
                # Its own session: a Ctrl-C of the test run reaches the tests, and the teardown stops it.
                process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                           env=environ, cwd=directory, start_new_session=True)
        except OSError as exc:
            _remove_directory(directory)
            raise _StartFailed(f"starting {dockerd}: {exc}") from exc
        running = cls(process, directory)
        host = f"unix://{paths['socket']}"
        try:
            client = running.wait_ready(host)
            _import_image(client)
        except (_StartFailed, docker.errors.DockerException, requests.RequestException, OSError) as exc:
            # Read before the directory goes with the daemon.
            failure = f"{exc}\n--- dockerd's log, its last {LOG_LINES} lines ---\n{_tail(paths['log'], LOG_LINES)}"
        except BaseException:
            running.stop()
            raise
        else:
            running.daemon = DockerDaemon(host=host, data_root=paths["data"], client=client, image=IMAGE,
                                          pid=process.pid, directory=directory, log=paths["log"])
            return running
        running.stop()
        raise _StartFailed(failure)

    def wait_ready(self, host: str) -> docker.DockerClient:
        """A client once the daemon answers a ping on ``host``, within :data:`READY_S`."""
        deadline = time.monotonic() + READY_S
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise _StartFailed(f"dockerd (pid {self.process.pid}) exited with {self.process.returncode} "
                                   f"before answering on {host}")
            try:
                probe = docker.DockerClient(base_url=host, timeout=5)
                try:
                    if probe.ping():
                        # The client the tests get waits as long as docker-py's default (60 s).
                        return docker.DockerClient(base_url=host)
                finally:
                    probe.close()
            except (docker.errors.DockerException, requests.RequestException, OSError) as exc:
                last = exc
            time.sleep(0.05)
        raise _StartFailed(f"dockerd (pid {self.process.pid}) did not answer on {host} within {READY_S:g}s "
                           f"(last: {last})")

    def stop(self) -> None:
        """Remove what still runs, stop the pid we started, unmount what it left, remove the directory."""
        daemon = self.daemon
        if daemon is not None and self.process.poll() is not None:
            warnings.warn(f"dockerd (pid {self.process.pid}) ended on its own (exit {self.process.returncode}) before "
                          "the session did: containers it ran may outlive it (containerd namespace "
                          f"{containerd_namespace(self.directory)})")
        if daemon is not None and self.process.poll() is None:
            try:
                for container in daemon.client.containers.list(all=True):
                    container.remove(force=True)
            except (docker.errors.DockerException, requests.RequestException) as exc:
                warnings.warn(f"removing the session's containers before stopping dockerd: {exc}")
            daemon.client.close()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                warnings.warn(f"dockerd (pid {self.process.pid}) ignored SIGTERM for {STOP_GRACE_S:g}s; killed")
                self.process.kill()
                self.process.wait()
        _remove_directory(self.directory)


# ---------------------------------------------------------------- the host
def _require_host() -> str:
    """dockerd's path, once root and a static busybox are there too; else why not."""
    if os.geteuid() != 0:
        raise _StartFailed("the Docker tests start a dockerd of their own, which needs root "
                           "(the tests run as root here and on CI)")
    dockerd = shutil.which("dockerd", path=f"{os.environ.get('PATH', '')}:{_SEARCH_PATH}")
    if dockerd is None:
        raise _StartFailed("dockerd is not installed: `make docker` installs Debian's docker.io")
    if not BUSYBOX.is_file() or not _is_static(BUSYBOX):
        raise _StartFailed(f"{BUSYBOX} is missing or not statically linked: `make docker` installs busybox-static")
    return dockerd


def _is_static(path: Path) -> bool:
    """Whether the ELF file at ``path`` names no program interpreter (PT_INTERP): it runs alone in
    an image that has no libc."""
    with path.open("rb") as file:
        header = file.read(64)
        if header[:4] != b"\x7fELF":
            return False
        little = header[5] == 1
        order = "<" if little else ">"
        if header[4] == 2:  # 64-bit
            phoff, = struct.unpack_from(order + "Q", header, 32)
            phentsize, phnum = struct.unpack_from(order + "HH", header, 54)
        else:
            phoff, = struct.unpack_from(order + "I", header, 28)
            phentsize, phnum = struct.unpack_from(order + "HH", header, 42)
        file.seek(phoff)
        table = file.read(phentsize * phnum)
    return all(struct.unpack_from(order + "I", table, index * phentsize)[0] != 3 for index in range(phnum))


def _short_directory() -> Path:
    """A new directory whose socket path fits a unix socket's limit: under $TMPDIR when that is
    short enough, else under /tmp; what killed sessions left there is removed first."""
    for base in (tempfile.gettempdir(), "/tmp"):
        candidate = Path(tempfile.mkdtemp(prefix=_PREFIX, dir=base)).resolve()
        if len(str(_paths(candidate)["socket"]).encode()) <= _SOCKET_MAX:
            _paths(candidate)["owner"].write_text(f"{os.getpid()}\n")
            _sweep(candidate.parent)
            return candidate
        candidate.rmdir()
    raise _StartFailed(f"no temporary directory is short enough for a unix socket (under {_SOCKET_MAX} bytes)")


def containerd_namespace(directory: Path) -> str:
    """The containerd namespace of the daemon that owns ``directory``: its name made of what
    containerd takes (``^[A-Za-z0-9]+(?:[._-][A-Za-z0-9]+)*$``). The directory's own name will not
    do: mkdtemp's suffix may begin or end with ``_`` or hold ``__`` (``tao-dockerd-_1zo85ru``), and
    then the daemon starts but every container's start fails with ``namespace validation``."""
    return _PREFIX + hashlib.sha256(directory.name.encode()).hexdigest()[:16]


def _paths(directory: Path) -> dict[str, Path]:
    return {"socket": directory / "docker.sock", "data": directory / "data", "exec": directory / "exec",
            "pidfile": directory / "dockerd.pid", "log": directory / "dockerd.log", "owner": directory / "owner",
            "config": directory / "daemon.json"}


def _write_config(path: Path, settings: dict[str, object]) -> None:
    staged = path.with_name(f".{path.name}")
    staged.write_text(json.dumps(settings))
    os.replace(staged, path)


def _sweep(base: Path) -> None:
    """Remove the directories of sessions that were killed: neither the test process that made one
    (its ``owner``) nor the dockerd it started (its pidfile) is alive. One without an owner may be
    being made now; it stays."""
    for directory in base.glob(f"{_PREFIX}*"):
        paths = _paths(directory)
        if (directory.is_dir() and paths["owner"].exists() and not _alive(paths["owner"])
                and not _alive(paths["pidfile"])):
            _remove_directory(directory)


def _alive(pidfile: Path) -> bool:
    """Whether the process ``pidfile`` names runs (a missing or unreadable file names none)."""
    try:
        os.kill(int(pidfile.read_text().strip()), 0)
    except PermissionError:
        return True
    except (OSError, ValueError):
        return False
    return True


def _tail(path: Path, lines: int) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"(unreadable: {exc})"
    return "\n".join(text.splitlines()[-lines:])


# ---------------------------------------------------------------- cleanup
def _mounts_under(directory: Path) -> list[Path]:
    """The mount points at or under ``directory`` in this process's mount namespace, deepest first."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = Path(re.sub(r"\\([0-7]{3})", lambda match: chr(int(match.group(1), 8)), line.split(" ")[4]))
        if point.is_relative_to(directory):
            found.append(point)
    return sorted(found, key=lambda point: len(point.parts), reverse=True)


def _remove_directory(directory: Path) -> None:
    """Detach what is still mounted under ``directory`` (never anything outside it), then remove
    it; if a mount will not go, the directory stays, with a warning, rather than be walked into."""
    libc = ctypes.CDLL(None, use_errno=True)
    for point in _mounts_under(directory):
        if libc.umount2(os.fsencode(point), _MNT_DETACH) != 0:
            warnings.warn(f"unmounting {point}: {os.strerror(ctypes.get_errno())}")
    remaining = _mounts_under(directory)
    if remaining:
        warnings.warn(f"left {directory} in place: still mounted under it: {', '.join(map(str, remaining))}")
        return
    shutil.rmtree(directory, ignore_errors=True)
    if directory.exists():
        warnings.warn(f"could not remove all of {directory}")


# ---------------------------------------------------------------- the image
def _import_image(client: docker.DockerClient) -> None:
    """Import :data:`IMAGE`: busybox-static and a link for each of its applets where busybox puts
    it, /etc/passwd and /etc/group (root, nobody, user 1000), a 1777 /tmp, and /proc /sys /dev."""
    repository, _, tag = IMAGE.partition(":")
    client.api.import_image_from_data(_rootfs_tar(), repository=repository, tag=tag)
    client.images.get(IMAGE)


def _rootfs_tar() -> bytes:
    applets = subprocess.run([str(BUSYBOX), "--list-full"], check=True, capture_output=True, text=True).stdout.split()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        def add(name: str, kind: bytes, mode: int, data: bytes = b"", link: str = "", owner: int = 0) -> None:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.linkname = kind, mode, link
            info.uid, info.gid, info.size = owner, owner, len(data)
            tar.addfile(info, io.BytesIO(data) if data else None)

        directories = {"bin", "sbin", "usr", "usr/bin", "usr/sbin", "etc", "proc", "sys", "dev", "root", "home"}
        directories |= {str(Path(applet).parent) for applet in applets}
        for name in sorted(directories):
            add(name, tarfile.DIRTYPE, 0o700 if name == "root" else 0o755)
        add("tmp", tarfile.DIRTYPE, 0o1777)
        add("home/user", tarfile.DIRTYPE, 0o755, owner=1000)
        add("bin/busybox", tarfile.REGTYPE, 0o755, BUSYBOX.read_bytes())
        for applet in applets:
            if applet != "bin/busybox":
                add(applet, tarfile.SYMTYPE, 0o777, link="/bin/busybox")
        add("etc/passwd", tarfile.REGTYPE, 0o644, PASSWD.encode())
        add("etc/group", tarfile.REGTYPE, 0o644, GROUP.encode())
    return buffer.getvalue()


#: The session's one dockerd (made last: it names the classes above).
_SHARED = Shared("the session's dockerd", _Running.start, _Running.stop, _StartFailed)
