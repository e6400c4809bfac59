"""The change-detection strategy on its own: what it trusts, and what it refuses to guess."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tao_data_io.fs.digest import file_digest
from tao_data_io.transfer.digests import DigestStore
from tao_data_io.transfer.local_walk import local_file
from tao_data_io.transfer.strategy import ContentStrategy


def _aged(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    old = time.time() - 60
    os.utime(path, (old, old))


def test_opaque_etag_recorded_at_transfer_is_trusted_while_the_file_is_unchanged(tmp_path: Path) -> None:
    """SSE-KMS ETags are not MD5s: only the ETag recorded when these bytes moved can say
    "unchanged" — and only while the file's stat identity holds."""
    path = tmp_path / "x.bin"
    _aged(path, b"payload")
    store = DigestStore(tmp_path / "digests.sqlite3")
    store.record(local_file("x.bin", path, path.stat()), etag="kms-opaque-etag-1")
    strategy = ContentStrategy(store, lambda key: None)
    assert strategy.unchanged(local_file("x.bin", path, path.stat()), "k", 7, "kms-opaque-etag-1")
    assert not strategy.unchanged(local_file("x.bin", path, path.stat()), "k", 7, "kms-opaque-etag-2")
    path.write_bytes(b"PAYLOAD")  # same size, new content, new mtime
    assert not strategy.unchanged(local_file("x.bin", path, path.stat()), "k", 7, "kms-opaque-etag-1")


def test_plain_etag_is_compared_with_the_content_not_the_size(tmp_path: Path) -> None:
    path = tmp_path / "y.bin"
    _aged(path, b"abc")
    strategy = ContentStrategy(DigestStore(None), lambda key: None)
    assert strategy.unchanged(local_file("y.bin", path, path.stat()), "k", 3, file_digest(path, "md5"))
    assert not strategy.unchanged(local_file("y.bin", path, path.stat()), "k", 3, "0" * 32)
    assert not strategy.unchanged(local_file("y.bin", path, path.stat()), "k", 4, file_digest(path, "md5"))


def test_racy_entry_keeps_its_etag_only_when_the_content_verifies(tmp_path: Path) -> None:
    path = tmp_path / "z.bin"
    path.write_bytes(b"fresh")  # mtime now: any entry recorded now is racy
    store = DigestStore(None)
    store.record(local_file("z.bin", path, path.stat()), md5=file_digest(path, "md5"), etag="kms-etag")
    strategy = ContentStrategy(store, lambda key: None)
    assert strategy.unchanged(local_file("z.bin", path, path.stat()), "k", 5, "kms-etag")
