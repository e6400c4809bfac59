"""Nothing of ours inside a tree the job reads: a staged input holds exactly its data — no state
directory, lock, digest cache or temp name — whatever its kind, and a URI inside another staged
folder (sparse4d's ``data_root`` with ``ann_file`` and ``anchor`` below it) is served from that
folder's copy: no second download, and none of the file's state inside the folder. Real HTTP
against the session's SeaweedFS."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tao_data_io.errors import UsageError
from tao_data_io.fs.confinement import STATE_DIR_NAME, TEMP_PREFIX
from tao_data_io.request import JobRequest
from tao_data_io.staging.stage import stage

from .helpers import tar_gz


def ours_inside(root: Path) -> list[str]:
    """Names below ``root`` that are tao-data-io's, not the data's."""
    return sorted(str(path.relative_to(root)) for path in root.rglob("*")
                  if path.name == STATE_DIR_NAME or path.name.startswith(TEMP_PREFIX))


def sparse4d(bucket: str, **extra: Any) -> JobRequest:
    return JobRequest.model_validate({
        "schema_version": "1", "job_id": "sparse4d-1", "image": "tao:6", "mode": "config", "config_format": "yaml",
        "command": "sparse4d train -e {config_path}",
        "spec": {"dataset": {"data_root": f"s3://{bucket}/nuscenes/", "ann_file": f"s3://{bucket}/nuscenes/ann.pkl",
                             "anchor": f"s3://{bucket}/nuscenes/kmeans/anchors.npy"}}, **extra})


@pytest.fixture
def nuscenes(s3_client: Any, bucket: str) -> str:
    for key, body in {"nuscenes/ann.pkl": b"annotations", "nuscenes/kmeans/anchors.npy": b"anchors",
                      "nuscenes/samples/CAM_FRONT/0.jpg": b"jpg"}.items():
        s3_client.put_object(Bucket=bucket, Key=key, Body=body)
    return bucket


def test_a_uri_inside_a_staged_folder_is_served_from_its_copy(tmp_path: Path, nuscenes: str,
                                                               env: dict[str, str]) -> None:
    staged = stage(sparse4d(nuscenes), tmp_path / "w", environ=env)
    by_source = {entry.source: entry for entry in staged.sources}
    root = by_source[f"s3://{nuscenes}/nuscenes/"]
    assert root.transferred_files == 3  # every object once, with the folder
    for inner in ("ann.pkl", "kmeans/anchors.npy"):
        entry = by_source[f"s3://{nuscenes}/nuscenes/{inner}"]
        assert entry.transferred_files == 0 and entry.note == f"served from the copy of s3://{nuscenes}/nuscenes/"
        assert entry.container_path == f"{root.container_path}/{inner}"
    assert ours_inside(tmp_path / "w" / str(root.sub_path)) == []
    config = yaml.safe_load(Path(str(staged.config().local_path)).read_text())  # type: ignore[union-attr]
    assert config["dataset"]["ann_file"] == config["dataset"]["data_root"] + "/ann.pkl"


def test_a_uri_inside_a_folder_its_excludes_leave_out_is_refused_naming_both(tmp_path: Path, nuscenes: str,
                                                                             env: dict[str, str]) -> None:
    request = sparse4d(nuscenes, inputs=[{"source": f"s3://{nuscenes}/nuscenes/", "excludes": ["*.pkl"]}])
    with pytest.raises(UsageError, match=r"ann\.pkl.*inside .*nuscenes/.*whose excludes leave it out"):
        stage(request, tmp_path / "w", environ=env)


def test_no_staged_input_of_any_kind_holds_anything_of_ours(tmp_path: Path, s3_client: Any, bucket: str,
                                                            env: dict[str, str]) -> None:
    objects = {"ds/a.jpg": b"a", "ds/sub/b.jpg": b"b", "one/file.bin": b"f",
               "sel/x.mp4": b"x", "sel/y.mp4": b"y", "sel/list.jsonl": json.dumps({"video": "x.mp4"}).encode(),
               "arc/calib.tar.gz": tar_gz({"calib/table.bin": b"t"})}
    for key, body in objects.items():
        s3_client.put_object(Bucket=bucket, Key=key, Body=body)
    request = JobRequest.model_validate({
        "schema_version": "1", "job_id": "kinds-1", "image": "tao:6", "mode": "config", "config_format": "json",
        "command": "t -e {config_path}", "spec": {"data": f"s3://{bucket}/ds/", "file": f"s3://{bucket}/one/file.bin"},
        "inputs": [{"source": f"s3://{bucket}/sel/", "kind": "selective", "annotation": f"s3://{bucket}/sel/list.jsonl",
                    "keys": ["video"]},
                   {"source": f"s3://{bucket}/arc/calib.tar.gz", "kind": "archive", "strip_components": 1}]})
    for attempt in range(2):  # and again, when everything is there already
        staged = stage(request, tmp_path / "w", environ=env)
        for entry in staged.sources:
            local = Path(str(entry.local_path))
            assert local.exists(), entry
            assert not local.is_dir() or ours_inside(local) == [], (entry.kind, ours_inside(local))
    assert {entry.kind for entry in staged.sources} == {"folder", "file", "selective", "archive", "config"}


def test_a_folder_inside_a_folder_with_excludes_is_refused_not_served_partly(tmp_path: Path, nuscenes: str,
                                                                             env: dict[str, str]) -> None:
    request = sparse4d(nuscenes, inputs=[{"source": f"s3://{nuscenes}/nuscenes/", "excludes": ["*/0.jpg"]}])
    request = request.model_copy(update={"spec": {"dataset": {"samples": f"s3://{nuscenes}/nuscenes/samples/"}}})
    with pytest.raises(UsageError, match=r"samples/.*lies inside .*nuscenes/.*excludes may leave part of it out"):
        stage(request, tmp_path / "w", environ=env)
