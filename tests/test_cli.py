"""The CLI as a user runs it: exit codes, error messages that name the fix, and no secret in any output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tao_data_io.embedded.s3 import EmbeddedS3

from .helpers import run_cli, tree_digest, write_tree


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
