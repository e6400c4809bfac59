"""The gates ``make test`` runs before pytest: ``ruff check .`` and ``mypy``, each with the
project's own configuration (``[tool.ruff]`` and ``[tool.mypy]`` in pyproject.toml).

For each gate, a test runs the very command the Makefile runs on the checkout (it must pass) and
on a small project holding that configuration and a planted error (it must fail, naming the
error) — so a gate that stopped catching anything, or a configuration that stopped reaching the
code, fails here too. Two more keep the rules the gates leave to people: every ``noqa`` and every
``type: ignore`` of the core says why, and the names a type checker reads for the lazy exports of
:mod:`tao_data_io.records` are the ones it exports.
"""

from __future__ import annotations

import ast
import io
import re
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: What `make test` runs, in the venv this test runs in.
RUFF = [sys.executable, "-m", "ruff", "check", "."]
MYPY = [sys.executable, "-m", "mypy"]


def gate(command: list[str], cwd: Path) -> tuple[int, str]:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=280)
    return done.returncode, done.stdout + done.stderr


def planted(tmp_path: Path, source: str) -> Path:
    """A project of the checkout's configuration whose core holds one module, ``source``."""
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    package = tmp_path / "tao_data_io"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "planted.py").write_text(source)
    return tmp_path


def test_ruff_passes_on_the_checkout() -> None:
    code, said = gate(RUFF, ROOT)
    assert code == 0, said


def test_ruff_fails_on_a_planted_error(tmp_path: Path) -> None:
    # An unused import (pyflakes), a line past 120 characters and a missing blank line (pycodestyle:
    # the formatter's checks), each where the gate looks.
    source = ('"""Planted."""\n\nimport os\n'
              f'LONG = "{"x" * 120}"\n'
              "def f() -> None:\n    pass\n")
    code, said = gate(RUFF, planted(tmp_path, source))
    assert code == 1, said
    assert "tao_data_io/planted.py:3:8" in said, said
    for rule in ("F401", "E501", "E302"):
        assert re.search(rf"\b{rule}\b", said), said


def test_mypy_passes_on_the_checkout() -> None:
    code, said = gate(MYPY, ROOT)
    assert code == 0, said
    assert "Success: no issues found" in said, said


def test_mypy_fails_on_a_planted_error(tmp_path: Path) -> None:
    # A wrong type, and (strict) a function without annotations.
    source = '"""Planted."""\n\nCOUNT: int = "three"\n\n\ndef untyped(value):\n    return value\n'
    code, said = gate(MYPY, planted(tmp_path, source))
    assert code == 1, said
    assert re.search(r"tao_data_io/planted\.py:3: error: .*\[assignment\]", said), said
    assert re.search(r"tao_data_io/planted\.py:6: error: .*\[no-untyped-def\]", said), said


def _comments(path: Path) -> list[tuple[int, str]]:
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    return [(token.start[0], token.string) for token in tokens if token.type == tokenize.COMMENT]


def test_every_suppression_says_why() -> None:
    """A ``noqa`` anywhere the linter looks, and a ``type: ignore`` in the core (the part mypy
    checks), each name their codes and carry the reason on their line: ``# noqa: E402 - why``,
    ``# type: ignore[misc]  # why``."""
    trees = ("tao_data_io", "tasks", "flows", "blocks", "deployments", "tests", "bench", "docs")
    unexplained = []
    for tree in trees:
        for path in sorted((ROOT / tree).rglob("*.py")):
            for line, comment in _comments(path):
                where = f"{path.relative_to(ROOT)}:{line}: {comment}"
                if "noqa" in comment and not re.search(r"noqa: [A-Z]+[0-9]+(, ?[A-Z]+[0-9]+)* - \S", comment):
                    unexplained.append(where)
                if (tree == "tao_data_io" and "type: ignore" in comment
                        and not re.search(r"type: ignore\[[a-z, -]+\]  # \S", comment)):
                    unexplained.append(where)
    assert unexplained == []


def test_the_type_checkers_view_of_the_records_package_is_what_it_exports() -> None:
    """``tao_data_io.records`` loads each public name on first use (PEP 562); the imports under
    ``TYPE_CHECKING`` are what a type checker reads instead, and must name the same set."""
    tree = ast.parse((ROOT / "tao_data_io" / "records" / "__init__.py").read_text())
    blocks = [node for node in ast.walk(tree) if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"]
    checked = {alias.asname or alias.name for block in blocks
               for child in block.body if isinstance(child, ast.ImportFrom) for alias in child.names}
    from tao_data_io import records

    assert checked == set(records.__all__)
