"""Import contracts (``[tool.importlinter]`` in pyproject.toml), enforced by the test suite.

The core stays usable without Prefect and talks to Kubernetes only through its (future)
``tao_data_io.kubernetes`` subpackage; the Prefect tasks and flows reach S3 and clusters only
through the core, never with their own boto3, obstore or kubernetes calls (blocks too); the launch
seam (the Backend protocol) imports no backend and not the registry above them, so the backends
and the seam never import each other in a circle. A second test builds a small tree that breaks
each rule, so a contract that stopped catching anything would fail too.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import tomli_w

ROOT = Path(__file__).resolve().parent.parent


def lint(project: Path) -> tuple[int, str]:
    """Lint ``project`` as ``lint-imports`` run there would, in a child process: the linter
    configures logging for its whole process (disabling every logger it does not name — Prefect's
    run loggers included, for every later flow test of the session) and finds packages as imports
    would, from the directory it runs in."""
    code = ("import sys; from importlinter.cli import lint_imports; "
            "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True, no_logo=True))")
    done = subprocess.run([sys.executable, "-c", code], cwd=project, capture_output=True, text=True, timeout=300)
    return done.returncode, done.stdout + done.stderr


def test_the_project_keeps_its_import_contracts() -> None:
    code, report = lint(ROOT)
    assert code == 0, report
    assert "5 kept, 0 broken" in report


def test_each_contract_catches_its_violation(tmp_path: Path) -> None:
    sources = {
        "tao_data_io/__init__.py": "",
        "tao_data_io/orchestrate.py": "import prefect\n",
        "tao_data_io/leak.py": "from kubernetes import client\n",
        "tao_data_io/kubernetes/__init__.py": "import kubernetes\n",  # the one place allowed to
        "tao_data_io/kubernetes/jobs.py": "from kubernetes import client\n",
        "tao_data_io/local/__init__.py": "",
        "tao_data_io/local/frame.py": "",
        "tao_data_io/backends.py": "",
        "tao_data_io/launch/__init__.py": "",
        "tao_data_io/launch/seam.py": "from tao_data_io.local import frame\nfrom tao_data_io import backends\n",
        "tasks/__init__.py": "import boto3\n",
        "flows/__init__.py": "",
        "flows/stage.py": "import obstore\nimport botocore.session\n",
        "flows/submit.py": "from tao_data_io.verbs import submit\nfrom tao_data_io.steps import open_record\n",
        "tao_data_io/verbs.py": "", "tao_data_io/steps.py": "",
        "blocks/__init__.py": "",
        "blocks/cluster.py": "from kubernetes import config\n",
    }
    for relative, text in sources.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text)
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (tmp_path / "pyproject.toml").write_text(tomli_w.dumps({"tool": {"importlinter": settings}}))

    code, report = lint(tmp_path)

    assert code == 1, report
    assert "0 kept, 5 broken" in report
    for line in ("tao_data_io.orchestrate -> prefect", "tao_data_io.leak -> kubernetes", "tasks -> boto3",
                 "flows.stage -> obstore", "flows.stage -> botocore", "blocks.cluster -> kubernetes",
                 "flows.submit -> tao_data_io.steps",
                 "tao_data_io.launch.seam -> tao_data_io.local.frame", "tao_data_io.launch.seam -> tao_data_io.backends"):
        assert line in report
    assert "tao_data_io.kubernetes" not in report.replace("Only tao_data_io.kubernetes talks", "")
    assert "flows.submit -> tao_data_io.verbs" not in report  # a verb is what a flow calls
