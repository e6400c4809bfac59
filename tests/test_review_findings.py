"""Findings of an adversarial review, one test per finding, each written to fail on the code it was
found in for the reason its comment gives; kept so the class of defect cannot come back."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

import tao_data_io
from tao_data_io.errors import UsageError
from tao_data_io.records import RecordStore
from tao_data_io.request import parse_request

from .helpers import run_cli

STAND_IN = Path(__file__).resolve().parent.parent / "examples" / "stand_in"
PACKAGE_ROOT = Path(tao_data_io.__file__).resolve().parents[1]
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

SECRET = "AttackSecretValue-7f3c9a1b2d"


def _args_request(**extra: Any) -> dict[str, Any]:
    return {"schema_version": "1", "image": "local", "command": ["true"], "mode": "args", "args": [], **extra}


def _write(path: Path, request: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(request))
    return path


@pytest.fixture
def env(s3_server: Any, bucket: str, s3_client: Any, tmp_path: Path) -> dict[str, str]:
    s3_client.put_object(Bucket=bucket, Key="ds/input.txt", Body=b"version-1\n")
    return {**s3_server.env(), "S3_BUCKET_NAME": bucket, "TAO_DATA_IO_RECORDS": str(tmp_path / "jobs"),
            "TAO_DATA_IO_WORKDIR": str(tmp_path / "work"), "HOME": str(tmp_path)}


def _held_request(tmp_path: Path, bucket: str, job_id: str) -> Path:
    """The stand-in, held RUNNING until ``tmp_path/hold/go`` exists, reading s3://bucket/ds/."""
    (tmp_path / "hold").mkdir(exist_ok=True)
    (tmp_path / "hold" / ".keep").write_text("")
    return _write(tmp_path / f"{job_id}.yaml", {
        "schema_version": "1", "job_id": job_id, "image": "local", "mode": "config", "config_format": "json",
        "command": "sh /stand-in/train.sh -e {config_path}", "spec": {"data": f"s3://{bucket}/ds/"},
        "mounts": [{"source": str(STAND_IN), "target": "/stand-in"},
                   {"source": str(tmp_path / "hold"), "target": "/hold"}],
        "environment": {"EPOCHS": "1", "EPOCH_SECONDS": "0", "HOLD_FILE": "/hold/go"},
    })


def _wait_state(job_id: str, env: dict[str, str], state: str, *extra: str, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    out = ""
    while time.monotonic() < deadline:
        out = run_cli("status", "--job-id", job_id, *extra, env=env).stdout
        if out.startswith(state):
            return out
        time.sleep(0.2)
    raise AssertionError(f"{job_id} never reached {state}: {out}")


# --------------------------------------------------------------------------------------------------
# Review finding 1 (security): a request may bind any host path into the local frame read-write. A job that
# mounts the checkout the supervisor imports from can plant code that later runs *outside* every
# frame, in the next job's supervisor, with that job's forwarded credentials (reproduced end to end
# by /tmp/attack/repro_checkout_plant.sh). README: "Not visible: your home directory, the project
# checkout, other jobs' directories". Expected: submit refuses a read-write bind of the package
# root (exit 2, `error:` naming the mount); today it runs the job, which writes into the checkout.
@needs_bwrap
def test_a_request_cannot_bind_the_checkout_read_write(env: dict[str, str], tmp_path: Path) -> None:
    planted = PACKAGE_ROOT / "tao_data_io" / "local" / "attack-finding-01.planted"
    request = _write(tmp_path / "plant.yaml", _args_request(
        job_id="plant-checkout", command=["sh", "-c", "echo pwned > /checkout/tao_data_io/local/attack-finding-01.planted"],
        mounts=[{"source": str(PACKAGE_ROOT), "target": "/checkout", "read_only": False}]))
    try:
        submitted = run_cli("submit", "--request", str(request), env=env)
        if submitted.returncode == 0:
            run_cli("collect", "--job-id", "plant-checkout", "--wait", "--poll-seconds", "0.2", env=env)
        assert not planted.exists(), "the job wrote into the checkout the supervisor imports its code from"
        assert submitted.returncode == 2 and "error:" in submitted.stderr, submitted.stderr
    finally:
        planted.unlink(missing_ok=True)


# --------------------------------------------------------------------------------------------------
# Review finding 2 (security): an input with a local source and no target appears at its source path, and
# that path skips the SHADOWED_DIRS check that `target` gets. `inputs: [{source: /proc}]` binds the
# host's /proc over the frame's fresh one: every host process (pid, cmdline) is visible inside the
# frame. README: "Not visible: ... the host's processes (each frame has its own pid namespace)".
# Expected: refused like `target: /proc` ("shadows /proc, which the frame needs for itself").
def test_a_targetless_local_input_cannot_shadow_proc() -> None:
    with pytest.raises(UsageError, match="shadows /proc"):
        parse_request(_args_request(inputs=[{"source": "/proc"}]), environ={})


# --------------------------------------------------------------------------------------------------
# Review finding 3 (security): parse_request promises "no literal value anywhere in it may equal a
# credential" but checks only spec/environment/args/command. A credential value in a mount or input
# target, a mount source or results_dir is accepted; on submit it lands in bubblewrap's argv
# (/proc/PID/cmdline, readable by every local user), launch.json, the probe checklist and
# verdict.json — and then the record refuses the verdict *after* the job started, so submit exits 2
# while the job runs with no backend_ref (`cancel` says "nothing was running").
# Expected: the request is refused up front, naming the field, never the value.
def test_a_credential_value_in_a_mount_target_is_refused() -> None:
    environ = {"AWS_SECRET_ACCESS_KEY": SECRET}
    with pytest.raises(UsageError, match=r"mounts\[0\]\.target"):
        parse_request(_args_request(mounts=[{"source": "/tmp", "target": f"/data/{SECRET}"}]), environ=environ)


# --------------------------------------------------------------------------------------------------
# Review finding 4 (wrong result): `cancel` without the job's --workdir (or TAO_DATA_IO_WORKDIR) finds no
# run directory, prints "job X CANCELED (nothing was running)", exits 0 and marks the record
# CANCELED — final — while the job goes on running and completes. (`collect --wait` likewise exits
# 3 at once: "not finished, poll again".) Expected: an error (exit 2) naming --workdir, the record
# left as it was; never a final CANCELED for a job that is still running.
@needs_bwrap
def test_cancel_with_the_wrong_workdir_does_not_record_a_running_job_canceled(
        env: dict[str, str], bucket: str, tmp_path: Path) -> None:
    workdir = str(tmp_path / "elsewhere")
    request = _held_request(tmp_path, bucket, "wd-cancel")
    assert run_cli("submit", "--request", str(request), "--workdir", workdir, env=env).returncode == 0
    try:
        _wait_state("wd-cancel", env, "RUNNING", "--workdir", workdir)
        canceled = run_cli("cancel", "--job-id", "wd-cancel", env=env)  # forgot --workdir
        still = run_cli("status", "--job-id", "wd-cancel", "--workdir", workdir, env=env).stdout
        record = RecordStore(tmp_path / "jobs").get("wd-cancel")
        assert not (canceled.returncode == 0 and still.startswith("RUNNING")), (
            f"cancel said {canceled.stdout.strip()!r} (exit 0) but the job is {still.strip()!r}")
        assert record.state != "CANCELED" or not still.startswith("RUNNING")
    finally:
        run_cli("cancel", "--job-id", "wd-cancel", "--workdir", workdir, env=env)


# --------------------------------------------------------------------------------------------------
# Review finding 5 (wrong result): submitting a job again while it runs (a retried submit, a Prefect retry)
# "starts nothing" but re-stages its inputs in place first: the running job's read-only input
# changes under it to whatever the bucket holds now. A *different* request under the same job id
# is worse: all its inputs are downloaded into the running job's workdir and its staging-map.json
# is overwritten before launch refuses ("already submitted ... with another plan", exit 2).
# Expected: a submit that finds the job already launched moves no byte into its staging root.
@needs_bwrap
def test_a_resubmit_of_a_running_job_does_not_restage_its_inputs(
        env: dict[str, str], bucket: str, s3_client: Any, tmp_path: Path) -> None:
    request = _held_request(tmp_path, bucket, "restage")
    assert run_cli("submit", "--request", str(request), env=env).returncode == 0
    staged = tmp_path / "work" / "restage" / "s3" / bucket / "ds" / "input.txt"
    try:
        _wait_state("restage", env, "RUNNING")
        assert staged.read_bytes() == b"version-1\n"
        s3_client.put_object(Bucket=bucket, Key="ds/input.txt", Body=b"version-2, changed under the job\n")
        again = run_cli("submit", "--request", str(request), env=env)
        assert again.returncode == 0, again.stderr
        assert staged.read_bytes() == b"version-1\n", "the running job's input was replaced by the resubmit"
    finally:
        run_cli("cancel", "--job-id", "restage", env=env)


# --------------------------------------------------------------------------------------------------
# Review finding 6 (security): run as root (a Prefect worker or CI container), the frame's uid 0 maps to
# the host's root and the host's /etc is bound in, so every job reads root-only host files:
# /etc/shadow, SSH host keys, /etc/kubernetes/*.conf. README: the frame "sees what a pod would see
# and nothing else of the host". Expected: a root-only (0600/0640) host file is unreadable inside.
@needs_bwrap
@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/etc/shadow"), reason="needs root and /etc/shadow")
def test_the_frame_cannot_read_root_only_host_files(env: dict[str, str], tmp_path: Path) -> None:
    request = _write(tmp_path / "shadow.yaml", _args_request(
        job_id="read-shadow", command=["sh", "-c", "head -c 16 /etc/shadow > /results/stolen"]))
    assert run_cli("submit", "--request", str(request), env=env).returncode == 0
    run_cli("collect", "--job-id", "read-shadow", "--wait", "--poll-seconds", "0.2", env=env)
    stolen = tmp_path / "work" / "read-shadow" / "results" / "stolen"
    assert not (stolen.exists() and stolen.stat().st_size > 0), "the job read the host's /etc/shadow"


# --------------------------------------------------------------------------------------------------
# Review finding 7 (data leak, careless user): an empty path argument silently means the current directory.
# `upload-results --results-dir "$RESULTS"` with RESULTS unset uploads whatever directory the user
# is in (here a fake ~/.ssh key) to the job's results prefix and exits 0; `sync "" s3://…`,
# `sync s3://… ""` and `stage --workdir ""` do the same. Expected: exit 2, `error:` naming the
# empty value; nothing uploaded.
def test_an_empty_results_dir_is_refused_not_the_current_directory(
        env: dict[str, str], bucket: str, s3_client: Any, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "id_rsa").write_text("-----BEGIN PRIVATE KEY-----\n")
    opened = run_cli("record", "open", "--job-id", "empty-dir", "--platform", "local", "--image", "i",
                     "--network-arch", "a", "--action", "b", "--results-dir", "/results", env=env)
    assert opened.returncode == 0, opened.stderr
    result = run_cli("upload-results", "--job-id", "empty-dir", "--results-dir", "", env=env, cwd=home)
    listed = s3_client.list_objects_v2(Bucket=bucket, Prefix="results/empty-dir/").get("Contents", [])
    assert not listed, f"uploaded the current directory: {[o['Key'] for o in listed]}"
    assert result.returncode == 2 and "error:" in result.stderr


# --------------------------------------------------------------------------------------------------
# Review finding 8 (bad message / exit code): a full filesystem while a record, staging map or config is
# written gives `error: OSError: [Errno 28] No space left on device` and exit 1 — no path, no fix —
# because the write/fsync error carries no filename. README: exit 2, "a path the operating system
# refuses: ... a read-only or full filesystem, each named with its fix". (Reproduced on a 1 MiB
# tmpfs with `record open`/`record mark`; simulated here with the kernel's error from fsync.)
def test_a_full_filesystem_while_writing_a_record_is_exit_2_naming_the_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from tao_data_io import cli

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    code = cli.main(["record", "open", "--root", str(tmp_path / "jobs"), "--job-id", "full-disk", "--platform", "x",
                     "--image", "i", "--network-arch", "a", "--action", "b", "--results-dir", "/results"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert str(tmp_path / "jobs") in err and "no space left" in err, err


# --------------------------------------------------------------------------------------------------
# Review finding 9 (bad message): `collect` (text) exits 1 after a partial upload but prints only
# "uploaded 0 files (0 B), 0 excluded": neither the file that failed nor its reason, nor the
# skipped out-of-tree symlink. README: "1 some objects failed (the summary lists each with its
# reason)"; a symlink that leaves the tree "is skipped and reported". (`upload-results` lists both.)
@needs_bwrap
def test_collect_names_the_files_that_failed_to_upload(env: dict[str, str], tmp_path: Path) -> None:
    request = _write(tmp_path / "bad-names.yaml", _args_request(
        job_id="bad-names", command=["sh", "-c", ("cd /results && echo ok > good.txt && printf x > \"$(printf 'bad\\nname')\""
                                                  " && ln -s /etc/hostname escapes")]))
    assert run_cli("submit", "--request", str(request), env=env).returncode == 0
    collected = run_cli("collect", "--job-id", "bad-names", "--wait", "--poll-seconds", "0.2", env=env)
    assert collected.returncode == 1, collected.stdout + collected.stderr
    said = collected.stdout + collected.stderr
    assert "bad\\nname" in said, f"the failed file is not named: {said!r}"
    assert "escapes" in said, f"the skipped symlink is not reported: {said!r}"


# --------------------------------------------------------------------------------------------------
# Review finding 10 (data loss outside the destination): a selective download whose annotation references
# a missing object undoes "this run's new files" with path-based unlink (remove_if_exists(dest /
# relative)), not through the O_NOFOLLOW directory descriptors the README promises for every
# removal ("created, renamed into place and removed through directory descriptors … never redirects
# a byte outside"). A directory inside dest swapped for a symlink before the undo redirects the
# removal: a file outside the destination is deleted.
def test_selective_undo_never_removes_a_file_outside_the_destination(
        s3_credentials: Any, s3_client: Any, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tao_data_io.staging.selective import MissingReferencesError, selective_download
    from tao_data_io.transfer.engine import TransferEngine

    s3_client.put_object(Bucket=bucket, Key="ds/sub/a.mp4", Body=b"clip")
    annotation = tmp_path / "ann.jsonl"
    annotation.write_text('{"video": "sub/a.mp4"}\n{"video": "sub/missing.mp4"}\n')
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "a.mp4").write_bytes(b"someone else's file")
    dest = tmp_path / "dest"
    engine = TransferEngine(s3_credentials, concurrency=4)
    real = engine.download_keys

    def then_swap(*args: Any, **kwargs: Any) -> Any:
        summary = real(*args, **kwargs)
        shutil.rmtree(dest / "sub")          # a concurrent writer of dest swaps the directory
        (dest / "sub").symlink_to(victim)    # for a symlink before the undo runs
        return summary

    monkeypatch.setattr(engine, "download_keys", then_swap)
    with pytest.raises(MissingReferencesError):
        selective_download(engine, str(annotation), ["video"], bucket, "ds", dest)
    assert (victim / "a.mp4").exists(), "the undo followed a symlink and deleted a file outside the destination"


# --------------------------------------------------------------------------------------------------
# Review finding 11 (wrong message): `cancel` of a job that already COMPLETEd prints "job X CANCELED
# (nothing was running)" and exits 0, while the record (rightly) stays COMPLETE. A script reading
# stdout believes it canceled a finished job. Expected: it says the job already ended COMPLETE.
def test_cancel_of_a_completed_job_does_not_say_canceled(tmp_path: Path) -> None:
    env = {"TAO_DATA_IO_RECORDS": str(tmp_path / "jobs"), "TAO_DATA_IO_WORKDIR": str(tmp_path / "work"),
           "HOME": str(tmp_path)}
    assert run_cli("record", "open", "--job-id", "done-1", "--platform", "local", "--image", "i", "--network-arch",
                   "a", "--action", "b", "--results-dir", "/results", env=env).returncode == 0
    assert run_cli("record", "mark", "done-1", "--state", "RUNNING", "--backend-ref", "local/done-1",
                   env=env).returncode == 0
    assert run_cli("record", "mark", "done-1", "--state", "COMPLETE", env=env).returncode == 0
    canceled = run_cli("cancel", "--job-id", "done-1", env=env)
    assert RecordStore(tmp_path / "jobs").get("done-1").state == "COMPLETE"
    assert "CANCELED" not in canceled.stdout, canceled.stdout


# --------------------------------------------------------------------------------------------------
# Review finding 12 (bad message): the most common request typo, an unquoted number in `environment`
# (`EPOCHS: 3`), was reported as "environment.EPOCHS: Input should be a valid string" — neither the
# value nor the fix. Now numbers and booleans are their text, as YAML users mean them, and a value
# that cannot be text (a list) names the field and the fix; a misspelt field names the one meant.
def test_a_number_in_environment_is_its_text_and_a_list_names_the_fix() -> None:
    assert parse_request(_args_request(environment={"EPOCHS": 3, "AMP": True, "LR": 0.001}), environ={}).environment \
        == {"EPOCHS": "3", "AMP": "true", "LR": "0.001"}
    with pytest.raises(UsageError) as caught:
        parse_request(_args_request(environment={"GPUS": [0, 1]}), environ={})
    assert "environment.GPUS" in str(caught.value) and "quote it" in str(caught.value)
    with pytest.raises(UsageError, match="unknown field 'enviroment': did you mean 'environment'"):
        parse_request({**_args_request(), "enviroment": {}}, environ={})


# --------------------------------------------------------------------------------------------------
# Review finding 13 (bad message): Ctrl-C (SIGINT) in the middle of a verb prints a Python traceback
# ("Traceback (most recent call last): … KeyboardInterrupt") instead of one line; files are safe
# and a rerun converges (checked), but the output is not the CLI's. Shown with `collect --wait` on a
# job that is still running (deterministic; a sync interrupted mid-transfer prints the same).
@needs_bwrap
def test_ctrl_c_prints_no_traceback(env: dict[str, str], bucket: str, tmp_path: Path) -> None:
    request = _held_request(tmp_path, bucket, "ctrl-c")
    assert run_cli("submit", "--request", str(request), env=env).returncode == 0
    try:
        _wait_state("ctrl-c", env, "RUNNING")
        full_env = {"PATH": os.environ["PATH"], **env}
        child = subprocess.Popen([sys.executable, "-m", "tao_data_io.cli", "collect", "--job-id", "ctrl-c", "--wait",
                                  "--poll-seconds", "0.2"], env=full_env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        time.sleep(1.5)
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=30)
        assert "Traceback" not in err, err
    finally:
        run_cli("cancel", "--job-id", "ctrl-c", env=env)


# --------------------------------------------------------------------------------------------------
# Review finding 14 (wrong result + misleading message): the verify probe runs with the request's
# environment and does not set its own PATH, but needs `mkdir` and `dd`. A request that sets PATH
# for its image (`PATH: /opt/conda/bin:…`, common for TAO/PyTorch images) fails verify with
# "/results: cannot be created" and the advice "make the results directory writable"; the command
# never runs. (On Kubernetes the probe runs in the training image with the same env.) Expected: the
# probe finds its tools whatever PATH the job sets; the job runs.
@needs_bwrap
def test_a_request_that_sets_path_still_verifies(env: dict[str, str], tmp_path: Path) -> None:
    request = _write(tmp_path / "path.yaml", _args_request(
        job_id="sets-path", command=["/bin/sh", "-c", "echo ran > /results/ran"],
        environment={"PATH": "/opt/conda/bin:/usr/local/nvidia/bin"}))
    submitted = run_cli("submit", "--request", str(request), env=env)
    assert submitted.returncode == 0, submitted.stderr


# --------------------------------------------------------------------------------------------------
# Review finding 15 (bad message / exit code): `collect --poll-seconds` is an unchecked float. `-1` or `nan`
# on a running job ends in `error: ValueError: sleep length must be non-negative` (or "Invalid value
# NaN") with exit 1 — the code for "some objects failed" — after the first poll; `0` spins a core.
# (`logs --tail -1` likewise prints nothing, exit 0.) `resync --settle-seconds` shows the expected
# behaviour: exit 2, naming the flag and its range.
@needs_bwrap
def test_a_negative_poll_interval_is_a_usage_error(env: dict[str, str], bucket: str,
                                                              tmp_path: Path) -> None:
    request = _held_request(tmp_path, bucket, "poll")
    assert run_cli("submit", "--request", str(request), env=env).returncode == 0
    try:
        _wait_state("poll", env, "RUNNING")
        collected = run_cli("collect", "--job-id", "poll", "--wait", "--poll-seconds", "-1", env=env)
        assert collected.returncode == 2 and "--poll-seconds" in collected.stderr, collected.stderr
    finally:
        run_cli("cancel", "--job-id", "poll", env=env)
