"""The state directory beside a destination (``PARENT/.tao-data-io/NAME/``: its lock, digest cache
and markers) when another user can write the parent — a shared team directory, a sticky ``/tmp``.
Whatever that user plants there (a symlink, a directory or a file of theirs) is never followed
and never trusted: the writer refuses, naming the path, what is wrong and the fix, or — for a
digest cache, which only ever saves a rehash — sets it aside and hashes again. We run as root
here, so "another user" is uid 65534, given the files with ``chown``."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tao_data_io.credentials import S3Credentials
from tao_data_io.errors import UnsafePathError
from tao_data_io.fs.confinement import STATE_DIR_NAME
from tao_data_io.fs.state import state_dir_for
from tao_data_io.staging.archive import extract_archive
from tao_data_io.staging.pretrained import pull_model
from tao_data_io.transfer.engine import TransferEngine

from .fake_registries import FakeRegistries
from .helpers import run_cli, tar_gz

ANOTHER_USER = 65534
NGC_KEY = "ngc-key-for-state-dir-tests-0123"


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    """A directory every user may write, sticky like ``/tmp``."""
    directory = tmp_path / "shared"
    directory.mkdir()
    directory.chmod(0o1777)
    return directory


@pytest.fixture
def root_only(tmp_path: Path) -> Path:
    """A directory only this process's user (root) may enter: what a planted link points at."""
    directory = tmp_path / "root-only"
    directory.mkdir(mode=0o700)
    return directory


def planted(path: Path) -> Path:
    """Hand ``path`` (a link itself, never its target) to another user, as if they had made it."""
    os.chown(path, ANOTHER_USER, ANOTHER_USER, follow_symlinks=False)
    return path


#: Where a link to a root-only directory is planted, and what the refusal then says is wrong: a
#: ``.tao-data-io`` link; another user's ``.tao-data-io`` holding a link for the destination; and
#: a link for the destination in a ``.tao-data-io`` of ours (left while it was not yet private).
PLANTED_LINKS = [(".tao-data-io", None, "{shared}/.tao-data-io is a symlink"),
                 (".tao-data-io/{name}", ANOTHER_USER, f"{{shared}}/.tao-data-io is owned by uid {ANOTHER_USER}"),
                 (".tao-data-io/{name}", 0, "{shared}/.tao-data-io/{name} is a symlink")]


def plant_link(shared: Path, at: str, state_owner: int | None, target: Path) -> None:
    """Another user's symlink to ``target`` at ``at``, in a ``.tao-data-io`` of ``state_owner``'s
    (None: the link is the ``.tao-data-io``)."""
    if state_owner is not None:
        (shared / STATE_DIR_NAME).mkdir()
        os.chown(shared / STATE_DIR_NAME, state_owner, state_owner)
    (shared / at).symlink_to(target)
    planted(shared / at)


def a_tar(path: Path) -> Path:
    path.write_bytes(tar_gz({"cls/a.txt": b"a"}))
    return path


def sync(credentials: S3Credentials, bucket: str, dest: Path) -> Any:
    with TransferEngine(credentials) as engine:
        return engine.sync(f"s3://{bucket}/p/", str(dest))


@pytest.mark.parametrize("at,state_owner,problem", PLANTED_LINKS)
def test_a_planted_state_directory_link_never_sends_a_sync_outside(s3_credentials: S3Credentials, s3_client: Any,
                                                                    bucket: str, shared: Path, root_only: Path,
                                                                    at: str, state_owner: int | None,
                                                                    problem: str) -> None:
    s3_client.put_object(Bucket=bucket, Key="p/a.bin", Body=b"a")
    plant_link(shared, at.format(name="data"), state_owner, root_only)
    with pytest.raises(UnsafePathError) as refused:
        sync(s3_credentials, bucket, shared / "data")
    message = str(refused.value)
    assert f"destination {str(shared / 'data')!r}" in message and problem.format(shared=shared, name="data") in message
    assert "remove it" in message
    assert os.listdir(root_only) == [] and not (shared / "data" / "a.bin").exists()


@pytest.mark.parametrize("at,state_owner,problem", PLANTED_LINKS)
def test_a_planted_state_directory_link_never_sends_an_extraction_outside(tmp_path: Path, shared: Path,
                                                                          root_only: Path, at: str,
                                                                          state_owner: int | None,
                                                                          problem: str) -> None:
    plant_link(shared, at.format(name="out"), state_owner, root_only)
    with pytest.raises(UnsafePathError) as refused:
        extract_archive(str(a_tar(tmp_path / "a.tgz")), shared / "out")
    assert problem.format(shared=shared, name="out") in str(refused.value)
    assert os.listdir(root_only) == [] and not (shared / "out").exists()


@pytest.mark.parametrize("at,state_owner,problem", PLANTED_LINKS)
def test_a_planted_state_directory_link_never_sends_a_model_pull_outside(shared: Path, root_only: Path, at: str,
                                                                         state_owner: int | None,
                                                                         problem: str) -> None:
    plant_link(shared, at.format(name="model"), state_owner, root_only)
    with FakeRegistries() as fake:
        fake.add_ngc_version("org/detector", "1.0", {"w.bin": b"weights"}, key=NGC_KEY)
        with pytest.raises(UnsafePathError) as refused:
            pull_model("ngc://org/detector:1.0", shared / "model",
                       environ={"NGC_API_URL": fake.url, "NGC_AUTH_URL": fake.url, "NGC_KEY": NGC_KEY})
    assert problem.format(shared=shared, name="model") in str(refused.value)
    assert os.listdir(root_only) == [] and not (shared / "model").exists()


def test_the_cli_refuses_a_planted_state_directory_naming_it_and_the_fix(cli_env: dict[str, str], bucket: str,
                                                                         shared: Path, root_only: Path) -> None:
    plant_link(shared, STATE_DIR_NAME, None, root_only)
    result = run_cli("sync", f"s3://{bucket}/ds/", str(shared / "data"), env=cli_env)
    assert result.returncode == 2, result.stderr
    assert f"{shared / STATE_DIR_NAME} is a symlink" in result.stderr and "remove it" in result.stderr
    assert "Traceback" not in result.stderr and os.listdir(root_only) == []


def forge_digests(store: Path, relative: str, etag: str) -> None:
    """Rewrite the cache's row for ``relative`` to vouch for ``etag``, trusted (not racy)."""
    with sqlite3.connect(store) as db:
        db.execute("UPDATE entries SET etag = ?, md5 = ?, recorded_ns = recorded_ns + 10000000000 WHERE relative = ?",
                   (etag, etag, relative))
    db.close()


def stale_setup(s3_client: Any, bucket: str, credentials: S3Credentials, dest: Path) -> str:
    """Sync version 1 of ``p/model.bin`` into ``dest``, then replace the object by a same-size
    version 2; return version 2's ETag (what a forged cache row would claim the old file holds)."""
    s3_client.put_object(Bucket=bucket, Key="p/model.bin", Body=b"1" * 64)
    assert sync(credentials, bucket, dest).transferred == ["model.bin"]
    s3_client.put_object(Bucket=bucket, Key="p/model.bin", Body=b"2" * 64)
    return s3_client.head_object(Bucket=bucket, Key="p/model.bin")["ETag"].strip('"')


def test_a_state_directory_another_user_owns_refuses_the_sync(s3_credentials: S3Credentials, s3_client: Any,
                                                              bucket: str, shared: Path) -> None:
    """Root synced ``data`` before; another user replaced its state by theirs, with a digest cache
    that vouches for the old file. The sync refuses (its lock lives there too), never keeps the
    old file silently."""
    dest = shared / "data"
    etag = stale_setup(s3_client, bucket, s3_credentials, dest)
    state = state_dir_for(dest)
    forge_digests(state / "digests.sqlite3", "model.bin", etag)
    for path in (state.parent, *state.parent.rglob("*")):
        planted(path)
    with pytest.raises(UnsafePathError) as refused:
        sync(s3_credentials, bucket, dest)
    message = str(refused.value)
    assert f"{state.parent} is owned by uid {ANOTHER_USER}, not by this process (uid {os.geteuid()})" in message
    assert "remove it" in message


def test_a_digest_cache_another_user_owns_is_not_trusted(s3_credentials: S3Credentials, s3_client: Any,
                                                         bucket: str, shared: Path) -> None:
    """A cache file of another user's inside our own state directory (made before it was ours)
    vouches for nothing: set aside, the file is hashed again and the stale one downloaded again."""
    dest = shared / "data"
    etag = stale_setup(s3_client, bucket, s3_credentials, dest)
    store = state_dir_for(dest) / "digests.sqlite3"
    forge_digests(store, "model.bin", etag)
    planted(store)
    again = sync(s3_credentials, bucket, dest)
    assert again.transferred == ["model.bin"] and (dest / "model.bin").read_bytes() == b"2" * 64
    assert os.stat(store).st_uid == os.geteuid()


def test_a_lock_file_another_user_owns_is_refused(s3_credentials: S3Credentials, s3_client: Any, bucket: str,
                                                  shared: Path) -> None:
    s3_client.put_object(Bucket=bucket, Key="p/a.bin", Body=b"a")
    dest = shared / "data"
    sync(s3_credentials, bucket, dest)
    planted(state_dir_for(dest) / "lock")
    with pytest.raises(UnsafePathError, match=rf"lock is owned by uid {ANOTHER_USER}, not by this process"):
        sync(s3_credentials, bucket, dest)


def test_an_extraction_marker_another_user_owns_is_refused(tmp_path: Path, shared: Path) -> None:
    archive = a_tar(tmp_path / "a.tgz")
    assert extract_archive(str(archive), shared / "out").extracted
    planted(state_dir_for(shared / "out") / "extracted.json")
    with pytest.raises(UnsafePathError, match=rf"extracted.json: it is owned by uid {ANOTHER_USER}.*remove it"):
        extract_archive(str(archive), shared / "out")


def test_a_model_marker_another_user_owns_vouches_for_nothing(shared: Path) -> None:
    """A pull trusts a file its own marker lists while its size holds; another user's marker
    (left in the state directory before it was ours) vouches for nothing: every file is hashed
    against the registry's digest, and a wrong one is fetched again."""
    dest = shared / "model"
    with FakeRegistries() as fake:
        fake.add_ngc_version("org/detector", "1.0", {"w.bin": b"weights!"}, key=NGC_KEY)
        environ = {"NGC_API_URL": fake.url, "NGC_AUTH_URL": fake.url, "NGC_KEY": NGC_KEY}
        pull_model("ngc://org/detector:1.0", dest, environ=environ)
        (dest / "w.bin").write_bytes(b"stale!!!")  # same size: only a hash tells
        planted(state_dir_for(dest) / "model.json")
        again = pull_model("ngc://org/detector:1.0", dest, environ=environ)
    assert again.fetched == ("w.bin",) and (dest / "w.bin").read_bytes() == b"weights!"


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757])
def test_a_state_directory_others_may_write_is_refused_with_the_chmod_that_fixes_it(tmp_path: Path, shared: Path,
                                                                                    mode: int) -> None:
    archive = a_tar(tmp_path / "a.tgz")
    extract_archive(str(archive), shared / "out")
    state = state_dir_for(shared / "out")
    state.chmod(mode)
    with pytest.raises(UnsafePathError, match=rf"writable by its group or others \(mode {mode:04o}\).*chmod go-w"):
        extract_archive(str(archive), shared / "out")
    state.chmod(mode & ~0o022)
    assert not extract_archive(str(archive), shared / "out").extracted  # fixed as told: up to date


def test_a_state_directory_in_a_sticky_shared_parent_is_private_to_its_owner(s3_credentials: S3Credentials,
                                                                             s3_client: Any, bucket: str,
                                                                             shared: Path) -> None:
    s3_client.put_object(Bucket=bucket, Key="p/a.bin", Body=b"a")
    dest = shared / "data"
    assert sync(s3_credentials, bucket, dest).transferred == ["a.bin"]
    for directory in (shared / STATE_DIR_NAME, state_dir_for(dest)):
        info = os.lstat(directory)
        assert stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and info.st_mode & 0o777 == 0o700
    assert sync(s3_credentials, bucket, dest).unchanged_files == 1


def test_a_state_directory_an_older_version_made_0755_is_still_used(s3_credentials: S3Credentials, s3_client: Any,
                                                                    bucket: str, tmp_path: Path) -> None:
    s3_client.put_object(Bucket=bucket, Key="p/a.bin", Body=b"a")
    dest = tmp_path / "data"
    state_dir_for(dest).mkdir(parents=True, mode=0o755)
    assert sync(s3_credentials, bucket, dest).transferred == ["a.bin"]
    assert (state_dir_for(dest) / "digests.sqlite3").exists()


def test_a_read_only_parent_keeps_the_state_in_the_users_cache(s3_server: Any, s3_client: Any, bucket: str,
                                                               tmp_path: Path, sandbox: None) -> None:
    """A destination that is a mount point under a read-only parent (a volume in a container):
    the state goes to ``$XDG_CACHE_HOME/tao-data-io/state/``, and reruns use it there."""
    s3_client.put_object(Bucket=bucket, Key="p/a.bin", Body=b"a")
    parent, cache = tmp_path / "ro", tmp_path / "cache"
    (parent / "data").mkdir(parents=True)
    command = ["bwrap", "--bind", "/", "/", "--ro-bind", str(parent), str(parent),
               "--bind", str(parent / "data"), str(parent / "data"), "--dev", "/dev", "--proc", "/proc", "--",
               sys.executable, "-m", "tao_data_io.cli", "sync", "--json", f"s3://{bucket}/p/", str(parent / "data")]
    env = {**s3_server.env(), "PATH": os.environ["PATH"], "HOME": str(tmp_path), "XDG_CACHE_HOME": str(cache)}
    for expected in ({"transferred_files": 1, "unchanged_files": 0}, {"transferred_files": 0, "unchanged_files": 1}):
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        summary = json.loads(done.stdout)
        assert {name: summary[name] for name in expected} == expected
    assert sorted(os.listdir(parent)) == ["data"]
    (state,) = (cache / "tao-data-io" / "state").iterdir()
    assert (state / "digests.sqlite3").exists() and os.stat(state).st_mode & 0o777 == 0o700
