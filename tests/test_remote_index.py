"""The upload's index of its destination, listed a folder at a time, several at once: it holds
exactly what one flat listing holds (on SeaweedFS and on moto, hostile keys included), a chunk
waits only for the folders its keys lie in, and where a level's folders cannot be trusted to
partition it (too many, not first folders, a store that ignores the delimiter) the level is
listed flat."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tao_data_io.credentials import S3Credentials
from tao_data_io.errors import TransferError
from tao_data_io.transfer import remote_index
from tao_data_io.transfer.client import make_s3_client
from tao_data_io.transfer.engine import TransferEngine
from tao_data_io.transfer.keys import unsendable_name
from tao_data_io.transfer.listing import list_remote
from tao_data_io.transfer.remote_index import RemoteIndex
from tao_data_io.uris import S3Url

from .helpers import write_tree

#: Long enough for a listing of a few keys on a loaded machine; reached only when a wait hangs.
HANG_S = 30


class Store:
    """ListObjectsV2 over a set of keys, grouped at a delimiter as S3 groups (a common prefix is a
    key up to and including the first delimiter after the prefix), paged by ``page_size``, in
    UTF-8 binary order; every request it answers is logged, and a folder listed flat may be held
    (``hold``) or fail (``fail``)."""

    def __init__(self, keys: Iterable[str], page_size: int = 2) -> None:
        self.keys = sorted(keys, key=str.encode)
        self.page_size = page_size
        self.requests: list[tuple[str, str | None]] = []
        self.held: dict[str, threading.Event] = {}
        self.failing: set[str] = set()
        self._log = threading.Lock()

    def hold(self, prefix: str) -> threading.Event:
        self.held[prefix] = threading.Event()
        return self.held[prefix]

    def entries(self, prefix: str, delimiter: str | None) -> list[tuple[str, str]]:
        entries: list[tuple[str, str]] = []
        for key in self.keys:
            if not key.startswith(prefix):
                continue
            cut = key.find(delimiter, len(prefix)) if delimiter else -1
            if cut < 0:
                entries.append(("key", key))
            elif ("common", key[:cut + 1]) not in entries[-1:]:
                entries.append(("common", key[:cut + 1]))
        return entries

    def __call__(self, prefix: str, delimiter: str | None) -> Iterator[Mapping[str, Any]]:
        with self._log:
            self.requests.append((prefix, delimiter))
        if prefix in self.held:
            assert self.held[prefix].wait(HANG_S)
        if prefix in self.failing:
            raise TransferError(f"listing s3://b/{prefix} failed")
        entries = self.entries(prefix, delimiter)
        for start in range(0, len(entries), self.page_size):
            page = entries[start:start + self.page_size]
            yield {"Contents": [{"Key": key, "Size": len(key), "ETag": '"e"'} for kind, key in page if kind == "key"],
                   "CommonPrefixes": [{"Prefix": key} for kind, key in page if kind == "common"],
                   "IsTruncated": start + self.page_size < len(entries)}


class IgnoresDelimiter(Store):
    def entries(self, prefix: str, delimiter: str | None) -> list[tuple[str, str]]:
        return super().entries(prefix, None)


class NamesDeeperFolders(Store):
    """Names ``p/a/b/`` where S3 would name ``p/a/``: not a partition of the level."""

    def entries(self, prefix: str, delimiter: str | None) -> list[tuple[str, str]]:
        if delimiter is None:
            return super().entries(prefix, None)
        return [("common", "p/a/b/") if entry == ("common", "p/a/") else entry
                for entry in super().entries(prefix, "/")]


KEYS = ["p/a-b", "p/a/1", "p/a/2", "p/a/b/3", "p/a//4", "p//5", "p/b/6", "p/b/7", "p/c/", "p/c/8", "p/top",
        "p/", "other/9"]


def indexed(index: RemoteIndex, keys: Iterable[str]) -> dict[str, int]:
    """What ``index`` holds of ``keys``: key → size."""
    return {key: obj.size for key, obj in index.among(list(keys)).items()}


def flat(store: Store, prefix: str = "p/") -> dict[str, int]:
    """What one flat listing holds, folder markers left out as the index leaves them."""
    return {key: len(key) for kind, key in store.entries(prefix, None) if not key.endswith("/")}


def opened(store: Store) -> RemoteIndex:
    return RemoteIndex(S3Url("b", "p/"), store)


def listed(store: Store, keys: list[str] = KEYS) -> list[str]:
    """The requests ``store`` answered for an index of ``p/`` (each ``prefix delimiter``, sorted:
    folders are listed in any order), once the index is found to hold what one flat listing holds."""
    index = opened(store)
    try:
        assert indexed(index, [*keys, "p/a/absent", "p/zz"]) == flat(store)
        assert index.total_bytes() == sum(flat(store).values())
    finally:
        index.close()
    return sorted(f"{prefix} {delimiter}" for prefix, delimiter in store.requests)


def test_folders_are_listed_apart_each_flat() -> None:
    assert listed(Store(KEYS)) == ["p/ /", "p/ None", "p// None", "p/a/ None", "p/b/ None", "p/c/ None"]


def test_a_prefix_of_one_page_is_listed_in_one_request() -> None:
    assert listed(Store(KEYS, page_size=1000)) == ["p/ None"]


def test_many_small_folders_are_listed_flat() -> None:
    keys = [f"p/epoch_{number:04d}/{name}" for number in range(1500) for name in ("model.pth", "events")]
    assert listed(Store(keys, page_size=1000), keys) == ["p/ None"]


def test_a_store_that_ignores_the_delimiter_gives_the_same_index() -> None:
    assert listed(IgnoresDelimiter(KEYS)) == ["p/ /", "p/ None"]


def test_a_level_naming_a_folder_that_is_not_a_first_folder_is_listed_flat() -> None:
    assert listed(NamesDeeperFolders(KEYS)) == ["p/ /", "p/ None"]


def test_a_level_naming_more_folders_than_it_may_split_is_listed_flat(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remote_index, "MOST_FOLDERS", 3)
    assert listed(Store(KEYS)) == ["p/ /", "p/ None"]


def test_a_chain_of_lone_folders_is_followed_to_the_level_with_several() -> None:
    keys = ["p/run/", "p/run/out/x/1", "p/run/out/y/2", "p/run/log", "p/note"]
    assert listed(Store(keys), keys) == ["p/ /", "p/ None", "p/run/ /", "p/run/out/ /", "p/run/out/x/ None",
                                         "p/run/out/y/ None"]


def test_a_chunk_waits_only_for_the_folders_its_keys_lie_in() -> None:
    store = Store(KEYS)
    release = store.hold("p/b/")
    index = opened(store)
    try:
        assert indexed(index, ["p/a/1", "p/a//4", "p/top", "p/zz/new"]) == {"p/a/1": 5, "p/a//4": 6, "p/top": 5}
        found: list[dict[str, int]] = []
        waiting = threading.Thread(target=lambda: found.append(indexed(index, ["p/b/6"])))
        waiting.start()
        assert not found  # p/b/ is still held
        release.set()
        waiting.join(HANG_S)
        assert found == [{"p/b/6": 5}]
    finally:
        release.set()
        index.close()


def test_a_folders_listing_error_is_raised_for_its_keys_and_by_the_total() -> None:
    store = Store(KEYS)
    store.failing.add("p/b/")
    index = opened(store)
    try:
        assert indexed(index, ["p/a/1"]) == {"p/a/1": 5}
        with pytest.raises(TransferError, match="p/b/"):
            index.among(["p/b/6"])
        with pytest.raises(TransferError, match="p/b/"):
            index.total_bytes()
    finally:
        index.close()


@pytest.mark.parametrize("markers", [False, True], ids=["objects", "folder markers"])
def test_closing_the_index_stops_a_listing_that_would_not_end(markers: bool) -> None:
    """Each listing stops at its next page, whatever the page holds: markers are no objects."""
    listing = threading.Event()

    def endless(prefix: str, delimiter: str | None) -> Iterator[Mapping[str, Any]]:
        if delimiter:
            yield {"CommonPrefixes": [{"Prefix": "p/a/"}, {"Prefix": "p/b/"}], "IsTruncated": False}
            return
        for number in range(10 ** 9):
            listing.set()
            yield {"Contents": [{"Key": f"{prefix}{number}{'/' if markers else ''}", "Size": 1, "ETag": '"e"'}],
                   "IsTruncated": True}

    index = RemoteIndex(S3Url("b", "p/"), endless)
    assert listing.wait(HANG_S)
    closing = threading.Thread(target=index.close)
    closing.start()
    closing.join(HANG_S)
    assert not closing.is_alive()


# --------------------------------------------------------------------------- real stores
def assert_indexed_as_listed(credentials: S3Credentials, bucket: str, prefix: str, keys: list[str]) -> None:
    """The index holds what boto3's flat listing holds: every byte in its total, and every key a
    file could be uploaded to (``among`` looks up no key an upload would skip) by its lookup."""
    listed = {obj.key: obj for obj in list_remote(make_s3_client(credentials), S3Url(bucket, prefix)).objects}
    with TransferEngine(credentials) as engine:
        index = engine.list_into_index(S3Url(bucket, prefix))
        try:
            assert index.among(keys + [prefix + "absent/x"]) == {
                key: obj for key, obj in listed.items() if unsendable_name(key) is None}
            assert index.total_bytes() == sum(obj.size for obj in listed.values())
        finally:
            index.close()


def test_the_index_on_seaweedfs_is_its_flat_listing(s3_credentials: S3Credentials, s3_client, bucket: str,  # type: ignore[no-untyped-def]
                                                    tmp_path: Path) -> None:
    files = {"a-b": b"1", "a/x": b"22", "a/y/z": b"333", "b c/ü+%20.bin": b"4444", "top": b"5", "d0/e/f/g": b"6",
             **{f"many/{i:03d}": bytes(i) for i in range(30)}}
    write_tree(tmp_path / "src", files)
    assert TransferEngine(s3_credentials).sync(str(tmp_path / "src"), f"s3://{bucket}/data/").ok
    s3_client.put_object(Bucket=bucket, Key="data/marker/", Body=b"")
    s3_client.put_object(Bucket=bucket, Key="data-sibling/not-listed", Body=b"x")
    assert_indexed_as_listed(s3_credentials, bucket, "data/", ["data/" + name for name in files])


def test_the_index_of_hostile_keys_on_moto_is_its_flat_listing(moto_credentials: S3Credentials) -> None:
    client = make_s3_client(moto_credentials)
    client.create_bucket(Bucket="remote-index")
    keys = ["p/../evil", "p//abs", "p/\x01ctl/x", "p/./dot", "p/dir/", "p/sp ace/x", "p/pct%20x/y", "p/plus+x/z",
            "p/ü/w", "p/q?x&y=z", "p/star*/v", "p/ok.txt", "p/a-b", "p/a/c", "other/not-listed"]
    for key in keys:
        client.put_object(Bucket="remote-index", Key=key, Body=key.encode())
    assert_indexed_as_listed(moto_credentials, "remote-index", "p/", keys)
