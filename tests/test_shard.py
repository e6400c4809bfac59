"""Shards over real HTTP: N shard runs fill a destination exactly as one run does."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tao_data_io.credentials import S3Credentials
from tao_data_io.errors import UsageError
from tao_data_io.fs.locks import destination_lock_path
from tao_data_io.fs.temp import lock_tag, temp_path_for
from tao_data_io.transfer.engine import TransferEngine
from tao_data_io.transfer.options import TransferOptions
from tao_data_io.transfer.shard import Shard, parse_shard, shard_of

from .helpers import tree_digest

FILES = {f"d{i % 4}/f{i:03d}.bin": bytes([i % 251]) * (i + 1) for i in range(60)}


@pytest.fixture
def engine(s3_credentials: S3Credentials) -> Iterator[TransferEngine]:
    with TransferEngine(s3_credentials, concurrency=16) as built:
        yield built


@pytest.fixture
def dataset(s3_client, bucket: str) -> str:  # type: ignore[no-untyped-def]
    for name, data in FILES.items():
        s3_client.put_object(Bucket=bucket, Key=f"data/{name}", Body=data)
    return f"s3://{bucket}/data/"


def test_n_shard_runs_produce_exactly_the_tree_of_one_run(engine: TransferEngine, dataset: str, tmp_path: Path) -> None:
    whole = engine.sync(dataset, str(tmp_path / "one"))
    moved: list[set[str]] = []
    for index in range(3):
        summary = engine.sync(dataset, str(tmp_path / "sharded"), TransferOptions(shard=Shard(index, 3)))
        assert summary.ok and summary.excluded_files == len(FILES) - summary.transferred_files
        moved.append(set(summary.transferred))
    assert whole.ok and whole.transferred_files == len(FILES)
    assert tree_digest(tmp_path / "sharded") == tree_digest(tmp_path / "one")
    assert sum(len(part) for part in moved) == len(FILES) and set.union(*moved) == set(FILES)  # disjoint, complete
    assert all(part for part in moved)  # 60 keys over 3 shards: none is empty
    again = engine.sync(dataset, str(tmp_path / "sharded"), TransferOptions(shard=Shard(1, 3)))
    assert again.transferred_files == 0 and again.unchanged_files == len(moved[1])


def test_a_shard_removes_only_its_own_killed_downloads(engine: TransferEngine, dataset: str, tmp_path: Path) -> None:
    dest = tmp_path / "out"
    owner = {name: shard_of(f"data/{name}", 2) for name in FILES}
    mine = next(name for name, index in owner.items() if index == 0)
    theirs = next(name for name, index in owner.items() if index == 1)
    leftovers = {}
    for name, shard in ((mine, Shard(0, 2)), (theirs, Shard(1, 2))):  # killed while holding their shard's lock
        temp = temp_path_for(dest / name, lock_tag(destination_lock_path(dest, shard.label)))
        temp.parent.mkdir(parents=True, exist_ok=True)
        temp.write_bytes(b"partial")
        leftovers[name] = temp
    assert engine.sync(dataset, str(dest), TransferOptions(shard=Shard(0, 2))).ok
    assert not leftovers[mine].exists() and leftovers[theirs].exists()


@pytest.mark.parametrize("text", ["3/3", "-1/2", "1", "a/b", "0/0", "1/2000"])
def test_bad_shards_are_refused_naming_the_value(text: str) -> None:
    with pytest.raises(UsageError, match=f"shard '{text}'"):
        parse_shard(text)


def test_shard_hash_is_stable_across_processes_and_versions() -> None:
    # Golden values: a change of the hash would send a rerun's keys to other shards.
    assert [shard_of(f"k{i}", 4) for i in range(8)] == [2, 0, 0, 2, 1, 2, 3, 3]
