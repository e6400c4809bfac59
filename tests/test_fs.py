"""The filesystem primitives every writer shares: atomic publish, locks, temp names, digests — and
the state each writer keeps beside a destination, never inside it (``fs.state_dir_for``): a dataset
loader that treats every sub-directory as a class must see exactly the data."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tao_data_io.credentials import S3Credentials
from tao_data_io.fs.atomic import atomic_write
from tao_data_io.fs.confinement import NAME_MAX_BYTES, is_within
from tao_data_io.fs.digest import file_digest
from tao_data_io.fs.locks import file_lock
from tao_data_io.fs.state import state_dir_for
from tao_data_io.fs.temp import lock_tag, remove_stale_temps, temp_name, temp_path_for
from tao_data_io.fs.tree import DestinationTree
from tao_data_io.request import JobRequest
from tao_data_io.staging.archive import extract_archive
from tao_data_io.staging.config import materialize_config
from tao_data_io.staging.selective import selective_download
from tao_data_io.transfer.engine import TransferEngine
from tao_data_io.transfer.options import TransferOptions

REQUEST = {"schema_version": "1", "image": "img", "mode": "config", "command": "train -e {config_path}",
           "config_format": "yaml", "spec": {"train": {"epochs": 3}}}


def test_materialize_config_converges_after_a_killed_run_left_its_temp_file(tmp_path: Path) -> None:
    """A killed run in a container (same PID next time) used to leave a temp name that made every
    rerun fail with FileExistsError."""
    request = JobRequest.model_validate(REQUEST)
    first = materialize_config(request, tmp_path)
    published = first.path.read_bytes()
    first.path.unlink()
    temp_path_for(first.path).write_bytes(b"half")
    (tmp_path / f".{first.path.name}.{os.getpid()}.tmp").write_bytes(b"half")  # the old naming, as a kill left it
    again = materialize_config(request, tmp_path)
    assert again.created and again.path == first.path and again.path.read_bytes() == published
    assert again.path.stat().st_mode & 0o777 == 0o644  # the job reads it as its own user


def test_materialize_config_from_many_threads_publishes_one_file(tmp_path: Path) -> None:
    request = JobRequest.model_validate(REQUEST)
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: materialize_config(request, tmp_path), range(32)))
    assert sum(result.created for result in results) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [results[0].path.name]


def test_atomic_write_without_replace_keeps_the_existing_file(tmp_path: Path) -> None:
    target = tmp_path / "a"
    assert atomic_write(target, b"one", replace=False)
    assert not atomic_write(target, b"two", replace=False)
    assert target.read_bytes() == b"one"
    assert atomic_write(target, b"three")
    assert target.read_bytes() == b"three" and os.listdir(tmp_path) == ["a"]


def test_temp_names_fit_a_name_of_255_utf8_bytes(tmp_path: Path) -> None:
    name = "é" * 127  # 254 bytes, 127 characters
    tag = lock_tag(tmp_path / "lock")
    temp = temp_path_for(tmp_path / name, tag)
    assert len(temp.name.encode()) <= NAME_MAX_BYTES
    temp.write_bytes(b"x")  # the filesystem accepts it
    remove_stale_temps(tmp_path / name, tag)
    assert not temp.exists()


def test_temp_names_never_repeat_across_threads_and_forks(tmp_path: Path) -> None:
    """Tokens are read from the OS a batch at a time: threads must not share one, and a forked
    child (a stage's s5cmd, a Prefect worker's subprocess) must not replay its parent's batch."""
    with ThreadPoolExecutor(8) as pool:
        names = list(pool.map(lambda _: temp_name("a.bin"), range(4000)))  # past several batches
    assert len(set(names)) == len(names)
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the child's next names, to the parent
        os.write(write, "\n".join(temp_name("a.bin") for _ in range(100)).encode())
        os._exit(0)
    os.close(write)
    parent = [temp_name("a.bin") for _ in range(100)]
    with os.fdopen(read) as pipe:
        forked = pipe.read().split("\n")
    os.waitpid(child, 0)
    assert len(forked) == 100 and not set(forked) & set(parent) and not set(forked) & set(names)


def test_a_closed_destination_tree_refuses_writes_instead_of_reopening_its_root(tmp_path: Path) -> None:
    """Its run ended and released the destination's lock: a straggler's write must fail, not
    quietly open the root again (and leak that descriptor)."""
    tree = DestinationTree(tmp_path / "dest")
    temp, fd = tree.create_temp("a/one.bin")
    os.close(fd)
    temp.publish()
    tree.close()
    with pytest.raises(ValueError, match="was closed"):
        tree.create_temp("b/two.bin")
    assert sorted(p.name for p in (tmp_path / "dest").rglob("*")) == ["a", "one.bin"]


def test_remove_stale_temps_spares_other_names_and_other_owners(tmp_path: Path) -> None:
    """Only the holder of the lock a temp file was written under can know it is abandoned."""
    mine, other = lock_tag(tmp_path / "lock"), lock_tag(tmp_path / "sub" / "lock")
    killed, theirs = temp_path_for(tmp_path / "a.bin", mine), temp_path_for(tmp_path / "b.bin", mine)
    in_flight = temp_path_for(tmp_path / "a.bin", other)
    for path in (killed, theirs, in_flight, tmp_path / "a.bin.keep"):
        path.write_bytes(b"1")
    remove_stale_temps(tmp_path / "a.bin", mine)
    assert not killed.exists() and theirs.exists() and in_flight.exists() and (tmp_path / "a.bin.keep").exists()


def test_file_lock_excludes_a_second_holder(tmp_path: Path) -> None:
    lock = tmp_path / "l"
    with file_lock(lock) as held:
        assert held
        seen: list[bool] = []
        thread = threading.Thread(target=lambda: seen.append(file_lock(lock, wait=False).__enter__()))
        thread.start()
        thread.join()
        assert seen == [False]
    with file_lock(lock, wait=False) as again:
        assert again


@pytest.mark.parametrize("algorithm,expected", [
    ("md5", hashlib.md5(b"hello").hexdigest()),
    ("sha256", hashlib.sha256(b"hello").hexdigest()),
    ("git-blob-sha1", hashlib.sha1(b"blob 5\0hello").hexdigest()),
])
def test_file_digest(tmp_path: Path, algorithm: str, expected: str) -> None:
    (tmp_path / "f").write_bytes(b"hello")
    assert file_digest(tmp_path / "f", algorithm) == expected


def test_is_within_resolves_symlinks(tmp_path: Path) -> None:
    (tmp_path / "root").mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "root" / "link").symlink_to(tmp_path / "outside")
    assert is_within(tmp_path / "root" / "a", tmp_path / "root")
    assert is_within(tmp_path / "root", tmp_path / "root")
    assert not is_within(tmp_path / "root" / "link" / "x", tmp_path / "root")
    assert not is_within(tmp_path / "rootx", tmp_path / "root")


# ----------------------------------------------------------------------------- nothing of ours inside a destination
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
    assert (state_dir_for(dest) / "digests.sqlite3").exists()


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
