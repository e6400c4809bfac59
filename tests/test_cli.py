"""The CLI as a user runs it: exit codes, error messages that name the fix, and no secret in any output."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tao_data_io.credentials import S3Credentials
from tao_data_io.embedded.s3 import EmbeddedS3

from .helpers import held_request, needs_bwrap, run_cli, tree_digest, wait_cli_state, write_tree


def test_sync_round_trip_with_json_summary(s3_server: EmbeddedS3, bucket: str, tmp_path: Path) -> None:
    write_tree(tmp_path / "src", {"a.txt": b"a", ".tao/x": b"x", "d/b.txt": b"b"})
    up = run_cli("sync", str(tmp_path / "src"), f"s3://{bucket}/p/", "--exclude", ".tao/*", "--json",
                 env=s3_server.env())
    assert up.returncode == 0, up.stderr
    summary = json.loads(up.stdout)
    assert summary["ok"] and sorted(summary["transferred"]) == ["a.txt", "d/b.txt"] and summary["excluded_files"] == 1
    down = run_cli("sync", f"s3://{bucket}/p/", str(tmp_path / "dst"), env=s3_server.env())
    assert down.returncode == 0 and "transferred 2 files" in down.stdout
    assert tree_digest(tmp_path / "dst") == {k: v for k, v in tree_digest(tmp_path / "src").items() if k != ".tao/x"}


def test_legacy_tao_names_work_over_http(s3_server: EmbeddedS3, bucket: str, tmp_path: Path) -> None:
    (tmp_path / "f.bin").write_bytes(b"legacy")
    legacy = {"ACCESS_KEY": s3_server.access_key_id, "SECRET_KEY": s3_server.secret_access_key,
              "S3_ENDPOINT_URL": s3_server.endpoint_url, "CLOUD_REGION": "us-east-1"}
    result = run_cli("cp", str(tmp_path / "f.bin"), f"s3://{bucket}/legacy/f.bin", env=legacy)
    assert result.returncode == 0, result.stderr
    back = run_cli("cp", f"s3://{bucket}/legacy/f.bin", str(tmp_path / "back.bin"), env=legacy)
    assert back.returncode == 0 and (tmp_path / "back.bin").read_bytes() == b"legacy"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["sync", "/tmp/a", "/tmp/b"], "exactly one s3:// side"),
        (["sync", "s3://Bad_Bucket/x", "/tmp/b"], "'Bad_Bucket'"),
        (["sync", "s3://good-bucket/x", "/tmp/b", "--concurrency", "0"], "--concurrency '0'"),
        (["cp", "s3://good-bucket/prefix/", "/tmp/b"], "use `sync` for a prefix"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
    ],
)
def test_bad_input_exits_2_with_an_error_line_naming_the_value(s3_server: EmbeddedS3, args: list[str],
                                                                expected: str) -> None:
    result = run_cli(*args, env=s3_server.env())
    assert result.returncode == 2
    assert result.stderr.startswith("error:") and expected in result.stderr


def test_missing_credentials_exit_2_naming_the_variables(tmp_path: Path) -> None:
    result = run_cli("sync", "s3://some-bucket/p/", str(tmp_path), env={})
    assert result.returncode == 2
    assert "AWS_ACCESS_KEY_ID" in result.stderr and "AWS_SECRET_ACCESS_KEY" in result.stderr


def test_missing_bucket_is_a_usage_error(s3_server: EmbeddedS3, tmp_path: Path) -> None:
    result = run_cli("sync", "s3://no-such-bucket-here/p/", str(tmp_path / "d"), env=s3_server.env())
    assert result.returncode == 2 and "'no-such-bucket-here' does not exist" in result.stderr


def test_secret_never_appears_in_output(s3_server: EmbeddedS3, bucket: str, tmp_path: Path) -> None:
    secret = s3_server.secret_access_key
    write_tree(tmp_path / "src", {"a.txt": b"a"})
    runs = [
        run_cli("sync", str(tmp_path / "src"), f"s3://{bucket}/s/", "--json", env=s3_server.env()),
        run_cli("--progress", "always", "sync", f"s3://{bucket}/s/", str(tmp_path / "d"), env=s3_server.env()),
        run_cli("sync", "s3://no-such-bucket-here/p/", str(tmp_path / "d"), env=s3_server.env()),
        # Wrong secret: the server rejects the signature; the message must not echo either value.
        run_cli("sync", f"s3://{bucket}/s/", str(tmp_path / "e"),
                env={**s3_server.env(), "AWS_SECRET_ACCESS_KEY": secret + "-wrong"}),
        # The secret smuggled into an argument value is masked in the error that echoes it.
        run_cli("sync", str(tmp_path / secret), f"s3://{bucket}/x/", env=s3_server.env()),
    ]
    assert runs[0].returncode == 0 and runs[1].returncode == 0
    assert runs[3].returncode == 2 and "rejected the credentials" in runs[3].stderr
    assert runs[4].returncode == 2 and "***AWS_SECRET_ACCESS_KEY***" in runs[4].stderr
    for result in runs:
        assert secret not in result.stdout + result.stderr
        assert s3_server.access_key_id not in result.stdout + result.stderr


def test_a_password_in_the_endpoint_url_never_reaches_the_output(s3_server: EmbeddedS3, bucket: str,
                                                                 tmp_path: Path) -> None:
    """Userinfo in AWS_ENDPOINT_URL: the large-object path (s5cmd) reads it from its environment,
    and no message quotes it — not even the error that names the endpoint."""
    from tao_data_io.transfer.client import make_s3_client

    make_s3_client(s3_server.credentials).put_object(Bucket=bucket, Key="p/big.bin", Body=b"b" * (33 * 1024 * 1024))
    password = "hunter2-endpoint-pass"
    with_userinfo = s3_server.endpoint_url.replace("http://", f"http://tao:{password}@")
    good = run_cli("sync", f"s3://{bucket}/p/", str(tmp_path / "d"),
                   env={**s3_server.env(), "AWS_ENDPOINT_URL": with_userinfo})
    assert good.returncode == 0, good.stderr
    assert (tmp_path / "d" / "big.bin").stat().st_size == 33 * 1024 * 1024
    refused = run_cli("sync", f"s3://{bucket}/p/", str(tmp_path / "e"), env={
        **s3_server.env(), "AWS_ENDPOINT_URL": with_userinfo, "AWS_SECRET_ACCESS_KEY": "not-the-secret"})
    assert refused.returncode == 2
    assert "rejected the credentials" in refused.stderr and "***USERINFO***" in refused.stderr
    for result in (good, refused):
        assert password not in result.stdout + result.stderr


def test_names_are_printed_with_control_characters_escaped(moto_credentials: S3Credentials, tmp_path: Path) -> None:
    """A key or file name can hold terminal escape sequences and newlines: printed raw they would
    retitle the terminal, recolour it, or forge whole lines of the report."""
    from tao_data_io.transfer.client import make_s3_client

    client = make_s3_client(moto_credentials)
    client.create_bucket(Bucket="escapes")
    for key in ("p/\x1b]0;pwned\x07title.txt", "p/two\rFAKE: all good", "p/fine.txt"):
        client.put_object(Bucket="escapes", Key=key, Body=b"x")
    env = {"AWS_ACCESS_KEY_ID": moto_credentials.access_key_id,
           "AWS_SECRET_ACCESS_KEY": moto_credentials.secret_access_key,
           "AWS_ENDPOINT_URL": str(moto_credentials.endpoint_url)}
    down = run_cli("sync", "s3://escapes/p/", str(tmp_path / "d"), env=env)
    (tmp_path / "up").mkdir()
    (tmp_path / "up" / "\x1b[31mred\x1b[0m.txt").write_bytes(b"x")
    (tmp_path / "up" / "two\nFAKE: all good").write_bytes(b"x")
    up = run_cli("sync", "--dry-run", str(tmp_path / "up"), "s3://escapes/up/", env=env)
    assert down.returncode == 1 and up.returncode == 0, down.stderr + up.stderr
    for output in (down.stdout + down.stderr, up.stdout + up.stderr):
        assert not any(c in output for c in "\x1b\x07\r")
    assert not any(line.startswith("FAKE") for line in up.stdout.splitlines())
    assert "\\x1b]0;pwned\\x07title.txt" in down.stdout and "two\\rFAKE" in down.stdout
    assert "\\x1b[31mred\\x1b[0m.txt" in up.stdout and "two\\nFAKE" in up.stdout


# ----------------------------------------------------------------------------- operating-system errors
def _exits_2_naming(result: subprocess.CompletedProcess[str], path: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert result.stderr.startswith("error:") and path in result.stderr, result.stderr
    assert "Error:" not in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_a_file_where_a_directory_is_expected_exits_2_naming_it(s3_server: EmbeddedS3, bucket: str,
                                                                tmp_path: Path) -> None:
    (tmp_path / "plain-file").write_bytes(b"x")
    result = run_cli("sync", f"s3://{bucket}/p/", str(tmp_path / "plain-file" / "dest"), env=s3_server.env())
    _exits_2_naming(result, str(tmp_path / "plain-file"))
    assert "not a directory" in result.stderr


def test_a_proc_path_exits_2_naming_it(s3_server: EmbeddedS3, bucket: str) -> None:
    result = run_cli("sync", f"s3://{bucket}/p/", "/proc/tao-data-io-dest", env=s3_server.env())
    _exits_2_naming(result, "/proc")


def test_permission_denied_exits_2_naming_the_path(s3_server: EmbeddedS3, bucket: str, tmp_path: Path) -> None:
    """A destination in a directory the user may read but not write. Root ignores permissions, so
    as root the command runs without the capabilities that let it (``setpriv``)."""
    from tao_data_io.transfer.client import make_s3_client

    make_s3_client(s3_server.credentials).put_object(Bucket=bucket, Key="p/a.txt", Body=b"a")
    read_only = tmp_path / "read-only"
    read_only.mkdir()
    prefix: list[str] = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("as root, needs setpriv to give up the capabilities that bypass permissions")
        prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"]
    read_only.chmod(0o500)
    try:
        result = subprocess.run([*prefix, sys.executable, "-m", "tao_data_io.cli", "sync", f"s3://{bucket}/p/",
                                 str(read_only / "dest")], capture_output=True, text=True, timeout=120,
                                env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), **s3_server.env()})
    finally:
        read_only.chmod(0o700)
    _exits_2_naming(result, str(read_only))
    assert "permission denied" in result.stderr.lower()


def test_a_closed_stdout_exits_quietly(s3_server: EmbeddedS3, bucket: str, tmp_path: Path) -> None:
    """``tao-data-io sync --dry-run … | head``: once head has read enough, the command ends
    without an error line or a traceback."""
    source = tmp_path / "many"
    source.mkdir()
    for i in range(3000):
        (source / f"a-rather-long-file-name-so-the-listing-fills-the-pipe-{i:05d}.bin").touch()
    argv = [sys.executable, "-m", "tao_data_io.cli", "sync", "--dry-run", str(source), f"s3://{bucket}/many/"]
    process = subprocess.Popen(argv, env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), **s3_server.env()},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stderr is not None
    first = process.stdout.readline()
    process.stdout.close()
    stderr = process.stderr.read()
    process.wait(timeout=120)
    assert first and stderr == ""
    assert process.returncode == 141


# ----------------------------------------------------------------------------- paths, interrupts and intervals
def test_an_empty_results_dir_is_refused_not_the_current_directory(
        cli_env: dict[str, str], bucket: str, s3_client: Any, tmp_path: Path) -> None:
    """An empty path argument is a usage error, never the current directory: ``upload-results
    --results-dir "$RESULTS"`` with RESULTS unset uploads nothing (exit 2, ``error:`` naming it)."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "id_rsa").write_text("-----BEGIN PRIVATE KEY-----\n")
    opened = run_cli("record", "open", "--job-id", "empty-dir", "--backend", "local", "--image", "i",
                     "--network-arch", "a", "--action", "b", "--results-dir", "/results", env=cli_env)
    assert opened.returncode == 0, opened.stderr
    result = run_cli("upload-results", "--job-id", "empty-dir", "--results-dir", "", env=cli_env, cwd=home)
    listed = s3_client.list_objects_v2(Bucket=bucket, Prefix="results/empty-dir/").get("Contents", [])
    assert not listed, f"uploaded the current directory: {[o['Key'] for o in listed]}"
    assert result.returncode == 2 and "error:" in result.stderr


def test_a_full_filesystem_while_writing_a_record_is_exit_2_naming_the_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A full filesystem while a record is written is exit 2 with the path and the fix, though the
    kernel's error from fsync carries no file name."""
    from tao_data_io import cli

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    code = cli.main(["record", "open", "--root", str(tmp_path / "jobs"), "--job-id", "full-disk", "--backend", "local",
                     "--image", "i", "--network-arch", "a", "--action", "b", "--results-dir", "/results"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert str(tmp_path / "jobs") in err and "no space left" in err, err


@needs_bwrap
def test_ctrl_c_prints_no_traceback(cli_env: dict[str, str], bucket: str, tmp_path: Path) -> None:
    """Ctrl-C (SIGINT) in the middle of a verb ends it with the CLI's one line, no Python traceback
    (shown with ``collect --wait`` on a running job)."""
    request = held_request(tmp_path, bucket, "ctrl-c")
    assert run_cli("submit", "--request", str(request), env=cli_env).returncode == 0
    try:
        wait_cli_state("ctrl-c", cli_env, "RUNNING")
        full_env = {"PATH": os.environ["PATH"], **cli_env}
        child = subprocess.Popen([sys.executable, "-m", "tao_data_io.cli", "collect", "--job-id", "ctrl-c", "--wait",
                                  "--poll-seconds", "0.2"], env=full_env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        time.sleep(1.5)
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=30)
        assert "Traceback" not in err, err
    finally:
        run_cli("cancel", "--job-id", "ctrl-c", env=cli_env)


@needs_bwrap
def test_sigterm_ends_a_verb_as_ctrl_c_does(cli_env: dict[str, str], bucket: str, tmp_path: Path) -> None:
    """A pod's deletion, or the results sidecar ending its resync for the final upload, sends
    SIGTERM: the verb unwinds (letting go of what it holds) and says so, as for Ctrl-C — not
    Python's default, which ends the process where it stands with exit -15."""
    request = held_request(tmp_path, bucket, "sigterm")
    assert run_cli("submit", "--request", str(request), env=cli_env).returncode == 0
    try:
        wait_cli_state("sigterm", cli_env, "RUNNING")
        child = subprocess.Popen([sys.executable, "-m", "tao_data_io.cli", "collect", "--job-id", "sigterm", "--wait",
                                  "--poll-seconds", "0.2"], env={"PATH": os.environ["PATH"], **cli_env},
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(1.5)
        child.send_signal(signal.SIGTERM)
        _, err = child.communicate(timeout=30)
        assert child.returncode == 130 and "interrupted" in err and "Traceback" not in err, (child.returncode, err)
    finally:
        run_cli("cancel", "--job-id", "sigterm", env=cli_env)


@needs_bwrap
def test_a_negative_poll_interval_is_a_usage_error(cli_env: dict[str, str], bucket: str, tmp_path: Path) -> None:
    """``collect --poll-seconds`` is checked up front: ``-1`` on a running job is exit 2 naming the flag
    (as ``resync --settle-seconds`` is), never a ValueError from ``sleep`` after the first poll."""
    request = held_request(tmp_path, bucket, "poll")
    assert run_cli("submit", "--request", str(request), env=cli_env).returncode == 0
    try:
        wait_cli_state("poll", cli_env, "RUNNING")
        collected = run_cli("collect", "--job-id", "poll", "--wait", "--poll-seconds", "-1", env=cli_env)
        assert collected.returncode == 2 and "--poll-seconds" in collected.stderr, collected.stderr
    finally:
        run_cli("cancel", "--job-id", "poll", env=cli_env)
