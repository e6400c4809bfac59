"""A job's end, where its users look for it: the scheduled resync notices a RUNNING job that
ended without a collect, records its end and says it (a line in its log, an ``ended-<job>``
artifact, what to do next); a resync that moves nothing makes no progress artifact; a
``run-tao-job`` run says on its own page how its job ended (a line in its log, a ``job-<job>``
artifact that points at what its collect subflow shows). Against the session's Prefect test
server, with the fake backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
from prefect.states import Running

from flows.collect import collect_tao_job
from flows.resync import resync_tao_outputs
from flows.run import run_tao_job
from flows.submit import submit_tao_job
from tao_data_io.records import RecordStore

from .flow_helpers import artifacts, by_key, fake_request, fake_target, records_block, results_keys
from .helpers import wait_for, write_tree

pytestmark = pytest.mark.usefixtures("prefect_harness")

WARNING = 30


def logged(state: Any, *words: str) -> list[Any]:
    """The run's log records that hold every one of ``words``, once there is one (the API handler
    sends them a moment after the flow returns)."""
    def read() -> list[Any] | None:
        with get_client(sync_client=True) as client:
            logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(
                any_=[state.state_details.flow_run_id])))
        return [log for log in logs if all(word in log.message for word in words)] or None

    return wait_for(f"a log line with {words}", read)


# ----------------------------------------------------------------------------- the resync
@pytest.mark.parametrize("outcome", ["ERROR", "COMPLETE"])
def test_the_resync_records_the_end_of_a_job_nothing_collects_and_says_what_to_do(
        env: dict[str, str], bucket: str, s3_client: Any, tmp_path: Path, outcome: str) -> None:
    """Submitted with submit-tao-job alone, the job ends; the next resync uploads what is new one
    last time, records the end, and says it — a warning unless it completed — naming the collect
    that uploads the rest; that collect then works as for any ended job."""
    target, records = fake_target(tmp_path, outcome=outcome), records_block(tmp_path / "jobs")
    job = f"alone-{outcome.lower()}"
    assert submit_tao_job(fake_request(bucket, job), target=target, records=records, return_state=True).is_completed()
    store = RecordStore(tmp_path / "jobs")
    assert store.get(job).state == "RUNNING"

    state = resync_tao_outputs(target=target, records=records, settle_seconds=0, return_state=True)
    assert state.is_completed(), state.message
    result = state.result()
    assert result["ended"] == {job: {"state": outcome, "message": "exit code 0" if outcome == "COMPLETE"
                                     else "exit code 3", "exit_code": 0 if outcome == "COMPLETE" else 3,
                                     "err_class": None if outcome == "COMPLETE" else "ERR_PROGRAM"}}
    assert result["outcomes"][job]["status"] == "uploaded"  # what it wrote, up one last time
    record = store.get(job)
    assert record.state == outcome and record.history[-1].reporter == "flow"

    [line] = logged(state, f"job {job} ended {outcome}")
    assert line.level == (20 if outcome == "COMPLETE" else WARNING)
    assert f"collect-tao-job with job_id {job}" in line.message
    report = str(by_key(artifacts(state), f"ended-{job}").data)
    assert f"Job `{job}` ended {outcome}" in report and "collect-tao-job" in report and f"`{job}`" in report
    assert "exit code" in report

    again = resync_tao_outputs(target=target, records=records, settle_seconds=0, return_state=True)
    assert again.result()["jobs"] == 0 and "ended" not in again.result()  # told once: its record says it now

    collected = collect_tao_job(job, target=target, records=records, poll_seconds=0.01, return_state=True)
    assert collected.is_completed() == (outcome == "COMPLETE"), collected.message
    assert results_keys(s3_client, bucket, job) == {"checkpoint_epoch_1.pth", "status.json"}
    assert store.get(job).uploads[-1]["final"] is True


def test_the_resync_says_a_watched_job_ended_without_asking_for_a_collect(env: dict[str, str], bucket: str,
                                                                          tmp_path: Path) -> None:
    """A job whose owning run is still running (a collect waiting on it, a run-tao-job) is
    collected by that run: the resync records the end and says so, and asks for nothing."""
    target, records = fake_target(tmp_path, outcome="ERROR"), records_block(tmp_path / "jobs")
    assert submit_tao_job(fake_request(bucket, "watched"), target=target, records=records,
                          return_state=True).is_completed()
    owner = RecordStore(tmp_path / "jobs").get("watched").owner
    assert owner is not None
    with get_client(sync_client=True) as client:  # its owner is running again: as if it were collecting
        client.set_flow_run_state(owner.removeprefix("prefect-flow-run/"), Running(), force=True)

    state = resync_tao_outputs(target=target, records=records, settle_seconds=0, return_state=True)
    assert state.is_completed(), state.message
    [line] = logged(state, "job watched ended ERROR")
    assert line.level == WARNING and owner in line.message and "collect-tao-job" not in line.message
    assert owner in str(by_key(artifacts(state), "ended-watched").data)


def test_a_resync_that_moves_nothing_makes_no_progress_artifact(env: dict[str, str], bucket: str,
                                                                tmp_path: Path) -> None:
    """A schedule every few minutes must not fill the UI with "0 files, 0 B" bars: only a resync
    that had something to move shows its progress."""
    target, records = fake_target(tmp_path, polls_until_done=10**6), records_block(tmp_path / "jobs")
    assert submit_tao_job(fake_request(bucket, "quiet"), target=target, records=records, return_state=True
                          ).is_completed()
    results = tmp_path / "fake-results" / "quiet"
    results.mkdir(parents=True)
    empty = resync_tao_outputs(target=target, records=records, settle_seconds=0, return_state=True)
    assert empty.is_completed() and empty.result()["outcomes"]["quiet"]["status"] == "uploaded"
    assert [a.description for a in artifacts(empty) if a.type == "progress"] == []  # an empty results directory

    write_tree(results, {"checkpoints/step-1.pth": b"w" * 100})
    moved = resync_tao_outputs(target=target, records=records, settle_seconds=0, return_state=True)
    assert [(a.description, a.data) for a in artifacts(moved) if a.type == "progress"] == [
        ("resync of job quiet's results: 1 of 1 files, 100 B of 100 B", 100.0)]

    unchanged = resync_tao_outputs(target=target, records=records, settle_seconds=0, return_state=True)
    assert unchanged.result()["outcomes"]["quiet"]["summary"]["unchanged_files"] == 1
    assert [a.description for a in artifacts(unchanged) if a.type == "progress"] == []  # nothing new


# ----------------------------------------------------------------------------- run-tao-job's own page
def test_run_tao_job_says_how_its_job_ended_on_its_own_page(env: dict[str, str], bucket: str,
                                                             tmp_path: Path) -> None:
    target, records = fake_target(tmp_path), records_block(tmp_path / "jobs")
    state = run_tao_job(fake_request(bucket, "ran-ok"), target=target, records=records, poll_seconds=0.01,
                        return_state=True)
    assert state.is_completed(), state.message
    [line] = logged(state, "job ran-ok ended COMPLETE: exit code 0")
    assert line.level == 20 and f"uploaded to s3://{bucket}/results/ran-ok/" in line.message  # where they went
    report = str(by_key(artifacts(state), "job-ran-ok").data)
    assert "Job `ran-ok` ended COMPLETE" in report and "| COMPLETE | 0 |" in report
    for shown in ("results-ran-ok", "training-ran-ok", "collect-ran-ok", f"s3://{bucket}/results/ran-ok/"):
        assert shown in report, shown
    assert "failure-ran-ok" not in report


def test_run_tao_job_says_how_its_failed_job_ended_on_its_own_page(env: dict[str, str], bucket: str,
                                                                   tmp_path: Path) -> None:
    target, records = fake_target(tmp_path, outcome="ERROR"), records_block(tmp_path / "jobs")
    state = run_tao_job(fake_request(bucket, "ran-bad"), target=target, records=records, poll_seconds=0.01,
                        return_state=True)
    assert state.is_failed()
    assert "job ran-bad ended ERROR: ERR_PROGRAM: the command exited 3" in str(state.message)  # as before
    [line] = logged(state, "job ran-bad ended ERROR: exit code 3")  # beside the collect's failure
    assert line.level == WARNING and f"uploaded to s3://{bucket}/results/ran-bad/" in line.message
    report = str(by_key(artifacts(state), "job-ran-bad").data)
    assert "Job `ran-bad` ended ERROR" in report and "| ERROR | 3 | exit code 3 |" in report
    assert "failure-ran-bad" in report and "results-ran-bad" in report


def test_run_tao_job_whose_wait_gave_up_says_the_job_still_runs(env: dict[str, str], bucket: str,
                                                                  tmp_path: Path) -> None:
    target, records = fake_target(tmp_path, polls_until_done=10**6), records_block(tmp_path / "jobs")
    state = run_tao_job(fake_request(bucket, "ran-long"), target=target, records=records, poll_seconds=0.01,
                        max_wait_seconds=0.1, return_state=True)
    assert state.is_failed() and "still RUNNING" in str(state.message)  # the collect's failure says it, once
    assert "collect again later" in str(state.message)
    assert not [a for a in artifacts(state) if a.key == "job-ran-long"]  # no end to show
    assert not [log for log in logged(state, "ran-long") if "ended" in log.message]
