"""Who owns a job, and what canceling the owner does: canceling a flow run that owns a job (a
submit, a collect, a run-tao-job) cancels the job through its backend — for real, through a
runner that serves the flow, with no process of the local frame left; a crash of the watcher
is not a cancel; the scheduled resync cancels a RUNNING job whose owner was canceled (hooks are
best-effort); a Prefect retry of a submit without a job id resumes the same job."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from prefect.client.orchestration import get_client
from prefect.settings import PREFECT_API_URL
from prefect.states import Cancelled, Cancelling

from flows.cancel import cancel_tao_job
from flows.collect import collect_tao_job
from flows.common import cancel_owned_job
from flows.resync import resync_tao_outputs
from flows.run import run_tao_job
from flows.submit import submit_tao_job
from tao_data_io.backends.local.backend import LocalBackend
from tao_data_io.backends.local.settings import LocalSettings
from tao_data_io.names import job_id_for_run
from tao_data_io.records import RecordStore

from .flow_helpers import REPO, fake_request, fake_target, local_target, records_block, stand_in_request
from .helpers import job_processes, wait_for

pytestmark = pytest.mark.usefixtures("prefect_harness")


def flow_run_of(state: Any) -> Any:
    with get_client(sync_client=True) as client:
        return client.read_flow_run(state.state_details.flow_run_id)


def test_the_cancellation_hook_cancels_the_job_the_run_owns(env: dict[str, str], bucket: str, tmp_path: Path) -> None:
    target, records = fake_target(tmp_path, polls_until_done=10**6), records_block(tmp_path / "jobs")
    state = submit_tao_job(fake_request(bucket, "owned"), target=target, records=records, return_state=True)
    assert state.is_completed(), state.message
    run = flow_run_of(state)
    store = RecordStore(tmp_path / "jobs")
    assert store.get("owned").owner == f"prefect-flow-run/{run.id}"

    cancel_owned_job(submit_tao_job, run, Cancelling())
    record = store.get("owned")
    assert record.state == "CANCELED" and record.history[-1].reporter == "flow"
    assert record.message == f"canceled: its flow run {run.name} was canceled"
    cancel_owned_job(submit_tao_job, run, Cancelling())  # twice: nothing more happens
    assert store.get("owned").history == record.history

    def said() -> list[str] | None:  # the run's log says what became of the job and its results
        from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

        with get_client(sync_client=True) as client:
            logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run.id])))
        found = [log.message for log in logs if log.level == 30 and "owned" in log.message]
        return found or None

    assert wait_for("the cancel's line", said) == [
        f"job owned CANCELED (canceled: its flow run {run.name} was canceled): its results were not uploaded; "
        "collect-tao-job with job_id owned uploads what it wrote"]


def test_the_resync_cancels_a_running_job_whose_owner_was_canceled(env: dict[str, str], bucket: str,
                                                                    tmp_path: Path) -> None:
    """The owner's hook may never run (its worker died with it): the next resync asks Prefect."""
    target, records = fake_target(tmp_path, polls_until_done=10**6), records_block(tmp_path / "jobs")
    for job_id in ("orphaned", "watched"):
        assert submit_tao_job(fake_request(bucket, job_id), target=target, records=records,
                              return_state=True).is_completed()
    store = RecordStore(tmp_path / "jobs")
    owner = store.get("orphaned").owner
    assert owner is not None
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(owner.removeprefix("prefect-flow-run/"), Cancelled(), force=True)

    result = resync_tao_outputs(target=target, records=records, settle_seconds=0)
    assert result["canceled"] == 1 and result["jobs"] == 2
    assert store.get("orphaned").state == "CANCELED" and store.get("watched").state == "RUNNING"
    assert store.get("orphaned").message == f"canceled: its owner {owner} was canceled"


def test_a_submit_without_a_job_id_takes_its_id_from_the_root_run(env: dict[str, str], bucket: str,
                                                                   tmp_path: Path) -> None:
    """A Prefect retry reruns the same flow run (a retried parent makes new subflow runs): the id
    comes from the root run, so the retry opens the job the first attempt opened."""
    target, records = fake_target(tmp_path, polls_until_done=10**6), records_block(tmp_path / "jobs")
    request = fake_request(bucket, "unused")
    request.pop("job_id")
    state = submit_tao_job(request, target=target, records=records, return_state=True)
    assert state.is_completed(), state.message
    run = flow_run_of(state)
    assert state.result()["job_id"] == job_id_for_run(str(run.id)) == run.name.removeprefix("submit-")
    assert job_id_for_run(str(run.id))[0].isalpha()

    outer = run_tao_job(request, target=target, records=records, poll_seconds=0.01, max_wait_seconds=0.1,
                        return_state=True)
    job_id = job_id_for_run(str(flow_run_of(outer).id))  # the root run: run-tao-job itself
    assert RecordStore(tmp_path / "jobs").get(job_id).state == "RUNNING"  # still running: the collect gave up
    assert outer.is_failed() and "still RUNNING" in str(outer.message)


def test_run_tao_job_submits_and_collects_and_cancel_tao_job_cancels(env: dict[str, str], bucket: str,
                                                                      tmp_path: Path) -> None:
    target, records = fake_target(tmp_path), records_block(tmp_path / "jobs")
    result = run_tao_job(fake_request(bucket, "whole"), target=target, records=records, poll_seconds=0.01)
    assert result["submitted"]["job_id"] == "whole" and result["collected"]["state"] == "COMPLETE"

    slow, records = fake_target(tmp_path / "slow", polls_until_done=10**6), records_block(tmp_path / "slow-jobs")
    assert submit_tao_job(fake_request(bucket, "stopped"), target=slow, records=records,
                          return_state=True).is_completed()
    said = cancel_tao_job("stopped", target=slow, records=records, reason="the GPUs are needed elsewhere")
    assert said == {"job_id": "stopped", "was": "RUNNING", "state": "CANCELED",
                    "message": "canceled: the GPUs are needed elsewhere"}


@pytest.fixture
def served(tmp_path: Path) -> Any:
    """The collect flow served by a runner in a process of its own, as a worker runs deployments:
    Prefect cancels a run there by stopping its process and running its ``on_cancellation`` hooks."""
    environ = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value()), "PREFECT_RUNNER_POLL_FREQUENCY": "1",
               "PYTHONPATH": str(REPO)}
    code = ("from flows.collect import collect_tao_job; "
            "collect_tao_job.serve(name='cancel-test', print_starting_message=False)")
    runner = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=environ, start_new_session=True,
                              stdout=(tmp_path / "runner.log").open("w"), stderr=subprocess.STDOUT)
    yield runner
    if runner.poll() is None:
        os.killpg(runner.pid, signal.SIGTERM)
        runner.wait(30)


def test_canceling_a_collect_run_stops_the_job_in_the_local_frame(env: dict[str, str], bucket: str, sandbox: None,
                                                                   tmp_path: Path, served: Any) -> None:
    """The whole path a user takes — a long job, its collect running in a worker, ``prefect
    flow-run cancel`` — ends with the record CANCELED and no process of the job left."""
    from prefect.deployments import run_deployment

    target, records = local_target(tmp_path), records_block(tmp_path / "jobs")
    long = stand_in_request(bucket, "long-job", environment={"EPOCHS": "1000", "EPOCH_SECONDS": "0.2"})
    assert submit_tao_job(long, target=target, records=records, return_state=True).is_completed()
    backend = LocalBackend(LocalSettings(run_root=str(tmp_path / "local")))
    assert job_processes(backend, "long-job")

    deployment = wait_for("the served deployment", lambda: _deployment("collect-tao-job/cancel-test"))
    run = run_deployment(deployment.id, parameters={"job_id": "long-job", "target": target, "records": records,
                                                    "poll_seconds": 0.2}, timeout=0)
    wait_for("the collect to watch the job", lambda: _state(run.id).is_running() or None, deadline_s=60)
    store = RecordStore(tmp_path / "jobs")
    wait_for("the collect to own the job", lambda: store.get("long-job").owner == f"prefect-flow-run/{run.id}" or None)
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(run.id, Cancelling(), force=True)
    wait_for("the run to be canceled", lambda: _state(run.id).is_cancelled() or None, deadline_s=90)
    wait_for("the job's record to say so", lambda: store.get("long-job").state == "CANCELED" or None, deadline_s=30)
    assert f"its flow run {_name(run.id)} was canceled" in (store.get("long-job").message or "")
    wait_for("every process of the job to end", lambda: not job_processes(backend, "long-job") or None, deadline_s=30)


def test_a_crashed_watcher_is_not_a_cancel_and_the_next_collect_takes_over(
        env: dict[str, str], bucket: str, sandbox: None, tmp_path: Path, served: Any) -> None:
    """The worker running a collect dies (a redeploy, a node drain): the job goes on, and the next
    collect owns it and sees it through."""
    from prefect.deployments import run_deployment

    target, records = local_target(tmp_path), records_block(tmp_path / "jobs")
    hold = tmp_path / "hold"
    held = stand_in_request(bucket, "outlives-its-watcher", mounts=[
        {"source": str(REPO / "examples" / "stand_in"), "target": "/stand-in"},
        {"source": str(hold), "target": "/control"}], environment={"EPOCHS": "1", "EPOCH_SECONDS": "0",
                                                                  "HOLD_FILE": "/control/go"})
    hold.mkdir()
    (hold / "waiting").touch()  # verify refuses an empty mount
    assert submit_tao_job(held, target=target, records=records, return_state=True).is_completed()
    deployment = wait_for("the served deployment", lambda: _deployment("collect-tao-job/cancel-test"))
    run = run_deployment(deployment.id, parameters={"job_id": "outlives-its-watcher", "target": target,
                                                    "records": records, "poll_seconds": 0.2}, timeout=0)
    store = RecordStore(tmp_path / "jobs")
    wait_for("the collect to own the job",
             lambda: store.get("outlives-its-watcher").owner == f"prefect-flow-run/{run.id}" or None, deadline_s=60)
    os.killpg(served.pid, signal.SIGKILL)  # the worker and its flow run process, without a word
    served.wait(30)

    backend = LocalBackend(LocalSettings(run_root=str(tmp_path / "local")))
    assert store.get("outlives-its-watcher").state == "RUNNING" and job_processes(backend, "outlives-its-watcher")
    (hold / "go").touch()
    state = collect_tao_job("outlives-its-watcher", target=target, records=records, poll_seconds=0.2,
                            return_state=True)
    assert state.is_completed(), state.message
    record = store.get("outlives-its-watcher")
    assert record.state == "COMPLETE" and record.owner == f"prefect-flow-run/{state.state_details.flow_run_id}"


def _deployment(name: str) -> Any:
    with get_client(sync_client=True) as client:
        try:
            return client.read_deployment_by_name(name)
        except Exception:  # noqa: BLE001 - not served yet
            return None


def _state(run_id: Any) -> Any:
    with get_client(sync_client=True) as client:
        return client.read_flow_run(run_id).state


def _name(run_id: Any) -> str:
    with get_client(sync_client=True) as client:
        return client.read_flow_run(run_id).name


def test_the_hook_of_a_run_that_no_longer_owns_the_job_leaves_it_alone(env: dict[str, str], bucket: str,
                                                                        tmp_path: Path) -> None:
    """A watcher's run that died (a zombie, later canceled by someone tidying up) must not cancel
    the job a newer collect took over."""
    target, records = fake_target(tmp_path, polls_until_done=10**6), records_block(tmp_path / "jobs")
    first = submit_tao_job(fake_request(bucket, "taken-over"), target=target, records=records, return_state=True)
    assert first.is_completed(), first.message
    later = collect_tao_job("taken-over", target=target, records=records, poll_seconds=0.01, max_wait_seconds=0,
                            return_state=True)
    store = RecordStore(tmp_path / "jobs")
    assert store.get("taken-over").owner == f"prefect-flow-run/{later.state_details.flow_run_id}"

    cancel_owned_job(submit_tao_job, flow_run_of(first), Cancelling())
    assert store.get("taken-over").state == "RUNNING"
    cancel_owned_job(collect_tao_job, flow_run_of(later), Cancelling())  # the owner's own cancel still works
    assert store.get("taken-over").state == "CANCELED"
