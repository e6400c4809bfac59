"""The digest cache as an incremental store: one row per file, so a run that changes a few files
writes a few rows; a killed run loses only what it recorded since its last commit; a cache of
the JSON schema before it is imported once; a damaged one costs a rehash, never a wrong answer."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tao_data_io.transfer.digests import COMMIT_EVERY, DigestStore
from tao_data_io.transfer.local_walk import LocalFile, local_file


def local(index: int, *, size: int = 1024) -> LocalFile:
    return LocalFile(f"n{index // 1280:05d}/img_{index:08d}.JPEG", Path("/data"), str(index), size,
                     1_700_000_000_000_000_000 + index, 1_700_000_000_000_000_000 + index, 10_000 + index)


def rows(path: Path) -> dict[str, int]:
    """relative → recorded_ns, read straight from the file (no store code involved)."""
    with sqlite3.connect(path) as db:
        return dict(db.execute("SELECT relative, recorded_ns FROM entries"))


def test_a_run_that_changes_20_of_10000_files_writes_20_rows(tmp_path: Path) -> None:
    path = tmp_path / "digests.sqlite3"
    store = DigestStore(path)
    for index in range(10_000):
        store.record(local(index), etag=f"{index:032x}")
    store.close()
    before = rows(path)
    changed_at = time.time_ns()
    store = DigestStore(path)
    assert all(store.same_stat(local(index)) is not None for index in range(0, 10_000, 97))
    for index in range(0, 10_000, 500):
        store.record(local(index), etag="f" * 32)
    store.close()
    after = rows(path)
    rewritten = {name for name, recorded in after.items() if recorded >= changed_at}
    assert len(after) == 10_000 and len(rewritten) == 20
    assert all(after[name] == before[name] for name in after.keys() - rewritten)


_KILLED = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    from tao_data_io.transfer.digests import DigestStore
    from tao_data_io.transfer.local_walk import LocalFile, local_file

    store = DigestStore(Path(sys.argv[1]))
    for index in range(int(sys.argv[2])):
        store.record(LocalFile(f"f{index}", Path("/"), f"f{index}", 1, index, index, index), etag="e" * 32)
    os._exit(9)  # killed: no commit, no close
""")


def test_a_run_killed_mid_way_loses_only_the_entries_since_its_last_commit(tmp_path: Path) -> None:
    path = tmp_path / "digests.sqlite3"
    recorded = 3 * COMMIT_EVERY + 17
    subprocess.run([sys.executable, "-c", _KILLED, str(path), str(recorded)], check=False)
    kept = rows(path)
    assert len(kept) == 3 * COMMIT_EVERY  # every commit held; the 17 after it were in flight
    store = DigestStore(path)
    try:
        assert store.same_stat(LocalFile("f0", Path("/"), "f0", 1, 0, 0, 0)) is not None
    finally:
        store.close()


def test_a_cache_of_the_json_schema_is_imported_once_then_removed(tmp_path: Path) -> None:
    legacy = tmp_path / "digests.json"
    file = local(7)
    legacy.write_text(json.dumps({"schema_version": 2, "entries": {file.relative: {
        "identity": [file.size, file.mtime_ns, file.ctime_ns, file.ino], "recorded_ns": 1, "md5": None,
        "etag": "kms-opaque", "multipart": {"8388608": "a" * 32 + "-2"}}}}))
    store = DigestStore(tmp_path / "digests.sqlite3")
    try:
        entry = store.same_stat(file)
    finally:
        store.close()
    assert entry is not None and entry.etag == "kms-opaque" and entry.multipart == {"8388608": "a" * 32 + "-2"}
    assert not legacy.exists()


def test_a_damaged_store_is_set_aside_and_costs_a_rehash(tmp_path: Path) -> None:
    path = tmp_path / "digests.sqlite3"
    path.write_bytes(b"not a database, at all" * 100)
    store = DigestStore(path)
    try:
        assert store.same_stat(local(1)) is None  # nothing known: the file is hashed again
        store.record(local(1), etag="e" * 32)
    finally:
        store.close()
    assert (tmp_path / "digests.sqlite3.damaged").exists() and len(rows(path)) == 1


def test_an_entry_describes_a_file_only_while_its_stat_is_unchanged(tmp_path: Path) -> None:
    store = DigestStore(tmp_path / "digests.sqlite3")
    try:
        store.record(local(3), md5="a" * 32)
        assert store.same_stat(local(3)) is not None
        assert store.same_stat(local(3, size=1025)) is None
        store.forget(local(3).relative)
        assert store.same_stat(local(3)) is None
    finally:
        store.close()


def test_a_downloaded_file_is_recorded_from_its_stat_as_record_would(tmp_path: Path) -> None:
    """record_written (a download's: the stat, no LocalFile) leaves the entry record does."""
    written = tmp_path / "a.bin"
    written.write_bytes(b"x" * 10)
    st = os.stat(written)
    store = DigestStore(tmp_path / "digests.sqlite3")
    try:
        store.record_written("a.bin", st, "e" * 32)
        store.save()
        entry = store.same_stat(local_file("a.bin", written, st))
        assert entry is not None and entry.etag == "e" * 32 and entry.md5 is None and entry.multipart == {}
        reference = store.record(local_file("a.bin", written, st), etag="e" * 32)
        assert (entry.identity, entry.etag, entry.md5, entry.multipart) == (
            reference.identity, reference.etag, reference.md5, reference.multipart)
    finally:
        store.close()


#: A file the killed run above records first; its row is what another user's store vouches for.
VOUCHED = LocalFile("f0", Path("/"), "f0", 1, 0, 0, 0)


@pytest.mark.parametrize("foreign", ["store", "wal", "link", "legacy"])
def test_a_store_another_user_left_vouches_for_nothing(tmp_path: Path, foreign: str) -> None:
    """Rows another user wrote — their store, the WAL SQLite would replay into ours, a link to a
    store elsewhere, a cache of the JSON schema — are never read: set aside, the file is hashed
    again. (Another user is uid 65534, given the file with chown; we run as root.)"""
    path = tmp_path / "digests.sqlite3"
    if foreign == "legacy":
        legacy = tmp_path / "digests.json"
        legacy.write_text(json.dumps({"schema_version": 2, "entries": {VOUCHED.relative: {
            "identity": [1, 0, 0, 0], "recorded_ns": 1, "md5": None, "etag": "e" * 32}}}))
        planted = legacy
    elif foreign == "wal":
        subprocess.run([sys.executable, "-c", _KILLED, str(path), str(COMMIT_EVERY)], check=False)
        planted = Path(f"{path}-wal")  # the rows are in the WAL only: the run was killed before a checkpoint
    else:
        theirs = tmp_path / "theirs" / "digests.sqlite3" if foreign == "link" else path
        theirs.parent.mkdir(exist_ok=True)
        store = DigestStore(theirs)
        store.record(VOUCHED, etag="e" * 32)
        store.close()
        if foreign == "link":
            path.symlink_to(theirs)
        planted = path
    os.chown(planted, 65534, 65534, follow_symlinks=False)
    store = DigestStore(path)
    try:
        assert store.same_stat(VOUCHED) is None
    finally:
        store.close()
    assert os.stat(path, follow_symlinks=False).st_uid == os.geteuid()
