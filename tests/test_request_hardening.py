"""Requests that are wrong but used to pass, and requests built to exhaust the loader: each is
refused quickly, with exit 2 from the CLI, naming the field (issue: hardening)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tao_data_io.errors import UsageError
from tao_data_io.request import load_request, parse_request
from tao_data_io.staging.config import materialize_config

from .helpers import run_cli

BASE: dict[str, Any] = {"schema_version": "1", "image": "img", "mode": "config", "command": "t -e {config_path}",
                        "config_format": "yaml", "spec": {"a": 1}}


def write(tmp_path: Path, text: str, name: str = "req.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def refused(data: dict[str, Any], fragment: str, environ: dict[str, str] | None = None) -> str:
    with pytest.raises(UsageError) as info:
        parse_request({**BASE, **data}, environ=environ)
    message = str(info.value)
    assert fragment in message, message
    return message


# ----------------------------------------------------------------------------- resource exhaustion
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
    result = run_cli("materialize-config", "--request", str(write(tmp_path, BILLION_LAUGHS)), "--output-dir",
                     str(tmp_path / "out"), env={})
    assert result.returncode == 2 and "alias" in result.stderr, result.stderr
    assert time.monotonic() - started < 60  # a guard against hanging CI, not a performance claim


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_deep_nesting_is_refused_naming_the_limit(tmp_path: Path, suffix: str) -> None:
    head = json.dumps(BASE)[:-1]  # JSON is YAML too
    text = head + ', "deep": ' + '{"x": ' * 2000 + "1" + "}" * 2000 + "}"
    with pytest.raises(UsageError, match="nested deeper than 64") as info:
        load_request(write(tmp_path, text, "req" + suffix))
    assert "TAO_DATA_IO_MAX_REQUEST_DEPTH" in str(info.value)


def test_an_oversized_request_is_refused_naming_the_override(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="TAO_DATA_IO_MAX_REQUEST_BYTES"):
        load_request(write(tmp_path, "#" * (2 * 1024 * 1024)))


@pytest.mark.parametrize(("text", "name"), [
    ('schema_version: "1"\nimage: a\nimage: b\n', "req.yaml"),
    ('{"schema_version": "1", "image": "a", "image": "b"}', "req.json"),
    ('schema_version: "1"\nspec:\n  train: {lr: 1, lr: 2}\n', "req.yaml"),
])
def test_duplicate_keys_are_refused(tmp_path: Path, text: str, name: str) -> None:
    with pytest.raises(UsageError, match="duplicate key"):
        load_request(write(tmp_path, text, name))


# ----------------------------------------------------------------------------- wrong but passing
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
    path = write(tmp_path, yaml.safe_dump({**BASE, "inputs": [{"source": "s3://bkt-1/a/", "target": "/etc"}]}))
    result = run_cli("materialize-config", "--request", str(path), "--output-dir", str(tmp_path / "o"), env={})
    assert result.returncode == 2 and "inputs[0].target" in result.stderr, result.stderr


@pytest.mark.parametrize("kind", ["device", "fifo", "directory"])
def test_a_request_path_that_is_not_a_regular_file_fails_at_once(tmp_path: Path, kind: str) -> None:
    """/dev/zero used to be read whole (memory), a FIFO without a writer to hang."""
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
