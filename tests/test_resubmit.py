"""Submitting a job again — a retried submit, a Prefect retry, a fixed request under the same id:
a running job is left as it is (nothing restaged), a job whose verify failed fails the same way
again, and a job that never launched runs once its request is fixed."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import yaml
from prefect import Flow
from prefect.client.orchestration import get_client
from prefect.states import State

from flows.submit import submit_tao_job
from tao_data_io.backends.local.settings import LocalSettings
from tao_data_io.records import RecordStore

from .flow_helpers import deployed, fake_request, fake_target, records_block
from .helpers import args_request, held_request, needs_bwrap, run_cli, wait_cli_state


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


def test_a_resubmit_of_a_job_whose_verify_failed_does_not_complete(
        prefect_harness: None, no_cloud: None, tmp_path: Path) -> None:
    """submit-tao-job run again for a job whose verify failed (record ERROR, the command never
    started) fails again: a retried deployment run never reports success for a job that never ran."""
    target, records = fake_target(tmp_path, verify_ok=False), records_block(tmp_path / "jobs")
    request = args_request(job_id="verify-failed-twice")
    assert submit_tao_job(request, target=target, records=records, return_state=True).is_failed()
    assert RecordStore(tmp_path / "jobs").get("verify-failed-twice").state == "ERROR"
    again = submit_tao_job(request, target=target, records=records, return_state=True)
    assert not again.is_completed(), f"the rerun completed: {again.result(raise_on_failure=False)}"


@needs_bwrap
def test_the_cli_resubmit_of_a_job_whose_verify_failed_is_not_exit_0(sandbox: None, tmp_path: Path) -> None:
    """``tao-data-io submit`` of the same request after a failed verify exits non-zero and never says
    "already running": the job is ERROR and its command never started."""
    (tmp_path / "empty").mkdir()
    request = tmp_path / "request.yaml"
    request.write_text(yaml.safe_dump(args_request(
        job_id="verify-fails", command=["/bin/sh", "-c"], args=["ls /in"],
        mounts=[{"source": str(tmp_path / "empty"), "target": "/in"}])))
    env = {"TAO_DATA_IO_RECORDS": str(tmp_path / "jobs"), "TAO_DATA_IO_WORKDIR": str(tmp_path / "work"),
           "HOME": str(tmp_path)}
    first = run_cli("submit", "--request", str(request), env=env)
    assert first.returncode == 2, first.stderr
    second = run_cli("submit", "--request", str(request), env=env)
    assert "already running" not in second.stderr, second.stderr
    assert second.returncode != 0, second.stderr


def test_a_fixed_request_can_rerun_a_job_whose_staging_failed(
        prefect_harness: None, env: dict[str, str], bucket: str, tmp_path: Path) -> None:
    """After a submit fails before launch (an input that does not exist: record ERROR with the
    reason, nothing started), the fixed request under the same job id runs it."""
    target, records = fake_target(tmp_path), records_block(tmp_path / "jobs")
    fixed = {**fake_request(bucket, "fix-and-rerun"), "spec": {"train": {"epochs": 1}}}
    bad = {**fixed, "inputs": [*fixed["inputs"], {"source": f"s3://{bucket}/no-such.bin", "kind": "file",
                                                  "target": "/extra/x.bin"}]}
    assert submit_tao_job(bad, target=target, records=records, return_state=True).is_failed()
    assert RecordStore(tmp_path / "jobs").get("fix-and-rerun").state == "ERROR"
    again = submit_tao_job(fixed, target=target, records=records, return_state=True)
    assert again.is_completed(), again.message


def test_a_job_whose_submit_failed_before_anything_ran_may_be_opened_again_for_a_fixed_request(
        tmp_path: Path) -> None:
    """A backend that refuses a submit before anything exists (a forward_env variable not set) leaves
    the record ERROR with the reason and no backend_ref; the request fixed under the same job id is
    then launched, not refused as already launched."""
    from tao_data_io.errors import CredentialError
    from tao_data_io.backends.local.backend import LocalBackend
    from tao_data_io.backends.local.settings import LocalSettings
    from tao_data_io.verbs import submit
    from tao_data_io.records import RecordStore
    from tao_data_io.request import parse_request

    store = RecordStore(tmp_path / "jobs")
    backend = LocalBackend(LocalSettings(run_root=str(tmp_path / "local")))
    first = parse_request(args_request(job_id="job-fixed-env", forward_env=["TAO_ATTACK_UNSET_TOKEN"]), environ={})
    with pytest.raises(CredentialError, match="TAO_ATTACK_UNSET_TOKEN"):
        submit(first, backend, store, staging_root=tmp_path / "work", environ={})
    record = store.get("job-fixed-env")
    assert record.state == "ERROR" and record.backend_ref is None  # nothing was launched, and the record says why
    assert "TAO_ATTACK_UNSET_TOKEN" in (record.message or "")
    fixed = parse_request(args_request(job_id="job-fixed-env"), environ={})  # forward_env dropped: the fix
    done = submit(fixed, backend, store, staging_root=tmp_path / "work", environ={})
    assert done.started


def test_a_job_that_ran_and_failed_resumes_from_its_uploaded_results_in_its_next_attempt(
        prefect_harness: None, no_cloud: None, env: dict[str, str], bucket: str, s3_client: Any, sandbox: None,
        tmp_path: Path) -> None:
    """run-tao-job of a job that fails after epoch 2 (its checkpoints uploaded), then run again —
    a Prefect retry of the run, from another worker whose results directory starts empty, as a
    new tier C pod's does: the second attempt starts with the first's results restored, TAO (the
    stand-in) resumes at epoch 3 instead of 1, and the record keeps both attempts."""
    from flows.run import run_tao_job
    from tao_data_io.backends.local.backend import LocalBackend

    from .flow_helpers import local_target, stand_in_request

    target, records = local_target(tmp_path), records_block(tmp_path / "jobs")
    request = stand_in_request(bucket, "resumed")
    request["environment"] = {**request["environment"], "EPOCHS": "4", "EPOCH_SECONDS": "0", "FAIL_AFTER_EPOCH": "2"}
    assert run_tao_job(request, target=target, records=records, poll_seconds=0.1, return_state=True).is_failed()
    store = RecordStore(tmp_path / "jobs")
    assert store.get("resumed").state == "ERROR"
    uploaded = {o["Key"] for o in s3_client.list_objects_v2(Bucket=bucket, Prefix="results/resumed/")["Contents"]}
    assert {"results/resumed/checkpoint_epoch_1.pth", "results/resumed/checkpoint_epoch_2.pth"} <= uploaded
    results = tmp_path / "local" / "resumed" / "results"
    shutil.rmtree(results)  # another worker: nothing of the first attempt on this host

    again = run_tao_job(request, target=target, records=records, poll_seconds=0.1, return_state=True)
    assert again.is_completed(), again.message
    record = store.get("resumed")
    assert record.state == "COMPLETE" and [(a.number, a.state) for a in record.attempts] == [(1, "ERROR"),
                                                                                           (2, "COMPLETE")]
    assert record.attempts[0].restored is None  # two checkpoints, status.json, train.log:
    assert str(record.attempts[1].restored).startswith("4 file(s)")
    log = LocalBackend(LocalSettings(run_root=str(tmp_path / "local"))).logs(str(record.backend_ref))
    assert "resumed from checkpoint_epoch_2.pth" in log and "epoch 1/4 done" not in log
    assert "epoch 3/4 done" in log and (results / "checkpoint_epoch_4.pth").exists()
    assert (tmp_path / "local" / "resumed" / "run" / "attempts" / "1" / "launch.json").exists()  # kept, put away


def test_a_completed_job_submitted_again_does_not_run_again(
        prefect_harness: None, no_cloud: None, tmp_path: Path) -> None:
    """Only a job that ended ERROR or CANCELED after it ran gets another attempt: a COMPLETE one
    is done, and its submit reports it launched, starting nothing."""
    target, records = fake_target(tmp_path), records_block(tmp_path / "jobs")
    from flows.run import run_tao_job

    request = fake_request("bucket-unused", "done-once")
    request["inputs"], request["spec"] = [], {"train": {"epochs": 1}}
    assert run_tao_job(request, target=target, records=records, poll_seconds=0.01, return_state=True).is_completed()
    state = submit_tao_job(request, target=target, records=records, return_state=True)
    assert state.is_completed() and state.result()["started"] is False
    assert len(RecordStore(tmp_path / "jobs").get("done-once").attempts) == 1


def test_a_retry_of_a_failed_run_tao_job_as_the_ui_asks_for_it_resumes_its_job_and_training(
        prefect_harness: None, no_cloud: None, env: dict[str, str], bucket: str, sandbox: None,
        tmp_path: Path) -> None:
    """Issue 40, item 2: a run-tao-job whose training fails after epoch 2, retried as the UI's
    Retry does it — the same flow run set to Scheduled "AwaitingRetry", then run again by a
    worker (here Prefect's own engine, in this process) — submits its job again: the same job
    id (the request has none: it comes from the run), a second attempt that resumes the training
    from the first's checkpoints, and a collect that follows that attempt to COMPLETE. Prefect
    reuses a Completed subflow that has a persisted result on a retry of its parent: the submit
    subflow must not be one, or the retry only collects the failed attempt again."""
    from prefect.flow_engine import load_flow_run, run_flow

    from flows.common import job_of
    from flows.run import run_tao_job
    from tao_data_io.backends.local.backend import LocalBackend

    from .flow_helpers import local_target, stand_in_request

    request = stand_in_request(bucket, "unused")
    del request["job_id"]
    request["environment"] = {**request["environment"], "EPOCHS": "4", "EPOCH_SECONDS": "0", "FAIL_AFTER_EPOCH": "2"}
    with get_client(sync_client=True) as client:  # a Retry is offered for a deployment's runs only
        run_id = client.create_flow_run_from_deployment(deployed(run_tao_job), parameters={
            "request": request, "target": local_target(tmp_path), "records": records_block(tmp_path / "jobs"),
            "poll_seconds": 0.1}).id
    assert run_flow(run_tao_job, flow_run=load_flow_run(run_id), return_type="state").is_failed()
    job_id = job_of(load_flow_run(run_id))
    store = RecordStore(tmp_path / "jobs")
    assert job_id is not None and store.get(job_id).state == "ERROR"

    again = _retried_as_the_ui_does(run_tao_job, run_id)

    assert again.is_completed(), again.message
    assert job_of(load_flow_run(run_id)) == job_id
    record = store.get(job_id)
    assert [(a.number, a.state) for a in record.attempts] == [(1, "ERROR"), (2, "COMPLETE")]
    log = LocalBackend(LocalSettings(run_root=str(tmp_path / "local"))).logs(str(record.backend_ref))
    assert "resumed from checkpoint_epoch_2.pth" in log and "epoch 3/4 done" in log


def _retried_as_the_ui_does(flow: Flow[..., Any], run_id: UUID) -> State:
    """The UI's Retry of the flow run ``run_id`` (its ``retryFlowRun``, to the letter: the run set
    to Scheduled "AwaitingRetry", not forced), then what a worker does with it — Prefect's own
    engine runs it again, here in this process; returns the run's new final state."""
    from prefect.flow_engine import load_flow_run, run_flow

    with get_client(sync_client=True) as client:
        said = client.request("POST", "/flow_runs/{id}/set_state", path_params={"id": run_id}, json={
            "state": {"type": "SCHEDULED", "name": "AwaitingRetry", "message": "Retry from the UI"},
            "force": False}).json()
    assert said["status"] == "ACCEPT", said  # the UI toasts "Retrying run" whatever the server says
    return run_flow(flow, flow_run=load_flow_run(run_id), return_type="state")
