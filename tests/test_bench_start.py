"""Every benchmark script starts: imports what it measures and parses its flags (``--help``). A
benchmark is run by hand, rarely, so a rename in the product (a decorator's arguments, a keyword
of the code it drives) broke ``bench/flows.py`` at import and nothing said so until a user ran it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(path for path in (ROOT / "bench").glob("*.py") if path.name != "__init__.py")


def test_there_are_benchmarks() -> None:
    assert len(SCRIPTS) >= 10, SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_a_benchmark_starts(script: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(tmp_path), "PREFECT_HOME": str(tmp_path / "prefect")}
    done = subprocess.run([sys.executable, str(script), "--help"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and "usage:" in done.stdout, done.stderr[-2000:]
