"""The job request model, spec rewriting and config materialization (no network)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
import yaml

from tao_data_io.errors import UsageError
from tao_data_io.request import JobRequest, load_request, parse_request
from tao_data_io.staging.config import materialize_config
from tao_data_io.staging.layout import placements
from tao_data_io.spec import remote_uris, rewrite

from .helpers import args_request, run_cli

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
#: A credential value as a careless user might paste it into a request.
SECRET = "AttackSecretValue-7f3c9a1b2d"


def request(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "schema_version": "1", "image": "nvcr.io/nvidia/tao/tao-toolkit:6.0.0-pyt", "mode": "config",
        "command": "dino train -e {config_path}", "config_format": "yaml",
        "spec": {"dataset": {"train": "s3://data-bucket/coco/train/"}, "train": {"epochs": 3}},
    }
    base.update(overrides)
    return base


def write(tmp_path: Path, data: dict[str, Any], name: str = "req.yaml") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data) if name.endswith(".json") else yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("example", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_examples_load(example: Path) -> None:
    assert load_request(example).schema_version == "1"


@pytest.mark.parametrize(
    ("overrides", "field", "needle"),
    [
        ({"spec": {"train.lr": 1, "train": {}}}, "spec", "must be nested"),
        ({"command": "dino train"}, "request", "{config_path}"),
        ({"mode": "args"}, "request", "needs 'args'"),
        ({"schema_version": "2"}, "schema_version", "'1'"),
        ({"job_id": "Bad_ID"}, "job_id", "not a valid job id"),
        ({"environment": {"AWS_SECRET_ACCESS_KEY": "x"}}, "environment", "forward_env"),
        ({"forward_env": ["1BAD"]}, "forward_env", "not a valid variable name"),
        ({"outputs": {"results_dir": "results"}}, "outputs.results_dir", "not absolute"),
        ({"outputs": {"results_dir": "/a/../b"}}, "outputs.results_dir", "not normalised"),
        ({"inputs": [{"source": "relative/path"}]}, "inputs[0].source", "absolute local path"),
        ({"inputs": [{"source": "s3://b-b/x/", "kind": "selective"}]}, "inputs[0]", "annotation"),
        ({"compute_shape": {"gpus": -1}}, "compute_shape.gpus", "greater than or equal to 0"),
        ({"surprise": 1}, "request", "unknown field 'surprise'"),
    ],
)
def test_invalid_requests_name_the_field_and_the_fix(tmp_path: Path, overrides: dict[str, Any], field: str,
                                                     needle: str) -> None:
    path = write(tmp_path, request(**overrides))
    with pytest.raises(UsageError) as info:
        load_request(path)
    message = str(info.value)
    assert f"{field}:" in message and needle in message, message


def test_spec_walk_finds_uris_at_any_depth_once() -> None:
    spec = {"a": {"b": [["s3://bkt-1/x/y.json", "hf://org/repo"], {"c": "s3://bkt-1/x/y.json"}]},
            "d": "ngc://nvidia/tao/resnet:18", "e": "/local/path", "f": 3, "g": None}
    assert remote_uris(spec) == [("spec.a.b[0][0]", "s3://bkt-1/x/y.json"), ("spec.a.b[0][1]", "hf://org/repo"),
                                 ("spec.d", "ngc://nvidia/tao/resnet:18")]
    mapping = {"s3://bkt-1/x/y.json": "/in/y.json"}
    assert rewrite(spec, mapping)["a"]["b"][1]["c"] == "/in/y.json"
    assert rewrite(spec, mapping)["e"] == "/local/path"


def test_placements_are_deterministic_and_targets_override() -> None:
    req = JobRequest.model_validate(request(
        spec={"x": "s3://data-bucket/coco/train/", "m": "hf://nvidia/dino@v1/weights/model.pth",
              "n": "ngc://nvidia/tao/resnet:18"},
        inputs=[{"source": "s3://data-bucket/coco/train/", "target": "/data/train"}]))
    got = {source: (p.sub_path, p.container_path) for source, p in placements(req).items()}
    assert got == {
        "s3://data-bucket/coco/train/": ("s3/data-bucket/coco/train", "/data/train"),
        "hf://nvidia/dino@v1/weights/model.pth": ("hf/nvidia/dino/v1/weights/model.pth",
                                                  "/tao-inputs/hf/nvidia/dino/v1/weights/model.pth"),
        "ngc://nvidia/tao/resnet:18": ("ngc/nvidia/tao/resnet/18", "/tao-inputs/ngc/nvidia/tao/resnet/18"),
    }


def test_uri_that_would_escape_the_staging_root_is_refused_at_load_time(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"spec\.x: .*'\.\.'"):
        load_request(write(tmp_path, request(spec={"x": "s3://data-bucket/a/../../etc"})))


@pytest.mark.parametrize("fmt", ["json", "yaml", "toml"])
def test_materialize_is_content_addressed_atomic_and_private(tmp_path: Path, fmt: str) -> None:
    req = JobRequest.model_validate(request(config_format=fmt))
    first = materialize_config(req, tmp_path / "out")
    assert first.created and first.path.name == f"tao-action-config-{first.sha256}.{fmt}"
    assert stat.S_IMODE(first.path.stat().st_mode) == 0o600
    assert "/tao-inputs/s3/data-bucket/coco/train" in first.path.read_text()
    assert "s3://" not in first.path.read_text()
    again = materialize_config(req, tmp_path / "out")
    assert (again.path, again.created) == (first.path, False)
    assert [p.name for p in (tmp_path / "out").iterdir()] == [first.path.name]  # no temp leftovers


def test_materialize_is_deterministic_whatever_the_key_order(tmp_path: Path) -> None:
    a = JobRequest.model_validate(request(spec={"b": 1, "a": {"y": 2, "x": 1}}))
    b = JobRequest.model_validate(request(spec={"a": {"x": 1, "y": 2}, "b": 1}))
    assert materialize_config(a, tmp_path / "a").sha256 == materialize_config(b, tmp_path / "b").sha256


def test_existing_config_with_other_content_is_an_error(tmp_path: Path) -> None:
    req = JobRequest.model_validate(request())
    made = materialize_config(req, tmp_path)
    os.chmod(made.path, 0o600)
    made.path.write_text("tampered: true\n")
    with pytest.raises(UsageError, match="different content"):
        materialize_config(req, tmp_path)


def test_toml_cannot_hold_null_and_says_so(tmp_path: Path) -> None:
    req = JobRequest.model_validate(request(config_format="toml", spec={"train": {"resume": None}}))
    with pytest.raises(UsageError, match=r"spec\.train\.resume is null"):
        materialize_config(req, tmp_path)


def test_materialize_config_cli(tmp_path: Path) -> None:
    path = write(tmp_path, request(), "req.json")
    result = run_cli("materialize-config", "--request", str(path), "--output-dir", str(tmp_path / "cfg"), env={})
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()).parent == tmp_path / "cfg"
    bad = write(tmp_path, request(spec={"train.lr": 0.1}), "bad.json")
    result = run_cli("materialize-config", "--request", str(bad), "--output-dir", str(tmp_path / "cfg"), env={})
    assert result.returncode == 2 and "must be nested" in result.stderr and "'train.lr'" in result.stderr


# ----------------------------------------------------------------------------- what a request may not hold
def test_a_targetless_local_input_cannot_shadow_proc() -> None:
    """A local input without a target appears at its own source path, which must be a usable target
    too: ``/proc`` as an input would bind the host's /proc over the frame's own (every host process
    visible inside), so it is refused like ``target: /proc``."""
    with pytest.raises(UsageError, match="shadows /proc"):
        parse_request(args_request(inputs=[{"source": "/proc"}]), environ={})


def test_a_credential_value_in_a_mount_target_is_refused() -> None:
    """No literal value anywhere in a request may equal a credential of the environment — a mount's
    target included (it would reach bubblewrap's argv, the launch plan and the probe's checklist); the
    request is refused up front, naming the field, never the value."""
    environ = {"AWS_SECRET_ACCESS_KEY": SECRET}
    with pytest.raises(UsageError, match=r"mounts\[0\]\.target"):
        parse_request(args_request(mounts=[{"source": "/tmp", "target": f"/data/{SECRET}"}]), environ=environ)


def test_a_number_in_environment_is_its_text_and_a_list_names_the_fix() -> None:
    """An unquoted number or boolean in ``environment`` (``EPOCHS: 3``) is its text, as YAML users
    mean it; a value that cannot be text (a list) names the field and the fix; a misspelt field
    names the one meant."""
    assert parse_request(args_request(environment={"EPOCHS": 3, "AMP": True, "LR": 0.001}), environ={}).environment \
        == {"EPOCHS": "3", "AMP": "true", "LR": "0.001"}
    with pytest.raises(UsageError) as caught:
        parse_request(args_request(environment={"GPUS": [0, 1]}), environ={})
    assert "environment.GPUS" in str(caught.value) and "quote it" in str(caught.value)
    with pytest.raises(UsageError, match="unknown field 'enviroment': did you mean 'environment'"):
        parse_request({**args_request(), "enviroment": {}}, environ={})
