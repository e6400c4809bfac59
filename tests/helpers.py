"""Small helpers shared by tests: build trees, fingerprint trees, run the CLI as a user would, build
a request, write one and wait for a job's state through it, wait for something with a deadline, read
an environment as torchrun does, count the URIs parsed, find a local job's processes."""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from tao_data_io.fs.confinement import STATE_DIR_NAME, TEMP_PREFIX
from tao_data_io.backends.local.process import proc_stat
from tao_data_io.request import JobRequest


T = TypeVar("T")
#: How long a test waits for something to happen before it fails (a deadline, never a timing assertion).
DEADLINE_S = 60.0
#: The training stand-in (``examples/stand_in/train.sh``) a local job mounts.
STAND_IN = Path(__file__).resolve().parent.parent / "examples" / "stand_in"
#: Shell text for a job's command that talks through its /control mount: write what follows into
#: /control/$1 whole (a temp name, then renamed), and wait for /control/$1.
REPORT = 'report() { name=$1; shift; printf "%s\\n" "$*" > /control/.$name && mv /control/.$name /control/$name; }\n'
AWAIT = 'await() { while [ ! -e /control/$1 ]; do sleep 0.05; done; }\n'
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


def wait_for(what: str, probe: Callable[[], T | None], deadline_s: float = DEADLINE_S) -> T:
    """``probe()``'s first truthy answer, asked every 50 ms; the test fails after ``deadline_s``."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"gave up after {deadline_s:g}s waiting for {what}")


def write_tree(root: Path, files: Mapping[str, bytes]) -> None:
    for relative, data in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def tree_digest(root: Path) -> dict[str, str]:
    """relative path → sha256 of every regular file below ``root``, our state dir excluded."""
    result = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != STATE_DIR_NAME]
        for name in filenames:
            path = Path(dirpath) / name
            result[path.relative_to(root).as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    return result


def temp_leftovers(root: Path) -> list[str]:
    return [str(p) for p in root.rglob(f"{TEMP_PREFIX}*")]


def run_cli(*args: str, env: Mapping[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``tao-data-io`` in a child with exactly ``env`` (plus PATH), as a user's shell would."""
    full_env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), **env}
    return subprocess.run([sys.executable, "-m", "tao_data_io.cli", *args], env=full_env, cwd=cwd,
                          capture_output=True, text=True, timeout=300)


#: Keys of objects a download must refuse: each would land outside its destination, or is no plain
#: path, or names tao-data-io's own state beside it.
HOSTILE_KEYS = ["p/../evil", "p/a/../../evil2", "p//abs", "p/a\\..\\b", "p/\x01ctl", "p/./dot",
                "p/.tao-data-io/digests.json"]


def args_request(**extra: Any) -> dict[str, Any]:
    """An args-mode request of the host's ``true``, with ``extra`` fields."""
    return {"schema_version": "1", "image": "local", "command": ["true"], "mode": "args", "args": [], **extra}


#: The least a request is: the schema version this project reads and an image.
REQUEST_BASE: dict[str, Any] = {"schema_version": "1", "image": "nvcr.io/nvidia/tao/tao-toolkit:6.0.0-pyt"}


def req(*presets: Mapping[str, Any], **fields: Any) -> JobRequest:
    """The tests' one request builder: :data:`REQUEST_BASE`, each of ``presets`` over it in turn (a
    module's usual job, such as tests/kube_helpers.py's ``ARGS_JOB``), then ``fields``, validated."""
    document: dict[str, Any] = dict(REQUEST_BASE)
    for layer in (*presets, fields):
        document.update(layer)
    return JobRequest.model_validate(document)


def write_request(path: Path, request: Mapping[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(dict(request)))
    return path


def held_request(tmp_path: Path, bucket: str, job_id: str) -> Path:
    """The stand-in, held RUNNING until ``tmp_path/hold/go`` exists, reading s3://bucket/ds/."""
    (tmp_path / "hold").mkdir(exist_ok=True)
    (tmp_path / "hold" / ".keep").write_text("")
    return write_request(tmp_path / f"{job_id}.yaml", {
        "schema_version": "1", "job_id": job_id, "image": "local", "mode": "config", "config_format": "json",
        "command": "sh /stand-in/train.sh -e {config_path}", "spec": {"data": f"s3://{bucket}/ds/"},
        "mounts": [{"source": str(STAND_IN), "target": "/stand-in"},
                   {"source": str(tmp_path / "hold"), "target": "/hold"}],
        "environment": {"EPOCHS": "1", "EPOCH_SECONDS": "0", "HOLD_FILE": "/hold/go"},
    })


def wait_cli_state(job_id: str, env: Mapping[str, str], state: str, *extra: str, timeout: float = 30) -> str:
    """``tao-data-io status`` of ``job_id`` once it says ``state`` (``extra``: more flags)."""
    deadline = time.monotonic() + timeout
    out = ""
    while time.monotonic() < deadline:
        out = run_cli("status", "--job-id", job_id, *extra, env=env).stdout
        if out.startswith(state):
            return out
        time.sleep(0.2)
    raise AssertionError(f"{job_id} never reached {state}: {out}")


@contextmanager
def only_environment(environ: Mapping[str, str]) -> Iterator[None]:
    """This process's environment is exactly ``environ`` inside the block, and as it was after."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def torchrun_arguments(environ: Mapping[str, str], argv: Sequence[str]) -> argparse.Namespace:
    """What torchrun makes of ``argv`` in a process whose whole environment is ``environ``.

    torchrun's parser takes each default from ``PET_<DEST>`` when the parser is built
    (``torch.distributed.argparse_util.env``), so it is built only once the environment is in
    place. Skips the test only where torch cannot be imported.
    """
    run = pytest.importorskip("torch.distributed.run", reason="torch is not installed (make test installs it)")
    with only_environment(environ):
        return run.get_args_parser().parse_args(list(argv))


def count_uri_parses(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Every URI text the parsers of :mod:`tao_data_io.uris` read from now on, counted: ``s3://``
    by ``parse_s3_url``, ``hf://`` and ``ngc://`` by ``parse_model_uri`` (``parse_uri`` calls
    them) — wherever a module of the package imported them."""
    from tao_data_io import uris

    counts: Counter[str] = Counter()
    for name in ("parse_s3_url", "parse_model_uri"):
        original = getattr(uris, name)

        def counting(text: str, *args: Any, _original: Callable[..., Any] = original, **kwargs: Any) -> Any:
            counts[text] += 1
            return _original(text, *args, **kwargs)

        for module in [m for m in list(sys.modules.values()) if getattr(m, "__name__", "").startswith("tao_data_io")]:
            if getattr(module, name, None) is original:
                monkeypatch.setattr(module, name, counting)
    return counts


def proc_text(pid: str, name: str) -> str:
    """``/proc/<pid>/<name>`` as text ("" once the process is gone)."""
    try:
        return (Path("/proc") / pid / name).read_bytes().decode("utf-8", "replace")
    except OSError:
        return ""


def live_processes() -> Iterator[tuple[int, str, str]]:
    """(pid, argv, environment) of every running process on this host but zombies."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        stat = proc_stat(int(entry))
        if stat is None or stat.state in ("Z", "X"):
            continue
        yield int(entry), proc_text(entry, "cmdline"), proc_text(entry, "environ")


def job_processes(backend: Any, job_id: str) -> dict[int, str]:
    """pid → argv of every live process of the job: the supervisor (its argv names the run
    directory) and every frame process (bubblewrap and all inside carry TAO_JOB_ID)."""
    run_dir = str(backend.run_root / job_id / "run")
    return {pid: argv.replace("\0", " ") for pid, argv, environ in live_processes()
            if run_dir in argv or f"\0TAO_JOB_ID={job_id}\0" in f"\0{environ}"}


def tar_gz(files: dict[str, bytes]) -> bytes:
    """A gzipped tarball of ``files`` (member name → bytes), in memory: an archive input's object."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def regular_files(root: Path) -> Iterator[Path]:
    """Every regular file under ``root``, no symlink followed, nothing that could block (a FIFO)."""
    for directory, _, names in os.walk(root):
        for name in names:
            path = Path(directory) / name
            try:
                if stat.S_ISREG(os.lstat(path).st_mode):
                    yield path
            except OSError:
                continue


def holding(roots: Sequence[Path], value: bytes) -> list[str]:
    """The regular files under ``roots`` whose bytes hold ``value``."""
    found = []
    for root in roots:
        for path in regular_files(root):
            try:
                if value in path.read_bytes():
                    found.append(str(path))
            except OSError:
                continue
    return found
