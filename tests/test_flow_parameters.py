"""What the flows take as parameters: a block that was never saved and a number of seconds out of
range (or a bool) are refused naming the parameter and the fix; a target that has no trace of a
job, and a records location not made yet, are told apart from a job that is lost."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

from flows import common
from flows.collect import collect_tao_job
from flows.resync import resync_tao_outputs
from flows.submit import submit_tao_job
from tao_data_io.records import RecordStore

from .flow_helpers import fake_target, local_target, records_block
from .helpers import args_request, wait_for


def _running_record(root: Path, job_id: str) -> RecordStore:
    """A job the record store says is RUNNING on the local backend (as a submit through another
    target, or another worker, leaves it)."""
    store = RecordStore(root)
    store.open(backend="local", image="local", network_arch="true", action="run", results_dir="/results",
               job_id=job_id, reporter="flow")
    store.mark(job_id, "RUNNING", reporter="flow", backend_ref=f"local/{job_id}")
    return store


def test_a_missing_block_names_the_parameter_and_the_fix(prefect_harness: None, no_cloud: None,
                                                          tmp_path: Path) -> None:
    """A block parameter naming a block that was never saved fails naming the flow parameter and how
    to fix it, not with Prefect's bare ValueError."""
    state = submit_tao_job(args_request(), target=local_target(tmp_path), records=records_block(tmp_path / "jobs"),
                           s3_credentials="tao-s3-credentials/never-saved", return_state=True)
    assert state.is_failed()
    message = str(state.message)
    assert "ValueError" not in message and "s3_credentials" in message, message


def test_a_negative_poll_interval_of_the_collect_flow_names_the_parameter(
        prefect_harness: None, no_cloud: None, tmp_path: Path) -> None:
    """collect-tao-job checks ``poll_seconds`` up front, as the CLI checks ``--poll-seconds``: ``-1``
    fails naming the parameter, never with ``sleep``'s ValueError after the first poll."""
    target, records = fake_target(tmp_path, polls_until_done=10**6), records_block(tmp_path / "jobs")
    assert submit_tao_job(args_request(job_id="poll-negative"), target=target, records=records,
                          return_state=True).is_completed()
    state = collect_tao_job("poll-negative", target=target, records=records, poll_seconds=-1,
                            max_wait_seconds=5, return_state=True)
    assert state.is_failed()
    assert "poll_seconds" in str(state.message), state.message


@pytest.mark.parametrize("value", [True, False])
def test_a_bool_is_not_a_number_of_seconds(value: bool) -> None:
    """A bool is not a number of seconds: ``poll_seconds=True`` or ``settle_seconds=False`` from a core
    caller is refused as a type mistake, though ``isinstance(True, int)`` holds."""
    from tao_data_io.errors import UsageError
    from tao_data_io.vocabulary import POLL_SECONDS_BOUNDS, SETTLE_SECONDS_BOUNDS, seconds_within

    for bounds in (POLL_SECONDS_BOUNDS, SETTLE_SECONDS_BOUNDS):
        if bounds[0] <= int(value):
            with pytest.raises(UsageError, match="must be a number of seconds"):
                seconds_within(value, bounds, name="poll_seconds")


def test_collect_with_a_target_that_cannot_find_the_job_fails(prefect_harness: None, no_cloud: None,
                                                               tmp_path: Path) -> None:
    """collect-tao-job on a target that has no trace of a job its record says is RUNNING fails, as the
    CLI's collect does, and leaves the record as it was: never an UNKNOWN that completes."""
    store = _running_record(tmp_path / "jobs", "lost-job")
    state = collect_tao_job("lost-job", target=local_target(tmp_path, "elsewhere"),
                            records=records_block(tmp_path / "jobs"), poll_seconds=0.05, return_state=True)
    assert store.get("lost-job").state == "RUNNING"
    assert state.is_failed(), f"collect completed: {state.result(raise_on_failure=False)}"


def test_resync_with_a_target_that_cannot_find_a_running_job_does_not_say_the_backend_uploads(
        prefect_harness: None, no_cloud: None, tmp_path: Path) -> None:
    """resync-tao-outputs picks RUNNING jobs by backend; a job its target cannot find (another local
    target's root) is counted as not found, never as one whose backend uploads its results."""
    _running_record(tmp_path / "jobs", "other-root-job")
    outcome = resync_tao_outputs(target=local_target(tmp_path, "elsewhere"), records=records_block(tmp_path / "jobs"),
                                 settle_seconds=0, return_state=True)
    result = outcome.result(raise_on_failure=False)
    assert not (outcome.is_completed() and isinstance(result, dict) and result.get("backend uploads")), result


def test_the_scheduled_resync_before_any_job_does_not_fail(prefect_harness: None, no_cloud: None,
                                                           tmp_path: Path) -> None:
    """A records location not made yet (no submit so far) is zero jobs: the scheduled
    resync-tao-outputs, running every 5 minutes from ``prefect deploy`` on, completes."""
    state = resync_tao_outputs(target=local_target(tmp_path), records=records_block(tmp_path / "jobs-not-yet"),
                               return_state=True)
    assert state.is_completed(), state.message
    assert state.result()["jobs"] == 0

    def said() -> list[str] | None:  # a run that found nothing says so, in one line
        with get_client(sync_client=True) as client:
            logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(
                any_=[state.state_details.flow_run_id])))
        found = [log.message for log in logs if "RUNNING" in log.message]
        return found or None

    assert wait_for("the resync's one line", said) == ["no RUNNING job on this target: nothing to resync"]


def _run_logs(state: Any) -> list[Any]:
    with get_client(sync_client=True) as client:
        return client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(
            any_=[state.state_details.flow_run_id])))


@pytest.mark.parametrize("flow_name", ["submit", "run"])
def test_bad_input_fails_the_run_with_its_message_once_and_no_engine_traceback(
        prefect_harness: None, no_cloud: None, tmp_path: Path, flow_name: str) -> None:
    """A request given twice is bad input: the run ends Failed with the error's own text as its
    message — the field and the fix — logged once, without the engine's traceback. The run flow
    fails the same way when its submit subflow does."""
    from flows.run import run_tao_job

    flow = {"submit": submit_tao_job, "run": run_tao_job}[flow_name]
    state = flow(args_request(), request_path="examples/demo-local.yaml", target=local_target(tmp_path),
                 records=records_block(tmp_path / "jobs"), return_state=True)
    assert state.is_failed() and str(state.message).startswith("give the job request itself"), state.message

    def logged() -> list[Any] | None:
        logs = _run_logs(state)
        return logs if any("Finished in state" in log.message for log in logs) else None

    logs = wait_for("the run's last log line", logged)
    assert not [log for log in logs if "Traceback" in log.message or "Encountered exception" in log.message]
    assert [log.message for log in logs if log.level >= 40] == [state.message]


def test_a_job_that_fails_fails_the_run_with_its_summary_once_and_no_engine_traceback(
        prefect_harness: None, no_cloud: None, tmp_path: Path) -> None:
    """A job whose command exits 1 is the job's outcome, not the flow's fault: run-tao-job (and its
    collect) end Failed with the job's failure summary as their message, logged once, with no
    Python traceback of the engine's in either run's log."""
    from flows.run import run_tao_job

    state = run_tao_job(args_request(command=["false"], job_id="fails-once"), target=local_target(tmp_path),
                        records=records_block(tmp_path / "jobs"), poll_seconds=0.2, return_state=True)
    assert state.is_failed() and "fails-once" in str(state.message) and "ERROR" in str(state.message), state.message
    with get_client(sync_client=True) as client:
        parent = client.read_flow_run(state.state_details.flow_run_id)
        children = [run for run in client.read_flow_runs() if run.name == "collect-fails-once"]
    assert len(children) == 1 and parent.name == "run-fails-once"

    for run_state in (state, children[0].state):
        def logged(run_state: Any = run_state) -> list[Any] | None:
            logs = _run_logs(run_state)
            return logs if any("Finished in state" in log.message for log in logs) else None

        logs = wait_for("the run's last log line", logged)
        assert not [log.message[:200] for log in logs if "Traceback" in log.message
                    or "Encountered exception" in log.message or "unexpected exception" in log.message]
        assert len([log for log in logs if log.level >= 40]) == 1, [log.message[:200] for log in logs]


def test_runs_that_do_not_know_their_job_yet_are_named_by_what_they_were_given(
        prefect_harness: None, no_cloud: None, tmp_path: Path) -> None:
    """A list of runs reads as what each one was: ``submit: <request file>, <when>`` (or ``request
    given in the form``) until the job is known (a run that fails before stays so), ``resync:
    <target>, <when>`` for each resync."""
    import re

    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    failed = submit_tao_job(request_path="examples/no-such-request.yaml", target=local_target(tmp_path),
                            records=records_block(tmp_path / "jobs"), return_state=True)
    formed = submit_tao_job(args_request(args=["x"], mode="config"), target=local_target(tmp_path),
                            records=records_block(tmp_path / "jobs"), return_state=True)
    resynced = resync_tao_outputs(target=local_target(tmp_path), records=records_block(tmp_path / "jobs"),
                                  return_state=True)
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[
            failed.state_details.flow_run_id, formed.state_details.flow_run_id, resynced.state_details.flow_run_id])))
    names = {run.id: run.name for run in runs}
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ"
    assert re.fullmatch(rf"submit: no-such-request\.yaml, {stamp}", names[failed.state_details.flow_run_id])
    assert formed.is_failed()  # a request that is no request (config mode without a spec): no job named
    assert re.fullmatch(rf"submit: request given in the form, {stamp}", names[formed.state_details.flow_run_id])
    assert re.fullmatch(rf"resync: \S+, {stamp}", names[resynced.state_details.flow_run_id])
    assert common.job_of(next(run for run in runs if run.id == failed.state_details.flow_run_id)) is None
