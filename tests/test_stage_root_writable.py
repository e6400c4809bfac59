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

from tao_data_io.errors import UnwritableError, UsageError
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
        "schema_version": "1", "job_id": "job-w", "image": "tao:6", "mode": "args", "command": ["dino", "train"],
        "args": [],
        "inputs": [{"source": "s3://bkt-1/data/", "target": "/data"}]})


def test_a_stage_refuses_a_volume_root_it_cannot_write_before_anything_moves(volume: Path) -> None:
    cache, jobs = volume / "cache", volume / "jobs" / "job-w"
    with as_stager(), pytest.raises(UsageError) as info:
        stage(request(), cache, map_path=jobs / "staging-map.json", environ={})
    said = str(info.value)
    assert f"the staging directory {cache} cannot be written by this stage" in said
    assert f"{volume} is owned by" in said and f"with mode {stat.S_IMODE(volume.stat().st_mode):04o}" in said
    assert "did not apply the pod's fsGroup" in said
    assert f"pre-create {cache} on the volume" in said and f"chmod 2775 {cache}`" in said
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
        prove_writable(cache, what="the staging directory")
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
    with as_stager(), pytest.raises(UnwritableError,
                                    match=rf"the staging map's directory {jobs} cannot be written") as info:
        stage(request(), cache, map_path=jobs / "staging-map.json", environ={})
    assert f"pre-create {volume / 'jobs'} on the volume" in str(info.value)  # one fix for every job's directory


def test_a_volume_whose_root_took_the_fs_group_is_written_by_any_member(volume: Path) -> None:
    group = 4242 if ROOT else os.getegid()  # a group only root hands out, as the kubelet does
    shared(volume, gid=group)  # the kubelet's SetVolumeOwnership: gid fsGroup, g+rwx, setgid
    with as_stager(groups=(group,)):
        prove_writable(volume / "cache", what="the staging directory")
    made = (volume / "cache").stat()
    assert made.st_gid == group and made.st_mode & stat.S_ISGID  # the setgid root handed its group on


def test_a_refusal_below_a_directory_this_user_cannot_search_still_names_the_fix(volume: Path) -> None:
    """The directory that refuses may be one the stage cannot even look into (mode 0700): the
    refusal names it, not a bare permission error."""
    locked = volume / "locked"
    if not ROOT:
        volume.chmod(0o755)
    locked.mkdir(mode=0o700)
    if not ROOT:
        volume.chmod(0o555)
        locked.chmod(0o000)
    with as_stager(), pytest.raises(UnwritableError) as info:
        prove_writable(locked / "jobs" / "job-w", what="the staging map's directory")
    assert f"{locked} is owned by" in str(info.value) and f"pre-create {locked / 'jobs'}" in str(info.value)
    if not ROOT:
        locked.chmod(0o700)


def test_a_dangling_symlink_where_the_staging_root_belongs_is_named(volume: Path) -> None:
    if not ROOT:
        volume.chmod(0o755)
    (volume / "cache").symlink_to(volume / "gone")
    with pytest.raises(UnwritableError, match=r"cache is in the way \(a file or a symlink"):
        prove_writable(volume / "cache", what="the staging directory")


def test_a_cache_whose_state_an_earlier_stage_left_as_root_is_refused_with_the_fix(volume: Path) -> None:
    """The roots may be writable while what an earlier stage (run as root) left below them is not:
    the cache's own state directories are proved too, before the entry's lock is taken."""
    from tao_data_io.staging.cache import stage_cached
    from tao_data_io.staging.layout import plan_inputs

    cache = volume / "cache"
    if not ROOT:
        volume.chmod(0o755)
    cache.mkdir()
    shared(cache)
    locks = cache / ".tao-data-io" / "locks"
    locks.mkdir(parents=True)
    locks.chmod(0o755 if ROOT else 0o555)  # root's, as a stage run as root leaves it
    (planned,) = plan_inputs(request())
    with as_stager(), pytest.raises(UnwritableError, match=rf"the stage cache's locks {locks} cannot be written"):
        stage_cached(planned, cache, environ={})
    locks.chmod(0o755)
