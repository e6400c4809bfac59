"""The one parser of s3:// hf:// ngc:// and the one rule for where each is staged (pure)."""

from __future__ import annotations

import pytest

from tao_data_io.errors import UsageError
from tao_data_io.request import JobRequest
from tao_data_io.staging.config import materialize_config
from tao_data_io.staging.layout import placements
from tao_data_io.uris import HFModelURI, NGCModelURI, S3Url, model_root, parse_uri, staging_location

# Every form the model puller accepts, with where its files land and where the source is staged.
MODEL_FORMS = [
    ("hf://org/repo", HFModelURI("org/repo"), "hf/org/repo/main", "hf/org/repo/main"),
    ("hf://org/repo@v1.0", HFModelURI("org/repo", "v1.0"), "hf/org/repo/v1.0", "hf/org/repo/v1.0"),
    ("hf://org/repo@0123456789abcdef0123456789abcdef01234567/onnx",
     HFModelURI("org/repo", "0123456789abcdef0123456789abcdef01234567", "onnx"),
     "hf/org/repo/0123456789abcdef0123456789abcdef01234567",
     "hf/org/repo/0123456789abcdef0123456789abcdef01234567/onnx"),
    ("hf://org/repo@refs%2Fpr%2F3/onnx", HFModelURI("org/repo", "refs/pr/3", "onnx"),
     "hf/org/repo/refs/pr/3", "hf/org/repo/refs/pr/3/onnx"),
    ("hf://org/repo@refs/pr/3/onnx/", HFModelURI("org/repo", "refs/pr/3", "onnx"),
     "hf/org/repo/refs/pr/3", "hf/org/repo/refs/pr/3/onnx"),
    ("hf://org/repo@feature%2Fx/a/b.bin", HFModelURI("org/repo", "feature/x", "a/b.bin"),
     "hf/org/repo/feature/x", "hf/org/repo/feature/x/a/b.bin"),
    ("hf://org/repo/weights/model.pth", HFModelURI("org/repo", None, "weights/model.pth"),
     "hf/org/repo/main", "hf/org/repo/main/weights/model.pth"),
    ("ngc://nvidia/tao/resnet:18", NGCModelURI("nvidia", "tao", "resnet", "18"),
     "ngc/nvidia/tao/resnet/18", "ngc/nvidia/tao/resnet/18"),
    ("ngc://nvidia/resnet:v1.0+b2", NGCModelURI("nvidia", None, "resnet", "v1.0+b2"),
     "ngc/nvidia/resnet/v1.0+b2", "ngc/nvidia/resnet/v1.0+b2"),
]


@pytest.mark.parametrize(("uri", "parsed", "root", "location"), MODEL_FORMS, ids=[f[0] for f in MODEL_FORMS])
def test_model_uri_forms_parse_and_stage_where_the_puller_writes(uri: str, parsed: object, root: str,
                                                                 location: str) -> None:
    got = parse_uri(uri)
    assert got == parsed
    assert isinstance(got, HFModelURI | NGCModelURI)
    # The puller writes the repository's files (with their repo paths) under the root; a
    # subpath source is that subpath inside it: the two must agree, whatever the spelling.
    assert staging_location(model_root(got)) == root
    assert staging_location(got) == location
    sub = getattr(got, "subpath", None)
    assert location == (f"{root}/{sub}" if sub else root)


def test_the_config_and_the_staging_map_say_where_the_model_is_pulled() -> None:
    """The defect: the config and the map said …/refs%2Fpr%2F3/onnx while the pull went to …/refs/pr/3."""
    request = JobRequest.model_validate({
        "schema_version": "1", "image": "i", "mode": "config", "config_format": "json",
        "command": "x -e {config_path}", "spec": {"m": "hf://org/repo@refs%2Fpr%2F3/onnx"}})
    planned = placements(request)["hf://org/repo@refs%2Fpr%2F3/onnx"]
    assert planned.sub_path == "hf/org/repo/refs/pr/3/onnx"
    assert planned.container_path == "/tao-inputs/hf/org/repo/refs/pr/3/onnx"


@pytest.mark.parametrize(("uri", "location"), [
    ("s3://bkt-1/coco/train/", "s3/bkt-1/coco/train"),
    ("s3://bkt-1/coco/train", "s3/bkt-1/coco/train"),
    ("s3://bkt-1/a.json", "s3/bkt-1/a.json"),
])
def test_s3_locations(uri: str, location: str) -> None:
    parsed = parse_uri(uri)
    assert isinstance(parsed, S3Url) and staging_location(parsed) == location


@pytest.mark.parametrize(("uri", "fragment"), [
    ("s3://Bad_Bucket/x", "not a valid S3 bucket name"),
    ("s3://bkt-1/a/../../etc", "'..'"),
    ("s3://bkt-1//x", "canonical"),
    ("hf://org", "organisation and a repository"),
    ("hf://org/repo@..", "'..'"),
    ("hf://org/repo/../x", "'..'"),
    ("ngc://nvidia/resnet", "':version' is missing"),
    ("ngc://a/b/c/d:1", "segment"),
    ("gs://bucket/x", "neither"),
])
def test_bad_uris_are_refused_naming_the_field(uri: str, fragment: str) -> None:
    with pytest.raises(UsageError, match=fragment) as info:
        staging_location(parse_uri(uri, field="spec.model"), field="spec.model")
    assert "spec.model" in str(info.value)


@pytest.mark.parametrize("uri", ["ngc://nvidia/resnet", "hf://org", "hf://org/repo/../x", "s3://bkt-1/a/../b"])
def test_a_request_naming_a_uri_the_stager_would_refuse_does_not_load(uri: str) -> None:
    """Before, materialize-config succeeded where stage later failed."""
    data = {"schema_version": "1", "image": "i", "mode": "config", "config_format": "json",
            "command": "x -e {config_path}", "spec": {"pretrained": uri}}
    with pytest.raises(ValueError, match="spec.pretrained"):
        JobRequest.model_validate(data)
    with pytest.raises(ValueError):
        JobRequest.model_validate({**data, "spec": {}, "inputs": [{"source": uri}]})


def test_materialize_and_placements_agree(tmp_path: object) -> None:
    from pathlib import Path

    request = JobRequest.model_validate({
        "schema_version": "1", "image": "i", "mode": "config", "config_format": "json",
        "command": "x -e {config_path}", "spec": {"m": "hf://org/repo@refs%2Fpr%2F3/onnx"}})
    config = materialize_config(request, Path(str(tmp_path)))
    assert "/tao-inputs/hf/org/repo/refs/pr/3/onnx" in config.path.read_text()
