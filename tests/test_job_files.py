"""Reading a file a job controls (its status.json in its results): what is shown is the file the
job wrote, never what a link it planted points to, and a FIFO never blocks the reader."""

from __future__ import annotations

import os
from pathlib import Path

from tao_data_io.fs.reading import read_job_file


def test_a_regular_file_is_read_from_its_end_within_the_limit(tmp_path: Path) -> None:
    (tmp_path / "status.json").write_bytes(b"a" * 100 + b"end\n")
    assert read_job_file(tmp_path, "status.json", limit=4) == b"end\n"
    assert read_job_file(tmp_path, "missing.json", limit=4) is None


def test_a_link_planted_by_the_job_is_not_followed(tmp_path: Path) -> None:
    secret = tmp_path / "credentials"
    secret.write_text("aws_secret_access_key = not-for-the-ui\n")
    results = tmp_path / "results"
    results.mkdir()
    (results / "status.json").symlink_to(secret)
    assert read_job_file(results, "status.json", limit=1024) is None
    linked = tmp_path / "linked-results"
    linked.symlink_to(results)  # a results directory that is itself a link
    (results / "real.json").write_text("{}\n")
    assert read_job_file(linked, "real.json", limit=1024) is None


def test_a_fifo_does_not_block_the_reader(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "status.json")
    assert read_job_file(tmp_path, "status.json", limit=1024) is None
    (tmp_path / "dir.json").mkdir()
    assert read_job_file(tmp_path, "dir.json", limit=1024) is None
