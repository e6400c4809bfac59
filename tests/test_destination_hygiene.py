"""Nothing of ours inside a destination tree: a dataset loader that treats every sub-directory as a
class must see exactly the objects (issue: hardening)."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path
from typing import Any

from tao_data_io.credentials import S3Credentials
from tao_data_io.fs import state_dir_for
from tao_data_io.staging.archive import extract_archive
from tao_data_io.staging.selective import selective_download
from tao_data_io.transfer.engine import TransferEngine, TransferOptions


def everything(root: Path) -> set[str]:
    found = set()
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            found.add((Path(dirpath) / name).relative_to(root).as_posix())
    return found


def test_a_synced_destination_holds_exactly_the_objects(s3_credentials: S3Credentials, s3_client: Any, bucket: str,
                                                        tmp_path: Path) -> None:
    for key in ("ds/cat/1.jpg", "ds/dog/2.jpg"):
        s3_client.put_object(Bucket=bucket, Key=key, Body=b"x")
    dest = tmp_path / "train"
    with TransferEngine(s3_credentials) as engine:
        engine.sync(f"s3://{bucket}/ds/", str(dest))
        engine.sync(f"s3://{bucket}/ds/", str(dest))
    assert everything(dest) == {"cat", "dog", "cat/1.jpg", "dog/2.jpg"}
    assert (state_dir_for(dest) / "digests.json").exists()


def test_an_extracted_tree_holds_exactly_the_members(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("cls/a.txt")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"a"))
    (tmp_path / "a.tar").write_bytes(buffer.getvalue())
    dest = tmp_path / "out"
    assert extract_archive(str(tmp_path / "a.tar"), dest).extracted
    assert everything(dest) == {"cls", "cls/a.txt"}
    assert not extract_archive(str(tmp_path / "a.tar"), dest).extracted  # the marker beside it still guards


def test_selective_missing_report_lives_beside_the_destination(s3_credentials: S3Credentials, s3_client: Any,
                                                               bucket: str, tmp_path: Path) -> None:
    s3_client.put_object(Bucket=bucket, Key="clips/a.mp4", Body=b"a")
    annotation = tmp_path / "ann.csv"
    annotation.write_text("video\na.mp4\ngone.mp4\n")
    dest = tmp_path / "clips"
    with TransferEngine(s3_credentials) as engine:
        result = selective_download(engine, str(annotation), ["video"], bucket, "clips", dest, missing="skip",
                                    options=TransferOptions())
    assert everything(dest) == {"a.mp4"}
    assert result.missing_report is not None and not str(result.missing_report).startswith(str(dest) + "/")
