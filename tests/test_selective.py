"""Annotation-selective download over real HTTP: every annotation format, reference rules,
missing objects in both modes, no listing, and the CLI verb."""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tao_data_io.credentials import S3Credentials
from tao_data_io.embedded.s3 import EmbeddedS3
from tao_data_io.errors import UsageError
from tao_data_io.staging.selective import MISSING_REPORT, MissingReferencesError, read_references, selective_download
from tao_data_io.transfer.client import make_s3_client
from tao_data_io.transfer.engine import TransferEngine
from tao_data_io.fs.confinement import STATE_DIR_NAME
from tao_data_io.fs.state import state_dir_for

from .helpers import run_cli, tree_digest

CLIPS = {f"clips/c{i}.mp4": f"clip-{i}".encode() for i in range(6)}


@pytest.fixture
def engine(s3_credentials: S3Credentials) -> TransferEngine:
    return TransferEngine(s3_credentials, concurrency=8)


@pytest.fixture
def dataset(s3_client, bucket: str) -> str:  # type: ignore[no-untyped-def]
    """``ds/clips/c0..c5.mp4`` plus unrelated objects under the same prefix."""
    for relative, data in CLIPS.items():
        s3_client.put_object(Bucket=bucket, Key=f"ds/{relative}", Body=data)
    for i in range(20):
        s3_client.put_object(Bucket=bucket, Key=f"ds/other/o{i}.mp4", Body=b"unreferenced")
    return bucket


def write_parquet(path: Path, columns: Mapping[str, Sequence[object]]) -> Path:
    pq.write_table(pa.table(columns), path)
    return path


def write_jsonl(path: Path, rows: Sequence[object]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_csv(path: Path, header: str, lines: list[str]) -> Path:
    path.write_text("\n".join([header, *lines]) + "\n")
    return path


ROWS = [{"video": "clips/c1.mp4", "caption": "a cat"}, {"video": "clips/c3.mp4", "caption": "a dog"},
        {"video": "clips/c1.mp4", "caption": "the cat again"}]


def rows_parquet(d: Path) -> Path:
    return write_parquet(d / "ann.parquet", {k: [r[k] for r in ROWS] for k in ROWS[0]})


def rows_jsonl_gz(d: Path) -> Path:
    (d / "ann.jsonl.gz").write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in ROWS).encode()))
    return d / "ann.jsonl.gz"


def rows_json_list(d: Path) -> Path:
    (d / "ann.json").write_text(json.dumps(ROWS))
    return d / "ann.json"


def rows_coco(d: Path) -> Path:
    (d / "coco.json").write_text(json.dumps({
        "info": {"version": 1},
        "images": [{"id": i, "video": r["video"]} for i, r in enumerate(ROWS)],
        "annotations": [{"image_id": 0, "bbox": [1, 2, 3, 4]}],
        "categories": [{"id": 1, "name": "cat"}],
    }))
    return d / "coco.json"


WRITERS: dict[str, Callable[[Path], Path]] = {
    "parquet": rows_parquet,
    "jsonl": lambda d: write_jsonl(d / "ann.jsonl", ROWS),
    "jsonl.gz": rows_jsonl_gz,
    "json list": rows_json_list,
    "coco json": rows_coco,
    "csv": lambda d: write_csv(d / "ann.csv", "caption,video",
                               [f'"{r["caption"]}, really",{r["video"]}' for r in ROWS]),
}


@pytest.mark.parametrize("kind", WRITERS)
def test_each_format_stages_exactly_the_referenced_objects(kind: str, engine: TransferEngine, dataset: str,
                                                           tmp_path: Path) -> None:
    annotation = WRITERS[kind](tmp_path)
    dest = tmp_path / "stage"
    result = selective_download(engine, str(annotation), ["video"], dataset, "ds", dest)
    assert result.ok and result.references == 2 and result.missing == []
    assert tree_digest(dest) == {r: hashlib.sha256(CLIPS[r]).hexdigest() for r in ("clips/c1.mp4", "clips/c3.mp4")}


def test_several_keys_and_list_valued_cells(engine: TransferEngine, dataset: str, tmp_path: Path) -> None:
    annotation = write_parquet(tmp_path / "ann.parquet", {
        "video": ["clips/c0.mp4", "clips/c1.mp4"],
        "frames": [["clips/c2.mp4", "clips/c3.mp4"], []],
    })
    assert read_references(annotation, ["video"]) == ["clips/c0.mp4", "clips/c1.mp4"]
    assert read_references(annotation, ["video", "frames"]) == [f"clips/c{i}.mp4" for i in range(4)]
    rows = [{"v": "clips/c4.mp4", "masks": ["clips/c5.mp4", "clips/c0.mp4"]}]
    assert read_references(write_jsonl(tmp_path / "a.jsonl", rows), ["v", "masks"]) == \
        ["clips/c0.mp4", "clips/c4.mp4", "clips/c5.mp4"]
    result = selective_download(engine, str(annotation), ["video", "frames"], dataset, "ds/", tmp_path / "d")
    assert sorted(result.summary.transferred) == [f"clips/c{i}.mp4" for i in range(4)]


def test_references_are_normalised_deduplicated_and_sorted(tmp_path: Path) -> None:
    rows = [{"v": r} for r in ("./b.mp4", "b.mp4", "a//x.mp4", "a/./x.mp4", "./a/x.mp4", "c d.mp4")]
    assert read_references(write_jsonl(tmp_path / "a.jsonl", rows), ["v"]) == ["a/x.mp4", "b.mp4", "c d.mp4"]


@pytest.mark.parametrize("reference", ["../x.mp4", "clips/../../x.mp4", "/etc/passwd", "//etc/passwd", "a\\b.mp4",
                                       "a\x01b.mp4", "clips/", ".", f"{STATE_DIR_NAME}/digests.json"])
def test_unsafe_references_are_refused_before_anything_moves(reference: str, engine: TransferEngine, dataset: str,
                                                             tmp_path: Path) -> None:
    annotation = write_jsonl(tmp_path / "ann.jsonl", [{"v": "clips/c0.mp4"}, {"v": reference}])
    with pytest.raises(UsageError) as info:
        selective_download(engine, str(annotation), ["v"], dataset, "ds", tmp_path / "d")
    assert repr(reference) in str(info.value) and "ann.jsonl, line 2, column 'v'" in str(info.value)
    assert not (tmp_path / "d").exists()


def test_missing_objects_fail_and_leave_nothing_new(engine: TransferEngine, dataset: str, tmp_path: Path) -> None:
    dest = tmp_path / "d"
    (dest / "clips").mkdir(parents=True)
    (dest / "clips" / "c0.mp4").write_bytes(b"stale copy from before")  # existed before: kept (refreshed)
    (dest / "mine.txt").write_bytes(b"not ours")
    (dest / "empty-before").mkdir()
    before = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*"))
    absent = [f"gone/g{i:02d}.mp4" for i in range(25)]
    # c1 is new in an existing directory, other/o0 is new in a new directory, new/dir/c2 is absent too.
    references = ["clips/c0.mp4", "clips/c1.mp4", "other/o0.mp4", "new/dir/c2.mp4", *absent]
    annotation = write_jsonl(tmp_path / "ann.jsonl", [{"v": r} for r in references])
    with pytest.raises(MissingReferencesError) as info:
        selective_download(engine, str(annotation), ["v"], dataset, "ds", dest)
    message = str(info.value)
    assert message.startswith("26 of 29 referenced objects do not exist") and "removed the 2 file(s)" in message
    listed = [f"ds/gone/g{i:02d}.mp4" for i in range(25)] + ["ds/new/dir/c2.mp4"]
    assert all(key in message for key in sorted(listed)[:20]) and sorted(listed)[20] not in message
    assert "(6 more)" in message and "missing 'skip'" in message
    assert info.value.missing == sorted(listed)
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*")) == before
    assert (dest / "clips" / "c0.mp4").read_bytes() == CLIPS["clips/c0.mp4"]


def test_missing_objects_into_a_fresh_directory_leave_no_directory(engine: TransferEngine, dataset: str,
                                                                   tmp_path: Path) -> None:
    annotation = write_jsonl(tmp_path / "ann.jsonl", [{"v": "clips/c0.mp4"}, {"v": "clips/nope.mp4"}])
    with pytest.raises(MissingReferencesError):
        selective_download(engine, str(annotation), ["v"], dataset, "ds", tmp_path / "fresh")
    assert not (tmp_path / "fresh").exists()


def test_missing_skip_stages_the_rest_and_writes_a_report(engine: TransferEngine, dataset: str, tmp_path: Path) -> None:
    dest = tmp_path / "d"
    annotation = write_jsonl(tmp_path / "ann.jsonl", [{"v": r} for r in ["clips/c0.mp4", "x/nope.mp4", "a.mp4"]])
    result = selective_download(engine, str(annotation), ["v"], dataset, "ds", dest, missing="skip")
    assert result.ok and result.summary.transferred == ["clips/c0.mp4"]
    assert result.missing == ["ds/a.mp4", "ds/x/nope.mp4"]
    report = state_dir_for(dest) / MISSING_REPORT
    assert result.missing_report == report and report.read_text() == "ds/a.mp4\nds/x/nope.mp4\n"
    assert not (dest / "x").exists()

    fixed = write_jsonl(tmp_path / "fixed.jsonl", [{"v": "clips/c0.mp4"}])
    again = selective_download(engine, str(fixed), ["v"], dataset, "ds", dest, missing="skip")
    assert again.missing == [] and not report.exists()  # a stale report would mislead


@pytest.mark.parametrize(("name", "content", "where"), [
    ("bad.jsonl", '{"v": "clips/c0.mp4"}\n\n{"v": "clips/c1.mp4"\n', "line 3"),
    ("num.jsonl", '{"v": "clips/c0.mp4"}\n{"v": 7}\n', "line 2"),
    ("null.jsonl", '{"v": "clips/c0.mp4"}\n{"v": null}\n', "line 2"),
    ("empty.jsonl", '{"v": "clips/c0.mp4"}\n{"v": ""}\n', "line 2"),
    ("listnum.jsonl", '{"v": ["clips/c0.mp4", 3]}\n', "line 1"),
    ("absent.jsonl", '{"v": "clips/c0.mp4"}\n{"w": "x"}\n', "line 2"),
    ("notobj.jsonl", '{"v": "clips/c0.mp4"}\n["v"]\n', "line 2"),
    ("empty.csv", "v,w\nclips/c0.mp4,1\n,2\n", "line 3"),
    ("unsafe.csv", "v,w\nclips/c0.mp4,1\nclips/c1.mp4,1\n/etc/passwd,2\n", "line 4"),
    ("rows.json", json.dumps([{"v": "a.mp4"}, {"v": {"nested": 1}}]), "$[1]"),
    ("coco.json", json.dumps({"images": [{"v": "a.mp4"}, {"id": 2}]}), "$.images[1]"),
])
def test_malformed_annotation_names_file_and_row(name: str, content: str, where: str, tmp_path: Path) -> None:
    (tmp_path / name).write_text(content)
    with pytest.raises(UsageError) as info:
        read_references(tmp_path / name, ["v"])
    assert f"{name}, {where}" in str(info.value)


def test_malformed_parquet_cells_name_the_row(tmp_path: Path) -> None:
    nulls = write_parquet(tmp_path / "n.parquet", {"v": ["a.mp4", "b.mp4", None]})
    with pytest.raises(UsageError, match=r"n\.parquet, row 3, column 'v': null"):
        read_references(nulls, ["v"])
    lists = write_parquet(tmp_path / "l.parquet", {"v": [["a.mp4"], ["b.mp4", ""]]})
    with pytest.raises(UsageError, match=r"l\.parquet, row 2, column 'v': empty value"):
        read_references(lists, ["v"])
    unsafe = write_parquet(tmp_path / "u.parquet", {"v": [["a.mp4"], ["b.mp4"], ["c.mp4", "../up.mp4"]]})
    with pytest.raises(UsageError, match=r"u\.parquet, row 3, column 'v': refusing reference '\.\./up\.mp4'"):
        read_references(unsafe, ["v"])
    numbers = write_parquet(tmp_path / "i.parquet", {"v": [1, 2]})
    with pytest.raises(UsageError, match=r"i\.parquet: column 'v' has type int64"):
        read_references(numbers, ["v"])


def test_unknown_extension_needs_format(tmp_path: Path) -> None:
    annotation = write_jsonl(tmp_path / "ann.txt", [{"v": "a.mp4"}])
    with pytest.raises(UsageError) as info:
        read_references(annotation, ["v"])
    assert "'ann.txt'" in str(info.value) and "set format to one of parquet" in str(info.value)
    assert read_references(annotation, ["v"], "jsonl") == ["a.mp4"]


@pytest.mark.parametrize("kind", ["parquet", "jsonl", "coco json", "csv"])
def test_missing_column_names_column_file_and_existing_columns(kind: str, tmp_path: Path) -> None:
    annotation = WRITERS[kind](tmp_path)
    with pytest.raises(UsageError) as info:
        read_references(annotation, ["video", "path"])
    message = str(info.value)
    assert f"{annotation.name}: no column 'path'" in message and "'video'" in message
    assert "'caption'" in message or "'id'" in message


def test_json_without_records_says_what_shape_is_expected(tmp_path: Path) -> None:
    (tmp_path / "paths.json").write_text(json.dumps(["a.mp4", "b.mp4"]))
    with pytest.raises(UsageError, match=r"paths\.json: holds no list of records"):
        read_references(tmp_path / "paths.json", ["v"])


def test_annotation_from_s3(engine: TransferEngine, s3_client, dataset: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    body = write_parquet(tmp_path / "local.parquet", {"video": ["clips/c2.mp4", "clips/c5.mp4"]}).read_bytes()
    s3_client.put_object(Bucket=dataset, Key="ann/train.parquet", Body=body)
    result = selective_download(engine, f"s3://{dataset}/ann/train.parquet", ["video"], dataset, "ds", tmp_path / "d")
    assert sorted(result.summary.transferred) == ["clips/c2.mp4", "clips/c5.mp4"]  # in the order they landed
    with pytest.raises(UsageError, match="does not exist"):
        selective_download(engine, f"s3://{dataset}/ann/nope.parquet", ["video"], dataset, "ds", tmp_path / "d")
    s3_client.put_object(Bucket=dataset, Key="ann/bad.jsonl", Body=b'{"video": "../up.mp4"}\n')
    with pytest.raises(UsageError,
                       match=f"s3://{dataset}/ann/bad.jsonl, line 1, column 'video': refusing reference '../up.mp4'"):
        selective_download(engine, f"s3://{dataset}/ann/bad.jsonl", ["video"], dataset, "ds", tmp_path / "d")


def test_no_listing_and_a_rerun_transfers_nothing(s3_credentials: S3Credentials, dataset: str, tmp_path: Path) -> None:
    engine = TransferEngine(s3_credentials, concurrency=8)
    client = make_s3_client(s3_credentials)
    operations: list[str] = []
    client.meta.events.register("before-send.s3", lambda event_name, **_: operations.append(event_name.split(".")[-1]))
    engine.client = client  # the engine's control plane goes through our counting client
    annotation = write_jsonl(tmp_path / "ann.jsonl", [{"v": f"clips/c{i}.mp4"} for i in range(4)])

    first = selective_download(engine, str(annotation), ["v"], dataset, "ds", tmp_path / "d")
    assert first.summary.transferred_files == 4
    assert operations == []  # fresh destination: straight to GET (s5cmd), no listing, no HEAD

    again = selective_download(engine, str(annotation), ["v"], dataset, "ds", tmp_path / "d")
    assert (again.summary.transferred_files, again.summary.unchanged_files) == (0, 4)
    assert operations == ["HeadObject"] * 4  # one HEAD per reference, never a listing


def test_cli(s3_server: EmbeddedS3, dataset: str, tmp_path: Path) -> None:
    annotation = write_jsonl(tmp_path / "ann.jsonl", [{"v": "clips/c0.mp4", "m": "clips/c1.mp4"},
                                                      {"v": "./clips/c2.mp4", "m": "clips/c1.mp4"}])
    common = ["selective-download", "--annotation", str(annotation), "--bucket", dataset, "--src-prefix", "ds"]
    done = run_cli(*common, "--key", "v,m", "--dest", str(tmp_path / "a"), "--json", env=s3_server.env())
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["references"] == 3
    assert sorted(summary["transferred"]) == ["clips/c0.mp4", "clips/c1.mp4", "clips/c2.mp4"]
    repeated = run_cli(*common, "--key", "v", "--key", "m", "--dest", str(tmp_path / "a"), env=s3_server.env())
    assert repeated.returncode == 0
    assert "3 references in v, m" in repeated.stdout and "transferred 0 files" in repeated.stdout

    bad = run_cli(*common, "--key", "nope", "--dest", str(tmp_path / "b"), env=s3_server.env())
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and "no column 'nope'" in bad.stderr

    missing = write_jsonl(tmp_path / "missing.jsonl", [{"v": "clips/zz.mp4"}])
    failed = run_cli(*common[:2], str(missing), *common[3:], "--key", "v", "--dest", str(tmp_path / "c"),
                     env=s3_server.env())
    assert failed.returncode == 1 and "ds/clips/zz.mp4" in failed.stderr and not (tmp_path / "c").exists()
    skipped = run_cli(*common[:2], str(missing), *common[3:], "--key", "v", "--dest", str(tmp_path / "c"),
                      "--missing", "skip", env=s3_server.env())
    assert skipped.returncode == 0 and MISSING_REPORT in skipped.stdout


def test_a_blank_row_in_a_one_column_csv_is_malformed(tmp_path: Path) -> None:
    """pandas skips blank lines by default, which silently dropped a row the module calls malformed."""
    annotation = write_csv(tmp_path / "ann.csv", "video", ["a.mp4", "", "b.mp4"])
    with pytest.raises(UsageError, match="line 3"):
        read_references(annotation, ["video"])


# ----------------------------------------------------------------------------- the undo stays inside
def test_selective_undo_never_removes_a_file_outside_the_destination(
        s3_credentials: Any, s3_client: Any, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The undo of a selective download whose annotation references a missing object removes this
    run's new files through directory descriptors: a directory inside the destination swapped for a
    symlink before the undo never redirects a removal outside it."""
    from tao_data_io.staging.selective import MissingReferencesError, selective_download
    from tao_data_io.transfer.engine import TransferEngine

    s3_client.put_object(Bucket=bucket, Key="ds/sub/a.mp4", Body=b"clip")
    annotation = tmp_path / "ann.jsonl"
    annotation.write_text('{"video": "sub/a.mp4"}\n{"video": "sub/missing.mp4"}\n')
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "a.mp4").write_bytes(b"someone else's file")
    dest = tmp_path / "dest"
    engine = TransferEngine(s3_credentials, concurrency=4)
    real = engine.download_keys

    def then_swap(*args: Any, **kwargs: Any) -> Any:
        summary = real(*args, **kwargs)
        shutil.rmtree(dest / "sub")          # a concurrent writer of dest swaps the directory
        (dest / "sub").symlink_to(victim)    # for a symlink before the undo runs
        return summary

    monkeypatch.setattr(engine, "download_keys", then_swap)
    with pytest.raises(MissingReferencesError):
        selective_download(engine, str(annotation), ["video"], bucket, "ds", dest)
    assert (victim / "a.mp4").exists(), "the undo followed a symlink and deleted a file outside the destination"
