"""What the Prefect UI shows about a job (tasks/reports.py: pure), and the progress arithmetic
behind its progress bars (tasks/progress.py)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from tao_data_io.launch.backend import FailureAnalysis, JobStatus
from tao_data_io.launch.probe import CheckResult, Verdict
from tao_data_io.outputs import UploadOutcome
from tao_data_io.records import JobRecord, OutputRoute
from tao_data_io.reporting import Progress
from tao_data_io.staging.stage_map import StagedSource
from tao_data_io.transfer.summary import Failure, TransferSummary
from tasks.progress import moves_anything, percent, progress_line
from tasks.reports import (cell, ended_line, ended_report, failure_report, job_line, job_report, launch_report,
                           results_line, staged_rows, upload_report)

NOW = datetime(2025, 1, 2, tzinfo=timezone.utc)
ROUTE = OutputRoute(route="s3", destination="s3://bkt1/results/job-1/", reason="S3_BUCKET_NAME is set")
RECORD = JobRecord(job_id="job-1", backend="local", image="tao:6", network_arch="dino", action="train",
                   storage_tier="B", storage_reason="the local frame stages into the workdir", results_dir="/results",
                   upload_excludes=["*.tmp"], state="RUNNING", created_at=NOW, updated_at=NOW, output_route=ROUTE)


def source(**fields: object) -> StagedSource:
    base: dict[str, object] = {"source": "s3://bkt1/data/", "kind": "folder", "sub_path": "s3/bkt1/data",
                               "container_path": "/data", "local_path": "/w/s3/bkt1/data", "files": 10,
                               "bytes": 2_000_000}
    return StagedSource.model_validate({**base, **fields})


def test_the_staged_table_says_what_moved_and_how_fast() -> None:
    rows = staged_rows([
        source(transferred_files=10, transferred_bytes=2_000_000, seconds=0.5),
        source(source="s3://bkt1/more/", transferred_files=0, unchanged_files=10, seconds=0.1),
        source(source="/mnt/data", kind="pre-positioned", sub_path=None, local_path=None, files=None, bytes=None),
        source(source="s3://bkt1/planned/", files=None, bytes=None, note="planned: staged on the cluster"),
        source(source="config:sha256:" + "ab" * 32, kind="config", container_path=f"/c/spec-{'ab' * 32}.yaml"),
    ])
    assert rows[0] == {"kind": "folder", "files": 10, "bytes": "1.9 MiB", "moved": "moved 10 files (1.9 MiB)",
                       "seconds": 0.5, "MB/s": "4", "source": "s3://bkt1/data/", "destination": "/data"}
    assert [row["moved"] for row in rows[1:4]] == ["already there", "pre-positioned (tier A): nothing moves",
                                                   "planned: staged on the cluster"]
    assert (rows[4]["source"], rows[4]["destination"]) == ("config:sha256:abababababab…", "/c/spec-abababababab….yaml")
    assert rows[1]["MB/s"] == "" and rows[2]["files"] == ""


def test_the_launch_report_has_the_tier_the_route_and_each_path_failures_first() -> None:
    verdict = Verdict(ok=False, checks=[
        CheckResult(kind="dir-nonempty", path="/data", ok=True, detail="readable, not empty", subject="s3://bkt1/data/"),
        CheckResult(kind="file", path="/odd|path", ok=False, detail="does not exist", subject="s3://bkt1/odd"),
    ])
    text = launch_report(RECORD, verdict)
    assert "NOT STARTED: verify failed" in text and "**Storage tier B**: the local frame stages" in text
    assert "**Output route `s3`** → `s3://bkt1/results/job-1/`" in text
    failing, passing = text.index("- **FAIL** `/odd|path` file: does not exist (input `s3://bkt1/odd`)"), text.index(
        "- pass `/data` dir-nonempty: readable, not empty (input `s3://bkt1/data/`)")
    assert failing < passing


def test_a_launch_report_item_keeps_a_path_with_backticks_and_newlines_on_one_line_of_code() -> None:
    verdict = Verdict(ok=False, checks=[CheckResult(kind="file", path="/in/`odd``\nname", ok=False, detail="no\nsuch",
                                                    subject="/in/`odd``\nname")])
    (item,) = [line for line in launch_report(RECORD, verdict).splitlines() if line.startswith("- ")]
    assert item == "- **FAIL** ``` /in/`odd`` name ``` file: no such"


def test_the_upload_report_names_every_exclusion_rule() -> None:
    summary = TransferSummary("/r", "s3://bkt1/results/job-1/", transferred_files=3, transferred_bytes=300,
                              excluded_files=2)
    summary.failed.append(Failure("big.pth", "503 SlowDown"))
    text = upload_report(RECORD, UploadOutcome("uploaded", "final upload", ROUTE, summary))
    assert "uploaded 3 files (300 B) to s3://bkt1/results/job-1/" in text and "1 FAILED" in text
    assert "`.tao/*` (always: TAO's own state)" in text and "`*.tmp` (the request's upload_excludes)" in text
    assert "`big.pth`: 503 SlowDown" in text


def test_the_failure_report_has_the_analysis_and_the_log_tail() -> None:
    status = JobStatus(state="ERROR", message="exit code 3", exit_code=3, err_class="ERR_PROGRAM")
    analysis = FailureAnalysis(err_class="ERR_PROGRAM", reason="the command exited 3", suggestion="read the log")
    text = failure_report("job-1", status, analysis, "line 1\n```oops\n")
    assert "**ERR_PROGRAM**: the command exited 3" in text and "Fix: read the log" in text
    assert text.count("```") == 2 and "'''oops" in text


@pytest.mark.parametrize(("progress", "expected"), [
    (Progress(10, 1000, 5, 250, 0), 25.0),
    (Progress(10, 0, 4, 0, 1), 50.0),
    (Progress(0, 0, 0, 0, 0), 0.0),
    (Progress(0, 0, 7, 700, 0, final=True), 100.0),
])
def test_progress_is_by_bytes_when_known_else_by_files(progress: Progress, expected: float) -> None:
    assert percent(progress) == expected


@pytest.mark.parametrize(("progress", "shown"), [
    (Progress(0, 0, 0, 0, 0, planning=True), False),  # the listing has not planned anything yet
    (Progress(0, 0, 0, 0, 0, final=True), False),  # it planned nothing: a resync of unchanged results
    (Progress(3, 300, 0, 0, 0, planning=True), True),
    (Progress(0, 0, 7, 700, 0), False),  # an archive, its totals unknown while it runs
    (Progress(0, 0, 7, 700, 0, final=True), True),
])
def test_a_progress_bar_is_made_only_for_what_moves_something(progress: Progress, shown: bool) -> None:
    assert moves_anything(progress) is shown


def test_the_progress_line_counts_files_and_sizes() -> None:
    assert progress_line("staging s3://b/p/", Progress(2000, 2048 * 1024, 1200, 1024 * 1024, 3)) == \
        "staging s3://b/p/: 1,200 of 2,000 files, 1.0 MiB of 2.0 MiB, 3 failed"
    assert cell("a|b\nc") == "a\\|b c"


def test_a_jobs_end_says_its_state_exit_code_message_and_where_its_results_are() -> None:
    ended = RECORD.model_copy(update={"state": "ERROR", "uploads": [
        {"final": True, "destination": ROUTE.destination, "started_at": NOW.isoformat()}]})
    status = JobStatus(state="ERROR", message="the command exited 1", exit_code=1, err_class="ERR_PROGRAM")
    assert job_line(ended, status, "collect-job-1") == (
        "job job-1 ended ERROR (exit code 1): the command exited 1; its results: uploaded to "
        "s3://bkt1/results/job-1/ (its log, progress and reports: the collect run collect-job-1, and this run's "
        "artifact job-job-1)")
    report = job_report(ended, status, "collect-job-1", {"collect-job-1": "http://ui/runs/flow-run/1"})
    assert "| ERROR | 1 | the command exited 1 |" in report and "[`collect-job-1`](http://ui/runs/flow-run/1)" in report
    assert "`failure-job-1`" in report and "`training-job-1`" in report
    complete = JobStatus(state="COMPLETE", message="exit code 0", exit_code=0)
    assert "failure-job-1" not in job_report(ended, complete, "collect-job-1")
    assert job_line(ended, complete, "c").startswith("job job-1 ended COMPLETE: exit code 0;")  # the code once

    assert results_line(RECORD.model_copy(update={"state": "ERROR"})) == (
        "not all uploaded to s3://bkt1/results/job-1/: collect-tao-job with job_id job-1 uploads them")
    mounted = OutputRoute(route="mount", destination="/mnt/results/job-1")
    assert results_line(RECORD.model_copy(update={"output_route": mounted})) == "on the mount at /mnt/results/job-1"
    gone = OutputRoute(route="ephemeral", destination="/results", reason="no bucket and no results root")
    assert results_line(RECORD.model_copy(update={"output_route": gone})) == (
        "not kept (ephemeral: no bucket and no results root)")


def test_an_end_the_resync_found_says_what_to_do_next() -> None:
    forgotten = JobStatus(state="ERROR", message="its pod is gone; the record says ERROR")
    line = ended_line("job-1", forgotten, None)
    assert line.startswith("job job-1 ended ERROR: its pod is gone")  # no exit code known: none said
    assert line.endswith("run collect-tao-job with job_id job-1 to upload its results and report why it failed")
    assert "| ERROR | not known |" in ended_report("job-1", forgotten, None)
    watched = ended_line("job-1", JobStatus(state="COMPLETE", exit_code=0), "prefect-flow-run/1")
    assert watched == ("job job-1 ended COMPLETE (exit code 0); its end is recorded, and the run that watches it "
                       "(prefect-flow-run/1) collects it")
    assert "nothing to do" in ended_report("job-1", JobStatus(state="COMPLETE"), "prefect-flow-run/1")
