"""Small helpers shared by tests: build trees, fingerprint trees, run the CLI as a user would, wait
for something with a deadline, read an environment as torchrun does, count the URIs parsed."""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tao_data_io.fs import STATE_DIR_NAME, TEMP_PREFIX


T = TypeVar("T")
#: How long a test waits for something to happen before it fails (a deadline, never a timing assertion).
DEADLINE_S = 60.0


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
