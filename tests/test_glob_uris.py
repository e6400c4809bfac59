"""A glob URI (TF2 EfficientDet's ``train_tfrecords: ['s3://…/train-*']``) stages exactly the
objects its pattern matches, and the spec gets the pattern back over their staged location — so
the job's own glob, applied there, finds exactly them. The rule is TensorFlow's
(``tf.io.gfile.glob``): ``*``, ``?`` and ``[…]`` match within one path component, never across
``/``; what that rule cannot honour (``**``, a pattern in the bucket) is refused when the request
is loaded. Real HTTP against the session's SeaweedFS."""

from __future__ import annotations

import glob
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tao_data_io.errors import UsageError
from tao_data_io.request import JobRequest, parse_request
from tao_data_io.staging.stage import stage

from .helpers import req

OBJECTS = ["tfrecords/train-00000-of-00002", "tfrecords/train-00001-of-00002", "tfrecords/val-00000-of-00001",
           "tfrecords/old/train-99999-of-99999", "shards/a/part-1.tfrecord", "shards/b/part-2.tfrecord",
           "shards/a/deeper/part-3.tfrecord", "bracketed[1]/one.bin", "bracketed1/two.bin"]


def request(spec: dict[str, Any]) -> JobRequest:
    return req(job_id="effdet-1", image="tao:6", mode="config", config_format="yaml",
               command="efficientdet_tf2 train -e {config_path}", spec=spec)


@pytest.fixture
def tfrecords(s3_client: Any, bucket: str) -> str:
    for key in OBJECTS:
        s3_client.put_object(Bucket=bucket, Key=key, Body=f"record {key}".encode())
    return bucket


def staged_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and ".tao-data-io" not in p.parts)


@pytest.mark.parametrize(("pattern", "matched"), [
    ("tfrecords/train-*", ["train-00000-of-00002", "train-00001-of-00002"]),
    ("tfrecords/*-0000?-of-0000?", ["train-00000-of-00002", "train-00001-of-00002", "val-00000-of-00001"]),
    ("shards/*/part-*.tfrecord", ["a/part-1.tfrecord", "b/part-2.tfrecord"]),
    ("bracketed[1]/*.bin", ["one.bin"]),
], ids=["last component", "?", "a component in the middle", "a bracket is itself"])
def test_a_glob_stages_what_it_matches_and_the_job_finds_exactly_that(
        pattern: str, matched: list[str], tmp_path: Path, tfrecords: str, env: dict[str, str]) -> None:
    uri = f"s3://{tfrecords}/{pattern}"
    staged = stage(request({"dataset": {"train_tfrecords": [uri]}}), tmp_path / "w", environ=env)
    (entry,) = [e for e in staged.sources if e.source == uri]
    assert entry.kind == "glob" and entry.files == len(matched)
    assert staged_files(Path(str(entry.local_path))) == matched  # no neighbour, nothing across a "/"
    config = yaml.safe_load(Path(str(staged.config().local_path)).read_text())  # type: ignore[union-attr]
    (rewritten,) = config["dataset"]["train_tfrecords"]
    rest = pattern.split("/", 1)[1] if not pattern.startswith("bracketed") else "*.bin"
    assert rewritten == f"{entry.container_path}/{rest}"
    # The job's own glob (Python's glob matches within a component, as TensorFlow's does), on
    # the host path the frame's path stands for:
    found = glob.glob(glob.escape(str(entry.local_path)) + "/" + rest)
    assert sorted(str(Path(f).relative_to(str(entry.local_path))) for f in found) == matched
    again = stage(request({"dataset": {"train_tfrecords": [uri]}}), tmp_path / "w", environ=env)
    (rerun,) = [e for e in again.sources if e.source == uri]
    assert rerun.transferred_files == 0  # a rerun moves nothing


def test_a_glob_that_matches_nothing_is_an_error_naming_it(tmp_path: Path, tfrecords: str, env: dict[str, str]) -> None:
    with pytest.raises(UsageError, match=r"dataset.val_tfrecords\[0\]: .*test-\*' matches no object"):
        stage(request({"dataset": {"val_tfrecords": [f"s3://{tfrecords}/tfrecords/test-*"]}}), tmp_path, environ=env)


@pytest.mark.parametrize(("uri", "fragment"), [
    ("s3://bkt-1/tfrecords/**/train-*", "'**'"),
    ("s3://bkt-*/tfrecords/train-*", "bucket"),
], ids=["recursive", "in the bucket"])
def test_a_pattern_the_rule_cannot_honour_is_refused_when_the_request_is_loaded(uri: str, fragment: str) -> None:
    with pytest.raises(UsageError, match=re.escape(fragment)):
        parse_request({"schema_version": "1", "image": "tao:6", "mode": "config", "config_format": "yaml",
                       "command": "t -e {config_path}", "spec": {"dataset": {"train_tfrecords": [uri]}}}, environ={})


def test_a_sharded_stage_stages_all_a_glob_matches_across_its_shards(tmp_path: Path, s3_client: Any, bucket: str,
                                                                     env: dict[str, str]) -> None:
    """Tier B's shards split a glob's matches as they split a folder's keys: together, all of them."""
    from tao_data_io.transfer.shard import Shard

    for index in range(20):
        s3_client.put_object(Bucket=bucket, Key=f"d/train-{index:02d}.tfrecord", Body=b"r")
    uri = f"s3://{bucket}/d/train-*"
    for index in range(2):
        staged = stage(request({"dataset": {"train_tfrecords": [uri]}}), tmp_path / "w", environ=env,
                       shard=Shard(index, 2))
    (entry,) = [e for e in staged.sources if e.source == uri]
    assert len(staged_files(Path(str(entry.local_path)))) == 20
