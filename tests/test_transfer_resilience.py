"""What a streamed engine must still get right at its edges: descriptors and threads released,
what a job puts at a download's name replaced and never read, the results budget never passed,
the digest cache never failing a run (shared, locked or damaged), every name a selective undo
needs, and progress that finishes."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tao_data_io.credentials import S3Credentials
from tao_data_io.reporting import Progress
from tao_data_io.transfer import digests as digests_module
from tao_data_io.transfer import summary as summary_module
from tao_data_io.transfer.digests import DigestStore
from tao_data_io.transfer.engine import TransferEngine
from tao_data_io.transfer.options import TransferOptions
from tao_data_io.transfer.local_walk import LocalFile
from tao_data_io.uris import S3Url

from .helpers import write_tree


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_dry_runs_leave_no_descriptor_open(s3_credentials: S3Credentials, s3_client: Any, bucket: str,
                                           tmp_path: Path) -> None:
    for index in range(30):
        s3_client.put_object(Bucket=bucket, Key=f"p/d{index}/x", Body=b"x")
    with TransferEngine(s3_credentials) as engine:
        engine.sync(f"s3://{bucket}/p/", str(tmp_path / "d"))
        before = open_descriptors()
        for _ in range(3):
            assert engine.sync(f"s3://{bucket}/p/", str(tmp_path / "d"), TransferOptions(dry_run=True)).ok
        assert open_descriptors() == before


_TEMPS = textwrap.dedent("""
    import resource, sys
    from pathlib import Path
    from tao_data_io.transfer.local_walk import temp_leftovers
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    print(len(temp_leftovers(Path(sys.argv[1]))))
""")


def test_killed_temp_files_are_found_below_more_directories_than_descriptors_allow(tmp_path: Path) -> None:
    """One descriptor per level at a time: 300 sibling directories under a limit of 64 descriptors."""
    from tao_data_io.fs.temp import temp_name

    for index in range(300):
        write_tree(tmp_path / "dest", {f"d{index:03d}/{temp_name('x.bin', 'killed')}": b"partial"})
    found = subprocess.run([sys.executable, "-c", _TEMPS, str(tmp_path / "dest")], capture_output=True, text=True,
                           check=True)
    assert found.stdout.strip() == "300"


@pytest.mark.parametrize("what", ["symlink", "fifo"])
def test_what_a_job_leaves_at_a_downloads_name_is_replaced_never_read(
        s3_credentials: S3Credentials, s3_client: Any, bucket: str, tmp_path: Path, what: str) -> None:
    """A symlink (to a file outside) or a FIFO where an object lands: each way of downloading
    replaces it with the object, reads nothing through it, and the other keys arrive too."""
    s3_client.put_object(Bucket=bucket, Key="p/a.bin", Body=b"")
    s3_client.put_object(Bucket=bucket, Key="p/b.bin", Body=b"bee")
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"")
    for way in ("sync", "cp", "keys"):
        dest = tmp_path / way
        dest.mkdir()
        if what == "symlink":
            (dest / "a.bin").symlink_to(outside)
        else:
            os.mkfifo(dest / "a.bin")
        with TransferEngine(s3_credentials) as engine:
            if way == "sync":
                summary = engine.sync(f"s3://{bucket}/p/", str(dest))
            elif way == "cp":
                summary = engine.copy(f"s3://{bucket}/p/a.bin", str(dest / "a.bin"))
                engine.copy(f"s3://{bucket}/p/b.bin", str(dest / "b.bin"))
            else:
                summary = engine.download_keys(bucket, [("p/a.bin", "a.bin"), ("p/b.bin", "b.bin")], dest,
                                               TransferOptions())
        assert summary.ok, (way, summary.failed)
        assert (dest / "a.bin").is_file() and not (dest / "a.bin").is_symlink()
        assert (dest / "b.bin").read_bytes() == b"bee"
    assert outside.read_bytes() == b""


def test_results_that_grow_while_they_are_counted_never_pass_the_budget(
        s3_credentials: S3Credentials, s3_client: Any, bucket: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    source = tmp_path / "results"
    write_tree(source, {"small.txt": b"s" * 100})
    counted = TransferEngine._within_budget

    def count_then_grow(self: TransferEngine, *args: Any) -> None:
        counted(self, *args)
        (source / "late.bin").write_bytes(b"L" * 200_000)  # the job writes between the two walks

    monkeypatch.setattr(TransferEngine, "_within_budget", count_then_grow)
    with TransferEngine(s3_credentials) as engine:
        summary = engine.upload_directory(source, S3Url(bucket, "r/"),
                                          TransferOptions(budget=(1000, "outputs.results_limit 1000")))
    assert [f.name for f in summary.failed] == ["late.bin"] and "outputs.results_limit" in summary.failed[0].reason
    stored = sum(o["Size"] for o in s3_client.list_objects_v2(Bucket=bucket, Prefix="r/").get("Contents", []))
    assert stored <= 1000


def local(index: int) -> LocalFile:
    return LocalFile(f"f{index}", Path("/"), f"f{index}", 1, index, index, index)


def test_a_digest_cache_another_writer_holds_only_costs_a_rehash(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Two uploads of one source share its cache: one holding the file must never fail the other."""
    monkeypatch.setattr(digests_module, "_BUSY_MS", 200)
    path = tmp_path / "digests.sqlite3"
    DigestStore(path).close()
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # a writer in the middle of its transaction
    try:
        store = DigestStore(path)
        for index in range(3):
            store.record(local(index), etag="e" * 32)
        assert store.same_stat(local(1)) is not None  # known for this run
        store.close()  # the write is dropped, logged
    finally:
        other.execute("ROLLBACK")
        other.close()


def test_a_digest_cache_damaged_inside_is_set_aside_and_the_run_goes_on(tmp_path: Path) -> None:
    path = tmp_path / "digests.sqlite3"
    store = DigestStore(path)
    for index in range(5000):
        store.record(local(index), etag=f"{index:032x}")
    store.close()
    with open(path, "r+b") as damaged:  # the header intact, pages in the middle overwritten
        damaged.seek(8192)
        damaged.write(os.urandom(16384))
    store = DigestStore(path)
    try:
        store.prefetch([local(index).relative for index in range(0, 5000, 7)])
        for index in range(0, 5000, 97):
            store.same_stat(local(index))  # a miss at worst, never an error
        store.record(local(1), etag="f" * 32)
    finally:
        store.close()
    assert (tmp_path / "digests.sqlite3.damaged").exists()


def test_a_selective_download_keeps_every_name_it_may_undo(s3_credentials: S3Credentials, s3_client: Any,
                                                           bucket: str, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(summary_module, "NAMES_KEPT", 3)
    for index in range(7):
        s3_client.put_object(Bucket=bucket, Key=f"p/{index}.jpg", Body=b"x")
    with TransferEngine(s3_credentials) as engine:
        summary = engine.download_keys(bucket, [(f"p/{i}.jpg", f"{i}.jpg") for i in range(7)], tmp_path / "d",
                                       TransferOptions())
        capped = engine.sync(f"s3://{bucket}/p/", str(tmp_path / "e"))
    assert len(summary.transferred) == 7 and len(capped.transferred) == 3 and capped.transferred_files == 7


def test_a_run_that_moves_nothing_still_says_it_finished(s3_credentials: S3Credentials, s3_client: Any, bucket: str,
                                                         tmp_path: Path) -> None:
    s3_client.put_object(Bucket=bucket, Key="p/a.txt", Body=b"a")
    down: list[Progress] = []
    up: list[Progress] = []
    with TransferEngine(s3_credentials) as engine:
        engine.sync(f"s3://{bucket}/p/", str(tmp_path / "d"))
        engine.sync(str(tmp_path / "d"), f"s3://{bucket}/q/")
        assert engine.sync(f"s3://{bucket}/p/", str(tmp_path / "d"), TransferOptions(progress=down.append)).ok
        assert engine.sync(str(tmp_path / "d"), f"s3://{bucket}/q/", TransferOptions(progress=up.append)).ok
    for seen in (down, up):  # both unchanged: no file moved, so only the last snapshot can say so
        assert seen[-1].finished and not any(progress.finished for progress in seen[:-1])
