"""`stage`: every input kind from the embedded S3 server (and a fake Hub), the staging map, reruns
that move nothing, and air-gapped requests that never open a socket."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tao_data_io.credentials import S3Credentials
from tao_data_io.embedded.s3 import EmbeddedS3
from tao_data_io.errors import UsageError
from tao_data_io.request import JobRequest
from tao_data_io.staging.stage import stage
from tao_data_io.staging.stage_map import STAGING_MAP_NAME, read_staging_map
from tao_data_io.transfer.engine import TransferEngine

from . import helpers
from .fake_registries import FakeRegistries
from .helpers import count_uri_parses, run_cli, tar_gz


@pytest.fixture
def populated(s3_client, bucket: str) -> str:  # type: ignore[no-untyped-def]
    for i in range(5):
        s3_client.put_object(Bucket=bucket, Key=f"coco/images/img{i}.jpg", Body=f"image{i}".encode())
    s3_client.put_object(Bucket=bucket, Key="coco/annotations.json", Body=b'{"images": []}')
    for name in ("a.mp4", "b.mp4", "unused.mp4"):
        s3_client.put_object(Bucket=bucket, Key=f"clips/{name}", Body=name.encode())
    s3_client.put_object(Bucket=bucket, Key="clips/train.jsonl", Body=b'{"video": "a.mp4"}\n{"video": "./b.mp4"}\n')
    s3_client.put_object(Bucket=bucket, Key="archives/calib.tar.gz",
                         Body=tar_gz({"calib/table.bin": b"table", "calib/info.txt": b"info"}))
    return bucket


def _request(bucket: str, **extra: Any) -> JobRequest:
    return helpers.req({
        "schema_version": "1", "job_id": "job-stage-1", "image": "tao:6", "mode": "config", "config_format": "yaml",
        "command": "dino train -e {config_path}",
        "spec": {"dataset": {"images": f"s3://{bucket}/coco/images/", "ann": f"s3://{bucket}/coco/annotations.json",
                             "again": [[f"s3://{bucket}/coco/images/"]]}},
        "inputs": _inputs(bucket),
    }, **extra)


def _inputs(bucket: str) -> list[dict[str, Any]]:
    return [
        {"source": f"s3://{bucket}/clips/", "kind": "selective", "annotation": f"s3://{bucket}/clips/train.jsonl",
         "keys": ["video"], "target": "/data/clips"},
        {"source": f"s3://{bucket}/archives/calib.tar.gz", "kind": "archive", "strip_components": 1,
         "target": "/data/calib"},
    ]


def test_stage_every_s3_kind_writes_the_map_and_the_config(s3_credentials: S3Credentials, populated: str,
                                                           tmp_path: Path) -> None:
    engine = TransferEngine(s3_credentials)
    staging_map = stage(_request(populated), tmp_path / "w", engine=engine)

    by_source = {entry.source: entry for entry in staging_map.sources}
    images = by_source[f"s3://{populated}/coco/images/"]
    assert (images.kind, images.files, images.container_path) == (
        "folder", 5, f"/tao-inputs/s3/{populated}/coco/images")
    assert (tmp_path / "w" / images.sub_path / "img3.jpg").read_bytes() == b"image3"
    assert by_source[f"s3://{populated}/coco/annotations.json"].kind == "file"
    clips = by_source[f"s3://{populated}/clips/"]
    assert (clips.kind, clips.files, clips.container_path) == ("selective", 2, "/data/clips")
    assert clips.sub_path == f"selective/s3/{populated}/clips"
    assert sorted(p.name for p in (tmp_path / "w" / clips.sub_path).glob("*.mp4")) == ["a.mp4", "b.mp4"]
    calib = by_source[f"s3://{populated}/archives/calib.tar.gz"]
    assert calib.kind == "archive" and (tmp_path / "w" / calib.sub_path / "table.bin").read_bytes() == b"table"
    config = next(entry for entry in staging_map.sources if entry.kind == "config")
    text = Path(config.local_path).read_text()
    assert f"/tao-inputs/s3/{populated}/coco/images" in text and "s3://" not in text
    assert len(staging_map.sources) == 5  # the image folder appears twice in the spec, once here

    on_disk = read_staging_map(tmp_path / "w" / STAGING_MAP_NAME)
    assert on_disk == staging_map and on_disk.schema_version == "1"


def test_a_staging_run_parses_each_source_once(s3_credentials: S3Credentials, populated: str,
                                               fake_hub: tuple[FakeRegistries, dict[str, str]], tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan parses every source once — each spelling of it once — and every later step (the kind
    resolved from the bucket, each input staged, the config rewritten) reads the parsed URI."""
    fake, env = fake_hub
    fake.add_hub_repo("nvidia/tiny", {"main": {"weights/model.pth": b"w" * 10}})
    images = f"s3://{populated}/coco/images/"
    request = _request(populated, spec={"images": images, "same": images[:-1], "again": [images],
                                        "ann": f"s3://{populated}/coco/annotations.json",
                                        "model": "hf://nvidia/tiny/weights/model.pth"},
                       inputs=[*_inputs(populated), {"source": str(tmp_path), "target": "/data/local"}])
    counts = count_uri_parses(monkeypatch)

    staging_map = stage(request, tmp_path / "w", engine=TransferEngine(s3_credentials), environ=env)

    sources = [images, images[:-1], f"s3://{populated}/coco/annotations.json", "hf://nvidia/tiny/weights/model.pth",
               f"s3://{populated}/clips/", f"s3://{populated}/archives/calib.tar.gz"]
    assert {source: counts[source] for source in sources} == dict.fromkeys(sources, 1)
    assert max(counts.values()) == 1, counts  # nor is an annotation or a bucket parsed twice
    assert [entry.kind for entry in staging_map.sources] == ["selective", "archive", "folder", "file", "model",
                                                              "pre-positioned", "config"]


def test_rerun_moves_nothing(s3_credentials: S3Credentials, populated: str, tmp_path: Path) -> None:
    engine = TransferEngine(s3_credentials)
    stage(_request(populated), tmp_path / "w", engine=engine)
    again = stage(_request(populated), tmp_path / "w", engine=engine)
    moved = {entry.kind: (entry.transferred_files, entry.unchanged_files) for entry in again.sources}
    assert moved == {"folder": (0, 5), "file": (0, 1), "selective": (0, 2), "archive": (0, 2), "config": (0, 1)}
    assert {entry.kind: entry.note for entry in again.sources}["archive"] == "up to date"


def test_a_prefix_written_two_ways_is_one_source_and_collisions_are_refused(s3_credentials: S3Credentials,
                                                                            populated: str, tmp_path: Path) -> None:
    req = _request(populated, spec={"a": f"s3://{populated}/coco/images/", "b": f"s3://{populated}/coco/images"},
                   inputs=[])
    staging_map = stage(req, tmp_path / "w", engine=TransferEngine(s3_credentials))
    assert [entry.kind for entry in staging_map.sources] == ["folder", "config"]
    config = next(entry for entry in staging_map.sources if entry.kind == "config")
    assert Path(config.local_path).read_text().count(f"/tao-inputs/s3/{populated}/coco/images") == 2
    # An archive beside a plain copy of the same prefix is staged apart, not nested into it.
    both = _request(populated, spec={"a": f"s3://{populated}/archives/"},
                    inputs=[{"source": f"s3://{populated}/archives/calib.tar.gz", "kind": "archive"}])
    staged = stage(both, tmp_path / "w2", engine=TransferEngine(s3_credentials))
    assert sorted(entry.sub_path or "" for entry in staged.sources if entry.kind != "config") == [
        f"archive/s3/{populated}/archives/calib.tar.gz", f"s3/{populated}/archives"]


def test_missing_input_is_a_clear_error(s3_credentials: S3Credentials, populated: str, tmp_path: Path) -> None:
    req = _request(populated, spec={"x": f"s3://{populated}/nothing/here"}, inputs=[])
    with pytest.raises(UsageError, match="does not exist"):
        stage(req, tmp_path / "w", engine=TransferEngine(s3_credentials))


def test_hf_model_in_spec_is_pulled_and_rewritten(fake_hub: tuple[FakeRegistries, dict[str, str]],
                                                  tmp_path: Path) -> None:
    fake, env = fake_hub
    fake.add_hub_repo("nvidia/tiny", {"main": {"weights/model.pth": b"w" * 100, "README.md": b"hi"}})
    req = JobRequest.model_validate({
        "schema_version": "1", "image": "tao:6", "mode": "config", "config_format": "json",
        "command": "x -e {config_path}", "spec": {"model": {"pretrained": "hf://nvidia/tiny/weights/model.pth"}}})
    staging_map = stage(req, tmp_path / "w", environ=env)
    model = next(entry for entry in staging_map.sources if entry.kind == "model")
    assert model.container_path == "/tao-inputs/hf/nvidia/tiny/main/weights/model.pth"
    assert model.sub_path == "hf/nvidia/tiny/main/weights/model.pth"
    assert Path(model.local_path).read_bytes() == b"w" * 100
    config = next(entry for entry in staging_map.sources if entry.kind == "config")
    spec = json.loads(Path(config.local_path).read_text())
    assert spec["model"]["pretrained"] == "/tao-inputs/hf/nvidia/tiny/main/weights/model.pth"


@pytest.fixture
def fake_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FakeRegistries, dict[str, str]]]:
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf-home" / "hub"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with FakeRegistries() as fake:
        yield fake, {"HF_ENDPOINT": fake.url, "HF_HOME": str(tmp_path / "hf-home")}


# ----------------------------------------------------------------------------- air gap
_connections: list[Any] = []
_watching = False


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _watching and event in ("socket.connect", "socket.getaddrinfo", "socket.bind"):
        _connections.append((event, args))


sys.addaudithook(_audit)


def test_air_gapped_request_with_remote_uris_fails_fast_listing_all_without_a_socket(tmp_path: Path) -> None:
    global _watching
    req = JobRequest.model_validate({
        "schema_version": "1", "image": "tao:6", "mode": "config", "config_format": "json",
        "command": "x -e {config_path}", "storage": {"air_gapped": True},
        "spec": {"a": "s3://data-bucket/train/", "b": "hf://nvidia/tiny", "c": "/lustre/here"},
        "inputs": [{"source": "ngc://nvidia/tao/resnet:18"}]})
    _connections.clear()
    _watching = True
    try:
        with pytest.raises(UsageError) as info:
            stage(req, tmp_path / "w", environ={})
    finally:
        _watching = False
    message = str(info.value)
    for uri in ("s3://data-bucket/train/", "hf://nvidia/tiny", "ngc://nvidia/tao/resnet:18"):
        assert uri in message
    assert _connections == []
    assert not (tmp_path / "w").exists()


def test_air_gapped_with_local_inputs_stages_without_network(tmp_path: Path) -> None:
    global _watching
    data = tmp_path / "lustre" / "datasets"
    data.mkdir(parents=True)
    (data / "a.jpg").write_bytes(b"x" * 10)
    req = JobRequest.model_validate({
        "schema_version": "1", "image": "tao:6", "mode": "config", "config_format": "json",
        "command": "x -e {config_path}", "storage": {"air_gapped": True, "tier": "A"},
        "spec": {"train": str(data)}, "inputs": [{"source": str(data)}]})
    _connections.clear()
    _watching = True
    try:
        staging_map = stage(req, tmp_path / "w", environ={})
    finally:
        _watching = False
    assert _connections == []
    kinds = {entry.kind: entry for entry in staging_map.sources}
    assert kinds["pre-positioned"].files is None and kinds["pre-positioned"].sub_path is None
    assert "config" in kinds


def test_stage_cli(s3_server: EmbeddedS3, populated: str, tmp_path: Path) -> None:
    path = tmp_path / "req.yaml"
    path.write_text(yaml.safe_dump(_request(populated).model_dump(exclude_none=True)))
    result = run_cli("stage", "--request", str(path), "--staging-dir", str(tmp_path / "w"), env=s3_server.env())
    assert result.returncode == 0, result.stderr
    assert "staging map:" in result.stdout and (tmp_path / "w" / STAGING_MAP_NAME).exists()
    bad = run_cli("stage", "--request", str(tmp_path / "nope.yaml"), "--staging-dir", str(tmp_path / "w"), env={})
    assert bad.returncode == 2 and "nope.yaml" in bad.stderr


def test_hf_revision_with_a_slash_is_pulled_where_the_config_points(fake_hub: tuple[FakeRegistries, dict[str, str]],
                                                                    tmp_path: Path) -> None:
    fake, env = fake_hub
    fake.add_hub_repo("org/repo", {"refs/pr/3": {"onnx/model.onnx": b"o" * 10, "README.md": b"r"}})
    uri = "hf://org/repo@refs%2Fpr%2F3/onnx"
    req = JobRequest.model_validate({
        "schema_version": "1", "image": "tao:6", "mode": "config", "config_format": "json",
        "command": "x -e {config_path}", "spec": {"model": uri}})
    staging_map = stage(req, tmp_path / "w", environ=env)
    model = next(entry for entry in staging_map.sources if entry.kind == "model")
    assert model.sub_path == "hf/org/repo/refs/pr/3/onnx"
    assert (tmp_path / "w" / model.sub_path / "model.onnx").read_bytes() == b"o" * 10
    config = next(entry for entry in staging_map.sources if entry.kind == "config")
    assert json.loads(Path(str(config.local_path)).read_text())["model"] == f"/tao-inputs/{model.sub_path}"


def test_pre_positioned_inputs_are_recorded_without_being_touched(tmp_path: Path) -> None:
    """On a worker that submits to a cluster, a PVC path does not exist; staging must not look."""
    req = JobRequest.model_validate({
        "schema_version": "1", "image": "tao:6", "mode": "args", "command": "train", "args": [],
        "inputs": [{"source": "/pvc/datasets/coco-that-is-not-here", "target": "/data/coco"}],
        "mounts": [{"source": "/pvc/also-not-here", "target": "/data/extra"}]})
    staging_map = stage(req, tmp_path / "w", environ={})
    (entry,) = staging_map.sources
    assert (entry.kind, entry.container_path, entry.local_path, entry.files) == (
        "pre-positioned", "/data/coco", None, None)


def test_an_empty_s3_folder_is_an_error_unless_allowed(s3_credentials: S3Credentials, populated: str,
                                                       tmp_path: Path) -> None:
    empty = {"source": f"s3://{populated}/nothing-here/", "target": "/data/empty"}
    request = _request(populated, spec={}, inputs=[empty])
    with pytest.raises(UsageError, match="inputs\\[0\\].*holds no object.*allow_empty"):
        stage(request, tmp_path / "w", engine=TransferEngine(s3_credentials))
    allowed = _request(populated, spec={}, inputs=[{**empty, "allow_empty": True}])
    staged = stage(allowed, tmp_path / "w", engine=TransferEngine(s3_credentials))
    assert [(s.kind, s.files) for s in staged.sources if s.kind != "config"] == [("folder", 0)]


def test_an_allowed_empty_folder_is_staged_as_an_empty_directory_the_job_can_mount(
        s3_credentials: S3Credentials, populated: str, tmp_path: Path) -> None:
    """``allow_empty: true`` on a prefix that holds nothing: the job still mounts its target, so
    staging leaves an empty directory there (the launch refused the job, "not on this host")."""
    empty = {"source": f"s3://{populated}/nothing-here/", "target": "/data/empty", "allow_empty": True}
    staged = stage(_request(populated, spec={}, inputs=[empty]), tmp_path / "w", engine=TransferEngine(s3_credentials))
    (folder,) = [source for source in staged.sources if source.kind == "folder"]
    assert folder.local_path is not None and Path(folder.local_path).is_dir()
    assert list(Path(folder.local_path).iterdir()) == []


def test_a_staging_map_that_calls_its_directory_workdir_still_reads(tmp_path: Path) -> None:
    """A map published before its directory was called ``staging_dir`` (``workdir``) is what a
    job staged then finds on resume: it reads, and is written back under the settled name."""
    old = {"schema_version": "1", "job_id": "job-1", "workdir": str(tmp_path), "inputs_root": "/tao-inputs",
           "sources": []}
    (tmp_path / STAGING_MAP_NAME).write_text(json.dumps(old), encoding="utf-8")
    staging_map = read_staging_map(tmp_path / STAGING_MAP_NAME)
    assert staging_map.staging_dir == str(tmp_path)
    assert "workdir" not in staging_map.to_dict() and staging_map.to_dict()["staging_dir"] == str(tmp_path)
