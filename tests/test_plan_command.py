"""``plan`` says what submitting would decide, offline: the same refusals as a submit for what the
backend cannot honour, and facts of the cluster at hand that may say less than the backend's
declaration, never more (a facts file cannot make the local frame run two nodes)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

from tao_data_io.commands.examples import catalogue

from .helpers import run_cli

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def test_plan_refuses_what_the_backend_cannot_honour_as_submit_would(tmp_path: Path) -> None:
    request = yaml.safe_load((EXAMPLES / "args-mode.yaml").read_text())
    request["compute_shape"] = {**request.get("compute_shape", {}), "disruption_retries": 2}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(request))
    shown = run_cli("plan", "--request", str(tmp_path / "job.yaml"), env={})
    assert shown.returncode == 2, shown.stdout
    assert "compute_shape.disruption_retries 2 asks for a lost pod to be replaced, which the local backend never " \
           "does" in shown.stderr
    assert run_cli("plan", "--backend", "kubernetes", "--request", str(tmp_path / "job.yaml"), env={}).returncode == 0


def test_facts_may_say_less_than_the_backend_can_do_never_more(tmp_path: Path) -> None:
    facts = tmp_path / "facts.json"
    facts.write_text(json.dumps({"capabilities": {"fetches_in_frame": True}}))
    raised = run_cli("plan", "--request", str(EXAMPLES / "tier-c.yaml"), "--facts", str(facts), env={})
    assert raised.returncode == 2
    assert "capabilities.fetches_in_frame is true in facts, and the local backend does not declare it" \
           in raised.stderr, raised.stderr
    facts.write_text(json.dumps({"capabilities": {"fetches_in_frame": False}}))
    lowered = run_cli("plan", "--backend", "kubernetes", "--request", str(EXAMPLES / "tier-c.yaml"), "--facts",
                      str(facts), env={})
    assert lowered.returncode == 2 and "storage.tier 'C' is impossible on kubernetes" in lowered.stderr
    facts.write_text(json.dumps({"backend": "kubernetes"}))
    other = run_cli("plan", "--request", str(EXAMPLES / "args-mode.yaml"), "--facts", str(facts), env={})
    assert other.returncode == 2 and "are those of the kubernetes backend, and --backend is 'local'" in other.stderr


def test_a_facts_file_of_before_capabilities_is_told_the_new_field(tmp_path: Path) -> None:
    facts = tmp_path / "facts.json"
    facts.write_text(json.dumps({"supports_in_frame_fetch": False}))
    old = run_cli("plan", "--backend", "kubernetes", "--request", str(EXAMPLES / "tier-c.yaml"), "--facts",
                  str(facts), env={})
    assert old.returncode == 2
    assert "supports_in_frame_fetch is now capabilities.fetches_in_frame" in old.stderr, old.stderr


@pytest.mark.parametrize("number", range(len(catalogue()["plan"])))
def test_every_plan_example_runs_as_its_help_shows_it(tmp_path: Path, number: int) -> None:
    what, command = catalogue()["plan"][number]
    (tmp_path / "examples").symlink_to(EXAMPLES)
    if "facts.json holds " in what:
        (tmp_path / "facts.json").write_text(what.split("facts.json holds ", 1)[1].rstrip(")"))
    argv = shlex.split(command)
    assert argv[0] == "tao-data-io"
    ran = run_cli(*argv[1:], env={}, cwd=tmp_path)
    assert ran.returncode == 0, (command, ran.stderr)
