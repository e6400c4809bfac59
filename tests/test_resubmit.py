"""Submitting a job again — a retried submit, a Prefect retry, a fixed request under the same id:
a running job is left as it is (nothing restaged), a job whose verify failed fails the same way
again, and a job that never launched runs once its request is fixed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .helpers import held_request, needs_bwrap, run_cli, wait_cli_state


@needs_bwrap
def test_a_resubmit_of_a_running_job_does_not_restage_its_inputs(
        cli_env: dict[str, str], bucket: str, s3_client: Any, tmp_path: Path) -> None:
    """Submitting a running job again starts nothing and moves no byte into its staging root: the
    running job's read-only input stays what it was staged as, whatever the bucket holds now."""
    request = held_request(tmp_path, bucket, "restage")
    assert run_cli("submit", "--request", str(request), env=cli_env).returncode == 0
    staged = tmp_path / "work" / "restage" / "s3" / bucket / "ds" / "input.txt"
    try:
        wait_cli_state("restage", cli_env, "RUNNING")
        assert staged.read_bytes() == b"version-1\n"
        s3_client.put_object(Bucket=bucket, Key="ds/input.txt", Body=b"version-2, changed under the job\n")
        again = run_cli("submit", "--request", str(request), env=cli_env)
        assert again.returncode == 0, again.stderr
        assert staged.read_bytes() == b"version-1\n", "the running job's input was replaced by the resubmit"
    finally:
        run_cli("cancel", "--job-id", "restage", env=cli_env)
