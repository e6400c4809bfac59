"""A job's results prefix belongs to one job record.

Job ids are unique within one record store only, and the results of job J go to
``s3://BUCKET/results/J/`` whichever store recorded J. Two stores that share a bucket and an id
must never write into, or restore from, each other's results: the first upload (or a frame's
upload check) claims the prefix for its record, every upload and restore checks the claim, and a
pod's copy of the record claims for the record it copies.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tao_data_io.embedded.s3 import EmbeddedS3
from tao_data_io.errors import UsageError
from tao_data_io.outputs import check_upload, restore_results, upload_results
from tao_data_io.records import RecordStore
from tao_data_io.routing import decide_route, record_route

from .helpers import run_cli, write_tree

JOB_ID = "train-1"
JOB = dict(backend="local", image="nvcr.io/nvidia/tao/tao-toolkit:6.0.0", network_arch="dino", action="train",
           results_dir="/results")
A_RESULTS = {"model.pth": b"A's weights", "private.txt": b"A's private notes"}


@pytest.fixture
def env(s3_server: EmbeddedS3, bucket: str, tmp_path: Path) -> dict[str, str]:
    return {**s3_server.env(), "S3_BUCKET_NAME": bucket, "XDG_CACHE_HOME": str(tmp_path / "cache")}


def routed_store(root: Path, env: dict[str, str]) -> RecordStore:
    """A record store at ``root`` holding job ``train-1``, routed to the bucket as submit routes it."""
    store = RecordStore(root)
    store.open(job_id=JOB_ID, **JOB)
    record_route(store, JOB_ID, decide_route(JOB_ID, env))
    return store


def body(s3_client: Any, bucket: str, name: str) -> bytes:
    return bytes(s3_client.get_object(Bucket=bucket, Key=f"results/{JOB_ID}/{name}")["Body"].read())


def belongs_to(store: RecordStore) -> str | None:
    route = store.get(JOB_ID).output_route
    assert route is not None
    return route.belongs_to


def test_a_second_store_with_the_same_job_id_neither_overwrites_nor_restores_the_firsts_results(
        env: dict[str, str], bucket: str, s3_client: Any, tmp_path: Path) -> None:
    first, second = routed_store(tmp_path / "a", env), routed_store(tmp_path / "b", env)
    write_tree(tmp_path / "a-results", A_RESULTS)
    assert upload_results(first, JOB_ID, tmp_path / "a-results", environ=env).summary.ok  # type: ignore[union-attr]

    write_tree(tmp_path / "b-results", {"model.pth": b"B's weights"})
    with pytest.raises(UsageError) as refused:
        upload_results(second, JOB_ID, tmp_path / "b-results", environ=env)
    message = str(refused.value)
    assert f"output_route.destination 's3://{bucket}/results/{JOB_ID}/'" in message
    assert str(tmp_path / "a") in message and str(tmp_path / "b") in message  # both records, by their stores
    assert "another job id" in message and "nothing was uploaded" in message
    assert body(s3_client, bucket, "model.pth") == b"A's weights" and second.get(JOB_ID).uploads == []

    destination = f"s3://{bucket}/results/{JOB_ID}/"
    with pytest.raises(UsageError, match="belongs to job record"):
        restore_results(destination, tmp_path / "b-next", belongs_to=belongs_to(second), environ=env)
    assert not (tmp_path / "b-next" / "private.txt").exists()

    restored = restore_results(destination, tmp_path / "a-next", belongs_to=belongs_to(first), environ=env)
    assert restored.startswith("2 file(s)") and (tmp_path / "a-next" / "private.txt").read_bytes() == A_RESULTS[
        "private.txt"]
    write_tree(tmp_path / "a-results", {"model.pth": b"A's weights, epoch 2"})
    assert upload_results(first, JOB_ID, tmp_path / "a-results", kind="resync", settle_seconds=0,
                          environ=env).summary.ok  # type: ignore[union-attr]
    assert body(s3_client, bucket, "model.pth") == b"A's weights, epoch 2"


def test_a_frames_upload_check_fails_on_a_prefix_another_record_claimed(env: dict[str, str], tmp_path: Path) -> None:
    """The check a tier C pod runs before the job's command starts: a job whose results could only
    go where another record's are fails its verify instead of running for nothing."""
    first, second = routed_store(tmp_path / "a", env), routed_store(tmp_path / "b", env)
    assert check_upload(first, JOB_ID, environ=env).ok
    refused = check_upload(second, JOB_ID, environ=env)
    assert not refused.ok and "belongs to job record" in refused.detail and "another job id" in refused.detail
    assert check_upload(first, JOB_ID, environ=env).ok


def test_a_pods_copy_of_the_record_claims_for_the_record_it_copies(env: dict[str, str], bucket: str,
                                                                   s3_client: Any, tmp_path: Path) -> None:
    """A pod imports the submitted record into a store of its own (a record created there, now):
    its check and its uploads claim the prefix for the submitter's record, whose own uploads then
    go on, and another store's job of the same id is refused."""
    submitted = routed_store(tmp_path / "submitter", env)
    pod = {**env, "TAO_DATA_IO_JOBS_DIR": str(tmp_path / "pod")}
    assert run_cli("record", "import", str(tmp_path / "submitter" / f"{JOB_ID}.json"), env=pod).returncode == 0
    checked = run_cli("check-upload", "--job-id", JOB_ID, env=pod)
    assert checked.returncode == 0, checked.stderr
    write_tree(tmp_path / "pod-results", A_RESULTS)
    uploaded = run_cli("upload-results", "--job-id", JOB_ID, "--results-dir", str(tmp_path / "pod-results"), env=pod)
    assert uploaded.returncode == 0, uploaded.stderr

    write_tree(tmp_path / "worker-results", {"status.json": b"{}"})
    collected = upload_results(submitted, JOB_ID, tmp_path / "worker-results", environ=env)
    assert collected.summary is not None and collected.summary.ok
    other = routed_store(tmp_path / "other", env)
    with pytest.raises(UsageError, match="belongs to job record"):
        upload_results(other, JOB_ID, tmp_path / "worker-results", environ=env)
    assert body(s3_client, bucket, "model.pth") == A_RESULTS["model.pth"]


def test_a_record_routed_before_claims_existed_uploads_where_it_did_and_claims_it(
        env: dict[str, str], bucket: str, s3_client: Any, tmp_path: Path) -> None:
    """A record whose route names no claimant (recorded by an earlier version) keeps its destination;
    its next upload claims the prefix for it, so another store's job of the same id is refused."""
    store = routed_store(tmp_path / "a", env)
    path = tmp_path / "a" / f"{JOB_ID}.json"
    document = json.loads(path.read_text())
    document["output_route"].pop("belongs_to")
    path.write_text(json.dumps(document))
    write_tree(tmp_path / "results", A_RESULTS)
    assert upload_results(store, JOB_ID, tmp_path / "results", environ=env).summary.ok  # type: ignore[union-attr]
    assert upload_results(store, JOB_ID, tmp_path / "results", environ=env).summary.ok  # type: ignore[union-attr]
    with pytest.raises(UsageError, match="belongs to job record"):
        upload_results(routed_store(tmp_path / "b", env), JOB_ID, tmp_path / "results", environ=env)
    assert body(s3_client, bucket, "private.txt") == A_RESULTS["private.txt"]


def test_a_pods_restore_of_another_records_results_is_refused(env: dict[str, str], bucket: str,
                                                               tmp_path: Path) -> None:
    """A pod restores with the command, naming its job: the record it imported must own the
    prefix, or nothing is restored (exit 2, naming both records)."""
    first = routed_store(tmp_path / "a", env)
    routed_store(tmp_path / "b", env)  # the same job id in another store
    write_tree(tmp_path / "a-results", A_RESULTS)
    assert upload_results(first, JOB_ID, tmp_path / "a-results", environ=env).summary.ok  # type: ignore[union-attr]
    destination = f"s3://{bucket}/results/{JOB_ID}/"
    refused = run_cli("restore-results", "--from", destination, "--results-dir", str(tmp_path / "b-next"),
                      "--job-id", JOB_ID, "--root", str(tmp_path / "b"), env=env)
    assert refused.returncode == 2 and "belongs to job record" in refused.stderr, refused.stderr
    assert not (tmp_path / "b-next" / "private.txt").exists()
    restored = run_cli("restore-results", "--from", destination, "--results-dir", str(tmp_path / "a-next"),
                       "--job-id", JOB_ID, "--root", str(tmp_path / "a"), env=env)
    assert restored.returncode == 0 and (tmp_path / "a-next" / "private.txt").exists(), restored.stderr


def test_a_restore_for_a_job_reads_only_the_prefix_its_record_names(env: dict[str, str], bucket: str,
                                                                    tmp_path: Path) -> None:
    """The claim holds for the prefix it is beside: a restore naming the job but another prefix (the
    bucket's whole results/, or a folder inside another job's) would step around it."""
    first = routed_store(tmp_path / "a", env)
    routed_store(tmp_path / "b", env)
    write_tree(tmp_path / "a-results", {"sub/model.pth": b"A's weights"})
    assert upload_results(first, JOB_ID, tmp_path / "a-results", environ=env).summary.ok  # type: ignore[union-attr]
    for source in (f"s3://{bucket}/results/", f"s3://{bucket}/results/{JOB_ID}/sub/"):
        refused = run_cli("restore-results", "--from", source, "--results-dir", str(tmp_path / "b-next"),
                          "--job-id", JOB_ID, "--root", str(tmp_path / "b"), env=env)
        assert refused.returncode == 2 and "is not where job" in refused.stderr, refused.stderr
    assert not (tmp_path / "b-next").exists()
