"""The launch plan (pure): the command's argv, the mounts of every staged source, what is refused,
and the probe's checklist the plan makes."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from tao_data_io.errors import UsageError
from tao_data_io.launch.plan import build_plan, command_argv
from tao_data_io.launch.probe import checklist
from tao_data_io.records import JobRecord, OutputRoute
from tao_data_io.request import JobRequest
from tao_data_io.staging.stage_map import StagedSource, StagingMap
from tao_data_io.tier import TierDecision

from .helpers import req


def config_req(command: str | list[str] = "dino train -e {config_path}", **fields: Any) -> JobRequest:
    return req(mode="config", command=command, config_format="yaml", spec={"train": {"epochs": 1}}, **fields)


CONFIG = "/tao-action-config/spec-abc.yaml"


@pytest.mark.parametrize(("request_", "argv", "shell"), [
    (config_req(), ["dino", "train", "-e", CONFIG], False),
    (config_req(["dino", "train", "-e", "{config_path}"]), ["dino", "train", "-e", CONFIG], False),
    (config_req("dino train -e {config_path} && echo done"), ["/bin/sh", "-c", f"dino train -e {CONFIG} && echo done"],
     True),
    (req(mode="args", command="python train.py", args=["--lr", "1e-3", "$(rm -rf /)", "a;b|c"]),
     ["python", "train.py", "--lr", "1e-3", "$(rm -rf /)", "a;b|c"], False),
    (req(mode="args", command=["sh", "-c"], args=["echo hi"]), ["sh", "-c", "echo hi"], False),
], ids=["split", "list", "shell-syntax", "args-stay-argv", "producer-declared-shell"])
def test_command_argv(request_: JobRequest, argv: list[str], shell: bool) -> None:
    assert command_argv(request_, CONFIG) == (argv, shell)


def test_a_shell_looking_spec_value_lands_in_the_config_never_in_argv() -> None:
    request = req(mode="config", command="train -e {config_path}", config_format="yaml",
                  spec={"note": "$(rm -rf /)"})
    argv, shell = command_argv(request, CONFIG)
    assert argv == ["train", "-e", CONFIG] and not shell


def _map(tmp_path: Path, *sources: StagedSource) -> StagingMap:
    return StagingMap(job_id="job-1", staging_dir=str(tmp_path), inputs_root="/tao-inputs", sources=list(sources))


def _record() -> JobRecord:
    now = datetime.now(timezone.utc)
    return JobRecord(job_id="job-1", backend="local", image="img", network_arch="dino", action="train",
                     storage_tier="B", results_dir="/results", state="PENDING", created_at=now, updated_at=now)


ROUTE = OutputRoute(route="s3", destination="s3://bkt-1/results/job-1/", reason="S3_BUCKET_NAME is set")
FOLDER = StagedSource(source="s3://bkt-1/coco/", kind="folder", sub_path="s3/bkt-1/coco",
                      container_path="/tao-inputs/s3/bkt-1/coco", local_path="/w/s3/bkt-1/coco", files=3, bytes=10)
COCO = {"source": "s3://bkt-1/coco/", "kind": "folder"}
CONFIG_SOURCE = StagedSource(source="config:sha256:abc", kind="config", sub_path="config/tao-action-config-abc.yaml",
                             container_path=CONFIG, local_path="/w/config/x.yaml", files=1, bytes=10)


def test_build_plan_mounts_every_source_and_holds_no_secret_value(tmp_path: Path) -> None:
    request = config_req(environment={"EPOCHS": "3"}, forward_env=["AWS_SECRET_ACCESS_KEY"], inputs=[COCO],
                         mounts=[{"source": "/lustre/pretrained", "target": "/pretrained"}])
    env = {"AWS_SECRET_ACCESS_KEY": "very-secret-value-123"}
    plan = build_plan(request, _map(tmp_path, FOLDER, CONFIG_SOURCE), TierDecision(tier="B", reason="r"), _record(),
                      ROUTE, environ=env)
    assert plan.argv == ["dino", "train", "-e", CONFIG] and plan.config_path == CONFIG
    assert [(m.origin, m.source, m.target, m.expect) for m in plan.mounts] == [
        ("staged", "s3/bkt-1/coco", "/tao-inputs/s3/bkt-1/coco", "dir"),
        ("config", "config/tao-action-config-abc.yaml", CONFIG, "file"),
        ("pre-positioned", "/lustre/pretrained", "/pretrained", "any")]
    assert plan.env == {"EPOCHS": "3", "TAO_JOB_ID": "job-1", "TAO_RESULTS_DIR": "/results"}
    assert plan.forward_env == ["AWS_SECRET_ACCESS_KEY"]
    assert "very-secret-value-123" not in plan.model_dump_json()


def test_a_staging_map_entry_the_request_does_not_declare_never_becomes_a_mount(tmp_path: Path) -> None:
    """The renderer contract's "no undeclared sources": the staging map is a file between steps and
    machines, and a source added to it by hand would be mounted into the job."""
    smuggled = FOLDER.model_copy(update={"source": "s3://bkt-1/someone-elses/", "container_path": "/etc-data"})
    with pytest.raises(UsageError,
                       match=r"sources\[1\] \('s3://bkt-1/someone-elses/' at '/etc-data'\) is not an input"):
        build_plan(config_req(inputs=[COCO]), _map(tmp_path, FOLDER, smuggled, CONFIG_SOURCE),
                   TierDecision(tier="B", reason="r"), _record(), ROUTE)
    declared = config_req(inputs=[{"source": "s3://bkt-1/coco"}])  # the prefix without its slash: the same source
    assert build_plan(declared, _map(tmp_path, FOLDER, CONFIG_SOURCE), TierDecision(tier="B", reason="r"), _record(),
                      ROUTE).mounts[0].source == "s3/bkt-1/coco"


def test_a_secret_smuggled_into_environment_under_an_innocent_name_is_refused(tmp_path: Path) -> None:
    request = config_req(environment={"LEARNING_RATE": "very-secret-value-123"})
    with pytest.raises(UsageError, match="environment 'LEARNING_RATE'") as info:
        build_plan(request, _map(tmp_path, CONFIG_SOURCE), TierDecision(tier="B", reason="r"), _record(), ROUTE,
                   environ={"AWS_SECRET_ACCESS_KEY": "very-secret-value-123"})
    assert "very-secret-value-123" not in str(info.value)


def test_results_inside_a_read_only_input_is_refused(tmp_path: Path) -> None:
    request = config_req(outputs={"results_dir": "/tao-inputs/s3/bkt-1/coco/out"}, inputs=[COCO])
    with pytest.raises(UsageError, match="read-only input"):
        build_plan(request, _map(tmp_path, FOLDER, CONFIG_SOURCE), TierDecision(tier="B", reason="r"), _record(),
                   ROUTE)


def test_checklist_dedupes_aliased_targets_and_ends_with_results(tmp_path: Path) -> None:
    plan = build_plan(config_req(inputs=[COCO]), _map(tmp_path, FOLDER, CONFIG_SOURCE),
                      TierDecision(tier="B", reason="r"), _record(), ROUTE)
    checks, token = checklist(plan)
    assert [c.kind for c in checks] == ["dir-nonempty", "file", "results-writable"]
    assert checks[-1].argument == token and len(token) == 32
