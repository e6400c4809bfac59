"""Import contracts (``[tool.importlinter]`` in pyproject.toml), enforced by the test suite, and
the core's import graph without circles.

The core stays usable without Prefect; only a backend's own package imports its client library;
backends never import one another, and the core's steps reach one only through the registry; the
Prefect tasks, flows, blocks and the deployments' helpers reach S3 and clusters only through the
core, never with their own boto3, obstore or kubernetes calls; the launch seam (the Backend
protocol) imports no backend and not the registry above them, so the backends and the seam never
import each other in a circle; the request and the modules it is made of import nothing above them.
A second test builds a small tree that breaks each rule, so a contract that stopped catching
anything would fail too. A third builds the core's import graph (function-level imports included)
and finds no circle but the one allowed below.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import grimp
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
    assert "8 kept, 0 broken" in report


def test_each_contract_catches_its_violation(tmp_path: Path) -> None:
    sources = {
        "tao_data_io/__init__.py": "",
        "tao_data_io/orchestrate.py": "import prefect\n",
        "tao_data_io/leak.py": "from kubernetes import client\n",
        "tao_data_io/backends/kubernetes/__init__.py": "import kubernetes\n",  # the one place allowed to
        "tao_data_io/backends/kubernetes/jobs.py": "from kubernetes import client\n",
        "tao_data_io/backends/local/__init__.py": "",
        # One backend imports another:
        "tao_data_io/backends/local/frame.py": "from tao_data_io.backends.kubernetes import jobs\n",
        "tao_data_io/backends/__init__.py": "",
        "tao_data_io/launch/__init__.py": "",
        "tao_data_io/launch/seam.py": ("from tao_data_io.backends.local import frame\n"
                                       "from tao_data_io import backends\n"),
        "tasks/__init__.py": "import boto3\n",
        "flows/__init__.py": "",
        "flows/stage.py": "import obstore\nimport botocore.session\n",
        "flows/submit.py": "from tao_data_io.verbs import submit\nfrom tao_data_io.steps import open_record\n",
        "tao_data_io/verbs.py": "", "tao_data_io/steps.py": "from tao_data_io.backends.local import frame\n",
        "blocks/__init__.py": "",
        "blocks/cluster.py": "from kubernetes import config\n",
        "deployments/__init__.py": "",
        "deployments/stack.py": "import botocore\n",
        "tao_data_io/request.py": "from tao_data_io.staging import layout\n",
        "tao_data_io/staging/__init__.py": "", "tao_data_io/staging/layout.py": "",
    }
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    for contract in settings["contracts"]:  # every module a contract names exists (empty unless given above)
        for module in contract.get("source_modules", []) + contract.get("forbidden_modules", []):
            relative = module.replace(".", "/")
            if module.startswith("tao_data_io.") and "*" not in module and f"{relative}/__init__.py" not in sources:
                sources.setdefault(f"{relative}.py", "")
    for relative, text in sources.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text)
    (tmp_path / "pyproject.toml").write_text(tomli_w.dumps({"tool": {"importlinter": settings}}))

    code, report = lint(tmp_path)

    assert code == 1, report
    assert "0 kept, 8 broken" in report
    for line in ("tao_data_io.orchestrate -> prefect", "tao_data_io.leak -> kubernetes", "tasks -> boto3",
                 "flows.stage -> obstore", "flows.stage -> botocore", "blocks.cluster -> kubernetes",
                 "flows.submit -> tao_data_io.steps", "deployments.stack -> botocore",
                 "tao_data_io.request -> tao_data_io.staging.layout",
                 "tao_data_io.launch.seam -> tao_data_io.backends.local.frame",
                 "tao_data_io.launch.seam -> tao_data_io.backends",
                 "tao_data_io.backends.local.frame -> tao_data_io.backends.kubernetes.jobs",
                 "tao_data_io.steps -> tao_data_io.backends.local.frame"):
        assert line in report
    assert "tao_data_io.backends.kubernetes.jobs -> kubernetes" not in report  # a backend's own client
    assert "flows.submit -> tao_data_io.verbs" not in report  # a verb is what a flow calls


#: The import circles the core keeps, each with its reason. The local frame's supervisor is started
#: as ``python -m tao_data_io.backends.local.supervisor`` and must detach before anything heavy is imported,
#: so it imports the runner only then, inside ``main``; the runner reads the run directory, which
#: names the supervisor's own record. Every other module is reached one way only.
ALLOWED_CIRCLES = [{"tao_data_io.backends.local.rundir", "tao_data_io.backends.local.runner",
                    "tao_data_io.backends.local.supervisor"}]


def test_the_core_has_no_import_circle_but_the_frame_supervisors() -> None:
    graph = grimp.build_graph("tao_data_io", include_external_packages=False, cache_dir=None)
    assert graph.find_modules_directly_imported_by("tao_data_io.request")  # the graph is of this checkout's code
    assert circles({module: graph.find_modules_directly_imported_by(module) for module in graph.modules}) == \
        ALLOWED_CIRCLES


def circles(imports: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (or a module importing itself),
    by Tarjan's algorithm, iteratively (the graph is deep)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for root in sorted(imports):
        if root in index:
            continue
        work = [(root, iter(sorted(imports[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, pending = work[-1]
            step = next(pending, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(imports.get(step, ())))))
                elif step in on_stack:
                    low[module] = min(low[module], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[module])
            if low[module] == index[module]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == module:
                        break
                if len(component) > 1 or module in imports.get(module, ()):
                    found.append(component)
    return found


def test_circles_finds_each_circle_and_only_circles() -> None:
    imports = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}, "f": {"d"}}
    assert sorted(map(sorted, circles(imports))) == [["a", "b", "c"], ["e"]]


def test_no_backend_is_told_apart_by_its_name_outside_its_package_and_the_registry() -> None:
    """A third backend must get the behaviour its abilities call for, never the local frame's by
    falling through ``if backend.name == "kubernetes"``: no comparison with a backend's name, and no
    ``Literal`` of them, anywhere but in that backend's own package and the registry."""
    import ast

    from tao_data_io.backends import BUILTIN, declarations

    names = set(declarations())
    own = {Path(*module.split(".")) for module in BUILTIN} | {Path("tao_data_io/backends/__init__.py")}
    offenders = []
    for root in ("tao_data_io", "blocks", "flows", "tasks", "deployments"):
        for path in sorted((ROOT / root).rglob("*.py")):
            relative = path.relative_to(ROOT)
            if any(relative == mine or mine in relative.parents for mine in own):
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Compare):
                    operands = [node.left, *node.comparators]
                elif (isinstance(node, ast.Subscript)
                      and getattr(node.value, "id", getattr(node.value, "attr", "")) == "Literal"):
                    operands = [node.slice]
                else:
                    continue
                said = {leaf.value for operand in operands for leaf in ast.walk(operand)
                        if isinstance(leaf, ast.Constant) and leaf.value in names}
                if said:
                    offenders.append(f"{relative}:{node.lineno}: {sorted(said)}")
    assert offenders == []


def test_no_test_module_imports_another() -> None:
    """Tests share fixtures through conftest.py and helpers through modules that hold no tests
    (docs/development.md): a test module imported by another runs its collection twice and ties
    the two files' tests together."""
    import ast

    found = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                named = [node.module or ""] if node.module else [alias.name for alias in node.names]
                found += [f"{path.relative_to(ROOT)}: {name}" for name in named
                          if name.rpartition(".")[2].startswith("test_")]
            elif isinstance(node, ast.Import):
                found += [f"{path.relative_to(ROOT)}: {alias.name}" for alias in node.names
                          if alias.name.rpartition(".")[2].startswith("test_")]
    assert found == []


def test_no_benchmark_imports_the_tests() -> None:
    """A benchmark measures the product (bench/README.md): what it runs is the product's own — the
    local frame, the demo's request (deployments/demo.py) — never a test's stand-in, which a test
    may change for its own needs."""
    import ast

    found = []
    for path in sorted((ROOT / "bench").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            named = ([node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0
                     else [alias.name for alias in node.names] if isinstance(node, ast.Import) else [])
            found += [f"{path.relative_to(ROOT)}:{node.lineno}: {name}" for name in named
                      if name == "tests" or name.startswith("tests.")]
    assert found == []
