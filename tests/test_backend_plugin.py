"""A backend from another distribution plugs in with its entry point alone: the CLI's ``--backend``
and flags, a target block, a flow's target parameter and the job record all find it, with no file
of this project changed — and a name no backend has is refused, naming those there are.

The toy distribution is written to a temporary directory (a package and its ``.dist-info`` with
an ``entry_points.txt``, as pip would install it) and put on the path of child processes only, so
this session's registry never sees it: each child is a fresh interpreter that finds it as a user's
would. Its backend keeps each job on disk, so every verb of a job can run in its own process, and
its ref (``toy:<job id>``) is no Kubernetes name: the record keeps a backend's own text.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from .helpers import args_request

ROOT = Path(__file__).resolve().parents[1]

TOY = '''
"""A toy backend: each job ends at once, COMPLETE, with one results file."""
import json
from pathlib import Path
from typing import ClassVar

from pydantic import Field

from tao_data_io.launch.backend import BackendSettings, JobStatus, LogChunk, Submission, Waits
from tao_data_io.launch.declaration import Declaration
from tao_data_io.launch.probe import CheckResult, Verdict, checklist
from tao_data_io.tier import Capabilities, ClusterFacts


class ToySettings(BackendSettings):
    name: ClassVar[str] = "toy"
    state_root: str = Field(title="State root", description="Where the toy keeps its jobs.")
    greeting: str = Field("hello", title="Greeting", description="What each job prints.")


class ToyBackend:
    name = "toy"

    def __init__(self, settings):
        self.capabilities = DECLARATION.capabilities
        self.settings = settings
        self.root = Path(settings.state_root)

    def config(self):
        return self.settings.model_dump(mode="json")

    def facts(self):
        return ClusterFacts(backend=self.name, capabilities=DECLARATION.capabilities)

    def preflight(self, plan, *, documents=None):
        return None

    def waits(self, plan):
        return Waits(submit=0.0, verify=0.0)

    def submit(self, plan, *, environ=None, documents=None):
        job = self.root / plan.job_id
        started = not job.exists()
        if started:
            (job / "results").mkdir(parents=True)
            (job / "results" / "model.pth").write_bytes(b"weights")
            (job / "end.json").write_text(json.dumps({"state": "COMPLETE", "exit_code": 0}))
        return Submission(backend_ref=f"toy:{plan.job_id}", started=started)

    def verify(self, ref, plan, *, timeout=600.0):
        checks, _ = checklist(plan)
        return Verdict(ok=True, checks=[CheckResult(kind=c.kind, path=c.path, ok=True, detail="toy: present",
                                                    subject=c.subject) for c in checks])

    def _job(self, ref):
        kind, _, job_id = ref.partition(":")
        assert kind == "toy", ref
        return self.root / job_id

    def status(self, ref):
        end = self._job(ref) / "end.json"
        if not end.exists():
            return JobStatus(state="UNKNOWN", message=f"{ref} is not known to the toy")
        return JobStatus(**json.loads(end.read_text()))

    def logs(self, ref, tail=None):
        return self.settings.greeting + "\\n"

    def cancel(self, ref):
        return False

    def failure_analysis(self, ref):
        return None

    def results_path(self, ref):
        return str(self._job(ref) / "results")

    def follow_logs(self, ref, cursor):
        return LogChunk(text="" if cursor else self.settings.greeting + "\\n", cursor="1")

    def training_status(self, ref):
        return None


DECLARATION = Declaration(settings=ToySettings, implementation="toy_backend:ToyBackend", title="Toy",
                    summary="A toy backend from another distribution.", settings_summary="Where the toy keeps jobs.",
                    capabilities=Capabilities(stages_on_host=True))
'''

#: Run in a child with the toy installed: save its target block and run the run-tao-job flow on it.
FLOW = '''
import json, sys
from blocks import TARGETS, JobRecords
from flows.run import run_tao_job

work, request = sys.argv[1], json.loads(sys.argv[2])
block = TARGETS["toy"](settings={"state_root": f"{work}/toy-flow", "greeting": "from the block"},
                       staging_root=f"{work}/staging-flow")
block.save("toy-plugin", overwrite=True)
JobRecords(location=f"{work}/jobs").save("toy-plugin", overwrite=True)
print(type(block).__name__, type(block).get_block_type_slug())
result = run_tao_job(request=request, target="tao-toy-target/toy-plugin", records="tao-job-records/toy-plugin")
print(json.dumps(result))
'''


@pytest.fixture
def toy(tmp_path: Path) -> dict[str, str]:
    """A child's environment with the toy distribution installed beside this project."""
    return _install(tmp_path, TOY)


def _install(tmp_path: Path, source: str) -> dict[str, str]:
    """A child's environment with a distribution whose ``toy_backend`` module is ``source``."""
    site = tmp_path / "site"
    (site / "toy_backend").mkdir(parents=True)
    (site / "toy_backend" / "__init__.py").write_text(source)
    info = site / "toy_backend-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-backend\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[tao_data_io.backends]\ntoy = toy_backend:DECLARATION\n")
    return {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PYTHONPATH": f"{site}{os.pathsep}{ROOT}",
            "TAO_DATA_IO_RECORDS": str(tmp_path / "jobs"), "TAO_DATA_IO_WORKDIR": str(tmp_path / "work")}


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tao_data_io.cli", *args], env=env, capture_output=True, text=True,
                          timeout=300, cwd=ROOT)


def _request(tmp_path: Path, job_id: str) -> dict[str, object]:
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    (data / "a.txt").write_text("a")
    return args_request(job_id=job_id, inputs=[{"source": str(data), "target": "/data"}])


def test_a_backend_from_another_distribution_runs_through_the_cli_and_the_record(toy: dict[str, str],
                                                                                 tmp_path: Path) -> None:
    request = tmp_path / "job.yaml"
    request.write_text(yaml.safe_dump(_request(tmp_path, "toy-cli")))
    help_text = _cli(toy, "submit", "--help").stdout
    assert "--backend {local,kubernetes,docker,slurm,toy}" in help_text and "--state-root STATE_ROOT" in help_text
    submitted = _cli(toy, "submit", "--backend", "toy", "--request", str(request), "--state-root",
                     str(tmp_path / "toy-cli"), "--greeting", "from the flags")
    assert submitted.returncode == 0, submitted.stderr
    record = json.loads(_cli(toy, "record", "show", "toy-cli", "--json").stdout)
    assert (record["backend"], record["backend_ref"], record["state"]) == ("toy", "toy:toy-cli", "RUNNING")
    assert record["backend_config"] == {"state_root": str(tmp_path / "toy-cli"), "greeting": "from the flags"}
    assert _cli(toy, "logs", "--job-id", "toy-cli").stdout == "from the flags\n"  # rebuilt from the record
    collected = _cli(toy, "collect", "--job-id", "toy-cli", "--json")
    assert json.loads(collected.stdout)["state"] == "COMPLETE", collected.stderr
    assert json.loads(_cli(toy, "record", "show", "toy-cli", "--json").stdout)["state"] == "COMPLETE"

    wrong = _cli(toy, "submit", "--backend", "toy", "--request", str(request), "--namespace", "tao")
    assert wrong.returncode == 2 and "--namespace is not a setting of the toy backend: its settings are " \
                                     "--state-root, --greeting" in wrong.stderr


def test_a_backend_from_another_distribution_has_its_target_block_and_runs_in_a_flow(
        toy: dict[str, str], tmp_path: Path, prefect_harness: None) -> None:
    from prefect.settings import PREFECT_API_URL

    env = {**toy, "PREFECT_API_URL": str(PREFECT_API_URL.value()), "PREFECT_HOME": str(tmp_path / "prefect")}
    ran = subprocess.run([sys.executable, "-c", textwrap.dedent(FLOW), str(tmp_path),
                          json.dumps(_request(tmp_path, "toy-flow"))],
                         env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert ran.returncode == 0, ran.stderr[-3000:]
    made, result = ran.stdout.strip().splitlines()[0], json.loads(ran.stdout.strip().splitlines()[-1])
    assert made == "ToyTarget tao-toy-target"
    assert result["submitted"]["backend_ref"] == "toy:toy-flow" and result["collected"]["state"] == "COMPLETE", result
    record = json.loads((tmp_path / "jobs" / "toy-flow.json").read_text())
    assert (record["backend"], record["backend_ref"]) == ("toy", "toy:toy-flow")
    assert record["backend_config"]["greeting"] == "from the block"


def test_a_name_no_backend_has_is_refused_naming_those_there_are(toy: dict[str, str], tmp_path: Path) -> None:
    request = tmp_path / "job.yaml"
    request.write_text(yaml.safe_dump(_request(tmp_path, "no-such")))
    unknown = _cli(toy, "submit", "--backend", "lsf", "--request", str(request))
    assert unknown.returncode == 2 and ("invalid choice: 'lsf' (choose from 'local', 'kubernetes', 'docker', 'slurm', "
                                        "'toy')") in unknown.stderr
    plain = {key: value for key, value in toy.items() if key != "PYTHONPATH"} | {"PYTHONPATH": str(ROOT)}
    _cli(toy, "submit", "--backend", "toy", "--request", str(request), "--state-root", str(tmp_path / "toy"))
    without = _cli(plain, "status", "--job-id", "no-such")  # the toy uninstalled: its record names an unknown one
    assert without.returncode == 2
    assert "backend 'toy' is not known here: use 'local', 'kubernetes', 'docker' or 'slurm'" in without.stderr


def _toy_with(*changes: tuple[str, str]) -> str:
    """The toy's source with each (old, new) text replaced: a plugin its author got wrong."""
    source = TOY
    for old, new in changes:
        assert old in source, old
        source = source.replace(old, new)
    return source


def test_a_setting_named_as_a_verbs_own_option_keeps_every_verb_working(tmp_path: Path) -> None:
    """A plugin whose settings are called ``workdir``, ``json`` and ``run`` (the verbs' own options
    and dispatch name) broke every verb's parser; the first two now come from ``--target`` only,
    ``--run`` is the setting's, and the verb's own ``--workdir``, ``--json`` and dispatch keep
    their meaning."""
    env = _install(tmp_path, _toy_with(('    greeting: str = Field("hello"', '    workdir: str = Field("w", '
                                        'description="Where the toy works.")\n    json: bool = Field(False, '
                                        'description="Whether it speaks JSON.")\n    run: str = Field("r", '
                                        'description="What it runs.")\n    greeting: str = Field("hello"')))
    for verb in ("submit", "collect", "status", "plan", "render-job"):
        shown = _cli(env, verb, "--help")
        assert shown.returncode == 0, (verb, shown.stderr[-2000:])
    help_text = _cli(env, "submit", "--help").stdout
    assert "workdir and json: in --target only" in " ".join(help_text.split()) and "--run RUN" in help_text
    request = tmp_path / "job.yaml"
    request.write_text(yaml.safe_dump(_request(tmp_path, "toy-named")))
    target = tmp_path / "toy.yaml"
    target.write_text(yaml.safe_dump({"state_root": str(tmp_path / "toy"), "workdir": "from-the-file", "run": "x"}))
    submitted = _cli(env, "submit", "--backend", "toy", "--request", str(request), "--target", str(target),
                     "--workdir", str(tmp_path / "work"), "--json")
    assert submitted.returncode == 0, submitted.stderr[-2000:]
    assert json.loads(submitted.stdout)["backend_ref"] == "toy:toy-named"
    record = json.loads(_cli(env, "record", "show", "toy-named", "--json").stdout)
    assert (record["backend_config"]["workdir"], record["backend_config"]["run"]) == ("from-the-file", "x")


@pytest.mark.parametrize(("change", "why"), [
    (('    name: ClassVar[str] = "toy"\n', ""), "declare no backend name"),
    (('ClassVar[str] = "toy"', 'ClassVar[str] = "a/b"'), "'a/b' is not a backend name"),
    (('ClassVar[str] = "toy"', 'ClassVar[str] = "local"'), "'local', which is already a backend"),
    (('title="Toy"', 'title="Lo-cal"'), "title 'Lo-cal' is not"),
    (('title="Toy"', 'title="Local"'), "the title of 'local'"),
    (("DECLARATION = Declaration(settings=ToySettings", "DECLARATION = Declaration(settings=dict"),
     "not a BackendSettings model"),
], ids=["no-name", "slash", "taken-name", "title-chars", "taken-title", "settings-not-a-model"])
def test_a_wrong_declaration_is_left_out_naming_why_and_every_other_backend_works(
        tmp_path: Path, change: tuple[str, str], why: str) -> None:
    env = _install(tmp_path, _toy_with(change))
    shown = _cli(env, "submit", "--help")
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert "--backend {local,kubernetes,docker,slurm}" in shown.stdout
    assert why in " ".join(shown.stderr.split()), shown.stderr
    blocks = subprocess.run([sys.executable, "-c", "import blocks; print(blocks.LocalTarget.get_block_type_slug(), "
                             "sorted(blocks.TARGETS))"], env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert blocks.returncode == 0, blocks.stderr[-2000:]
    assert blocks.stdout.split() == ["tao-local-target", "['docker',", "'kubernetes',", "'local',", "'slurm']"]


def test_a_title_that_names_a_block_class_of_this_project_cannot_shadow_it(tmp_path: Path) -> None:
    env = _install(tmp_path, _toy_with(('title="Toy"', 'title="Compute"')))
    ran = subprocess.run([sys.executable, "-c", "import blocks, blocks.targets as t; toy = blocks.TARGETS['toy']; "
                          "print(blocks.ComputeTarget is toy, t.ComputeTarget is toy, toy.get_block_type_slug())"],
                         env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert ran.stdout.split() == ["False", "False", "tao-toy-target"]


@pytest.mark.parametrize(("change", "why"), [
    (("    def waits(self, plan):", "    def _waits(self, plan):"), "lacks waits"),
    (('implementation="toy_backend:ToyBackend"', 'implementation="toy_backend:NoSuchBackend"'),
     "toy_backend:NoSuchBackend, which cannot be loaded"),
    (('implementation="toy_backend:ToyBackend"', 'implementation="no_such_module:ToyBackend"'),
     "no_such_module:ToyBackend, which cannot be loaded"),
], ids=["lacks-a-method", "no-such-class", "no-such-module"])
def test_a_backend_that_does_not_keep_the_protocol_is_refused_naming_what_it_lacks(
        tmp_path: Path, change: tuple[str, str], why: str) -> None:
    env = _install(tmp_path, _toy_with(change))
    request = tmp_path / "job.yaml"
    request.write_text(yaml.safe_dump(_request(tmp_path, "toy-broken")))
    submitted = _cli(env, "submit", "--backend", "toy", "--request", str(request), "--state-root", str(tmp_path / "t"))
    assert submitted.returncode == 2, submitted.stderr[-2000:]
    assert why in submitted.stderr and "Traceback" not in submitted.stderr, submitted.stderr[-2000:]
