"""Small helpers shared by tests: build trees, fingerprint trees, run the CLI as a user would."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from tao_data_io.fs import STATE_DIR_NAME, TEMP_PREFIX


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
