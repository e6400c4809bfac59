"""The tier B stage cache and sharded staging, over real HTTP (SeaweedFS)."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tao_data_io.credentials import S3Credentials
from tao_data_io.fs.confinement import STATE_DIR_NAME
from tao_data_io.request import JobRequest
from tao_data_io.staging.cache import marker_path, stage_cached
from tao_data_io.staging.stage import plan_stage, stage
from tao_data_io.transfer.engine import TransferEngine
from tao_data_io.transfer.shard import Shard

from . import helpers
from .helpers import count_uri_parses, tree_digest


@pytest.fixture
def dataset(s3_client, bucket: str) -> str:  # type: ignore[no-untyped-def]
    for i in range(40):
        s3_client.put_object(Bucket=bucket, Key=f"coco/images/img{i:02d}.jpg", Body=f"image{i}".encode() * (i + 1))
    s3_client.put_object(Bucket=bucket, Key="coco/annotations.json", Body=b'{"images": []}')
    s3_client.put_object(Bucket=bucket, Key="coco/labels.txt", Body=b"cat\ndog\n")
    return bucket


def _request(bucket: str, **extra: Any) -> JobRequest:
    return helpers.req({
        "schema_version": "1", "job_id": "job-cache-1", "image": "tao:6", "mode": "config", "config_format": "yaml",
        "command": "dino train -e {config_path}",
        "spec": {"dataset": {"images": f"s3://{bucket}/coco/images/"}},
        "inputs": [{"source": f"s3://{bucket}/coco/annotations.json", "kind": "file"},
                   {"source": f"s3://{bucket}/coco/labels.txt", "kind": "file"}]}, **extra)


def _data(root: Path) -> dict[str, str]:
    """The staged tree without the config and the map (the config is named by its content)."""
    return {k: v for k, v in tree_digest(root).items() if k.startswith("s3/")}


def test_a_second_job_on_the_same_dataset_moves_zero_bytes(s3_credentials: S3Credentials, dataset: str,
                                                           tmp_path: Path) -> None:
    cache = tmp_path / "volume" / "cache"
    with TransferEngine(s3_credentials) as engine:
        first = stage(_request(dataset), cache, engine=engine, stager=stage_cached, map_path=tmp_path / "m1.json")
        images = next(s for s in first.sources if s.kind == "folder")
        marker = json.loads(marker_path(cache, images.sub_path or "").read_text())
        second = stage(_request(dataset, job_id="job-cache-2"), cache, engine=engine, stager=stage_cached,
                       map_path=tmp_path / "m2.json")
    assert sum(s.transferred_files for s in first.sources if s.kind != "config") == 42
    assert [s.transferred_bytes for s in second.sources if s.kind != "config"] == [0, 0, 0]
    assert all(s.note == "stage cache hit: source unchanged" for s in second.sources if s.kind != "config")
    assert [s.sub_path for s in second.sources] == [s.sub_path for s in first.sources]  # the same subPaths
    again = json.loads(marker_path(cache, images.sub_path or "").read_text())
    assert again["identity"] == marker["identity"] and again["staged_at"] == marker["staged_at"]
    assert again["last_used"] >= marker["last_used"] and again["entry"]["files"] == 40
    assert not any(STATE_DIR_NAME in part for part in _data(cache))  # markers live beside, never inside, an entry


def test_the_listing_the_cache_read_is_gone_after_a_hit_a_miss_or_a_failure(s3_credentials: S3Credentials,
                                                                           dataset: str, tmp_path: Path) -> None:
    """The folder's listing is spooled to disk while its identity is hashed, for the sync to
    read instead of listing again: it is this stage's only — a million keys are not kept."""
    cache = tmp_path / "volume" / "cache"

    def spools() -> list[str]:
        return sorted(p.name for p in (cache / STATE_DIR_NAME).rglob("*.listing"))

    with TransferEngine(s3_credentials) as engine:
        stage(_request(dataset), cache, engine=engine, stager=stage_cached)  # a miss
        assert spools() == []
        stage(_request(dataset, job_id="job-cache-2"), cache, engine=engine, stager=stage_cached)  # a hit
        assert spools() == []
        with pytest.raises(Exception):
            stage(_request("no-such-bucket-anywhere"), cache, engine=engine, stager=stage_cached)  # a failure
    assert spools() == []


def test_a_changed_source_is_staged_again(s3_credentials: S3Credentials, s3_client, dataset: str,  # type: ignore[no-untyped-def]
                                          tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    with TransferEngine(s3_credentials) as engine:
        stage(_request(dataset), cache, engine=engine, stager=stage_cached)
        s3_client.put_object(Bucket=dataset, Key="coco/images/img00.jpg", Body=b"changed")
        second = stage(_request(dataset), cache, engine=engine, stager=stage_cached)
    images = next(s for s in second.sources if s.kind == "folder")
    assert images.transferred_files == 1 and images.note != "stage cache hit: source unchanged"
    assert (cache / (images.sub_path or "") / "img00.jpg").read_bytes() == b"changed"


def test_n_shards_stage_exactly_what_one_run_stages(s3_credentials: S3Credentials, dataset: str,
                                                    tmp_path: Path) -> None:
    with TransferEngine(s3_credentials) as engine:
        stage(_request(dataset), tmp_path / "one", engine=engine)
        parts = [stage(_request(dataset), tmp_path / "sharded", engine=engine, stager=stage_cached, shard=Shard(i, 3),
                       map_path=tmp_path / f"map-{i}.json") for i in range(3)]
    assert _data(tmp_path / "sharded") == _data(tmp_path / "one") and len(_data(tmp_path / "one")) == 42
    moved = [sum(s.transferred_files for s in part.sources if s.kind != "config") for part in parts]
    assert sum(moved) == 42 and all(moved)


def test_plan_stage_moves_nothing_and_matches_the_real_layout(s3_credentials: S3Credentials, dataset: str,
                                                              tmp_path: Path) -> None:
    planned = plan_stage(_request(dataset), tmp_path / "plan", environ={})  # no credentials: nothing is asked
    with TransferEngine(s3_credentials) as engine:
        real = stage(_request(dataset), tmp_path / "real", engine=engine)
    assert [(s.source, s.kind, s.sub_path, s.container_path) for s in planned.sources] == \
        [(s.source, s.kind, s.sub_path, s.container_path) for s in real.sources]
    assert sorted(os.listdir(tmp_path / "plan")) == ["config", "staging-map.json"]


def test_the_cache_resolves_a_kind_once_and_lists_a_folder_once(
        s3_credentials: S3Credentials, dataset: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the cache path the source's kind is asked of the bucket once (for its identity and for
    staging alike), a folder is listed once (the listing its identity hashes is the one the sync
    then uses), and each source is parsed once."""
    folder, file = f"s3://{dataset}/coco/images", f"s3://{dataset}/coco/annotations.json"  # auto: the bucket says
    request = _request(dataset, spec={"epochs": 1}, inputs=[{"source": folder}, {"source": file}])
    counts = count_uri_parses(monkeypatch)
    calls: Counter[str] = Counter()
    with TransferEngine(s3_credentials) as engine:
        for name in ("exists", "has_prefix", "pages"):
            def counted(*args: Any, _name: str = name, _method: Any = getattr(engine, name)) -> Any:
                calls[_name] += 1
                return _method(*args)
            monkeypatch.setattr(engine, name, counted)
        staged = stage(request, tmp_path / "cache", engine=engine, stager=stage_cached)
    assert [(s.kind, s.transferred_files) for s in staged.sources] == [("folder", 40), ("file", 1), ("config", 1)]
    assert calls == {"exists": 2, "has_prefix": 1, "pages": 1}  # HEAD each key, LIST one; list the folder once
    assert {source: counts[source] for source in (folder, file)} == {folder: 1, file: 1}
