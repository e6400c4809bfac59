"""Import contracts (``[tool.importlinter]`` in pyproject.toml), enforced by the test suite.

The core stays usable without Prefect and talks to Kubernetes only through its (future)
``tao_data_io.kubernetes`` subpackage; the Prefect tasks and flows reach S3 and clusters only
through the core, never with their own boto3, obstore or kubernetes calls. A second test builds a
small tree that breaks each rule, so a contract that stopped catching anything would fail too.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest
import tomli_w
from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parent.parent
ROOT_PACKAGES = ("tao_data_io", "tasks", "flows", "blocks")


def lint(project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Lint ``project`` as ``lint-imports`` run there would (it puts the working directory first
    on sys.path, for good: the path is restored after the test)."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.chdir(project)
    code = lint_imports(config_filename=str(project / "pyproject.toml"), no_cache=True, no_logo=True)
    return code, capsys.readouterr().out


def test_the_project_keeps_its_import_contracts(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    code, report = lint(ROOT, monkeypatch, capsys)
    assert code == 0, report
    assert "3 kept, 0 broken" in report


def test_each_contract_catches_its_violation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    sources = {
        "tao_data_io/__init__.py": "",
        "tao_data_io/orchestrate.py": "import prefect\n",
        "tao_data_io/leak.py": "from kubernetes import client\n",
        "tao_data_io/kubernetes/__init__.py": "import kubernetes\n",  # the one place allowed to
        "tao_data_io/kubernetes/jobs.py": "from kubernetes import client\n",
        "tasks/__init__.py": "import boto3\n",
        "flows/__init__.py": "",
        "flows/stage.py": "import obstore\nimport botocore.session\n",
        "blocks/__init__.py": "",
        "blocks/cluster.py": "from kubernetes import config\n",
    }
    for relative, text in sources.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text)
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (tmp_path / "pyproject.toml").write_text(tomli_w.dumps({"tool": {"importlinter": settings}}))
    # The linter finds packages as imports would: make it find the small tree, not this project.
    for name in [n for n in sys.modules if n.split(".")[0] in ROOT_PACKAGES]:
        monkeypatch.delitem(sys.modules, name)

    code, report = lint(tmp_path, monkeypatch, capsys)

    assert code == 1, report
    assert "0 kept, 3 broken" in report
    for line in ("tao_data_io.orchestrate -> prefect", "tao_data_io.leak -> kubernetes", "tasks -> boto3",
                 "flows.stage -> obstore", "flows.stage -> botocore", "blocks.cluster -> kubernetes"):
        assert line in report
    assert "tao_data_io.kubernetes" not in report.replace("Only tao_data_io.kubernetes talks", "")
