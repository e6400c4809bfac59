"""The job request: the model and its validation (each error naming the field and the fix), loading
within limits (alias bombs, deep nesting, duplicate keys, files that are not files), what a request
may not hold, the spec walk and rewrite, and the materialized config (no network)."""

from __future__ import annotations

import json
import os
import stat
import time
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


def test_a_request_that_leaves_out_its_version_is_version_1() -> None:
    """The run form sends no schema_version unless its schema gives a default (issue 40): a
    request without one is read as the only version there is; any other is refused (below)."""
    given = request()
    del given["schema_version"]
    assert parse_request(given).schema_version == "1"
    assert JobRequest.model_json_schema()["properties"]["schema_version"]["default"] == "1"


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
def test_materialize_is_content_addressed_atomic_and_readable_by_the_jobs_user(tmp_path: Path, fmt: str) -> None:
    """0644: the job reads it as its own user, who is not the stager when the backend runs as
    root (the spec holds no credential: one is refused before this)."""
    req = JobRequest.model_validate(request(config_format=fmt))
    first = materialize_config(req, tmp_path / "out")
    assert first.created and first.path.name == f"tao-action-config-{first.sha256}.{fmt}"
    assert stat.S_IMODE(first.path.stat().st_mode) == 0o644
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


BASE: dict[str, Any] = {"schema_version": "1", "image": "img", "mode": "config", "command": "t -e {config_path}",
                        "config_format": "yaml", "spec": {"a": 1}}


def write_text(tmp_path: Path, text: str, name: str = "req.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def refused(data: dict[str, Any], fragment: str, environ: dict[str, str] | None = None) -> str:
    with pytest.raises(UsageError) as info:
        parse_request({**BASE, **data}, environ=environ)
    message = str(info.value)
    assert fragment in message, message
    return message


# ----------------------------------------------------------------------------- requests built to exhaust the loader
BILLION_LAUGHS = """\
schema_version: "1"
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


def test_yaml_alias_bomb_is_refused_quickly(tmp_path: Path) -> None:
    started = time.monotonic()
    result = run_cli("materialize-config", "--request", str(write_text(tmp_path, BILLION_LAUGHS)), "--output-dir",
                     str(tmp_path / "out"), env={})
    assert result.returncode == 2 and "alias" in result.stderr, result.stderr
    assert time.monotonic() - started < 60  # a guard against hanging CI, not a performance claim


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_deep_nesting_is_refused_naming_the_limit(tmp_path: Path, suffix: str) -> None:
    head = json.dumps(BASE)[:-1]  # JSON is YAML too
    text = head + ', "deep": ' + '{"x": ' * 2000 + "1" + "}" * 2000 + "}"
    with pytest.raises(UsageError, match="nested deeper than 64") as info:
        load_request(write_text(tmp_path, text, "req" + suffix))
    assert "TAO_DATA_IO_MAX_REQUEST_DEPTH" in str(info.value)


def test_an_oversized_request_is_refused_naming_the_override(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="TAO_DATA_IO_MAX_REQUEST_BYTES"):
        load_request(write_text(tmp_path, "#" * (2 * 1024 * 1024)))


@pytest.mark.parametrize(("text", "name"), [
    ('schema_version: "1"\nimage: a\nimage: b\n', "req.yaml"),
    ('{"schema_version": "1", "image": "a", "image": "b"}', "req.json"),
    ('schema_version: "1"\nspec:\n  train: {lr: 1, lr: 2}\n', "req.yaml"),
])
def test_duplicate_keys_are_refused(tmp_path: Path, text: str, name: str) -> None:
    with pytest.raises(UsageError, match="duplicate key"):
        load_request(write_text(tmp_path, text, name))


# ----------------------------------------------------------------------------- requests wrong as a whole
def test_two_inputs_with_one_target_are_refused() -> None:
    refused({"inputs": [{"source": "s3://bkt-1/a/", "target": "/data/x"},
                        {"source": "s3://bkt-1/b/", "target": "/data/x"}]}, "inputs[1].target")


def test_a_target_nested_in_another_is_refused() -> None:
    refused({"inputs": [{"source": "s3://bkt-1/a/", "target": "/data"},
                        {"source": "s3://bkt-1/b/", "target": "/data/b"}]}, "inside")
    refused({"mounts": [{"source": "/pvc/a", "target": "/data"}],
             "inputs": [{"source": "s3://bkt-1/b/", "target": "/data/b"}]}, "inside")


def test_the_same_source_declared_twice_is_refused() -> None:
    refused({"inputs": [{"source": "s3://bkt-1/a.tar.gz", "kind": "archive"},
                        {"source": "s3://bkt-1/a.tar.gz", "kind": "file"}]}, "declared twice")


@pytest.mark.parametrize("target", ["/etc", "/usr/local/data", "/bin", "/lib64", "/proc/x", "/sys", "/dev/shm",
                                    "/tao-action-config", "/tao-data-io-verify/x"])
def test_targets_that_shadow_system_or_reserved_paths_are_refused(target: str) -> None:
    refused({"inputs": [{"source": "s3://bkt-1/a/", "target": target}]}, "shadows")


def test_results_dir_shadowing_a_system_path_is_refused() -> None:
    refused({"outputs": {"results_dir": "/usr/results"}}, "shadows")


@pytest.mark.parametrize(("fmt", "spec", "fragment"), [
    ("json", {"when": "DATE"}, "spec.when"),
    ("toml", {"when": "DATE"}, "spec.when"),
    ("json", {"lr": float("inf")}, "spec.lr"),
    ("json", {"lr": float("nan")}, "spec.lr"),
    ("toml", {"map": {1: "a"}}, "spec.map"),
    ("json", {"blob": b"\x00\x01"}, "spec.blob"),
])
def test_values_the_config_format_cannot_represent_are_refused(tmp_path: Path, fmt: str, spec: dict[str, Any],
                                                               fragment: str) -> None:
    import datetime

    spec = {key: (datetime.date(2024, 1, 1) if value == "DATE" else value) for key, value in spec.items()}
    request = parse_request({**BASE, "config_format": fmt, "spec": spec})
    with pytest.raises(UsageError, match=fragment.replace(".", r"\.")):
        materialize_config(request, tmp_path)


def test_a_credential_value_in_spec_or_environment_is_refused_by_name_only() -> None:
    environ = {"AWS_SECRET_ACCESS_KEY": "s3cr3t-v4lue-xyz"}
    message = refused({"spec": {"train": {"note": "s3cr3t-v4lue-xyz"}}}, "spec.train.note", environ)
    assert "s3cr3t-v4lue-xyz" not in message
    message = refused({"environment": {"LR": "s3cr3t-v4lue-xyz"}}, "environment.LR", environ)
    assert "s3cr3t-v4lue-xyz" not in message


def test_cli_exit_2_for_a_wrong_request(tmp_path: Path) -> None:
    path = write_text(tmp_path, yaml.safe_dump({**BASE, "inputs": [{"source": "s3://bkt-1/a/", "target": "/etc"}]}))
    result = run_cli("materialize-config", "--request", str(path), "--output-dir", str(tmp_path / "o"), env={})
    assert result.returncode == 2 and "inputs[0].target" in result.stderr, result.stderr


@pytest.mark.parametrize("kind", ["device", "fifo", "directory"])
def test_a_request_path_that_is_not_a_regular_file_fails_at_once(tmp_path: Path, kind: str) -> None:
    """A request path is read only if it is a regular file: /dev/zero would be read whole (memory),
    a FIFO without a writer would hang."""
    import os

    if kind == "device":
        path = Path("/dev/zero")
    elif kind == "fifo":
        path = tmp_path / "req.yaml"
        os.mkfifo(path)
    else:
        path = tmp_path
    with pytest.raises(UsageError, match="not a regular file"):
        load_request(path)


#: A credential under a plain name, as a job forwards it (``forward_env: [WANDB_KEY]``).
FORWARDED = {"WANDB_KEY": "wandb-plain-name-value-0123456789"}


@pytest.mark.parametrize(("request_data", "field"), [
    (args_request(args=["--key", FORWARDED["WANDB_KEY"]]), "args[1]"),
    ({**BASE, "environment": {"NOTE": f"key={FORWARDED['WANDB_KEY']}"}}, "environment.NOTE"),
    ({**BASE, "spec": {"logging": {"wandb": {"key": FORWARDED["WANDB_KEY"]}}}}, "spec.logging.wandb.key"),
], ids=["args", "environment", "spec"])
def test_a_forwarded_variables_value_is_a_credential_whatever_its_name(request_data: dict[str, Any],
                                                                       field: str) -> None:
    """forward_env makes a variable a credential, however it is called: its value anywhere else
    in the request would be written in clear (the launch record, the config, the flow run's
    parameters). Refused, naming the field, never the value."""
    with pytest.raises(UsageError) as info:
        parse_request({**request_data, "forward_env": ["WANDB_KEY"]}, environ=FORWARDED)
    message = str(info.value)
    assert f"{field} holds the value of a credential variable" in message and FORWARDED["WANDB_KEY"] not in message
    assert parse_request(request_data, environ=FORWARDED)  # not forwarded: just a value


@pytest.mark.parametrize(("part", "shape", "fragment"), [
    ("compute_shape", {"shm_size": "999999Ti"}, "shm_size '999999Ti' is more than 1Ti"),
    ("compute_shape", {"ephemeral_storage": "999999Ti"}, "ephemeral_storage '999999Ti' is more than 64Ti"),
    ("outputs", {"results_limit": "999999Ti"}, "results_limit '999999Ti' is more than 64Ti"),
    ("outputs", {"results_limit": "20GB"}, "results_limit '20GB' is not a binary quantity"),
], ids=["shm", "ephemeral", "results", "results-unit"])
def test_a_size_no_machine_has_is_refused_naming_the_cap(part: str, shape: dict[str, Any], fragment: str) -> None:
    refused({part: shape}, fragment, environ={})


def test_a_forwarded_variable_holding_an_ordinary_word_does_not_refuse_the_request() -> None:
    """WANDB_ENTITY=nvidia, forwarded: the image nvcr.io/nvidia/… is not a leaked credential."""
    request = {**BASE, "image": "nvcr.io/nvidia/tao/tao-toolkit:6.0.0-pyt", "forward_env": ["WANDB_ENTITY"]}
    assert parse_request(request, environ={"WANDB_ENTITY": "nvidia"}).forward_env == ["WANDB_ENTITY"]


@pytest.mark.parametrize("name", ["PATH", "LD_PRELOAD", "LD_AUDIT", "PYTHONPATH", "NODE_OPTIONS", "IFS"])
def test_forward_env_refuses_a_variable_that_controls_processes(name: str) -> None:
    """forward_env hands the worker's value to the job's frame or pod as a credential: PATH or
    LD_PRELOAD would instead steer which programs run there and what they load."""
    refused({"forward_env": [name]}, f"forward_env name {name!r} controls how programs run", environ={})
