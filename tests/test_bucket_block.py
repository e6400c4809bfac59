"""``TaoS3Bucket``: code written for prefect-aws's ``S3Bucket`` runs unchanged on it, and it moves
bytes as the engine does — nothing outside the destination, no half-written file under a final
name, nothing sent or fetched again that is already there — over real HTTP (SeaweedFS; moto for
the keys SeaweedFS refuses to store)."""

from __future__ import annotations

import asyncio
import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from prefect import flow

from blocks import JobRecords, S3EnvCredentials, TaoS3Bucket
from tao_data_io.credentials import S3Credentials
from tao_data_io.embedded.s3 import EmbeddedS3
from tao_data_io.errors import TransferError, UnsafePathError, UsageError
from tao_data_io.fs.confinement import TEMP_PREFIX
from tao_data_io.fs.state import state_dir_for
from tao_data_io.transfer.client import make_s3_client

from .flow_helpers import REPO, name
from .helpers import HOSTILE_KEYS, temp_leftovers, tree_digest, write_tree

TREE = {"a.txt": b"alpha", "sub/b.bin": os.urandom(70_000), "sub/deeper/c.json": b"{}"}


def _prefect_aws_bucket(bucket: str, folder: str) -> Any:
    """prefect-aws's own S3Bucket on the same server and folder, with its credentials built in
    memory (never saved) from the same variables."""
    from prefect_aws import S3Bucket

    return S3Bucket(bucket_name=bucket, bucket_folder=folder, credentials=S3EnvCredentials().aws_credentials())


def _code_written_for_s3bucket(block: Any, work: Path) -> dict[str, Any]:
    """What a user's flow does with prefect-aws's S3Bucket: every ObjectStorageBlock method and
    the result-storage pair, in their argument order and defaults."""
    write_tree(work / "out", TREE)
    (work / "single.txt").write_bytes(b"single")
    seen: dict[str, Any] = {}
    block.upload_from_folder(work / "out", "runs/r1")
    seen["folder"] = tree_digest(block.download_folder_to_path("runs/r1", work / "back"))
    seen["key"] = block.upload_from_path(work / "single.txt", "files/single.txt")
    seen["path"] = block.download_object_to_path("files/single.txt", work / "got.txt").read_bytes()
    block.upload_from_file_object(io.BytesIO(b"streamed"), "files/stream.bin")
    seen["stream"] = block.download_object_to_file_object("files/stream.bin", io.BytesIO()).getvalue()
    block.write_path("results/r.json", b'{"ok": 1}')
    seen["read"] = block.read_path("results/r.json")
    return seen


def test_code_written_for_prefect_aws_s3bucket_runs_unchanged_and_gives_the_same_results(
        s3_env: dict[str, str], bucket: str, tmp_path: Path) -> None:
    ours = _code_written_for_s3bucket(TaoS3Bucket(bucket_name=bucket, bucket_folder="ours"), tmp_path / "ours")
    theirs = _code_written_for_s3bucket(_prefect_aws_bucket(bucket, "theirs"), tmp_path / "theirs")
    assert ours == {**theirs, "key": "ours/files/single.txt"} and theirs["key"] == "theirs/files/single.txt"
    assert ours["folder"] == tree_digest(tmp_path / "ours" / "out")


def test_in_an_async_flow_every_method_is_awaitable_as_prefect_aws_s_are(s3_env: dict[str, str], bucket: str,
                                                                         tmp_path: Path, prefect_harness: None) -> None:
    block = TaoS3Bucket(bucket_name=bucket, bucket_folder="async")
    write_tree(tmp_path / "out", TREE)

    @flow
    async def user_flow() -> bytes:
        await block.upload_from_folder(tmp_path / "out", "r")
        await block.download_folder_to_path("r", tmp_path / "back")
        await block.awrite_path("x.bin", b"x")
        return await block.read_path("x.bin")

    assert asyncio.run(user_flow()) == b"x"
    assert tree_digest(tmp_path / "back") == tree_digest(tmp_path / "out")


def test_unchanged_files_are_neither_sent_nor_fetched_again(s3_env: dict[str, str], bucket: str, s3_client: Any,
                                                            tmp_path: Path) -> None:
    block = TaoS3Bucket(bucket_name=bucket, bucket_folder="skip")
    write_tree(tmp_path / "out", TREE)
    block.upload_from_folder(tmp_path / "out")
    stamps = {o["Key"]: o["LastModified"] for o in s3_client.list_objects_v2(Bucket=bucket)["Contents"]}
    block.download_folder_to_path("", tmp_path / "back")
    inodes = {p: p.stat().st_ino for p in (tmp_path / "back").rglob("*") if p.is_file()}
    time.sleep(1.1)  # S3 times are whole seconds: a second PUT would show
    block.upload_from_folder(tmp_path / "out")
    block.download_folder_to_path("", tmp_path / "back")
    assert {o["Key"]: o["LastModified"] for o in s3_client.list_objects_v2(Bucket=bucket)["Contents"]} == stamps
    assert {p: p.stat().st_ino for p in (tmp_path / "back").rglob("*") if p.is_file()} == inodes  # no new file


def test_keys_that_would_land_outside_the_destination_are_refused_and_the_rest_arrive(
        moto_credentials: S3Credentials, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for variable, value in {"AWS_ACCESS_KEY_ID": moto_credentials.access_key_id,
                            "AWS_SECRET_ACCESS_KEY": moto_credentials.secret_access_key,
                            "AWS_ENDPOINT_URL": str(moto_credentials.endpoint_url)}.items():
        monkeypatch.setenv(variable, value)
    client = make_s3_client(moto_credentials)
    client.create_bucket(Bucket="hostile-block")
    for key in [*HOSTILE_KEYS, "p/ok.txt"]:
        client.put_object(Bucket="hostile-block", Key=key, Body=b"payload")
    dest = tmp_path / "box" / "dest"
    with pytest.raises(TransferError, match=rf"{len(HOSTILE_KEYS)} object\(s\) failed.*refusing key"):
        TaoS3Bucket(bucket_name="hostile-block").download_folder_to_path("p", dest)
    assert tree_digest(dest) == {"ok.txt": tree_digest(dest)["ok.txt"]}
    assert not [p for p in tmp_path.rglob("*evil*")] and not (tmp_path / "box" / "abs").exists()


def test_a_download_killed_midway_leaves_only_whole_files_and_a_rerun_converges(
        s3_server: EmbeddedS3, s3_env: dict[str, str], bucket: str, tmp_path: Path) -> None:
    source = tmp_path / "src"
    write_tree(source, {f"shard-{i:03d}.bin": os.urandom(256 * 1024) for i in range(200)})
    block = TaoS3Bucket(bucket_name=bucket, bucket_folder="killed")
    block.upload_from_folder(source)
    dest = tmp_path / "dest"
    code = (f"from blocks import TaoS3Bucket; TaoS3Bucket(bucket_name={bucket!r}, bucket_folder='killed')"
            f".download_folder_to_path('', {str(dest)!r})")
    child = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env={**os.environ, **s3_server.env()},
                             start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(list(dest.glob("shard-*"))) < 20:
        time.sleep(0.02)
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    expected = tree_digest(source)
    final = {n: d for n, d in tree_digest(dest).items() if not Path(n).name.startswith(TEMP_PREFIX)}
    assert 0 < len(final) < len(expected), "the kill should land mid-download"
    assert all(expected[n] == d for n, d in final.items())
    block.download_folder_to_path("", dest)
    assert tree_digest(dest) == expected and temp_leftovers(dest) == [] and temp_leftovers(state_dir_for(dest)) == []


@pytest.mark.parametrize(("call", "match"), [
    (lambda b, tmp: b.upload_from_path(tmp / "f.txt", "/etc/passwd"), "refusing to_path '/etc/passwd'"),
    (lambda b, tmp: b.upload_from_path(tmp / "f.txt", "a/../../b"), "refusing to_path 'a/../../b'"),
    (lambda b, tmp: b.download_folder_to_path("../other-team", tmp), "refusing from_folder '../other-team'"),
    (lambda b, tmp: b.download_object_to_path("", tmp / "x"), "from_path is empty"),
    (lambda b, tmp: b.upload_from_path(tmp, "k"), "is not a regular file"),
    (lambda b, tmp: b.upload_from_folder(tmp / "f.txt", "k"), "is not a directory"),
    (lambda b, tmp: b.upload_from_path(tmp / "f.txt", "k", ExtraArgs={"ACL": "public-read"}),
     r"takes no boto3 arguments \(ExtraArgs\)"),
    (lambda b, tmp: b.read_path("no/such/key"), "there is no object s3://.*/team-a/no/such/key"),
    (lambda b, tmp: b.download_object_to_path("f.txt", tmp), "to_path .* is a directory: give the path of the file"),
    (lambda b, tmp: b.upload_from_path(tmp / "link.txt", "k"), "is a symlink, which is never followed"),
])
def test_bad_paths_and_arguments_are_refused_naming_the_argument(s3_env: dict[str, str], bucket: str,
                                                                tmp_path: Path, call: Any, match: str) -> None:
    (tmp_path / "f.txt").write_bytes(b"f")
    (tmp_path / "link.txt").symlink_to(tmp_path / "f.txt")
    with pytest.raises((UsageError, UnsafePathError), match=match):
        call(TaoS3Bucket(bucket_name=bucket, bucket_folder="team-a"), tmp_path)


def test_the_block_refuses_a_bad_bucket_or_folder_when_it_is_made() -> None:
    with pytest.raises(ValueError, match="bucket_name: bucket 'Not_A_Bucket'"):
        TaoS3Bucket(bucket_name="Not_A_Bucket")
    with pytest.raises(ValueError, match=r"bucket_name 'bkt/team-a' holds a folder: .* \('team-a'\) as bucket_folder"):
        TaoS3Bucket(bucket_name="bkt/team-a")
    with pytest.raises(ValueError, match="refusing bucket_folder 'a/../b'"):
        TaoS3Bucket(bucket_name="ok-bucket", bucket_folder="a/../b")
    assert TaoS3Bucket(bucket_name="ok-bucket", bucket_folder="/team/").bucket_folder == "team/"


def test_flow_results_persist_in_the_bucket_and_any_other_machine_reads_them(
        s3_env: dict[str, str], bucket: str, s3_client: Any, prefect_harness: None, tmp_path: Path) -> None:
    """What a Kubernetes work pool needs (each flow run a fresh pod): results in S3, through a
    block that stores variable names, never a key."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_LOCAL_STORAGE_PATH, temporary_settings

    block = TaoS3Bucket(bucket_name=bucket, bucket_folder="prefect-results")
    saved = name()
    block.save(saved)

    @flow(persist_result=True, result_storage=f"tao-s3-bucket/{saved}", result_serializer="json")
    def job_flow() -> dict[str, int]:
        return {"answer": 42}

    run_id = job_flow(return_state=True).state_details.flow_run_id
    keys = [o["Key"] for o in s3_client.list_objects_v2(Bucket=bucket, Prefix="prefect-results/")["Contents"]]
    assert len(keys) == 1 and b'"answer"' in block.read_path(keys[0].removeprefix("prefect-results/"))
    with temporary_settings({PREFECT_LOCAL_STORAGE_PATH: tmp_path / "another-machine"}):
        with get_client(sync_client=True) as client:
            state = client.read_flow_run(run_id).state
        assert state is not None and state.result() == {"answer": 42}
    assert not (tmp_path / "another-machine").exists()


def test_the_records_block_can_keep_its_records_in_a_bucket_block_with_its_credentials(
        s3_env: dict[str, str], bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEAM_S3_ID", s3_env["AWS_ACCESS_KEY_ID"])
    monkeypatch.setenv("TEAM_S3_SECRET", s3_env["AWS_SECRET_ACCESS_KEY"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-right-secret-0123")  # what the flow run's block would read
    team = S3EnvCredentials(access_key_id_env="TEAM_S3_ID", secret_access_key_env="TEAM_S3_SECRET")
    store = JobRecords(bucket=TaoS3Bucket(bucket_name=bucket, bucket_folder="records", credentials=team)).store()
    assert store.location == f"s3://{bucket}/records/" and store.list_records() == []
    with pytest.raises(ValueError, match="location '/srv/jobs' and bucket both say where the records live"):
        JobRecords(location="/srv/jobs", bucket=TaoS3Bucket(bucket_name=bucket))
