"""Tier C stages into the pod's own disk, so before submit the inputs are sized from what the
bucket lists (tao_data_io.staging.sizing), into the planned staging map: an upper bound — never
less than what the stage writes, since too small a limit evicts the job — or nothing at all when
an input's staged size cannot be bounded. Real HTTP against the session's SeaweedFS."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tao_data_io.request import JobRequest
from tao_data_io.staging.sizing import BLOCK_BYTES
from tao_data_io.staging.stage import plan_stage, stage
from tao_data_io.staging.stage_map import read_staging_map

from .helpers import req


def request(bucket: str, inputs: list[dict[str, Any]]) -> JobRequest:
    return req(job_id="job-size", image="tao:6", mode="args", command=["dino", "train"], args=[], inputs=inputs)


@pytest.fixture
def dataset(s3_client: Any, bucket: str) -> dict[str, int]:
    sizes = {"coco/images/a.jpg": 70_000, "coco/images/b.jpg": 1, "coco/images/sub/c.jpg": 12_345,
             "coco/annotations.json": 900, "weights/model.pth": 2_000_000}
    for key, size in sizes.items():
        s3_client.put_object(Bucket=bucket, Key=key, Body=b"\0" * size)
    return sizes


def on_disk(root: Path) -> int:
    """What the kubelet counts against an emptyDir's sizeLimit: the blocks of every file and
    every directory under it, as ``du`` does."""
    return sum(path.lstat().st_blocks * 512 for path in (root, *root.rglob("*")))


def staged_input(root: Path) -> Path:
    (found,) = [path for path in root.rglob("*") if path.is_dir() and path.name in ("images", "scenes")
                and ".tao-data-io" not in path.parts]
    return found


def test_a_folder_and_a_file_are_bounded_by_their_listing_and_the_stage_stays_within(
        tmp_path: Path, bucket: str, dataset: dict[str, int], env: dict[str, str]) -> None:
    inputs = [{"source": f"s3://{bucket}/coco/images/", "target": "/data/images"},
              {"source": f"s3://{bucket}/weights/model.pth", "kind": "auto", "target": "/weights/model.pth"}]
    planned = plan_stage(request(bucket, inputs), tmp_path / "plan", size=True, environ=env)
    assert planned.planned_bytes is not None
    assert read_staging_map(tmp_path / "plan" / "staging-map.json").planned_bytes == planned.planned_bytes
    stage(request(bucket, inputs), tmp_path / "real", environ=env)
    staged = [staged_input(tmp_path / "real"), next((tmp_path / "real").rglob("model.pth"))]
    written = sum(on_disk(path) for path in staged)
    assert written <= planned.planned_bytes <= written + 8 * BLOCK_BYTES, (written, planned.planned_bytes)


def test_a_tree_of_many_small_files_in_many_directories_stays_within_its_bound(
        tmp_path: Path, s3_client: Any, bucket: str, env: dict[str, str]) -> None:
    """Per-sample directories: the directories' own blocks outweigh the bytes (one-byte files),
    which a bound of bytes and file blocks alone would leave out — and the pod would be evicted."""
    for scene in range(60):
        for camera in ("front", "back"):
            s3_client.put_object(Bucket=bucket, Key=f"ds/scenes/s{scene:03d}/{camera}/0.jpg", Body=b"x")
    inputs = [{"source": f"s3://{bucket}/ds/scenes/", "target": "/data"}]
    bound = plan_stage(request(bucket, inputs), tmp_path / "plan", size=True, environ=env).planned_bytes
    stage(request(bucket, inputs), tmp_path / "real", environ=env)
    written = on_disk(staged_input(tmp_path / "real"))
    assert bound is not None and written <= bound, (written, bound)
    assert written > 120 * BLOCK_BYTES * 2  # the directories are most of it


def test_a_selective_input_is_bounded_by_its_prefix_and_its_annotation(
        tmp_path: Path, bucket: str, dataset: dict[str, int], env: dict[str, str]) -> None:
    inputs = [{"source": f"s3://{bucket}/coco/images/", "target": "/data/images", "kind": "selective",
               "annotation": f"s3://{bucket}/coco/annotations.json", "annotation_format": "json",
               "keys": ["images[].file_name"]}]
    planned = plan_stage(request(bucket, inputs), tmp_path, size=True, environ=env)
    files = ([size for key, size in dataset.items() if key.startswith("coco/images/")]
             + [dataset["coco/annotations.json"]])
    assert planned.planned_bytes is not None and planned.planned_bytes >= sum(files) + len(files) * BLOCK_BYTES


@pytest.mark.parametrize("unbounded", [
    {"source": "s3://{bucket}/weights/model.tar.gz", "kind": "archive", "target": "/weights"},
    {"source": "hf://nvidia/some-model", "target": "/models/m"},
], ids=["archive: its extracted size", "model: the Hub's files"])
def test_an_input_whose_staged_size_is_not_listed_leaves_the_request_unbounded(
        tmp_path: Path, bucket: str, dataset: dict[str, int], env: dict[str, str], unbounded: dict[str, Any]) -> None:
    inputs = [{"source": f"s3://{bucket}/coco/images/", "target": "/data/images"},
              {**unbounded, "source": unbounded["source"].format(bucket=bucket)}]
    assert plan_stage(request(bucket, inputs), tmp_path, size=True, environ=env).planned_bytes is None


def test_a_folder_past_the_object_budget_is_unbounded_and_only_a_sizing_plan_lists(
        tmp_path: Path, bucket: str, dataset: dict[str, int], env: dict[str, str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tao_data_io.staging import sizing

    inputs = [{"source": f"s3://{bucket}/coco/images/", "target": "/data/images"}]
    monkeypatch.setattr(sizing, "MOST_OBJECTS", 2)  # the folder holds 3
    assert plan_stage(request(bucket, inputs), tmp_path / "big", size=True, environ=env).planned_bytes is None
    assert plan_stage(request(bucket, inputs), tmp_path / "off", environ=env).planned_bytes is None  # tier B: not asked


def test_a_glob_is_bounded_by_what_it_matches(tmp_path: Path, s3_client: Any, bucket: str, env: dict[str, str]) -> None:
    for key in ("tf/train-0", "tf/train-1", "tf/val-0", "tf/old/train-9"):
        s3_client.put_object(Bucket=bucket, Key=key, Body=b"r" * 5000)
    inputs = [{"source": f"s3://{bucket}/tf/train-*", "target": "/data/train"}]
    bound = plan_stage(request(bucket, inputs), tmp_path / "plan", size=True, environ=env).planned_bytes
    stage(request(bucket, inputs), tmp_path / "real", environ=env)
    (root,) = [p for p in (tmp_path / "real").rglob("tf") if p.is_dir() and ".tao-data-io" not in p.parts]
    written = on_disk(root)
    assert bound is not None and written <= bound < written + 4 * BLOCK_BYTES + 2 * 5000, (written, bound)
