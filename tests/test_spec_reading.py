"""A request's spec is read the way TAO reads it — with OmegaConf, whose YAML loader is PyYAML's
YAML 1.1 rules plus a float rule (``2e-05`` is a float), without timestamps (dates stay
strings), merges included — and the materialized config is written so TAO reads back the same
value and type, in all three config formats. OmegaConf itself is the reference reader here."""

from __future__ import annotations

import json
import math
import tomllib
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from tao_data_io.errors import UsageError
from tao_data_io.request import load_request
from tao_data_io.staging.config import materialize_config

#: Every scalar form the issue names, as an experiment spec writes it (the value of ``v``).
FORMS = ["2e-05", "1e-4", "1E+3", ".5", "1_000", "0x1F", "0o17", "inf", ".inf", "-.inf", "~", "null", "yes", "no",
         "on", "2024-05-01", "2024-05-01 10:00:00", '"1e-4"', "'2e-05'", "1.5", "01", "1:30", "+12", "1.0e+5",
         "not-a-number", "._5", "._", "1_e5", "1_0e5", "-.5", "1.e3"]


def request_text(value: str, fmt: str = "yaml") -> str:
    return (f"schema_version: '1'\nimage: nvcr.io/nvidia/tao/tao-toolkit:6.0.0-pyt\nmode: config\n"
            f"config_format: {fmt}\ncommand: dino train -e {{config_path}}\n"
            f"environment:\n  LR: 2e-05\nspec:\n  train:\n    v: {value}\n")


def taos_reading(value: str) -> Any:
    """What TAO gets for ``v``: OmegaConf loading the spec as written."""
    return OmegaConf.to_container(OmegaConf.create(f"train:\n  v: {value}\n"))["train"]["v"]  # type: ignore[index]


def same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("value", FORMS)
def test_a_spec_scalar_is_read_as_omegaconf_reads_it(value: str, tmp_path: Path) -> None:
    (tmp_path / "r.yaml").write_text(request_text(value))
    request = load_request(tmp_path / "r.yaml", environ={})
    assert request.spec is not None
    got, expected = request.spec["train"]["v"], taos_reading(value)
    assert same(got, expected), (value, got, expected)
    assert request.environment == {"LR": "2e-05"}  # environment values stay the text as written


def holdable(value: str, fmt: str) -> bool:
    """TOML has no null and JSON no infinity: those are refused with the field named
    (test_request.py::test_values_the_config_format_cannot_represent_are_refused)."""
    expected = taos_reading(value)
    return not (expected is None and fmt == "toml"
                or isinstance(expected, float) and not math.isfinite(expected) and fmt == "json")


@pytest.mark.parametrize(("value", "fmt"), [(value, fmt) for fmt in ("yaml", "json", "toml") for value in FORMS
                                            if holdable(value, fmt)])
def test_the_materialized_config_reads_back_as_tao_read_the_spec(value: str, fmt: str, tmp_path: Path) -> None:
    expected = taos_reading(value)
    (tmp_path / "r.yaml").write_text(request_text(value, fmt))
    config = materialize_config(load_request(tmp_path / "r.yaml", environ={}), tmp_path / "out")
    text = config.path.read_text()
    if fmt == "yaml":
        read = OmegaConf.to_container(OmegaConf.create(text))["train"]["v"]  # type: ignore[index]
    elif fmt == "json":
        read = json.loads(text)["train"]["v"]
    else:
        read = tomllib.loads(text)["train"]["v"]
    assert same(read, expected), (value, fmt, text)


def test_a_merge_key_and_its_override_are_read_as_omegaconf_reads_them(tmp_path: Path) -> None:
    text = request_text("1").replace("spec:\n  train:\n    v: 1\n", (
        "spec:\n  base: &base\n    lr: 0.01\n    epochs: 10\n  train:\n    <<: *base\n    lr: 0.1\n"))
    (tmp_path / "r.yaml").write_text(text)
    request = load_request(tmp_path / "r.yaml", environ={})
    assert request.spec is not None and request.spec["train"] == {"lr": 0.1, "epochs": 10}
    reference = OmegaConf.to_container(OmegaConf.create(text))["spec"]  # type: ignore[index]
    assert request.spec == reference


#: A mapping that merges and overrides, itself merged elsewhere — in both orders the loader can meet them.
NESTED_MERGES = {
    "defined inside the merge that uses it": (
        "  train:\n    <<: &base\n      <<: &root {lr: 1, wd: 2}\n      lr: 3\n    wd: 5\n  again: *base\n"),
    "defined before the merge that uses it": (
        "  root: &root {lr: 1, wd: 2}\n  base: &base\n    <<: *root\n    lr: 3\n  train:\n    <<: *base\n"
        "    wd: 5\n"),
    "merged in a list, then aliased": (
        "  a: &a {x: 1}\n  b: &b\n    <<: *a\n    x: 2\n  c:\n    <<: [*b, *a]\n    x: 3\n  d: *b\n"),
}


@pytest.mark.parametrize("spec", NESTED_MERGES.values(), ids=list(NESTED_MERGES))
def test_a_merged_mapping_that_merges_and_overrides_itself_reads_as_omegaconf_reads_it(spec: str,
                                                                                        tmp_path: Path) -> None:
    """PyYAML flattens a merge into the merged mapping's node in place, so a mapping met a second
    time (its anchor aliased after it was merged) looked as if it held its override twice: the
    duplicate check must look at each mapping as written, once, whatever order nodes are met in."""
    text = request_text("1").replace("spec:\n  train:\n    v: 1\n", "spec:\n" + spec)
    (tmp_path / "r.yaml").write_text(text)
    request = load_request(tmp_path / "r.yaml", environ={})
    assert request.spec == OmegaConf.to_container(OmegaConf.create(text))["spec"]  # type: ignore[index]


def test_a_key_written_twice_in_one_mapping_is_still_refused_beside_a_merge(tmp_path: Path) -> None:
    """The duplicate-key check is about keys written in one mapping, before merging: a merged key
    overridden once is fine (above), one written twice is not."""
    text = request_text("1").replace("spec:\n  train:\n    v: 1\n", (
        "spec:\n  base: &base\n    lr: 0.01\n  train:\n    <<: *base\n    lr: 0.1\n    lr: 0.2\n"))
    (tmp_path / "r.yaml").write_text(text)
    with pytest.raises(UsageError, match="duplicate key 'lr'"):
        load_request(tmp_path / "r.yaml", environ={})
