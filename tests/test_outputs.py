"""Output routing, results uploads and scheduled resyncs, through the CLI against a real S3 server.

What must hold: the three routes and their precedence; bad variables refused by name; ``.tao/*``
never uploaded whatever the user includes; no symlink followed out of the tree; uploads after a
failed job; a file still being written never uploaded half-done; one resync at a time; a resync
that stops once the final upload is in; a summary in the record without any credential value; the
results limit bounding what the prefix holds; a restore that skips keys no directory can hold.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tao_data_io.credentials import S3Credentials
from tao_data_io.embedded.s3 import EmbeddedS3
from tao_data_io.errors import UsageError
from tao_data_io.records import RecordStore
from tao_data_io.routing import decide_route, ephemeral_warning, record_route
from tao_data_io.transfer.client import make_s3_client

from .helpers import run_cli, write_tree

JOB_ID = "job-1"
JOB = dict(backend="kubernetes", image="nvcr.io/nvidia/tao/tao-toolkit:5.5.0-pyt", network_arch="dino",
           action="train", storage_tier="B", results_dir="/results/dino")
RESULTS = {"model.pth": b"weights" * 100, "logs/train.log": b"epoch 1\n", "status.json": b'{"ok": 1}'}


@pytest.fixture
def store(tmp_path: Path) -> RecordStore:
    store = RecordStore(tmp_path / "jobs")
    store.open(job_id=JOB_ID, **JOB)
    return store


@pytest.fixture
def env(s3_server: EmbeddedS3, bucket: str, tmp_path: Path) -> dict[str, str]:
    return {**s3_server.env(), "S3_BUCKET_NAME": bucket, "TAO_DATA_IO_JOBS_DIR": str(tmp_path / "jobs"),
            "XDG_CACHE_HOME": str(tmp_path / "cache")}


@pytest.fixture
def results(tmp_path: Path) -> Path:
    root = tmp_path / "results"
    write_tree(root, RESULTS)
    return root


def remote(s3_client: Any, bucket: str, job_id: str = JOB_ID) -> dict[str, bytes]:
    """relative key → body of every object under the job's results prefix."""
    prefix = f"results/{job_id}/"
    pages = s3_client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return {item["Key"][len(prefix):]: s3_client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
            for page in pages for item in page.get("Contents", [])}


def upload(results: Path, env: dict[str, str], *extra: str,
           verb: str = "upload-results") -> subprocess.CompletedProcess[str]:
    return run_cli(verb, "--job-id", JOB_ID, "--results-dir", str(results), *extra, env=env)


def unboxed(text: str) -> str:
    """The words of a boxed warning, border and wrapping removed."""
    return " ".join(text.replace("!", " ").split())


# --------------------------------------------------------------------------- routing
def test_s3_route_is_recorded_once_and_a_different_route_needs_force(store: RecordStore, env: dict[str, str],
                                                                      bucket: str, tmp_path: Path) -> None:
    slashed = {**env, "S3_BUCKET_NAME": f"/{bucket}/"}
    first = run_cli("route-outputs", "--job-id", JOB_ID, "--record", env=slashed)
    assert first.returncode == 0, first.stderr
    decision = json.loads(first.stdout)
    assert decision["route"] == "s3" and decision["destination"] == f"s3://{bucket}/results/{JOB_ID}/"
    assert "S3_BUCKET_NAME" in decision["reason"] and first.stderr == ""
    again = run_cli("route-outputs", "--job-id", JOB_ID, "--record", env=slashed)
    assert again.returncode == 0 and json.loads(again.stdout) == decision
    assert store.get(JOB_ID).output_route.model_dump() == decision  # type: ignore[union-attr]

    moved = {**env, "TAO_RESULTS_ROOT": str(tmp_path / "mount")}
    refused = run_cli("route-outputs", "--job-id", JOB_ID, "--record", env=moved)
    assert refused.returncode == 2 and refused.stderr.startswith("error:")
    assert "route is 's3' in the record, 'mount' now" in refused.stderr and "--force" in refused.stderr
    assert store.get(JOB_ID).output_route.route == "s3"  # type: ignore[union-attr]
    forced = run_cli("route-outputs", "--job-id", JOB_ID, "--record", "--force", env=moved)
    assert forced.returncode == 0, forced.stderr
    assert store.get(JOB_ID).output_route.destination == str(tmp_path / "mount" / JOB_ID)  # type: ignore[union-attr]


def test_mount_route_wins_over_the_bucket_and_uploads_nothing(store: RecordStore, env: dict[str, str], bucket: str,
                                                              s3_client: Any, results: Path, tmp_path: Path) -> None:
    mount = tmp_path / "mount"
    both = {**env, "TAO_RESULTS_ROOT": f"{mount}/"}
    decided = run_cli("route-outputs", "--job-id", JOB_ID, env=both)
    assert decided.returncode == 0, decided.stderr
    decision = json.loads(decided.stdout)
    assert decision["route"] == "mount" and decision["destination"] == f"{mount}/{JOB_ID}"
    assert "TAO_RESULTS_ROOT" in decision["reason"] and "precedence over S3_BUCKET_NAME" in decision["reason"]
    assert store.get(JOB_ID).output_route is None  # without --record nothing is stored

    on_mount = mount / JOB_ID / "run"
    write_tree(on_mount, RESULTS)
    done = upload(on_mount, both)
    assert done.returncode == 0, done.stderr
    assert "nothing to upload" in done.stdout and str(mount / JOB_ID) in done.stdout

    elsewhere = upload(results, both)
    assert elsewhere.returncode == 2 and elsewhere.stderr.startswith("error:")
    assert str(results) in elsewhere.stderr and str(mount / JOB_ID) in elsewhere.stderr
    assert "nothing was copied" in elsewhere.stderr
    assert remote(s3_client, bucket) == {} and sorted(p.name for p in (mount / JOB_ID).iterdir()) == ["run"]
    assert store.get(JOB_ID).uploads == []


def test_ephemeral_route_warns_loudly_on_stderr_and_uploads_nothing(store: RecordStore, env: dict[str, str],
                                                                    bucket: str, s3_client: Any, results: Path) -> None:
    bare = {name: value for name, value in env.items() if name != "S3_BUCKET_NAME"}
    decided = run_cli("route-outputs", "--job-id", JOB_ID, env=bare)
    assert decided.returncode == 0, decided.stderr
    assert json.loads(decided.stdout)["route"] == "ephemeral"
    for result in (decided, upload(results, bare)):
        assert result.returncode == 0, result.stderr
        assert "WARNING: RESULTS ARE EPHEMERAL" in result.stderr
        assert ephemeral_warning(JOB_ID) in unboxed(result.stderr)  # the same words as submit prints
    assert remote(s3_client, bucket) == {} and store.get(JOB_ID).uploads == []


@pytest.mark.parametrize(("variable", "value"), [
    ("TAO_RESULTS_ROOT", "results/here"),
    ("TAO_RESULTS_ROOT", "/mnt/../etc"),
    ("S3_BUCKET_NAME", "My_Bucket"),
    ("S3_BUCKET_NAME", "s3://my-bucket"),
    ("S3_BUCKET_NAME", "my-bucket/results"),
    ("S3_BUCKET_NAME", "ab"),
])
def test_bad_route_variables_are_refused_by_name(variable: str, value: str) -> None:
    with pytest.raises(UsageError) as caught:
        decide_route(JOB_ID, {variable: value})
    message = str(caught.value)
    assert message.startswith(f"{variable} {value!r}") and "set " in message


def test_bad_route_variables_exit_2_on_the_command_line(tmp_path: Path) -> None:
    for variable, value in (("TAO_RESULTS_ROOT", "relative/root"), ("S3_BUCKET_NAME", "Bad_Bucket")):
        result = run_cli("route-outputs", "--job-id", JOB_ID, env={variable: value})
        assert result.returncode == 2 and result.stdout == ""
        assert result.stderr.startswith(f"error: {variable} {value!r}")


# --------------------------------------------------------------------------- upload-results
def test_tao_state_is_never_uploaded_even_with_include_all(store: RecordStore, env: dict[str, str], bucket: str,
                                                           s3_client: Any, results: Path) -> None:
    write_tree(results, {".tao/status.json": b"{}", ".tao/deep/token": b"secret-ish"})
    done = upload(results, env, "--include", "*", "--include", ".tao/*")
    assert done.returncode == 0, done.stderr
    assert remote(s3_client, bucket) == RESULTS
    assert store.get(JOB_ID).uploads[-1]["excluded_files"] == 2


def test_excludes_add_to_the_tao_exclude(store: RecordStore, env: dict[str, str], bucket: str, s3_client: Any,
                                         results: Path) -> None:
    write_tree(results, {".tao/status.json": b"{}", "scratch/a.bin": b"a", "x.tmp": b"t", "keep.tmp.txt": b"k"})
    done = upload(results, env, "--exclude", "*.tmp", "--exclude", "scratch/*")
    assert done.returncode == 0, done.stderr
    assert remote(s3_client, bucket) == {**RESULTS, "keep.tmp.txt": b"k"}
    assert "3 excluded" in done.stdout


def test_declared_upload_excludes_from_the_record_apply(env: dict[str, str], bucket: str, s3_client: Any,
                                                        results: Path) -> None:
    opened = run_cli("record", "open", *(f"--{k.replace('_', '-')}={v}" for k, v in JOB.items()),
                     "--job-id", "job-declared", "--upload-exclude", "*.tmp", env=env)
    assert opened.returncode == 0, opened.stderr
    write_tree(results, {"x.tmp": b"t", ".tao/s.json": b"{}"})
    done = run_cli("upload-results", "--job-id", "job-declared", "--results-dir", str(results), env=env)
    assert done.returncode == 0, done.stderr
    assert remote(s3_client, bucket, "job-declared") == RESULTS


def test_results_past_the_jobs_limit_by_apparent_size_upload_nothing_and_say_why(
        env: dict[str, str], bucket: str, s3_client: Any, results: Path, tmp_path: Path) -> None:
    """A 1 GiB sparse file takes a few KiB of disk and 1,073,741,824 bytes in S3 (no sparse
    objects): counted by apparent size against the request's outputs.results_limit, the upload
    is refused before a byte moves, naming the limit, the total and the largest files."""
    from tao_data_io.outputs import upload_results

    store = RecordStore(tmp_path / "jobs")
    store.open(job_id="job-sparse", results_limit="64Mi", **JOB)
    with open(results / "sparse.bin", "wb") as handle:
        handle.truncate(1024**3)
    assert os.stat(results / "sparse.bin").st_blocks * 512 < 1024**2  # nothing on disk
    with pytest.raises(UsageError, match=r"holds 1\.0 GiB to upload .*more than the job's outputs.results_limit 64Mi "
                                         r"allows .*nothing was uploaded. The largest: sparse.bin \(1\.0 GiB\)"):
        upload_results(store, "job-sparse", results, environ=env)
    assert remote(s3_client, bucket, "job-sparse") == {}
    (results / "sparse.bin").unlink()
    assert upload_results(store, "job-sparse", results, environ=env).summary.ok  # within it: uploaded


def test_the_results_limit_bounds_what_the_prefix_holds_across_resyncs(
        env: dict[str, str], bucket: str, s3_client: Any, results: Path, tmp_path: Path) -> None:
    """A job that keeps only its newest checkpoint: each resync alone is under the limit, but an
    upload never deletes, so the prefix would grow by one checkpoint a resync. The limit counts what
    the prefix holds (a rewritten file once, at its new size) and refuses the resync that would
    pass it, saying what the prefix holds and the fix."""
    from tao_data_io.outputs import upload_results

    mib = 1024**2
    store = RecordStore(tmp_path / "jobs")
    store.open(job_id="job-limit", results_limit="4Mi", **JOB)
    for name in RESULTS:
        (results / name).unlink()
    refusals = []
    for epoch in range(1, 6):
        for older in results.glob("checkpoint_*.pth"):
            older.unlink()
        write_tree(results, {f"checkpoint_{epoch}.pth": os.urandom(3 * mib // 2), "latest.pth": os.urandom(mib // 4)})
        try:
            upload_results(store, "job-limit", results, kind="resync", settle_seconds=0, environ=env)
        except UsageError as refused:
            refusals.append((epoch, str(refused)))
        held = sum(len(data) for data in remote(s3_client, bucket, "job-limit").values())
        assert held <= 4 * mib, f"after resync {epoch} the prefix holds {held} bytes"
    assert sorted(remote(s3_client, bucket, "job-limit")) == ["checkpoint_1.pth", "checkpoint_2.pth", "latest.pth"]
    assert [epoch for epoch, _ in refusals] == [3, 4, 5]
    message = refusals[0][1]
    assert "s3://" in message and "already holds 3.0 MiB under names this upload does not write" in message
    assert "more than the job's outputs.results_limit 4Mi allows (4.0 MiB); nothing was uploaded" in message
    assert "delete from" in message and "Raise the job's outputs.results_limit" in message


def test_symlinks_out_of_the_tree_and_special_files_are_not_uploaded(store: RecordStore, env: dict[str, str],
                                                                     bucket: str, s3_client: Any, results: Path,
                                                                     tmp_path: Path) -> None:
    outside = Path("/etc/hostname")
    if not outside.is_file():
        outside = tmp_path / "outside.txt"
        outside.write_text("not yours")
    (results / "hostname").symlink_to(outside)
    (results / "logs" / "latest.log").symlink_to(results / "logs" / "train.log")  # inside: uploaded as a file
    os.mkfifo(results / "pipe")
    done = upload(results, env)
    assert done.returncode == 0, done.stderr
    assert remote(s3_client, bucket) == {**RESULTS, "logs/latest.log": RESULTS["logs/train.log"]}
    assert "skipped: hostname: symlink points outside the tree" in done.stdout
    assert "skipped: pipe: special file" in done.stdout
    assert store.get(JOB_ID).uploads[-1]["skipped_files"] == 2


@pytest.mark.parametrize("verb", ["upload-results", "resync"])
def test_a_results_dir_that_is_or_lies_under_a_symlink_is_refused(store: RecordStore, env: dict[str, str],
                                                                  bucket: str, s3_client: Any, tmp_path: Path,
                                                                  verb: str) -> None:
    """The job controls its results path: a link there could point the upload at any directory
    the uploader can read. Refused, naming the path; nothing is uploaded."""
    secrets_dir = tmp_path / "elsewhere" / "secrets"
    write_tree(secrets_dir, {"id_rsa": b"private"})
    (tmp_path / "linked").symlink_to(secrets_dir)
    (tmp_path / "parent-link").symlink_to(tmp_path / "elsewhere")
    for results_dir in (tmp_path / "linked", tmp_path / "parent-link" / "secrets"):
        done = upload(results_dir, env, "--settle-seconds", "0", verb=verb)
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith("error:") and str(results_dir) in done.stderr and "symlink" in done.stderr
    assert remote(s3_client, bucket) == {}


def test_a_hard_link_to_a_file_outside_the_results_is_skipped_and_reported(store: RecordStore, env: dict[str, str],
                                                                           bucket: str, s3_client: Any,
                                                                           results: Path, tmp_path: Path) -> None:
    """A hard link is the file itself: one made inside the results to a file elsewhere would
    upload that file. Links that all lie inside the results are just one file under two names."""
    outside = tmp_path / "outside.key"
    outside.write_bytes(b"not yours")
    os.link(outside, results / "borrowed.key")
    os.link(results / "model.pth", results / "model-copy.pth")
    done = upload(results, env)
    assert done.returncode == 0, done.stderr
    assert remote(s3_client, bucket) == {**RESULTS, "model-copy.pth": RESULTS["model.pth"]}
    assert "skipped: borrowed.key: " in done.stdout and "hard link" in done.stdout


def test_files_with_reserved_names_are_reported_as_skipped(store: RecordStore, env: dict[str, str], bucket: str,
                                                           s3_client: Any, results: Path) -> None:
    """Names tao-data-io keeps for itself are never uploaded, and never dropped without a word."""
    write_tree(results, {".tao-data-io/digests.json": b"{}", "logs/.tao-data-io-partial.0a1b2c3d4e5f.train.log": b"x"})
    done = upload(results, env)
    assert done.returncode == 0, done.stderr
    assert remote(s3_client, bucket) == RESULTS
    assert "skipped: .tao-data-io: " in done.stdout
    assert "skipped: logs/.tao-data-io-partial.0a1b2c3d4e5f.train.log: " in done.stdout
    assert store.get(JOB_ID).uploads[-1]["skipped_files"] == 2


def test_upload_after_a_failed_job_is_recorded_and_reruns_are_incremental(store: RecordStore, env: dict[str, str],
                                                                          bucket: str, s3_client: Any,
                                                                          results: Path) -> None:
    store.mark(JOB_ID, "RUNNING", reporter="agent")
    store.mark(JOB_ID, "ERROR", reporter="agent", message="OOMKilled")
    write_tree(results, {".tao/status.json": b"{}"})
    first = upload(results, env)
    assert first.returncode == 0, first.stderr
    assert remote(s3_client, bucket) == RESULTS
    assert "transferred 3 files" in first.stdout and "final upload recorded" in first.stdout

    write_tree(results, {"model.pth": b"better weights", "ckpt/epoch_2.pth": b"epoch 2"})
    second = upload(results, env)
    assert second.returncode == 0, second.stderr
    assert remote(s3_client, bucket) == {**RESULTS, "model.pth": b"better weights", "ckpt/epoch_2.pth": b"epoch 2"}

    uploads = store.get(JOB_ID).uploads
    assert len(uploads) == 2
    entry = uploads[-1]
    assert entry["by"] == "upload" and entry["route"] == "s3" and entry["job_state"] == "ERROR"
    assert entry["destination"] == f"s3://{bucket}/results/{JOB_ID}/" and entry["results_dir"] == str(results)
    assert entry["final"] is True and entry["ok"] is True and entry["settle_seconds"] == 0
    assert (entry["uploaded_files"], entry["uploaded_bytes"]) == (2, len(b"better weights") + len(b"epoch 2"))
    assert (entry["unchanged_files"], entry["excluded_files"], entry["skipped_files"]) == (2, 1, 0)
    assert (entry["failed_files"], entry["failed"]) == (0, [])
    assert entry["started_at"] <= entry["at"]


def test_no_upload_inside_a_slurm_allocation_when_asked(store: RecordStore, env: dict[str, str], bucket: str,
                                                        s3_client: Any, results: Path) -> None:
    inside = upload(results, {**env, "SLURM_JOB_ID": "4242"}, "--no-upload-in-allocation")
    assert inside.returncode == 2 and inside.stderr.startswith("error: SLURM_JOB_ID is '4242'")
    assert "login node after the allocation ends" in inside.stderr
    assert remote(s3_client, bucket) == {}
    login = upload(results, env, "--no-upload-in-allocation")
    assert login.returncode == 0, login.stderr
    assert remote(s3_client, bucket) == RESULTS


def test_no_credential_value_in_the_record_or_the_output(s3_server: EmbeddedS3, store: RecordStore,
                                                         env: dict[str, str], results: Path, tmp_path: Path) -> None:
    secret = s3_server.secret_access_key
    (results / f"{secret}.log").symlink_to(tmp_path / "nowhere")  # a name that is the secret, printed as skipped
    outputs = [run_cli("route-outputs", "--job-id", JOB_ID, "--record", env=env), upload(results, env),
               upload(results, env, "--settle-seconds", "0", verb="resync")]
    assert [result.returncode for result in outputs] == [0, 0, 0], [result.stderr for result in outputs]
    assert "***AWS_SECRET_ACCESS_KEY***.log" in outputs[1].stdout  # printed, masked
    record_text = (tmp_path / "jobs" / f"{JOB_ID}.json").read_text()
    assert store.get(JOB_ID).uploads  # the summary is there…
    for text in [record_text, *(result.stdout + result.stderr for result in outputs)]:
        assert secret not in text and s3_server.access_key_id not in text  # …and no credential value


# --------------------------------------------------------------------------- resync
def test_resync_leaves_a_file_being_written_and_uploads_it_whole_later(store: RecordStore, env: dict[str, str],
                                                                       bucket: str, s3_client: Any,
                                                                       results: Path) -> None:
    store.mark(JOB_ID, "RUNNING", reporter="agent")
    time.sleep(1.2)  # RESULTS are now older than the 1 s settle window
    growing = results / "logs" / "growing.log"
    started, stop = threading.Event(), threading.Event()

    def writer() -> None:
        with growing.open("ab", buffering=0) as handle:
            index = 0
            while not stop.is_set():
                handle.write(f"step {index:06d} loss 0.{index % 997:03d}\n".encode())
                index += 1
                started.set()
                time.sleep(0.002)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        started.wait(5)
        during = upload(results, env, "--settle-seconds", "1", verb="resync")
    finally:
        stop.set()
        thread.join()
    assert during.returncode == 0, during.stderr
    final = growing.read_bytes()
    seen = remote(s3_client, bucket)
    # Absent, or the complete final state — never a prefix of it (a truncated upload).
    assert seen.get("logs/growing.log", final) == final
    assert {name: seen[name] for name in RESULTS} == RESULTS
    assert "skipped: logs/growing.log: modified in the last 1s" in during.stdout

    time.sleep(1.2)  # the writer has stopped: let the file settle
    after = upload(results, env, "--settle-seconds", "1", verb="resync")
    assert after.returncode == 0, after.stderr
    assert remote(s3_client, bucket) == {**RESULTS, "logs/growing.log": final}
    entries = store.get(JOB_ID).uploads
    assert [entry["by"] for entry in entries] == ["resync", "resync"]
    assert [entry["final"] for entry in entries] == [False, False]  # the job is still RUNNING


def test_a_second_resync_leaves_while_another_holds_the_lock(store: RecordStore, env: dict[str, str], bucket: str,
                                                             s3_client: Any, results: Path) -> None:
    with store.upload_lock(JOB_ID, wait=False) as held:  # what a running resync holds
        assert held
        second = upload(results, env, "--settle-seconds", "0", verb="resync")
        assert second.returncode == 0, second.stderr
        assert "holds the lock" in second.stdout
        assert remote(s3_client, bucket) == {} and store.get(JOB_ID).uploads == []
        # A final upload waits for the holder instead of racing it.
        final = subprocess.Popen([sys.executable, "-m", "tao_data_io.cli", "upload-results", "--job-id", JOB_ID,
                                  "--results-dir", str(results)],
                                 env={"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), **env},
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert final.stderr is not None
        waiting = final.stderr.readline()
        assert "waiting for it to finish" in waiting and final.poll() is None
        assert remote(s3_client, bucket) == {}
    out, err = final.communicate(timeout=120)
    assert final.returncode == 0, err
    assert remote(s3_client, bucket) == RESULTS and "transferred 3 files" in out


def test_resync_does_nothing_once_the_job_is_terminal_and_the_final_upload_succeeded(
        store: RecordStore, env: dict[str, str], bucket: str, s3_client: Any, results: Path) -> None:
    store.mark(JOB_ID, "COMPLETE", reporter="agent")
    final = upload(results, env)
    assert final.returncode == 0, final.stderr
    assert store.get(JOB_ID).uploads[-1]["final"] is True

    write_tree(results, {"late.txt": b"written after the final upload"})
    resync = upload(results, env, "--settle-seconds", "0", verb="resync")
    assert resync.returncode == 0, resync.stderr
    assert "is COMPLETE and its final upload" in resync.stdout and "nothing left to resync" in resync.stdout
    assert remote(s3_client, bucket) == RESULTS and len(store.get(JOB_ID).uploads) == 1


def test_resync_before_the_job_made_its_results_dir_waits_quietly(store: RecordStore, env: dict[str, str],
                                                                 tmp_path: Path) -> None:
    early = upload(tmp_path / "not-yet", env, verb="resync")
    assert early.returncode == 0 and "does not exist yet" in early.stdout
    final = upload(tmp_path / "not-yet", env)  # the explicit upload still insists on a directory
    assert final.returncode == 2 and "is not a directory" in final.stderr


def test_tao_state_at_any_depth_and_declared_excludes_are_final() -> None:
    """`sub/.tao/x` was uploaded, and `--include '*'` re-admitted a job's declared upload_excludes."""
    from tao_data_io.outputs import results_filter
    from tao_data_io.transfer.filters import FilterRule

    admit_all = results_filter([FilterRule("include", "*")], upload_excludes=["*.tmp"])
    assert not admit_all(".tao/state.json") and not admit_all("sub/.tao/x") and not admit_all("a/b/.tao/c/d")
    assert not admit_all("scratch.tmp") and not admit_all("deep/scratch.tmp")
    assert admit_all("checkpoint.pth") and admit_all("my.tao/file") and admit_all("x.taox/y")


# --------------------------------------------------------------------------- restore-results
def moto_env(credentials: S3Credentials) -> dict[str, str]:
    return {"AWS_ACCESS_KEY_ID": credentials.access_key_id, "AWS_SECRET_ACCESS_KEY": credentials.secret_access_key,
            "AWS_ENDPOINT_URL": str(credentials.endpoint_url)}


def test_a_key_no_results_directory_can_hold_is_skipped_by_every_restore_naming_it_and_the_fix(
        moto_credentials: S3Credentials, tmp_path: Path) -> None:
    """One planted key under the results prefix (``../x``: it would land outside the results
    directory) failed every retry of the job; it is skipped, named with the fix, and the rest is
    restored, each time."""
    from tao_data_io.outputs import restore_results

    client = make_s3_client(moto_credentials)
    client.create_bucket(Bucket="planted-restore")
    client.put_object(Bucket="planted-restore", Key="results/job-1/model.pth", Body=b"weights")
    client.put_object(Bucket="planted-restore", Key="results/job-1/../x", Body=b"planted")
    for attempt in (2, 3, 4):
        report = restore_results("s3://planted-restore/results/job-1/", tmp_path / "results",
                                 environ=moto_env(moto_credentials))
        assert "'results/job-1/../x'" in report and "'..' component" in report, (attempt, report)
        assert "rename or delete it under s3://planted-restore/results/job-1/" in report
    assert (tmp_path / "results" / "model.pth").read_bytes() == b"weights" and not (tmp_path / "x").exists()


def test_a_failed_restore_never_promises_that_submitting_again_resumes_it(moto_credentials: S3Credentials,
                                                                          tmp_path: Path) -> None:
    """``a`` and ``a/b`` can both be keys, but not both be in one directory: that fails every time,
    so the error says what a new submit does and does not fix, and names the fix for a key."""
    from tao_data_io.errors import TransferError
    from tao_data_io.outputs import restore_results

    client = make_s3_client(moto_credentials)
    client.create_bucket(Bucket="clashing-restore")
    client.put_object(Bucket="clashing-restore", Key="results/job-1/a", Body=b"a file")
    client.put_object(Bucket="clashing-restore", Key="results/job-1/a/b", Body=b"a file in a directory")
    with pytest.raises(TransferError) as failed:
        restore_results("s3://clashing-restore/results/job-1/", tmp_path / "results",
                        environ=moto_env(moto_credentials))
    message = str(failed.value)
    assert "submitting again resumes it" not in message
    assert "rename or delete it under s3://clashing-restore/results/job-1/" in message


# --------------------------------------------------------------------------- the command's head start
# A routed job (submit records its route) lets the command take the upload lock and begin listing
# before the record model loads (tao_data_io/upload_head_start.py). What it believes of the raw
# record is where to begin; everything else is decided from the validated record, under the lock.
@pytest.fixture
def routed(store: RecordStore, env: dict[str, str]) -> RecordStore:
    record_route(store, JOB_ID, decide_route(JOB_ID, env))
    return store


def test_a_routed_resync_uploads_exactly_what_changed_across_listing_pages(routed: RecordStore, env: dict[str, str],
                                                                            bucket: str, s3_client: Any,
                                                                            tmp_path: Path) -> None:
    tree = {f"ckpt/{i:04d}.bin": f"epoch {i}".encode() for i in range(1100)}  # two listing pages
    write_tree(tmp_path / "results", tree)
    first = upload(tmp_path / "results", env, "--settle-seconds", "0", verb="resync")
    assert first.returncode == 0, first.stderr
    changed = {"ckpt/0003.bin": b"rewritten", "ckpt/1099.bin": b"rewritten too", "new.txt": b"new"}
    time.sleep(0.01)
    write_tree(tmp_path / "results", changed)
    again = upload(tmp_path / "results", env, "--settle-seconds", "0", verb="resync")
    assert again.returncode == 0, again.stderr
    entry = routed.get(JOB_ID).uploads[-1]
    assert (entry["uploaded_files"], entry["unchanged_files"]) == (3, 1098)
    assert remote(s3_client, bucket) == {**tree, **changed}


def test_a_routed_resync_leaves_a_held_lock_and_a_final_upload_waits_for_it(routed: RecordStore, env: dict[str, str],
                                                                             bucket: str, s3_client: Any,
                                                                             results: Path) -> None:
    with routed.upload_lock(JOB_ID, wait=False) as held:
        assert held
        second = upload(results, env, "--settle-seconds", "0", verb="resync")
        assert second.returncode == 0 and "holds the lock" in second.stdout, second.stderr
        final = subprocess.Popen([sys.executable, "-m", "tao_data_io.cli", "upload-results", "--job-id", JOB_ID,
                                  "--results-dir", str(results)],
                                 env={"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), **env},
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert final.stderr is not None
        assert "waiting for it to finish" in final.stderr.readline() and final.poll() is None
        assert remote(s3_client, bucket) == {}
    out, err = final.communicate(timeout=120)
    assert final.returncode == 0, err
    assert remote(s3_client, bucket) == RESULTS and len(routed.get(JOB_ID).uploads) == 1


def test_the_head_start_holds_the_lock_and_lists_before_the_record_model_loads(
        routed: RecordStore, env: dict[str, str], bucket: str, results: Path, tmp_path: Path) -> None:
    assert upload(results, env).returncode == 0  # objects to list
    code = ("import json, sys\nfrom pathlib import Path\nfrom tao_data_io.upload_head_start import head_start\n"
            "with head_start(sys.argv[1], sys.argv[2], Path(sys.argv[3]), resync=True) as begun:\n"
            "    listed = begun.listing.among([f'results/{sys.argv[2]}/{name}' for name in sys.argv[4:]])\n"
            "    print(json.dumps({'held': begun.held, 'listed': sorted(listed),"
            " 'pydantic': 'pydantic' in sys.modules}))\n")
    child = subprocess.run([sys.executable, "-c", code, str(tmp_path / "jobs"), JOB_ID, str(results), *RESULTS],
                           env={"PATH": os.environ["PATH"], **env}, capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr
    assert json.loads(child.stdout) == {"held": True, "listed": sorted(f"results/{JOB_ID}/{name}" for name in RESULTS),
                                        "pydantic": False}
    with routed.upload_lock(JOB_ID, wait=False) as held:  # released when the child ended
        assert held


def test_a_route_changed_after_the_head_start_is_the_one_uploaded_to(routed: RecordStore, env: dict[str, str],
                                                                     bucket: str, s3_client: Any,
                                                                     results: Path, tmp_path: Path) -> None:
    from tao_data_io.outputs import upload_results
    from tao_data_io.upload_head_start import head_start

    with head_start(tmp_path / "jobs", JOB_ID, results, resync=False, environ=env) as begun:
        assert begun is not None and begun.listing is not None
        assert str(begun.listing.prefix) == f"s3://{bucket}/results/{JOB_ID}/"
        with routed.upload_lock(JOB_ID, wait=False) as other:
            assert not other  # the head start holds the job's upload lock
        moved = decide_route(JOB_ID, {**env, "S3_BUCKET_NAME": bucket}).model_copy(
            update={"destination": f"s3://{bucket}/moved/{JOB_ID}/"})
        record_route(routed, JOB_ID, moved, force=True)  # e.g. `route-outputs --record --force` meanwhile
        outcome = upload_results(routed, JOB_ID, results, environ=env, begun=begun)
    assert outcome.status == "uploaded" and outcome.route is not None and outcome.route.destination == moved.destination
    assert remote(s3_client, bucket) == {}  # nothing where the raw record said at first
    listed = s3_client.list_objects_v2(Bucket=bucket, Prefix=f"moved/{JOB_ID}/")["KeyCount"]
    assert listed == len(RESULTS) and outcome.summary is not None and outcome.summary.transferred_files == len(RESULTS)


def test_a_record_the_model_refuses_releases_the_lock_the_head_start_took(routed: RecordStore, env: dict[str, str],
                                                                           results: Path, tmp_path: Path) -> None:
    path = tmp_path / "jobs" / f"{JOB_ID}.json"
    document = json.loads(path.read_text())
    path.write_text(json.dumps({**document, "state": "NOT-A-STATE"}))  # raw JSON still names an S3 route
    resync = upload(results, env, "--settle-seconds", "0", verb="resync")
    assert resync.returncode != 0 and "is not a valid job record" in resync.stderr and "state" in resync.stderr
    with routed.upload_lock(JOB_ID, wait=False) as held:
        assert held


@pytest.mark.parametrize(("state", "resync", "begins"), [
    ("RUNNING", True, True), ("COMPLETE", True, False), ("COMPLETE", False, True)])
def test_a_finished_jobs_resync_begins_nothing_early_but_its_final_upload_does(
        routed: RecordStore, env: dict[str, str], results: Path, tmp_path: Path, state: str, resync: bool,
        begins: bool) -> None:
    """A resync of an ended job usually finds its final upload recorded: a listing would be waste."""
    from tao_data_io.upload_head_start import head_start

    routed.mark(JOB_ID, state, reporter="agent")
    with head_start(tmp_path / "jobs", JOB_ID, results, resync=resync, environ=env) as begun:
        assert (begun is not None) is begins


def test_the_head_start_begins_nothing_for_what_the_ordinary_way_must_refuse(routed: RecordStore,
                                                                              env: dict[str, str], results: Path,
                                                                              tmp_path: Path) -> None:
    from tao_data_io.upload_head_start import head_start

    jobs = tmp_path / "jobs"
    no_credentials = {key: value for key, value in env.items() if not key.startswith("AWS_")}
    for job_id, where, environ in [("../escape", results, env), (JOB_ID, tmp_path / "missing", env),
                                   ("no-such-job", results, env), (JOB_ID, results, no_credentials)]:
        with head_start(jobs, job_id, where, resync=True, environ=environ) as begun:
            assert begun is None, (job_id, where)
    (jobs / f"{JOB_ID}.json").write_text("{not json")
    with head_start(jobs, JOB_ID, results, resync=True, environ=env) as begun:
        assert begun is None


def test_a_final_upload_of_a_record_the_model_refuses_says_so_without_waiting_for_the_lock(
        routed: RecordStore, env: dict[str, str], results: Path, tmp_path: Path) -> None:
    """The head start takes no lock it would have to wait for: validating the record comes first."""
    path = tmp_path / "jobs" / f"{JOB_ID}.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "state": "NOT-A-STATE"}))
    with routed.upload_lock(JOB_ID, wait=False) as held:  # another upload, which may run for an hour
        assert held
        final = upload(results, env)
    assert final.returncode != 0 and "is not a valid job record" in final.stderr
    assert "waiting for it to finish" not in final.stderr


def test_a_listing_index_fits_the_statement_limits_of_older_sqlite(routed: RecordStore, env: dict[str, str],
                                                                   bucket: str, s3_client: Any, tmp_path: Path) -> None:
    """SQLite before 3.32 (Ubuntu 20.04's 3.31, RHEL 8's 3.26) binds at most 999 variables a statement
    (sqlite.org/limits.html, "Maximum Number Of Host Parameters In A Single SQL Statement":
    SQLITE_MAX_VARIABLE_NUMBER defaults to 999 before 3.32.0, 32766 since)."""
    tree = {f"f{i:04d}.bin": f"{i}".encode() for i in range(1100)}
    write_tree(tmp_path / "results", tree)
    assert upload(tmp_path / "results", env).returncode == 0
    older = ("import sqlite3, sys\n_connect = sqlite3.connect\n"
             "def connect(*args, **kwargs):\n    db = _connect(*args, **kwargs)\n"
             "    db.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 999)\n    return db\n"
             "sqlite3.connect = connect\nfrom tao_data_io.cli import main\nsys.exit(main(sys.argv[1:]))\n")
    write_tree(tmp_path / "results", {"f0007.bin": b"changed"})
    again = subprocess.run([sys.executable, "-c", older, "upload-results", "--job-id", JOB_ID, "--results-dir",
                            str(tmp_path / "results")], env={"PATH": os.environ["PATH"], **env},
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert routed.get(JOB_ID).uploads[-1]["uploaded_files"] == 1
    assert remote(s3_client, bucket)["f0007.bin"] == b"changed"
