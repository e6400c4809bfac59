"""The product uses Prefect's public API only: ``pyproject.toml`` allows any ``prefect>=3.9``,
and a private module (``prefect._internal…``) may move in any release without notice."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("tao_data_io", "tasks", "flows", "blocks", "deployments")


def _private_imports(path: Path, base: Path = ROOT) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else (
            [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        found += [f"{path.relative_to(base)}:{node.lineno}: {name}" for name in names
                  if any(part.startswith("_") and not part.startswith("__") for part in name.split(".")[1:])
                  and name.split(".")[0] in {"prefect", "prefect_aws", "pydantic", "kubernetes", "docker"}]
    return found


def test_no_private_module_of_a_dependency_is_imported() -> None:
    found = [hit for top in PRODUCT for path in sorted((ROOT / top).rglob("*.py")) for hit in _private_imports(path)]
    assert not found, found


def test_the_check_sees_a_private_import(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text("import os\nfrom prefect._internal.compatibility.async_dispatch import async_dispatch\n",
                       encoding="utf-8")
    assert _private_imports(planted, tmp_path) == ["planted.py:2: prefect._internal.compatibility.async_dispatch"]
