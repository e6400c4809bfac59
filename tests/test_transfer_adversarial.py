"""Hostile keys, hostile trees and interrupted runs: nothing lands outside the destination, no
truncated file ever sits under a final name, and a rerun converges.

Traversal keys (``..``, ``//``) are rejected by SeaweedFS itself, but AWS S3 stores them, so
those cases run against moto's S3 server — still real HTTP, boto3 and s5cmd unpatched.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bench.latency_proxy import LatencyProxy
from tao_data_io.credentials import S3Credentials
from tao_data_io.embedded.s3 import EmbeddedS3
from tao_data_io.transfer.engine import TransferEngine
from tao_data_io.transfer.obstore_executor import LARGE_OBJECT_BYTES
from tao_data_io.transfer.options import TransferOptions
from tao_data_io.transfer.s5cmd_executor import PART_SIZE_MIB as S5CMD_PART_SIZE_MIB
from tao_data_io.transfer.work import Executor
from tao_data_io.transfer.client import make_s3_client
from tao_data_io.fs.confinement import TEMP_PREFIX
from tao_data_io.fs.locks import file_lock
from tao_data_io.fs.state import state_dir_for

from .helpers import HOSTILE_KEYS, run_cli, temp_leftovers, tree_digest, write_tree


def test_traversal_keys_are_refused_and_nothing_is_written_outside(moto_credentials: S3Credentials,
                                                                   tmp_path: Path) -> None:
    client = make_s3_client(moto_credentials)
    client.create_bucket(Bucket="hostile")
    for key in [*HOSTILE_KEYS, "p/ok.txt", "p/sub/fine.txt"]:
        client.put_object(Bucket="hostile", Key=key, Body=b"payload")
    dest = tmp_path / "box" / "dest"
    dest.mkdir(parents=True)
    summary = TransferEngine(moto_credentials).sync("s3://hostile/p/", str(dest))

    assert sorted(f.name for f in summary.failed) == sorted(HOSTILE_KEYS)
    for failure in summary.failed:
        assert "refusing key" in failure.reason
    assert tree_digest(dest).keys() == {"ok.txt", "sub/fine.txt"}  # the good keys still arrive
    outside = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")}
    ours = ("box/.tao-data-io", "box/.tao-data-io/dest", "box/.tao-data-io/dest/lock",
            "box/.tao-data-io/dest/digests.sqlite3")
    assert all(p == "box" or p.startswith("box/dest") or p in ours for p in outside), outside


def test_cli_reports_refused_keys_and_exits_1(moto_credentials: S3Credentials, tmp_path: Path) -> None:
    client = make_s3_client(moto_credentials)
    client.create_bucket(Bucket="hostile-cli")
    client.put_object(Bucket="hostile-cli", Key="p/../escape.txt", Body=b"x")
    client.put_object(Bucket="hostile-cli", Key="p/good.txt", Body=b"x")
    env = {"AWS_ACCESS_KEY_ID": moto_credentials.access_key_id,
           "AWS_SECRET_ACCESS_KEY": moto_credentials.secret_access_key,
           "AWS_ENDPOINT_URL": str(moto_credentials.endpoint_url)}
    result = run_cli("sync", "s3://hostile-cli/p/", str(tmp_path / "d"), env=env)
    assert result.returncode == 1
    assert "p/../escape.txt" in result.stdout and "'..'" in result.stdout
    assert (tmp_path / "d" / "good.txt").exists() and not (tmp_path / "escape.txt").exists()


def test_symlink_inside_destination_is_never_followed(s3_credentials: S3Credentials, s3_client, bucket: str,
                                                      tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "link").symlink_to(outside)
    s3_client.put_object(Bucket=bucket, Key="p/link/pwned.txt", Body=b"x")
    s3_client.put_object(Bucket=bucket, Key="p/fine.txt", Body=b"x")
    summary = TransferEngine(s3_credentials).sync(f"s3://{bucket}/p/", str(dest))
    assert [f.name for f in summary.failed] == ["p/link/pwned.txt"]
    assert "symlink" in summary.failed[0].reason
    assert list(outside.iterdir()) == []


def test_upload_symlink_and_special_file_policy(s3_credentials: S3Credentials, bucket: str, tmp_path: Path) -> None:
    source = tmp_path / "results"
    write_tree(source, {"model.pth": b"weights", "logs/train.log": b"log"})
    (source / "hostname").symlink_to("/etc/hostname")
    (source / "alias.pth").symlink_to(source / "model.pth")
    (source / "dangling").symlink_to(tmp_path / "nope")
    (source / "logdir").symlink_to(source / "logs")
    os.mkfifo(source / "pipe")
    summary = TransferEngine(s3_credentials).sync(str(source), f"s3://{bucket}/r/")

    assert summary.ok
    assert sorted(summary.transferred) == ["alias.pth", "logs/train.log", "model.pth"]
    reasons = {s.name: s.reason for s in summary.skipped}
    assert set(reasons) == {"hostname", "dangling", "logdir", "pipe"}
    assert "outside the tree" in reasons["hostname"]
    dest = tmp_path / "back"
    TransferEngine(s3_credentials).sync(f"s3://{bucket}/r/", str(dest))
    assert (dest / "alias.pth").read_bytes() == b"weights"
    assert not (dest / "hostname").exists()


def test_sigkill_mid_download_then_rerun_is_byte_identical(s3_server: EmbeddedS3, s3_credentials: S3Credentials,
                                                           bucket: str, tmp_path: Path) -> None:
    source = tmp_path / "src"
    write_tree(source, {f"shard-{i:03d}.bin": os.urandom(256 * 1024) for i in range(300)})
    write_tree(source, {f"big-{i}.bin": os.urandom(6 * 1024 * 1024) for i in range(2)})  # streamed by obstore
    write_tree(source, {"huge.bin": os.urandom(40 * 1024 * 1024)})  # ≥ 8 MiB: the s5cmd path
    assert TransferEngine(s3_credentials).sync(str(source), f"s3://{bucket}/ds/").ok
    dest = tmp_path / "dest"

    argv = [sys.executable, "-m", "tao_data_io.cli", "sync", f"s3://{bucket}/ds/", str(dest), "--concurrency", "4"]
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), **s3_server.env()}
    child = subprocess.Popen(argv, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(list(dest.glob("shard-*"))) < 20:
        time.sleep(0.02)
    os.killpg(child.pid, signal.SIGKILL)  # the CLI and its s5cmd child die together, mid-run
    child.wait()
    final = {name: digest for name, digest in tree_digest(dest).items() if not Path(name).name.startswith(TEMP_PREFIX)}
    assert 0 < len(final) < 303, "the kill should land mid-download"
    # Whatever sits under a final name is complete and correct; partial data only in temp names.
    expected = tree_digest(source)
    assert all(expected[name] == digest for name, digest in final.items())

    rerun = run_cli("sync", f"s3://{bucket}/ds/", str(dest), env=s3_server.env())
    assert rerun.returncode == 0, rerun.stderr
    assert tree_digest(dest) == expected
    assert temp_leftovers(dest) == [] and temp_leftovers(state_dir_for(dest)) == []  # s5cmd's spool too


class _Meddling:
    """Wraps the real executor; changes the source tree right before the bytes move, the way a
    job still writing (or an attacker racing the scan) would."""

    def __init__(self, inner: Executor, meddle: Callable[[], None]) -> None:
        self.inner, self.meddle = inner, meddle

    def run(self, batches, on_done) -> None:  # type: ignore[no-untyped-def]
        def meddled():  # type: ignore[no-untyped-def]
            for batch in batches:  # planned: the scan has seen the files
                self.meddle()
                yield batch

        self.inner.run(meddled(), on_done)


def _engine_with(credentials: S3Credentials, meddle: Callable[[], None]) -> TransferEngine:
    engine = TransferEngine(credentials)
    engine.executor = _Meddling(engine.executor, meddle)
    return engine


def test_file_changed_while_uploading_is_a_failure_not_a_success(s3_credentials: S3Credentials, s3_client,
                                                                  bucket: str, tmp_path: Path) -> None:
    source = tmp_path / "results"
    write_tree(source, {"train.log": b"epoch 1\n", "model.pth": b"weights"})
    engine = _engine_with(s3_credentials, lambda: (source / "train.log").open("ab").write(b"epoch 2\n"))
    summary = engine.sync(str(source), f"s3://{bucket}/r/")
    # Grown since the scan: refused before a byte is read (it would otherwise be read to wherever
    # it has grown by then), and the rerun takes it as it is.
    assert [f.name for f in summary.failed] == ["r/train.log"]
    assert "changed size since it was scanned (8 → 16 bytes)" in summary.failed[0].reason
    assert summary.transferred == ["model.pth"]
    again = TransferEngine(s3_credentials).sync(str(source), f"s3://{bucket}/r/")
    assert again.ok  # the rerun converges: the object now holds exactly the file as it is
    assert s3_client.get_object(Bucket=bucket, Key="r/train.log")["Body"].read() == b"epoch 1\nepoch 2\n"


@pytest.mark.parametrize("tree", ["the user's", "a job's"])
def test_a_file_grown_right_after_its_check_is_reported_changed_and_a_jobs_is_read_to_its_checked_size(
        tree: str, s3_credentials: S3Credentials, s3_client: Any, bucket: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Grown between the check of its descriptor (a regular file, its inode, its size) and the
    read: never called uploaded, and the rerun takes it as it is. From a job's results the read
    stops at the checked size, so a job that makes a checked file 64 MiB (or a terabyte, sparse)
    gets 8 bytes read; a small file of the user's own is read by obstore through its descriptor."""
    from tao_data_io.transfer import obstore_executor

    source = tmp_path / "results"
    write_tree(source, {"train.log": b"epoch 1\n"})
    checked = obstore_executor.open_scanned

    def check_then_grow(*args: Any, **kwargs: Any) -> int:
        fd = checked(*args, **kwargs)
        os.truncate(source / "train.log", 64 * 1024 * 1024)
        return fd

    monkeypatch.setattr(obstore_executor, "open_scanned", check_then_grow)
    options = TransferOptions(untrusted_source="results_dir" if tree == "a job's" else None)
    summary = TransferEngine(s3_credentials).sync(str(source), f"s3://{bucket}/r/", options)
    assert [f.name for f in summary.failed] == ["r/train.log"] and "changed while uploading" in summary.failed[0].reason
    if tree == "a job's":
        assert s3_client.get_object(Bucket=bucket, Key="r/train.log")["Body"].read() == b"epoch 1\n"
    monkeypatch.undo()
    assert TransferEngine(s3_credentials).sync(str(source), f"s3://{bucket}/r/", options).ok
    assert s3_client.head_object(Bucket=bucket, Key="r/train.log")["ContentLength"] == 64 * 1024 * 1024


def test_an_upload_where_descriptors_cannot_be_opened_by_their_link_reads_each_file_itself(
        s3_credentials: S3Credentials, s3_client: Any, bucket: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """No procfs of this process's own (a sandbox without /proc, another PID namespace's): the
    small files obstore would open by their descriptor's link are read here instead, all of them."""
    from tao_data_io.transfer import obstore_executor

    monkeypatch.setattr(obstore_executor, "FD_LINKS", str(tmp_path / "no-proc"))
    source = tmp_path / "data"
    files = {f"d/{i}.txt": f"file {i}\n".encode() for i in range(20)}
    write_tree(source, files)
    summary = TransferEngine(s3_credentials).sync(str(source), f"s3://{bucket}/p/")
    assert summary.ok and summary.transferred_files == 20
    assert all(s3_client.get_object(Bucket=bucket, Key=f"p/{name}")["Body"].read() == body
               for name, body in files.items())


def test_file_swapped_for_a_symlink_after_the_scan_is_not_followed(s3_credentials: S3Credentials, s3_client,
                                                                    bucket: str, tmp_path: Path) -> None:
    source = tmp_path / "results"
    write_tree(source, {"notes.txt": b"mine"})

    def swap() -> None:
        (source / "notes.txt").unlink()
        (source / "notes.txt").symlink_to("/etc/hostname")

    summary = _engine_with(s3_credentials, swap).sync(str(source), f"s3://{bucket}/r/")
    assert [f.name for f in summary.failed] == ["r/notes.txt"]
    listing = s3_client.list_objects_v2(Bucket=bucket, Prefix="r/")
    assert listing.get("KeyCount", 0) == 0


def _swap_for_a_fifo(directory: Path, name: str) -> Callable[[], None]:
    """A job's move between the scan and the read: ``directory`` (holding the regular file
    ``name``) exchanged for one holding a FIFO of that name, which blocks any plain open."""
    def swap() -> None:
        decoy = directory.with_name(directory.name + ".decoy")
        decoy.mkdir()
        os.mkfifo(decoy / name)
        directory.rename(directory.with_name(directory.name + ".real"))
        decoy.rename(directory)
    return swap


def _finishes(work: Callable[[], Any], fifo: Path, seconds: float = 20) -> Any:
    """``work``'s result, failing (never hanging the suite) when it blocks; a blocked open of the
    FIFO is released by opening its other end."""
    outcome: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: outcome.setdefault("result", work()), daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        open(fifo, "wb").close()
        thread.join(10)
        pytest.fail(f"blocked on the FIFO {fifo} the job swapped in")
    return outcome["result"]


def test_a_file_swapped_for_a_fifo_after_the_scan_never_blocks_the_upload(s3_credentials: S3Credentials, s3_client,
                                                                           bucket: str, tmp_path: Path) -> None:
    source = tmp_path / "results"
    write_tree(source, {"logs/train.log": b"epoch 1\n", "model.pth": b"weights"})
    engine = _engine_with(s3_credentials, _swap_for_a_fifo(source / "logs", "train.log"))
    summary = _finishes(lambda: engine.sync(str(source), f"s3://{bucket}/r/"), source / "logs" / "train.log")
    assert [f.name for f in summary.failed] == ["r/logs/train.log"] and "regular file" in summary.failed[0].reason
    assert summary.transferred == ["model.pth"]


def test_a_file_swapped_for_a_fifo_before_its_digest_never_blocks_the_comparison(
        s3_credentials: S3Credentials, s3_client, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Skip-unchanged reads a file the remote already has (its MD5) between the walk and the
    upload: the same window, before any byte moves."""
    from tao_data_io.transfer import upload as engine_module

    source = tmp_path / "results"
    write_tree(source, {"logs/train.log": b"epoch 1\n"})
    s3_client.put_object(Bucket=bucket, Key="r/logs/train.log", Body=b"epoch 1\n")
    walked = engine_module.walk_local

    def walk_then_swap(*args: Any, **kwargs: Any) -> Any:
        yield from walked(*args, **kwargs)
        _swap_for_a_fifo(source / "logs", "train.log")()  # once walked, before it is decided

    monkeypatch.setattr(engine_module, "walk_local", walk_then_swap)
    summary = _finishes(lambda: TransferEngine(s3_credentials).sync(str(source), f"s3://{bucket}/r/"),
                        source / "logs" / "train.log")
    assert not summary.ok and "regular file" in " ".join(f.reason for f in summary.failed)


def test_a_result_whose_name_holds_a_control_character_is_skipped_once_never_retried_forever(
        s3_credentials: S3Credentials, s3_client, bucket: str, tmp_path: Path) -> None:
    """obstore (object_store's Path) cannot send a key with a control character, and such keys
    break listings and most tools anyway: the file is skipped with its reason and the fix, the
    rest uploads, and the upload is complete — not a failure every rerun repeats."""
    source = tmp_path / "results"
    names = ["bad\x01name.txt", "line\nbreak.txt", "del\x7f.txt"]
    write_tree(source, {"model.pth": b"w", **{name: b"x" for name in names}})
    for attempt in range(2):
        summary = TransferEngine(s3_credentials).sync(str(source), f"s3://{bucket}/r/")
        assert summary.ok and summary.failed == []
        assert sorted(s.name for s in summary.skipped) == sorted(names)
        assert all("control character" in s.reason and "rename it" in s.reason for s in summary.skipped)
    assert [o["Key"] for o in s3_client.list_objects_v2(Bucket=bucket, Prefix="r/")["Contents"]] == ["r/model.pth"]


def test_a_file_gone_before_its_digest_fails_alone_and_the_rest_uploads(
        s3_credentials: S3Credentials, s3_client, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tao_data_io.transfer import upload as engine_module

    source = tmp_path / "results"
    write_tree(source, {"a.txt": b"one", "b.txt": b"two"})
    TransferEngine(s3_credentials).sync(str(source), f"s3://{bucket}/r/")
    write_tree(source, {"a.txt": b"ONE", "b.txt": b"TWO"})  # same sizes: compared by digest
    walked = engine_module.walk_local

    def walk_then_remove(*args: Any, **kwargs: Any) -> Any:
        yield from walked(*args, **kwargs)
        (source / "a.txt").unlink()  # once walked, before it is decided

    monkeypatch.setattr(engine_module, "walk_local", walk_then_remove)
    summary = TransferEngine(s3_credentials).sync(str(source), f"s3://{bucket}/r/")
    assert [f.name for f in summary.failed] == ["r/a.txt"] and summary.transferred == ["b.txt"]


def test_a_result_whose_name_is_not_utf8_is_skipped_once_and_the_record_keeps_it(
        s3_credentials: S3Credentials, s3_client, bucket: str, tmp_path: Path) -> None:
    source = tmp_path / "results"
    write_tree(source, {"model.pth": b"w"})
    (source / os.fsdecode(b"bad-\xff.bin")).write_bytes(b"x")
    for attempt in range(2):
        summary = TransferEngine(s3_credentials).sync(str(source), f"s3://{bucket}/r/")
        assert summary.ok and [s.reason for s in summary.skipped] == [
            "its name is not UTF-8, which an S3 key must be; not uploaded — rename it to upload it"]
        json.dumps([s.name for s in summary.skipped])  # what a record stores: serialisable


def test_a_results_tree_nested_deeper_than_the_scan_goes_is_uploaded_but_its_depths(
        s3_credentials: S3Credentials, s3_client, bucket: str, tmp_path: Path) -> None:
    """A job can nest its results as deep as it likes (1,100 levels ended every upload with a
    RecursionError): the scan stops at its depth limit, a descriptor per level at most, names what
    it left out, and uploads the rest."""
    from tao_data_io.transfer.local_walk import MAX_SCAN_DEPTH

    source = tmp_path / "results"
    write_tree(source, {"model.pth": b"w", "d/" * 3 + "shallow.txt": b"s"})
    (source / "/".join(["n"] * 300)).mkdir(parents=True)  # past the limit, within PATH_MAX
    summary = TransferEngine(s3_credentials).sync(str(source), f"s3://{bucket}/r/")
    assert summary.ok and sorted(summary.transferred) == ["d/d/d/shallow.txt", "model.pth"]
    assert [s.reason for s in summary.skipped] == [f"directory more than {MAX_SCAN_DEPTH} levels deep; left out"]


def test_symlink_to_an_excluded_file_is_excluded_too(s3_credentials: S3Credentials, bucket: str,
                                                     tmp_path: Path) -> None:
    from tao_data_io.transfer.filters import PathFilter

    source = tmp_path / "results"
    write_tree(source, {".tao/state.json": b"internal", "model.pth": b"w"})
    (source / "state-link.json").symlink_to(source / ".tao" / "state.json")
    summary = TransferEngine(s3_credentials).sync(str(source), f"s3://{bucket}/r/",
                                                  TransferOptions(filter=PathFilter.from_patterns([".tao/*"])))
    assert summary.transferred == ["model.pth"] and summary.excluded_files == 2


# ----------------------------------------------------------------------------- write-time confinement
def _put_many(s3_client: Any, bucket: str, objects: dict[str, bytes]) -> None:
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda item: s3_client.put_object(Bucket=bucket, Key=item[0], Body=item[1]), objects.items()))


def test_a_directory_swapped_for_a_symlink_during_a_sync_never_redirects_a_write(
        s3_credentials: S3Credentials, s3_client: Any, bucket: str, tmp_path: Path) -> None:
    """The plan is made while ``sub`` is a real directory; while the bytes move, another process
    keeps replacing it with a symlink to a directory outside. Whatever lands, lands inside."""
    objects = {f"p/sub/f{i:04d}.bin": os.urandom(512) for i in range(600)}
    objects["p/sub/big.bin"] = os.urandom(33 * 1024 * 1024)  # ≥ 8 MiB: the s5cmd path too
    _put_many(s3_client, bucket, objects)
    outside, dest = tmp_path / "outside", tmp_path / "dest"
    outside.mkdir()
    (dest / "sub").mkdir(parents=True)
    stop = threading.Event()

    def swap() -> None:
        while not stop.is_set():
            for step in (lambda: os.rename(dest / "sub", dest / "sub.real"),
                         lambda: os.symlink(outside, dest / "sub"),
                         lambda: os.unlink(dest / "sub"),
                         lambda: os.rename(dest / "sub.real", dest / "sub")):
                try:
                    step()
                except OSError:
                    pass  # the sync created or moved something in between; keep swapping

    swapper = threading.Thread(target=swap)
    swapper.start()
    try:
        summary = TransferEngine(s3_credentials, concurrency=8).sync(f"s3://{bucket}/p/", str(dest))
    finally:
        stop.set()
        swapper.join()
    assert list(outside.iterdir()) == []
    arrived = {name.split("/", 1)[1]: digest for name, digest in tree_digest(dest).items()}
    expected = {key[len("p/sub/"):]: hashlib.sha256(body).hexdigest() for key, body in objects.items()}
    assert all(expected[name] == digest for name, digest in arrived.items() if not name.startswith(TEMP_PREFIX))
    assert summary.transferred_files + len(summary.failed) == len(objects)


def test_a_key_longer_than_255_bytes_fails_alone(moto_credentials: S3Credentials, tmp_path: Path) -> None:
    """200 characters, 400 bytes in UTF-8 (SeaweedFS refuses such keys, AWS stores them): the name
    the filesystem refuses is one failed key, and the rest of the run goes on."""
    client = make_s3_client(moto_credentials)
    client.create_bucket(Bucket="long-names")
    long_dir, long_file = "é" * 200, "ü" * 130
    for key in (f"p/{long_dir}/f.txt", f"p/d/{long_file}", "p/ok.txt"):
        client.put_object(Bucket="long-names", Key=key, Body=b"x")
    summary = TransferEngine(moto_credentials).sync("s3://long-names/p/", str(tmp_path / "d"))
    assert summary.transferred == ["ok.txt"]
    assert sorted(f.name for f in summary.failed) == sorted([f"p/{long_dir}/f.txt", f"p/d/{long_file}"])
    assert all("255 bytes" in f.reason for f in summary.failed)


# ----------------------------------------------------------------------------- one version, or nothing
PART = S5CMD_PART_SIZE_MIB * 1024 * 1024


def _sync_while_overwriting_between_parts(s3_server: EmbeddedS3, s3_client: Any, bucket: str,
                                          dest: Path) -> tuple[Any, bytes, bytes]:
    """Sync a large object (s5cmd reads it in ranged parts) that is overwritten, same size, right
    before its second part is requested; the summary, the old and the new bytes."""
    old, new = os.urandom(PART + 1024 * 1024), os.urandom(PART + 1024 * 1024)
    s3_client.put_object(Bucket=bucket, Key="p/big.bin", Body=old)
    overwritten = threading.Event()

    def overwrite_before_the_second_part(head: bytes) -> None:
        if b"/p/big.bin" in head and f"range: bytes={PART}-".encode() in head.lower() and not overwritten.is_set():
            s3_client.put_object(Bucket=bucket, Key="p/big.bin", Body=new)
            overwritten.set()

    with LatencyProxy("127.0.0.1", s3_server.port, 0, on_request=overwrite_before_the_second_part) as proxy:
        credentials = replace(s3_server.credentials, endpoint_url=f"http://127.0.0.1:{proxy.port}")
        summary = TransferEngine(credentials).sync(f"s3://{bucket}/p/", str(dest))
    assert overwritten.is_set(), "the test must change the object mid-download"
    return summary, old, new


def test_an_object_overwritten_between_ranged_parts_is_never_published_mixed(
        s3_server: EmbeddedS3, s3_client: Any, bucket: str, tmp_path: Path) -> None:
    """The file published is one version, never both: the mixed one is discarded and the object
    read again, whole."""
    summary, old, new = _sync_while_overwriting_between_parts(s3_server, s3_client, bucket, tmp_path / "d")
    published = (tmp_path / "d" / "big.bin").read_bytes() if (tmp_path / "d" / "big.bin").exists() else None
    assert published in (old, new, None)
    assert summary.ok and published == new
    assert temp_leftovers(tmp_path / "d") == []


def test_an_object_overwritten_and_set_back_while_the_child_reads_it_is_read_again_not_published(
        s3_server: EmbeddedS3, s3_client: Any, bucket: str, tmp_path: Path) -> None:
    """The s5cmd child's GET is not bound to the listed ETag, so the check after it must tell the
    listed version from the same bytes written again: an object overwritten (B) as the child reads
    it and set back (A again: the same ETag) before the check is read again, not published as A
    with B's bytes — which the digest record would then keep for good."""
    size = LARGE_OBJECT_BYTES + 1024 * 1024  # the child's path, in one GET
    listed, overwrite = os.urandom(size), os.urandom(size)
    s3_client.put_object(Bucket=bucket, Key="p/model.bin", Body=listed)
    time.sleep(1.1)  # S3's LastModified counts whole seconds: the writes below fall in a later one
    steps: list[str] = []

    def overwrite_then_set_back(head: bytes) -> None:
        if f"/{bucket}/p/model.bin".encode() not in head:
            return
        if head.startswith(b"GET") and not steps:
            s3_client.put_object(Bucket=bucket, Key="p/model.bin", Body=overwrite)
            steps.append("overwritten")
        elif head.startswith(b"HEAD") and steps == ["overwritten"]:
            s3_client.put_object(Bucket=bucket, Key="p/model.bin", Body=listed)
            steps.append("set back")

    dest = tmp_path / "d"
    with LatencyProxy("127.0.0.1", s3_server.port, 0, on_request=overwrite_then_set_back) as proxy:
        credentials = replace(s3_server.credentials, endpoint_url=f"http://127.0.0.1:{proxy.port}")
        with TransferEngine(credentials) as engine:
            summary = engine.sync(f"s3://{bucket}/p/", str(dest))
    assert steps == ["overwritten", "set back"], "the test must change the object under the child"
    assert summary.ok and (dest / "model.bin").read_bytes() == listed
    with TransferEngine(s3_server.credentials) as engine:
        rerun = engine.sync(f"s3://{bucket}/p/", str(dest))
    assert (rerun.transferred_files, (dest / "model.bin").read_bytes() == listed) == (0, True)


def test_an_object_that_keeps_changing_fails_naming_the_limit(s3_server: EmbeddedS3, s3_client: Any, bucket: str,
                                                              tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TAO_DATA_IO_READ_ATTEMPTS", "1")
    summary, _, _ = _sync_while_overwriting_between_parts(s3_server, s3_client, bucket, tmp_path / "d")
    assert [f.name for f in summary.failed] == ["p/big.bin"]
    assert "changed" in summary.failed[0].reason and "TAO_DATA_IO_READ_ATTEMPTS" in summary.failed[0].reason
    assert not (tmp_path / "d" / "big.bin").exists() and temp_leftovers(tmp_path / "d") == []


def test_the_s5cmd_child_dies_with_its_parent(s3_server: EmbeddedS3, s3_client: Any, bucket: str,
                                              tmp_path: Path) -> None:
    """SIGKILL the command while s5cmd downloads: the child must not go on writing on its own,
    outside any lock."""
    import psutil

    s3_client.put_object(Bucket=bucket, Key="p/big.bin", Body=os.urandom(33 * 1024 * 1024))
    release = threading.Event()

    def hold(head: bytes) -> threading.Event | None:
        return release if head.startswith(b"GET ") and b"/p/big.bin" in head else None

    with LatencyProxy("127.0.0.1", s3_server.port, 0, on_request=hold) as proxy:
        env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path),
               **s3_server.env(), "AWS_ENDPOINT_URL": f"http://127.0.0.1:{proxy.port}"}
        parent = subprocess.Popen([sys.executable, "-m", "tao_data_io.cli", "sync", f"s3://{bucket}/p/",
                                   str(tmp_path / "d")], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            child = _wait_for_child(psutil.Process(parent.pid), "s5cmd")
            parent.kill()
            parent.wait()
            gone, alive = psutil.wait_procs([child], timeout=30)
        finally:
            release.set()
        for process in alive:
            process.kill()
    assert alive == [], "s5cmd outlived the command that started it"


def _wait_for_child(parent: Any, name: str) -> Any:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for child in parent.children(recursive=True):
            if child.name() == name:
                return child
        time.sleep(0.02)
    raise AssertionError(f"{name} never started")


# ----------------------------------------------------------------------------- concurrency and leftovers
def test_a_sync_into_a_parent_leaves_a_running_sync_into_a_subdirectory_alone(
        s3_server: EmbeddedS3, s3_client: Any, bucket: str, tmp_path: Path) -> None:
    """Two destinations, one inside the other, two locks: the outer sync's sweep of abandoned
    temp files must not take the inner sync's file while it is being written."""
    body = os.urandom(256 * 1024)
    s3_client.put_object(Bucket=bucket, Key="inner/f.bin", Body=body)
    s3_client.put_object(Bucket=bucket, Key="outer/x.bin", Body=b"x")
    data = tmp_path / "data"
    release = threading.Event()

    def hold(head: bytes) -> threading.Event | None:
        return release if head.startswith(b"GET ") and b"/inner/f.bin" in head else None

    with LatencyProxy("127.0.0.1", s3_server.port, 0, on_request=hold) as proxy:
        slow = replace(s3_server.credentials, endpoint_url=f"http://127.0.0.1:{proxy.port}")
        inner: list[Any] = []
        thread = threading.Thread(target=lambda: inner.append(
            TransferEngine(slow).sync(f"s3://{bucket}/inner/", str(data / "sub"))))
        thread.start()
        try:
            in_flight = _wait_for(lambda: temp_leftovers(data / "sub"))
            outer = TransferEngine(s3_server.credentials).sync(f"s3://{bucket}/outer/", str(data))
            survived = [Path(p).exists() for p in in_flight]
        finally:
            release.set()
            thread.join()
    assert outer.ok and survived == [True]
    assert inner[0].ok and (data / "sub" / "f.bin").read_bytes() == body


def test_cp_holds_the_destination_lock(s3_credentials: S3Credentials, s3_client: Any, bucket: str,
                                       tmp_path: Path) -> None:
    """Every writer of a destination holds its lock, or a sync's sweep would take its temp file."""
    s3_client.put_object(Bucket=bucket, Key="k/model.pth", Body=b"w")
    dest = tmp_path / "models"
    dest.mkdir()
    lock = state_dir_for(dest) / "lock"
    done: list[Any] = []
    with file_lock(lock):
        thread = threading.Thread(target=lambda: done.append(
            TransferEngine(s3_credentials).copy(f"s3://{bucket}/k/model.pth", str(dest / "model.pth"))))
        thread.start()
        seen = _wait_for(lambda: "waiting" if _blocked_on(lock) else "finished" if not thread.is_alive() else None)
        wrote_while_locked = (dest / "model.pth").exists()
    thread.join()
    assert seen == "waiting" and not wrote_while_locked
    assert done[0].ok and (dest / "model.pth").read_bytes() == b"w"


def _blocked_on(lock: Path) -> bool:
    """Whether some process waits for a flock on ``lock`` (``/proc/locks`` lists waiters with '->')."""
    inode = os.stat(lock).st_ino
    return any("->" in line and line.split()[-3].endswith(f":{inode}")
               for line in Path("/proc/locks").read_text().splitlines())


def _wait_for(condition: Callable[[], Any]) -> Any:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError("the condition never held")
