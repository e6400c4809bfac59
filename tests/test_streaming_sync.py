"""A download streams: the listing is read a page at a time and planned a chunk at a time, so
memory holds one chunk whatever the listing's length — and every guarantee holds across pages
and chunks, with faults injected mid-stream over real HTTP: a page that fails (listed again from
its continuation token, never twice), a listing that keeps failing (an error, what arrived kept,
a rerun converges), an object overwritten while the stream runs (read as one version), a run
killed mid-way (the rerun finishes it, nothing half-written left)."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tao_data_io.commands.transfer import report
from tao_data_io.console import Console
from tao_data_io.credentials import S3Credentials
from tao_data_io.embedded.s3 import EmbeddedS3
from tao_data_io.errors import TaoDataIOError
from tao_data_io.transfer import options as engine_module
from tao_data_io.transfer import summary as summary_module
from tao_data_io.transfer.client import make_s3_client
from tao_data_io.transfer.engine import TransferEngine
from tao_data_io.transfer.options import TransferOptions
from tao_data_io.transfer.obstore_executor import ObstoreExecutor
from tao_data_io.transfer.work import Item, ItemDone

from .helpers import temp_leftovers, tree_digest, write_tree
from .s3_faults import FaultProxy

#: More than two listing pages (1,000 keys each) and several plan chunks (with CHUNK).
OBJECTS = 2100
CHUNK = 500


def name(index: int) -> str:
    return f"n{index // 700:02d}/img_{index:05d}.JPEG"


@pytest.fixture(scope="module")
def many(s3_server: EmbeddedS3, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, str]]:
    """A bucket of OBJECTS small objects under data/, once for the module; their local digests."""
    source = tmp_path_factory.mktemp("many")
    write_tree(source, {name(i): f"object {i}\n".encode() * (1 + i % 7) for i in range(OBJECTS)})
    s3_server.create_bucket("stream-many")
    with TransferEngine(s3_server.credentials) as engine:
        assert engine.sync(str(source), "s3://stream-many/data/").ok
    return "stream-many", tree_digest(source)


@pytest.fixture
def chunked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_module, "PLAN_CHUNK", CHUNK)


class Recording(ObstoreExecutor):
    """The real executor, noting each batch it is handed (and running ``after_first`` once the
    first has been handed over, before the second is planned)."""

    def __init__(self, credentials: S3Credentials, after_first: Any = None) -> None:
        super().__init__(credentials)
        self.batches: list[int] = []
        self.after_first = after_first

    def run(self, batches: Iterable[Sequence[Item]], on_done: ItemDone) -> None:
        def noted() -> Iterator[Sequence[Item]]:
            for batch in batches:
                self.batches.append(len(batch))
                yield batch
                if len(self.batches) == 1 and self.after_first is not None:
                    self.after_first()

        super().run(noted(), on_done)


def through(proxy: FaultProxy, credentials: S3Credentials) -> S3Credentials:
    return S3Credentials(credentials.access_key_id, credentials.secret_access_key, endpoint_url=proxy.url,
                         region=credentials.region)


def test_a_listing_of_several_pages_is_planned_and_moved_a_chunk_at_a_time(
        s3_credentials: S3Credentials, many: tuple[str, dict[str, str]], chunked: None, tmp_path: Path) -> None:
    bucket, expected = many
    mover = Recording(s3_credentials)
    with TransferEngine(s3_credentials, executor=mover) as engine:
        summary = engine.sync(f"s3://{bucket}/data/", str(tmp_path / "d"))
    assert summary.ok and summary.transferred_files == OBJECTS
    assert mover.batches == [CHUNK] * (OBJECTS // CHUNK) + [OBJECTS % CHUNK]
    assert tree_digest(tmp_path / "d") == expected
    with TransferEngine(s3_credentials, executor=Recording(s3_credentials)) as engine:
        again = engine.sync(f"s3://{bucket}/data/", str(tmp_path / "d"))
    assert (again.transferred_files, again.unchanged_files) == (0, OBJECTS)


def test_the_first_transfers_start_once_the_first_listing_page_is_in(
        s3_credentials: S3Credentials, many: tuple[str, dict[str, str]], tmp_path: Path) -> None:
    mover = Recording(s3_credentials)
    with TransferEngine(s3_credentials, executor=mover) as engine:
        assert engine.sync(f"s3://{many[0]}/data/", str(tmp_path / "d")).ok
    assert mover.batches == [1000, OBJECTS - 1000]  # one page, then the rest (less than a chunk)


def test_the_next_chunk_is_planned_while_this_one_moves(
        s3_credentials: S3Credentials, many: tuple[str, dict[str, str]], chunked: None, tmp_path: Path) -> None:
    """No planning gap between chunks: the first object of the first chunk is not reported
    until the second chunk has been asked for — a run that planned a chunk only once the one
    before had moved would wait here (and fail after the timeout) instead of finishing."""
    asked_second = threading.Event()
    waited: list[bool] = []

    class Pipelined(ObstoreExecutor):
        def run(self, batches: Iterable[Sequence[Item]], on_done: ItemDone) -> None:
            def noted() -> Iterator[Sequence[Item]]:
                for index, batch in enumerate(batches):
                    if index == 1:
                        asked_second.set()
                    yield batch

            def held(item: Item, failed: Any, landed: Any) -> None:
                if not waited:
                    waited.append(asked_second.wait(timeout=30))
                on_done(item, failed, landed)

            super().run(noted(), held)

    with TransferEngine(s3_credentials, executor=Pipelined(s3_credentials)) as engine:
        summary = engine.sync(f"s3://{many[0]}/data/", str(tmp_path / "d"))
    assert waited == [True] and summary.ok and summary.transferred_files == OBJECTS


def test_a_page_that_fails_mid_listing_is_listed_again_from_its_token_never_twice(
        s3_server: EmbeddedS3, many: tuple[str, dict[str, str]], chunked: None, tmp_path: Path) -> None:
    bucket, expected = many

    def fails(method: str, path: str) -> bool:
        return method == "GET" and "continuation-token" in path

    with FaultProxy(s3_server.endpoint_url, fails) as proxy:
        with TransferEngine(through(proxy, s3_server.credentials)) as engine:
            summary = engine.sync(f"s3://{bucket}/data/", str(tmp_path / "d"))
    assert len(proxy.failed) == 1 and summary.ok and summary.transferred_files == OBJECTS
    listed = [r for r in proxy.seen if r.startswith(f"GET /{bucket}?") or r.startswith(f"GET /{bucket}/?")]
    assert len(listed) == 4  # page 1, page 2 refused, page 2 through boto3, page 3
    assert tree_digest(tmp_path / "d") == expected


def test_a_listing_that_keeps_failing_ends_in_an_error_keeps_what_arrived_and_a_rerun_converges(
        s3_server: EmbeddedS3, many: tuple[str, dict[str, str]], chunked: None, tmp_path: Path) -> None:
    bucket, expected = many

    def fails(method: str, path: str) -> bool:
        return method == "GET" and "continuation-token" in path

    dest = tmp_path / "d"
    with FaultProxy(s3_server.endpoint_url, fails, status=403, times=None) as proxy:
        with TransferEngine(through(proxy, s3_server.credentials)) as engine:
            with pytest.raises(TaoDataIOError, match="stream-many"):
                engine.sync(f"s3://{bucket}/data/", str(dest))
    arrived = tree_digest(dest)
    assert len(arrived) == 1000 and all(expected[k] == v for k, v in arrived.items())  # page 1, whole files only
    assert temp_leftovers(dest) == []
    with TransferEngine(s3_server.credentials) as engine:
        rerun = engine.sync(f"s3://{bucket}/data/", str(dest))
    assert (rerun.transferred_files, rerun.unchanged_files) == (OBJECTS - 1000, 1000)
    assert tree_digest(dest) == expected


def test_an_object_overwritten_while_the_stream_runs_is_read_as_one_version(
        s3_credentials: S3Credentials, many: tuple[str, dict[str, str]], chunked: None, tmp_path: Path) -> None:
    bucket, _ = many
    client = make_s3_client(s3_credentials)
    key = f"data/{name(700)}"  # listed on page 1 with its old ETag, moved in the second chunk
    original = client.get_object(Bucket=bucket, Key=key)["Body"].read()

    def overwrite() -> object:
        return client.put_object(Bucket=bucket, Key=key, Body=b"the new version\n")

    try:
        with TransferEngine(s3_credentials, executor=Recording(s3_credentials, after_first=overwrite)) as engine:
            summary = engine.sync(f"s3://{bucket}/data/", str(tmp_path / "d"))
        assert summary.ok and summary.transferred_files == OBJECTS
        assert (tmp_path / "d" / name(700)).read_bytes() == b"the new version\n"
    finally:
        client.put_object(Bucket=bucket, Key=key, Body=original)


_KILLED = textwrap.dedent("""
    import os, signal, sys
    from tao_data_io.credentials import S3Credentials
    from tao_data_io.transfer import options as engine_module
    from tao_data_io.transfer.engine import TransferEngine
    from tao_data_io.transfer.options import TransferOptions
    from tao_data_io.transfer.obstore_executor import ObstoreExecutor

    class Killed(ObstoreExecutor):
        def run(self, batches, on_done):
            batch = next(iter(batches))
            super().run([batch[:len(batch) // 2]], on_done)
            os.kill(os.getpid(), signal.SIGKILL)  # mid-chunk: half of it moved, the rest never started

    engine_module.PLAN_CHUNK = int(sys.argv[4])
    credentials = S3Credentials(os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"],
                                endpoint_url=os.environ["AWS_ENDPOINT_URL"])
    TransferEngine(credentials, executor=Killed(credentials)).sync(f"s3://{sys.argv[1]}/{sys.argv[2]}", sys.argv[3])
""")


def test_a_run_killed_mid_stream_is_finished_by_the_next_leaving_nothing_half_written(
        s3_server: EmbeddedS3, many: tuple[str, dict[str, str]], tmp_path: Path) -> None:
    bucket, expected = many
    dest = tmp_path / "d"
    child = subprocess.run([sys.executable, "-c", _KILLED, bucket, "data/", str(dest), str(CHUNK)],
                           env={**os.environ, **s3_server.env()}, capture_output=True, text=True)
    assert child.returncode == -signal.SIGKILL, child.stderr
    arrived = tree_digest(dest)
    assert len(arrived) == CHUNK // 2 and all(expected[k] == v for k, v in arrived.items())
    with TransferEngine(s3_server.credentials) as engine:
        rerun = engine.sync(f"s3://{bucket}/data/", str(dest))
    assert rerun.ok and (rerun.transferred_files, rerun.unchanged_files) == (OBJECTS - CHUNK // 2, CHUNK // 2)
    assert tree_digest(dest) == expected and temp_leftovers(dest) == []


def test_an_upload_streamed_in_chunks_decides_each_file_against_its_own_object(
        s3_credentials: S3Credentials, bucket: str, chunked: None, tmp_path: Path) -> None:
    """The tree is walked in the order S3 lists keys (``a-b`` < ``a.txt`` < ``a/…`` < ``a0``: a
    directory sorts as its name and ``/``), so each chunk finds its objects in the part of the
    listing it reads — across chunk boundaries too: a rerun uploads nothing, a change only itself."""
    source = tmp_path / "results"
    files = {"a-b": b"1", "a.txt": b"2", "a0": b"3", **{f"a/{i:04d}.ckpt": b"a%d" % i for i in range(600)},
             **{f"b-c/{i:04d}.log": b"c%d" % i for i in range(500)},
             **{f"b/{i:04d}.bin": b"b%d" % i for i in range(1000)}}
    write_tree(source, files)
    old = 1_600_000_000
    for path in source.rglob("*"):
        os.utime(path, (old, old))
    mover = Recording(s3_credentials)
    with TransferEngine(s3_credentials, executor=mover) as engine:
        first = engine.sync(str(source), f"s3://{bucket}/up/")
        assert first.ok and first.transferred_files == len(files) and max(mover.batches) <= CHUNK
        again = engine.sync(str(source), f"s3://{bucket}/up/")
        assert (again.transferred_files, again.unchanged_files) == (0, len(files))
        (source / "a" / "0499.ckpt").write_bytes(b"changed")
        (source / "b" / "0000.bin").write_bytes(b"changed too")
        changed = engine.sync(str(source), f"s3://{bucket}/up/")
        assert sorted(changed.transferred) == ["a/0499.ckpt", "b/0000.bin"]
        assert changed.unchanged_files == len(files) - 2
    with TransferEngine(s3_credentials) as engine:
        assert engine.sync(f"s3://{bucket}/up/", str(tmp_path / "back")).ok
    assert tree_digest(tmp_path / "back") == tree_digest(source)


@pytest.fixture
def few_kept(monkeypatch: pytest.MonkeyPatch) -> int:
    """A summary keeps this many failures and skips (counting the rest): the cap, made small."""
    monkeypatch.setattr(summary_module, "NAMES_KEPT", 40)
    return 40


def test_a_download_whose_every_object_is_refused_counts_each_failure_and_keeps_a_bounded_few(
        s3_server: EmbeddedS3, many: tuple[str, dict[str, str]], few_kept: int, tmp_path: Path) -> None:
    """A role that may list but not read (an SSE-KMS key it cannot use: every GET is 403) fails
    each of 1.28 M objects: the summary counts them all but holds only the first few, or the
    stage pod's memory grows by every key and reason until it is OOM-killed."""
    bucket, _ = many
    fails = lambda method, path: method == "GET" and "/data/" in path  # noqa: E731 - objects, not the listing
    with FaultProxy(s3_server.endpoint_url, fails, status=403, times=None) as proxy:
        with TransferEngine(through(proxy, s3_server.credentials)) as engine:
            summary = engine.sync(f"s3://{bucket}/data/", str(tmp_path / "d"))
    assert not summary.ok and summary.failed_files == OBJECTS and summary.transferred_files == 0
    assert len(summary.failed) == few_kept and summary.to_dict()["failed_files"] == OBJECTS
    assert f"{OBJECTS} failed" in summary.describe()
    assert temp_leftovers(tmp_path / "d") == []
    out, err = io.StringIO(), io.StringIO()
    assert report(summary, Console(stdout=out, stderr=err), as_json=False) == 1
    printed = out.getvalue().splitlines()
    assert sum(line.startswith("  FAILED: ") for line in printed) == few_kept
    assert f"  … and {OBJECTS - few_kept} more FAILED" in printed and f"error: {OBJECTS} object(s)" in err.getvalue()


def test_an_upload_whose_every_file_is_left_for_later_counts_each_skip_and_keeps_a_bounded_few(
        s3_credentials: S3Credentials, bucket: str, chunked: None, few_kept: int, tmp_path: Path) -> None:
    """A resync of a tree the job has just written leaves every file for a later run (the settle
    time): counted, each one, but only the first few held with their reasons."""
    write_tree(tmp_path / "results", {f"r/{i:04d}.log": b"x" for i in range(1200)})
    with TransferEngine(s3_credentials) as engine:
        summary = engine.sync(str(tmp_path / "results"), f"s3://{bucket}/fresh/", TransferOptions(settle_seconds=3600))
    assert summary.ok and summary.transferred_files == 0 and summary.skipped_files == 1200
    assert len(summary.skipped) == few_kept and summary.to_dict()["skipped_files"] == 1200
    assert "1200 skipped" in summary.describe()
