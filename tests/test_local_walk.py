"""What the walk cannot decide where it meets it (a symlink, a file with several links) is held
on disk until the tree has been seen, not in memory: a dataset assembled with ``ln -s`` holds a
million such entries. Held that way, every entry is still decided as the policy says — across
many statements of the store and many lookups of the second walk — and a device or inode number
past SQLite's signed range comes back whole."""

from __future__ import annotations

import os
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

from tao_data_io.credentials import S3Credentials
from tao_data_io.fs.temp import temp_name
from tao_data_io.transfer import local_walk
from tao_data_io.transfer.engine import TransferEngine
from tao_data_io.transfer.local_walk import LocalFile, LocalWalk, walk_local
from tao_data_io.transfer.summary import Skipped

from .helpers import tree_digest, write_tree

#: More entries of each kind than one statement of the store writes, and more files than one
#: lookup of the second walk asks about.
MANY = 3 * local_walk.ROWS_A_STATEMENT + 7
FILES = 2 * local_walk._LOOKUP + 11


def test_a_tree_of_many_links_is_decided_as_the_policy_says(s3_credentials: S3Credentials, bucket: str,
                                                             tmp_path: Path) -> None:
    source, outside = tmp_path / "results", tmp_path / "elsewhere"
    write_tree(source, {f"data/{i:04d}.jpg": b"image %d" % i for i in range(FILES)})
    write_tree(outside, {**{f"{i}.key": b"not yours %d" % i for i in range(MANY)},
                         **{f"{i}.other": b"nor this %d" % i for i in range(MANY)}})
    for i in range(MANY):
        (source / f"inside-{i:04d}.jpg").symlink_to(source / f"data/{(i * 7) % FILES:04d}.jpg")  # the second walk
        (source / f"leaves-{i:04d}").symlink_to(outside / f"{i}.other")
        (source / f"dangles-{i:04d}").symlink_to(tmp_path / f"nothing-{i}")
        os.link(source / f"data/{i:04d}.jpg", source / f"twin-{i:04d}.jpg")  # both names inside: one file twice
        os.link(outside / f"{i}.key", source / f"borrowed-{i:04d}.key")  # a link to a file outside
        (source / f"to-twin-{i:04d}.jpg").symlink_to(source / f"twin-{i:04d}.jpg")  # found among the held files
        (source / f"to-borrowed-{i:04d}").symlink_to(source / f"borrowed-{i:04d}.key")
    (source / "to-a-directory").symlink_to(source / "data")

    with TransferEngine(s3_credentials) as engine:
        summary = engine.sync(str(source), f"s3://{bucket}/r/")
        assert summary.ok
        reasons: dict[str, list[str]] = {}
        for skipped in summary.skipped:
            reasons.setdefault(skipped.name.rsplit("-", 1)[0], []).append(skipped.reason)
        assert {kind: len(found) for kind, found in reasons.items()} == {
            "leaves": MANY, "dangles": MANY, "borrowed": MANY, "to-borrowed": MANY, "to-a": 1}
        assert all("outside the tree" in reason for reason in reasons["leaves"])
        assert all("dangling" in reason for reason in reasons["dangles"])
        assert all("a hard link to a file with 2 links, only 1 of them" in reason
                   for reason in reasons["borrowed"] + reasons["to-borrowed"])
        assert "to a directory" in reasons["to-a"][0]
        assert summary.transferred_files == FILES + 3 * MANY  # data, inside-, twin-, to-twin-
        engine.sync(f"s3://{bucket}/r/", str(tmp_path / "back"))
    back = tree_digest(tmp_path / "back")
    data = tree_digest(source / "data")
    assert len(back) == summary.transferred_files
    for i in range(MANY):
        assert back[f"inside-{i:04d}.jpg"] == data[f"{(i * 7) % FILES:04d}.jpg"]
        assert back[f"twin-{i:04d}.jpg"] == back[f"to-twin-{i:04d}.jpg"] == data[f"{i:04d}.jpg"]
    with TransferEngine(s3_credentials) as engine:
        again = engine.sync(str(source), f"s3://{bucket}/r/")
    assert (again.transferred_files, again.unchanged_files) == (0, summary.transferred_files)


def test_the_walk_keeps_what_it_holds_back_out_of_memory(tmp_path: Path) -> None:
    """20,000 symlinks held as tuples of a name, a stat and a link took ~8 MB of Python objects
    until the walk's end; on disk, what is left in Python memory is a statement's rows."""
    root = tmp_path / "links"
    root.mkdir()
    for i in range(20_000):
        os.symlink(f"/nowhere/{i:06d}/image.JPEG", root / f"img_{i:06d}.JPEG")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with LocalWalk() as walk:
            tracemalloc.start()
            try:
                assert list(walk_local(fd, root, walk)) == []  # all held back
                held, _ = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            decided = sum(1 for entry in walk.decided(root) if isinstance(entry, Skipped))
    finally:
        os.close(fd)
    assert decided == 20_000
    assert held < 1 << 20, f"{held} bytes of Python memory held after walking 20,000 symlinks"


def test_device_and_inode_numbers_past_sqlites_signed_range_come_back_whole(tmp_path: Path) -> None:
    """``st_dev`` and ``st_ino`` are unsigned 64-bit; an overlayfs inode carrying its xino bits
    can pass 2**63, where a SQLite integer ends."""
    dev, ino = 2**64 - 1, 2**63 + 5
    with LocalWalk() as walk:
        walk.hold_linked(LocalFile("a.bin", tmp_path, "a.bin", 10, 1000, 2000, ino, dev, None, 2))
        walk.hold_linked(LocalFile("b.bin", tmp_path, "b.bin", 10, 1000, 2000, ino, dev, None, 2))
        target: Any = os.stat_result((0o100644, ino, dev, 2, 0, 0, 10, 1, 2, 3, 1.0, 2.0, 3.0, 1000, 1000, 2000))
        walk.hold_link("alias.bin", target, "a.bin")
        decided = list(walk.decided(tmp_path))
    files = {entry[0].relative: entry for entry in decided if not isinstance(entry, Skipped)}
    assert set(files) == {"a.bin", "b.bin", "alias.bin"} and all(outside is None for _, outside in files.values())
    assert all(local.identity == (dev, ino) for local, _ in files.values())
    assert files["alias.bin"][0].path == tmp_path / "a.bin" and files["alias.bin"][0].target_relative == "a.bin"


def test_a_hard_link_moved_while_the_tree_is_walked_is_not_counted_as_two_names(
        s3_credentials: S3Credentials, bucket: str, tmp_path: Path, monkeypatch: Any) -> None:
    """A link whose other name is outside the tree is refused because the walk meets fewer of its
    names than ``st_nlink``. A job that moves its name (``a/x`` → ``z/x``) after the walk met it
    and before the walk reaches ``z/`` is met twice under two names — as many as ``st_nlink`` —
    and the outside file would go up. A rename changes the inode's ctime: names of one inode
    met with different ctimes (or link counts) are refused."""
    source, outside = tmp_path / "results", tmp_path / "elsewhere"
    write_tree(source, {"a/keep.txt": b"kept", "z/keep.txt": b"kept too"})
    write_tree(outside, {"secret": b"someone else's file"})
    os.link(outside / "secret", source / "a" / "x")
    held = local_walk.LocalWalk.hold_linked

    def moved_once_met(walk: LocalWalk, local: LocalFile) -> None:
        held(walk, local)
        if local.relative == "a/x":
            os.rename(source / "a" / "x", source / "z" / "x")

    monkeypatch.setattr(local_walk.LocalWalk, "hold_linked", moved_once_met)
    with TransferEngine(s3_credentials) as engine:
        summary = engine.sync(str(source), f"s3://{bucket}/r/")
        engine.sync(f"s3://{bucket}/r/", str(tmp_path / "back"))
    assert tree_digest(tmp_path / "back") == {k: v for k, v in tree_digest(source).items() if k != "z/x"}
    assert sorted(skipped.name for skipped in summary.skipped) == ["a/x", "z/x"]
    assert all("changed while the tree was walked" in skipped.reason for skipped in summary.skipped)


def test_the_second_walk_looks_its_targets_up_by_index(tmp_path: Path) -> None:
    """Each of the second walk's lookups asks about :data:`~local_walk._LOOKUP` files; a lookup
    that scans the held symlinks makes a tree of N files and N symlinks to them cost N²/300 row
    reads (320,000 of each: 95 s, and a 1.28 M-image ``ln -s`` view ~25 min). The plan must
    search ``links`` by its identity index (sqlite.org/eqp.html: SEARCH, not SCAN)."""
    with LocalWalk() as walk:
        for i in range(2 * local_walk.ROWS_A_STATEMENT):
            walk.hold_link(f"alias-{i}", FileNotFoundError(2, "No such file or directory"), f"nothing-{i}")
        list(walk.decided(tmp_path))
        db = walk._db
        assert db is not None
        plan = [row[3] for row in db.execute("EXPLAIN QUERY PLAN " + local_walk._wanted_statement(local_walk._LOOKUP),
                                             [0] * (2 * local_walk._LOOKUP))]
    assert not any(step.startswith("SCAN links") or step.startswith("SCAN k") for step in plan), plan
    assert any("USING INDEX links_identity" in step for step in plan), plan


def test_what_the_walk_skips_is_handed_on_not_held(tmp_path: Path) -> None:
    """Special files and reserved names are reported as the walk meets them, to a summary that
    keeps the first names and counts the rest: a tree of 100,000 FIFOs held each as a ``Skipped``
    took 15 MB until the walk's end, 100,000 reserved names 8 MB."""
    root = tmp_path / "tree"
    (root / "pipes").mkdir(parents=True)
    (root / "partial").mkdir()
    for i in range(10_000):
        os.mkfifo(root / "pipes" / f"p{i:05d}")
        (root / "partial" / temp_name(f"f{i:05d}")).write_bytes(b"")
    handed: Counter[str] = Counter()  # by reason: a sink that holds no name, so what is traced is the walk's
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with LocalWalk(skip=lambda *skipped: handed.update(entry.reason for entry in skipped)) as walk:
            tracemalloc.start()
            try:
                assert list(walk_local(fd, root, walk)) == []
                held, _ = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
    finally:
        os.close(fd)
    assert handed == {"special file (socket, FIFO or device); refused": 10_000, local_walk.RESERVED_REASON: 10_000}
    assert held < 1 << 20, f"{held} bytes of Python memory held after walking 20,000 skipped entries"
