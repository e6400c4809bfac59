"""The transfer engine over real HTTP against the embedded SeaweedFS server."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import obstore
import pytest

from tao_data_io.credentials import S3Credentials
from tao_data_io.errors import UsageError
from tao_data_io.transfer.engine import TransferEngine
from tao_data_io.transfer.options import TransferOptions
from tao_data_io.transfer.upload import upload_digest_path
from tao_data_io.transfer.filters import FilterRule, PathFilter
from tao_data_io.transfer.digests import DigestStore
from tao_data_io.transfer.listing import list_remote, s3_time_ns
from tao_data_io.transfer.local_walk import local_file
from tao_data_io.fs.state import state_dir_for
from tao_data_io.uris import parse_s3_url

from .helpers import tree_digest, write_tree


@pytest.fixture
def engine(s3_credentials: S3Credentials) -> TransferEngine:
    return TransferEngine(s3_credentials, concurrency=16)


def test_round_trip_past_one_thousand_keys(engine: TransferEngine, s3_client, bucket: str, tmp_path: Path) -> None:
    source = tmp_path / "src"
    write_tree(source, {f"d{i % 13}/file-{i:05d}.bin": os.urandom(64 + i % 50) for i in range(1234)})

    up = engine.sync(str(source), f"s3://{bucket}/data")
    assert up.ok and up.transferred_files == 1234

    listing = list_remote(s3_client, parse_s3_url(f"s3://{bucket}/data/"))
    assert len(listing.objects) == 1234  # the listing paginated past 1,000 keys

    dest = tmp_path / "dest"
    down = engine.sync(f"s3://{bucket}/data/", str(dest))
    assert down.ok and down.transferred_files == 1234
    assert tree_digest(dest) == tree_digest(source)


def test_prefix_without_slash_does_not_match_siblings(engine: TransferEngine, s3_client, bucket: str,
                                                      tmp_path: Path) -> None:
    for key in ("ds/a.txt", "ds-other/b.txt", "ds.txt"):
        s3_client.put_object(Bucket=bucket, Key=key, Body=key.encode())
    summary = engine.sync(f"s3://{bucket}/ds", str(tmp_path / "out"))
    assert summary.ok
    assert tree_digest(tmp_path / "out").keys() == {"a.txt"}


def test_rerun_moves_nothing_and_changes_are_detected_exactly(engine: TransferEngine, s3_client, bucket: str,
                                                              tmp_path: Path) -> None:
    files = {f"f{i}.bin": os.urandom(1000) for i in range(20)}
    for name, data in files.items():
        s3_client.put_object(Bucket=bucket, Key=f"p/{name}", Body=data)
    dest = tmp_path / "dest"
    assert engine.sync(f"s3://{bucket}/p/", str(dest)).transferred_files == 20

    again = engine.sync(f"s3://{bucket}/p/", str(dest))
    assert (again.transferred_files, again.unchanged_files) == (0, 20)

    # A changed remote object of the same size is refetched (ETag differs).
    new_remote = os.urandom(1000)
    s3_client.put_object(Bucket=bucket, Key="p/f3.bin", Body=new_remote)
    # A truncated local file is repaired.
    with open(dest / "f5.bin", "r+b") as handle:
        handle.truncate(10)
    # A same-size local corruption with the mtime put back is still caught (content, not time).
    target = dest / "f7.bin"
    st = target.stat()
    target.write_bytes(bytes(1000))
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))

    repaired = engine.sync(f"s3://{bucket}/p/", str(dest))
    assert sorted(repaired.transferred) == ["f3.bin", "f5.bin", "f7.bin"]
    assert (dest / "f3.bin").read_bytes() == new_remote
    assert (dest / "f5.bin").read_bytes() == files["f5.bin"]
    assert (dest / "f7.bin").read_bytes() == files["f7.bin"]


def test_rerun_after_racy_window_uses_the_digest_cache(engine: TransferEngine, s3_client, bucket: str,
                                                       tmp_path: Path) -> None:
    s3_client.put_object(Bucket=bucket, Key="p/a.bin", Body=b"a" * 4096)
    dest = tmp_path / "d"
    engine.sync(f"s3://{bucket}/p/", str(dest))
    digests = state_dir_for(dest) / "digests.sqlite3"

    def recorded() -> int:
        store = DigestStore(digests)
        try:
            entry = store.same_stat(local_file("a.bin", dest / "a.bin", (dest / "a.bin").stat()))
        finally:
            store.close()
        assert entry is not None
        return entry.recorded_ns

    time.sleep(2.1)
    engine.sync(f"s3://{bucket}/p/", str(dest))  # the object is seconds old: the entry was racy, so rehashed once
    settled = recorded()
    assert engine.sync(f"s3://{bucket}/p/", str(dest)).unchanged_files == 1
    assert recorded() == settled  # trusted from the cache: no rehash, no new entry
    # Replace the content behind the cache's back, keeping size and mtime — the cache trusts
    # stat identity only while ctime is unchanged, so this is still caught.
    st = (dest / "a.bin").stat()
    (dest / "a.bin").write_bytes(b"b" * 4096)
    os.utime(dest / "a.bin", ns=(st.st_atime_ns, st.st_mtime_ns))
    summary = engine.sync(f"s3://{bucket}/p/", str(dest))
    assert summary.transferred == ["a.bin"]
    assert (dest / "a.bin").read_bytes() == b"a" * 4096


def test_downloads_take_the_objects_last_modified(engine: TransferEngine, s3_client, bucket: str,
                                                  tmp_path: Path) -> None:
    s3_client.put_object(Bucket=bucket, Key="p/x.txt", Body=b"x")
    head = s3_client.head_object(Bucket=bucket, Key="p/x.txt")
    engine.sync(f"s3://{bucket}/p/", str(tmp_path / "d"))
    assert (tmp_path / "d" / "x.txt").stat().st_mtime_ns == s3_time_ns(head["LastModified"])


def test_a_small_object_read_in_one_ranged_get_is_published_only_when_its_md5_is_the_listed_etag(
        engine: TransferEngine, s3_client, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The one-request read of a small object (:data:`PROVEN_BYTES`) keeps bytes only if their MD5
    is the listed ETag. Bytes that are not (here: what a store whose ETags are not MD5s would
    look like) are never published: the object is read again with the GET bound to the ETag, and
    that bucket is read that way from then on."""
    files = {f"f{i}.bin": os.urandom(100 + i) for i in range(40)}  # more than the engine moves at once
    for name, data in files.items():
        s3_client.put_object(Bucket=bucket, Key=f"p/{name}", Body=data)
    ranged: list[str] = []
    real = obstore.get_range_async

    async def other_bytes(store: object, key: str, *, start: int, end: int) -> bytes:
        ranged.append(key)
        return bytes(reversed(bytes(await real(store, key, start=start, end=end))))  # type: ignore[arg-type]

    monkeypatch.setattr(obstore, "get_range_async", other_bytes)
    dest = tmp_path / "d"
    summary = engine.sync(f"s3://{bucket}/p/", str(dest))
    assert summary.ok and summary.transferred_files == len(files)
    assert tree_digest(dest) == {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
    assert 1 <= len(ranged) < len(files)  # once the bucket's ETags proved no MD5s, no more ranged reads
    assert engine.sync(f"s3://{bucket}/p/", str(dest)).unchanged_files == len(files)


def test_a_small_object_overwritten_with_as_many_bytes_after_the_listing_is_read_as_its_new_version(
        engine: TransferEngine, s3_client, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ranged read of the listed size finds other bytes of that size: their MD5 is not the
    listed ETag, so they are not published as that version; the bound GET is refused (412) and the
    object is read again whole — the new version, recorded with its own ETag."""
    old, new = b"o" * 500, b"n" * 500
    s3_client.put_object(Bucket=bucket, Key="p/x.bin", Body=old)
    real = obstore.get_range_async

    async def overwritten_first(store: object, key: str, *, start: int, end: int) -> object:
        s3_client.put_object(Bucket=bucket, Key="p/x.bin", Body=new)
        return await real(store, key, start=start, end=end)  # type: ignore[arg-type]

    monkeypatch.setattr(obstore, "get_range_async", overwritten_first)
    dest = tmp_path / "d"
    summary = engine.sync(f"s3://{bucket}/p/", str(dest))
    assert summary.ok and summary.transferred == ["x.bin"]
    assert (dest / "x.bin").read_bytes() == new
    monkeypatch.undo()
    assert engine.sync(f"s3://{bucket}/p/", str(dest)).unchanged_files == 1


def test_upload_records_the_servers_etag(engine: TransferEngine, s3_client, bucket: str, tmp_path: Path) -> None:
    source = tmp_path / "r"
    write_tree(source, {"m.pth": b"m" * 1000})
    old = time.time() - 60
    os.utime(source / "m.pth", (old, old))
    engine.sync(str(source), f"s3://{bucket}/r/")
    etag = s3_client.head_object(Bucket=bucket, Key="r/m.pth")["ETag"].strip('"')
    store = DigestStore(upload_digest_path(source))
    try:
        entry = store.same_stat(local_file("m.pth", source / "m.pth", (source / "m.pth").stat()))
    finally:
        store.close()
    assert entry is not None and entry.etag == etag and entry.md5 is None  # known without hashing


def test_multipart_objects_are_compared_exactly(s3_credentials: S3Credentials, s3_client, bucket: str,
                                                tmp_path: Path) -> None:
    from boto3.s3.transfer import TransferConfig

    data = os.urandom(12 * 1024 * 1024 + 123)
    source = tmp_path / "big.bin"
    source.write_bytes(data)
    s3_client.upload_file(str(source), bucket, "m/big.bin",
                          Config=TransferConfig(multipart_threshold=5 * 1024 * 1024,
                                                multipart_chunksize=5 * 1024 * 1024))
    etag = s3_client.head_object(Bucket=bucket, Key="m/big.bin")["ETag"]
    assert etag.strip('"').endswith("-3")

    engine = TransferEngine(s3_credentials)
    dest = tmp_path / "dest"
    assert engine.sync(f"s3://{bucket}/m/", str(dest)).transferred_files == 1
    assert (dest / "big.bin").read_bytes() == data
    # Without the digest cache the local file must be recognised by computing the multipart
    # ETag (part size from HEAD ?partNumber=1) — not by guessing from size or time.
    for cache in state_dir_for(dest).glob("digests.sqlite3*"):  # the store and its WAL
        cache.unlink()
    again = engine.sync(f"s3://{bucket}/m/", str(dest))
    assert (again.transferred_files, again.unchanged_files) == (0, 1)

    # Upload direction: a file equal to the multipart object is not re-uploaded.
    up = engine.sync(str(dest), f"s3://{bucket}/m/")
    assert (up.transferred_files, up.unchanged_files) == (0, 1)


def test_upload_is_incremental(engine: TransferEngine, bucket: str, tmp_path: Path) -> None:
    source = tmp_path / "results"
    write_tree(source, {f"ckpt/{i}.pth": os.urandom(2048) for i in range(30)})
    assert engine.sync(str(source), f"s3://{bucket}/results/job1").transferred_files == 30
    write_tree(source, {"ckpt/new.pth": b"new", "ckpt/3.pth": os.urandom(2048)})
    summary = engine.sync(str(source), f"s3://{bucket}/results/job1/")
    assert sorted(summary.transferred) == ["ckpt/3.pth", "ckpt/new.pth"]
    assert summary.unchanged_files == 29


def test_excludes_and_includes_follow_aws_semantics(engine: TransferEngine, bucket: str, tmp_path: Path) -> None:
    source = tmp_path / "src"
    write_tree(source, {".tao/state.json": b"1", ".tao/deep/x": b"2", "logs/a.log": b"3", "logs/keep.json": b"4",
                        "model.pth": b"5"})
    rules = PathFilter((FilterRule("exclude", ".tao/*"), FilterRule("exclude", "logs/*"),
                        FilterRule("include", "*.json")))
    summary = engine.sync(str(source), f"s3://{bucket}/r/", TransferOptions(filter=rules))
    # The last matching rule wins, exactly as in `aws s3 sync`: the include re-admits *every*
    # JSON file, .tao/state.json too (which is why outputs append their `.tao/*` rule last).
    assert sorted(summary.transferred) == [".tao/state.json", "logs/keep.json", "model.pth"]
    assert summary.excluded_files == 2

    dest = tmp_path / "dest"
    down = engine.sync(f"s3://{bucket}/r/", str(dest), TransferOptions(filter=PathFilter.from_patterns(["*.pth"])))
    assert sorted(tree_digest(dest)) == [".tao/state.json", "logs/keep.json"]
    assert down.excluded_files == 1


def test_dry_run_moves_nothing(engine: TransferEngine, s3_client, bucket: str, tmp_path: Path) -> None:
    s3_client.put_object(Bucket=bucket, Key="p/a", Body=b"a")
    summary = engine.sync(f"s3://{bucket}/p/", str(tmp_path / "d"), TransferOptions(dry_run=True))
    assert summary.transferred == ["a"] and summary.dry_run
    assert not (tmp_path / "d").exists()


def test_a_bucket_that_does_not_exist_creates_nothing_locally(engine: TransferEngine, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="'no-such-bucket-here' does not exist"):
        engine.sync("s3://no-such-bucket-here/p/", str(tmp_path / "d"))
    assert not (tmp_path / "d").exists()


def test_folder_markers_are_reported_not_downloaded(engine: TransferEngine, s3_client, bucket: str,
                                                    tmp_path: Path) -> None:
    s3_client.put_object(Bucket=bucket, Key="p/empty/", Body=b"")
    s3_client.put_object(Bucket=bucket, Key="p/empty/x", Body=b"x")
    summary = engine.sync(f"s3://{bucket}/p/", str(tmp_path / "d"))
    assert summary.ok and [s.name for s in summary.skipped] == ["p/empty/"]
    assert tree_digest(tmp_path / "d").keys() == {"empty/x"}


def test_copy_single_objects_both_ways(engine: TransferEngine, bucket: str, tmp_path: Path) -> None:
    source = tmp_path / "model.onnx"
    source.write_bytes(b"weights" * 100)
    assert engine.copy(str(source), f"s3://{bucket}/models/").ok  # trailing slash: keep the name
    assert engine.copy(str(source), f"s3://{bucket}/models/renamed.onnx").ok
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    assert engine.copy(f"s3://{bucket}/models/model.onnx", str(out_dir)).ok
    assert engine.copy(f"s3://{bucket}/models/renamed.onnx", str(tmp_path / "x" / "y.onnx")).ok
    assert (out_dir / "model.onnx").read_bytes() == source.read_bytes()
    assert (tmp_path / "x" / "y.onnx").read_bytes() == source.read_bytes()
    again = engine.copy(f"s3://{bucket}/models/model.onnx", str(out_dir))
    assert (again.transferred_files, again.unchanged_files) == (0, 1)
    missing = engine.copy(f"s3://{bucket}/models/nope.onnx", str(out_dir))
    assert not missing.ok and "no such object" in missing.failed[0].reason


def test_download_keys_without_listing(engine: TransferEngine, s3_client, bucket: str, tmp_path: Path) -> None:
    for i in range(5):
        s3_client.put_object(Bucket=bucket, Key=f"clips/c{i}.mp4", Body=f"clip{i}".encode())
    dest = tmp_path / "stage"
    items = [("clips/c1.mp4", "c1.mp4"), ("clips/c3.mp4", "sub/c3.mp4"), ("clips/nope.mp4", "nope.mp4")]
    summary = engine.download_keys(bucket, items, dest, TransferOptions())
    assert sorted(summary.transferred) == ["c1.mp4", "sub/c3.mp4"]
    assert [(f.name, f.missing) for f in summary.failed] == [("clips/nope.mp4", True)]
    assert (dest / "sub" / "c3.mp4").read_bytes() == b"clip3"
    assert not (dest / "nope.mp4").exists()

    s3_client.put_object(Bucket=bucket, Key="clips/c1.mp4", Body=b"CLIP1")  # changed remotely
    again = engine.download_keys(bucket, items[:2], dest, TransferOptions())
    assert again.transferred == ["c1.mp4"] and again.unchanged_files == 1
    assert (dest / "c1.mp4").read_bytes() == b"CLIP1"


def test_settle_time_leaves_fresh_files_for_a_later_run(engine: TransferEngine, bucket: str, tmp_path: Path) -> None:
    source = tmp_path / "results"
    write_tree(source, {"old.pth": b"old", "growing.log": b"partial"})
    old = time.time() - 120
    os.utime(source / "old.pth", (old, old))
    # ctime cannot be set back, so age both by the settle window itself: a long window skips
    # everything just written, a zero window skips nothing.
    fresh = engine.sync(str(source), f"s3://{bucket}/r/", TransferOptions(settle_seconds=3600))
    assert fresh.transferred == [] and {s.name for s in fresh.skipped} == {"old.pth", "growing.log"}
    time.sleep(1.2)
    (source / "growing.log").write_bytes(b"partial and more")
    later = engine.sync(str(source), f"s3://{bucket}/r/", TransferOptions(settle_seconds=1))
    assert later.transferred == ["old.pth"] and [s.name for s in later.skipped] == ["growing.log"]
