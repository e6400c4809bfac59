"""Import boundaries: only tao_data_io/kubernetes/ may import the kubernetes client (until the
import-linter contract lands, this test is the contract)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_only_the_kubernetes_package_imports_the_kubernetes_client() -> None:
    offenders = [str(path.relative_to(ROOT)) for folder in ("tao_data_io", "tasks", "flows", "blocks", "deployments")
                 for path in (ROOT / folder).rglob("*.py")
                 if "kubernetes" in _imports(path) and (ROOT / "tao_data_io" / "kubernetes") not in path.parents]
    assert offenders == []
