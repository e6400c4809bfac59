"""What ``make demo`` prints of its job's record at the end: each state of the history and who
reported it. A rename of the history's word (``source`` → ``reporter``) once broke it after the
job had completed, and nothing but a run of the demo read that code."""

from __future__ import annotations

from pathlib import Path

from deployments.demo import record_summary
from tao_data_io.records import RecordStore


def test_the_demos_record_summary_says_each_state_and_who_reported_it(tmp_path: Path) -> None:
    store = RecordStore(tmp_path / "jobs")
    job_id = store.open(job_id="demo-1", backend="local", image="tao:demo", network_arch="dino", action="train",
                        results_dir="/results", reporter="flow").job_id
    store.mark(job_id, "RUNNING", reporter="agent", backend_ref="local/demo-1")
    store.mark(job_id, "COMPLETE", reporter="flow", message="exit code 0")
    said = record_summary(store.get(job_id), str(tmp_path / "jobs" / "demo-1.json"))
    rows = [line.split() for line in said.splitlines() if line.startswith("      ")]
    assert [row[:2] for row in rows] == [["PENDING", "flow"], ["RUNNING", "agent"], ["COMPLETE", "flow"]]
