"""The stage root must be writable by whoever stages: a stage proves it before a byte moves, and
refuses with the directory, its owner and mode, and the fix — real permissions, on real
directories, as the stager image's user (uid 1000) when the tests run as root."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tao_data_io.errors import UsageError
from tao_data_io.request import JobRequest
from tao_data_io.staging.stage import stage
from tao_data_io.staging.writable import SHARED_MODE, prove_writable

STAGER = 1000
ROOT = os.geteuid() == 0


@pytest.fixture
def volume() -> Iterator[Path]:
    """A freshly provisioned volume's root: ``root:root 0755`` (when not root: ours, ``0555``,
    which refuses us the same way). Outside pytest's 0700 base, so uid 1000 can reach it."""
    base = Path(tempfile.mkdtemp(prefix="tao-volume-"))
    base.chmod(0o755)
    root = base / "volume"
    root.mkdir()
    root.chmod(0o755 if ROOT else 0o555)
    yield root
    for path in (root, *root.rglob("*")):
        if path.is_dir():
            path.chmod(0o755)
    shutil.rmtree(base)


@contextmanager
def as_stager(groups: tuple[int, ...] = ()) -> Iterator[None]:
    """The stage pod's identity: uid and gid 1000 with ``groups`` (a pod's fsGroup) when root;
    ourselves otherwise."""
    if not ROOT:
        yield
        return
    before = os.getgroups()
    os.setgroups([STAGER, *groups])
    os.setegid(STAGER)
    os.seteuid(STAGER)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)
        os.setgroups(before)


def shared(directory: Path, gid: int = STAGER) -> None:
    """What the fix (or a volume that applied fsGroup) makes of a directory."""
    if ROOT:
        os.chown(directory, 0, gid)
    directory.chmod(SHARED_MODE)


def request() -> JobRequest:
    return JobRequest.model_validate({
        "schema_version": "1", "job_id": "job-w", "image": "tao:6", "mode": "args", "command": ["dino", "train"], "args": [],
        "inputs": [{"source": "s3://bkt-1/data/", "target": "/data"}]})


def test_a_stage_refuses_a_volume_root_it_cannot_write_before_anything_moves(volume: Path) -> None:
    cache, jobs = volume / "cache", volume / "jobs" / "job-w"
    with as_stager(), pytest.raises(UsageError) as info:
        stage(request(), cache, map_path=jobs / "staging-map.json", environ={})
    said = str(info.value)
    assert f"the staging root {cache} cannot be written by this stage" in said
    assert f"{volume} is owned by" in said and f"with mode {stat.S_IMODE(volume.stat().st_mode):04o}" in said
    assert "did not apply the pod's fsGroup" in said
    assert f"pre-create {cache} on the volume" in said and "chmod 2775 DIR" in said
    assert list(volume.iterdir()) == []  # nothing was written


def test_a_pre_created_group_writable_cache_is_the_fix(volume: Path) -> None:
    cache = volume / "cache"
    if ROOT:
        cache.mkdir()
    else:
        volume.chmod(0o755)
        cache.mkdir()
        volume.chmod(0o555)
    shared(cache)
    with as_stager():
        prove_writable(cache, what="the staging root")
        (cache / "entry").mkdir()
    assert sorted(p.name for p in cache.iterdir()) == ["entry"]  # the probe's file is gone


def test_the_map_directory_is_proved_too(volume: Path) -> None:
    """The staging map lands beside the cache (``jobs/<job>/``): a fix that pre-creates only
    ``cache/`` is refused with the other directory named, still before any transfer."""
    cache = volume / "cache"
    if not ROOT:
        volume.chmod(0o755)
    cache.mkdir()
    if not ROOT:
        volume.chmod(0o555)
    shared(cache)
    jobs = volume / "jobs" / "job-w"
    with as_stager(), pytest.raises(UsageError, match=rf"the staging map's directory {jobs} cannot be written"):
        stage(request(), cache, map_path=jobs / "staging-map.json", environ={})


def test_a_volume_whose_root_took_the_fs_group_is_written_by_any_member(volume: Path) -> None:
    group = 4242 if ROOT else os.getegid()  # a group only root hands out, as the kubelet does
    shared(volume, gid=group)  # the kubelet's SetVolumeOwnership: gid fsGroup, g+rwx, setgid
    with as_stager(groups=(group,)):
        prove_writable(volume / "cache", what="the staging root")
    made = (volume / "cache").stat()
    assert made.st_gid == group and made.st_mode & stat.S_ISGID  # the setgid root handed its group on
