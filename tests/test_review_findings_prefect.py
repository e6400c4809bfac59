"""Findings of an adversarial review of the Prefect layer (flows/, tasks/, blocks/) and the CLI's
pipeline verbs, one test per finding, each written to fail on the code it was found in for the
reason its docstring gives."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from prefect.client.orchestration import get_client

from blocks import LocalTarget
from flows.collect import collect_tao_job
from flows.resync import resync_tao_outputs
from flows.submit import submit_tao_job
from tao_data_io.local.settings import LocalSettings
from tao_data_io.records import RecordStore

from .helpers import run_cli
from .flow_helpers import fake_request, fake_target, name, records_block

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

#: A credential value as a careless user might paste it into the wrong field of a request.
SECRET = "hf_AttackPrefectSecret7f3c9a1b"


def _args_request(**extra: Any) -> dict[str, Any]:
    return {"schema_version": "1", "image": "local", "command": ["true"], "mode": "args", "args": [], **extra}


def _local(tmp_path: Path, sub: str = "local") -> str:
    block = name()
    LocalTarget(settings=LocalSettings(run_root=str(tmp_path / sub)), staging_root=str(tmp_path / f"work-{sub}")).save(block)
    return f"tao-local-target/{block}"


def _running_record(root: Path, job_id: str) -> RecordStore:
    """A job the record store says is RUNNING on the local platform (as a submit through another
    target, or another worker, leaves it)."""
    store = RecordStore(root)
    store.open(platform="local", image="local", network_arch="true", action="run", results_dir="/results",
               job_id=job_id, source="flow")
    store.mark(job_id, "RUNNING", source="flow", backend_ref=f"local/{job_id}")
    return store


@pytest.fixture
def no_cloud(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("S3_BUCKET_NAME", "TAO_RESULTS_ROOT", "TAO_DATA_IO_RECORDS", "AWS_MAX_ATTEMPTS"):
        monkeypatch.delenv(variable, raising=False)


# --------------------------------------------------------------------------------------------------
def test_a_request_file_error_never_puts_a_credential_value_into_the_flow_run_state(
        prefect_harness: None, no_cloud: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A request file whose invalid field holds a credential value fails submit-tao-job with a
    message that quotes the value, and that message is stored unmasked as the flow run's state
    message in Prefect's database (and the exception in result storage) — only logs are masked."""
    monkeypatch.setenv("HF_TOKEN", SECRET)
    request = tmp_path / "request.yaml"
    request.write_text(yaml.safe_dump(_args_request(inputs=[{"source": SECRET}])))
    state = submit_tao_job(str(request), target=_local(tmp_path), records=records_block(tmp_path / "jobs"),
                           return_state=True)
    assert state.is_failed()
    assert "inputs[0].source" in str(state.message)  # the field is named...
    with get_client(sync_client=True) as client:
        stored = client.read_flow_run(state.state_details.flow_run_id).state
    assert stored is not None and SECRET not in str(stored.message)  # ...but the value must not be stored


def test_a_yaml_syntax_error_never_puts_a_credential_value_into_the_flow_run_state(
        prefect_harness: None, no_cloud: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """PyYAML's error quotes the offending line, so a request file with a syntax error on the line
    holding a credential value stores that value (up to PyYAML's snippet width: the whole of a short
    one, the first ~25 characters of a long one) in the failed flow run's state message."""
    monkeypatch.setenv("HF_TOKEN", SECRET)
    request = tmp_path / "request.yaml"
    request.write_text(f"schema_version: '1'\nimage: local\nspec: {{note: {SECRET}\n")
    state = submit_tao_job(str(request), target=_local(tmp_path), records=records_block(tmp_path / "jobs"),
                           return_state=True)
    assert state.is_failed() and "not valid YAML" in str(state.message)
    with get_client(sync_client=True) as client:
        stored = client.read_flow_run(state.state_details.flow_run_id).state
    assert stored is not None and SECRET[:16] not in str(stored.message)


def test_a_job_id_equal_to_a_credential_value_never_names_the_flow_run(
        prefect_harness: None, no_cloud: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The submit flow's run name is computed from the request with an empty environment
    (flows/submit.py run_name), so a job_id that equals a credential value becomes the stored flow
    run name ``submit-<value>`` although the flow itself refuses the request for holding it."""
    value = "zz-credential-value-42"  # a lowercase secret (MinIO-style) is a valid job id
    monkeypatch.setenv("MY_STORE_SECRET_KEY", value)
    request = tmp_path / "request.yaml"
    request.write_text(yaml.safe_dump(_args_request(job_id=value)))
    state = submit_tao_job(str(request), target=_local(tmp_path), records=records_block(tmp_path / "jobs"),
                           return_state=True)
    assert state.is_failed() and "holds the value of a credential" in str(state.message)
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(state.state_details.flow_run_id)
    assert value not in run.name


# --------------------------------------------------------------------------------------------------
def test_a_resubmit_of_a_job_whose_verify_failed_does_not_complete(
        prefect_harness: None, no_cloud: None, tmp_path: Path) -> None:
    """submit-tao-job run again for a job whose verify failed (record ERROR, the command never
    started) completes successfully with ``started: False`` via already_launched, so a retried
    deployment run reports success for a job that never ran."""
    target, records = fake_target(tmp_path, verify_ok=False), records_block(tmp_path / "jobs")
    request = _args_request(job_id="verify-failed-twice")
    assert submit_tao_job(request, target=target, records=records, return_state=True).is_failed()
    assert RecordStore(tmp_path / "jobs").get("verify-failed-twice").state == "ERROR"
    again = submit_tao_job(request, target=target, records=records, return_state=True)
    assert not again.is_completed(), f"the rerun completed: {again.result(raise_on_failure=False)}"


@needs_bwrap
def test_the_cli_resubmit_of_a_job_whose_verify_failed_is_not_exit_0(sandbox: None, tmp_path: Path) -> None:
    """`tao-data-io submit` of the same request after a failed verify exits 0, prints the job id and
    says "already running", though the job is ERROR and its command never started (the README:
    submit exits 2 on a failed verify)."""
    (tmp_path / "empty").mkdir()
    request = tmp_path / "request.yaml"
    request.write_text(yaml.safe_dump(_args_request(
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


# --------------------------------------------------------------------------------------------------
def test_collect_with_a_target_that_cannot_find_the_job_fails(prefect_harness: None, no_cloud: None,
                                                               tmp_path: Path) -> None:
    """collect-tao-job on a target that has no trace of a job its record says is RUNNING
    completes successfully with state UNKNOWN, where the CLI's collect (steps._known) fails
    naming where the job was submitted; the flow never uses the record's backend_config."""
    store = _running_record(tmp_path / "jobs", "lost-job")
    state = collect_tao_job("lost-job", target=_local(tmp_path, "elsewhere"), records=records_block(tmp_path / "jobs"),
                            poll_seconds=0.05, return_state=True)
    assert store.get("lost-job").state == "RUNNING"
    assert state.is_failed(), f"collect completed: {state.result(raise_on_failure=False)}"


def test_resync_with_a_target_that_cannot_find_a_running_job_does_not_say_the_backend_uploads(
        prefect_harness: None, no_cloud: None, tmp_path: Path) -> None:
    """resync-tao-outputs picks RUNNING jobs by platform only; for a job its target cannot find
    (another local target's root) the backend's results_path is None and the flow reports
    "backend uploads" and completes, though nothing uploads that job's results."""
    _running_record(tmp_path / "jobs", "other-root-job")
    outcome = resync_tao_outputs(target=_local(tmp_path, "elsewhere"), records=records_block(tmp_path / "jobs"),
                                 settle_seconds=0, return_state=True)
    result = outcome.result(raise_on_failure=False)
    assert not (outcome.is_completed() and isinstance(result, dict) and result.get("backend uploads")), result


def test_the_scheduled_resync_before_any_job_does_not_fail(prefect_harness: None, no_cloud: None,
                                                           tmp_path: Path) -> None:
    """With a directory records block, resync-tao-outputs fails (UsageError: root does not exist)
    on every scheduled run until the first job is submitted — the deployment runs it every 5 min
    from `prefect deploy` on — while an S3 records block returns zero jobs."""
    state = resync_tao_outputs(target=_local(tmp_path), records=records_block(tmp_path / "jobs-not-yet"),
                               return_state=True)
    assert state.is_completed(), state.message
    assert state.result()["jobs"] == 0


def test_a_missing_block_names_the_parameter_and_the_fix(prefect_harness: None, no_cloud: None,
                                                          tmp_path: Path) -> None:
    """A block parameter naming a block that was never saved fails with Prefect's bare ValueError
    ("Unable to find block document named … for block type …"), which names neither the flow
    parameter nor how to fix it (flows/common.py load_block wraps only the type check)."""
    state = submit_tao_job(_args_request(), target=_local(tmp_path), records=records_block(tmp_path / "jobs"),
                           s3_credentials="tao-s3-credentials/never-saved", return_state=True)
    assert state.is_failed()
    message = str(state.message)
    assert "ValueError" not in message and "s3_credentials" in message, message


# --------------------------------------------------------------------------------------------------
def test_a_forwarded_credential_printed_by_the_job_is_masked_in_the_failure_artifact(
        prefect_harness: None, no_cloud: None, sandbox: None, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The failure report masks the log tail only with values whose variable NAME looks secret
    (tasks/outputs.py report_failure → Redactor), so a credential the request forwards under a
    plain name (forward_env: [WANDB_KEY]) and the job prints lands unmasked in the Prefect artifact."""
    value = "wandb-credential-0123456789"
    monkeypatch.setenv("WANDB_KEY", value)
    target, records = _local(tmp_path), records_block(tmp_path / "jobs")
    loud = _args_request(job_id="loud-forward", command=["/bin/sh", "-c"], args=['echo "key is $WANDB_KEY"; exit 3'],
                         forward_env=["WANDB_KEY"])
    try:
        assert submit_tao_job(loud, target=target, records=records, return_state=True).is_completed()
        failed = collect_tao_job("loud-forward", target=target, records=records, poll_seconds=0.05,
                                 return_state=True)
        assert failed.is_failed()
        with get_client(sync_client=True) as client:
            found = [a for a in client.read_artifacts() if a.key == "failure-loud-forward"]
        assert found and "key is" in str(found[0].data)
        assert value not in str(found[0].data)
    finally:
        from tao_data_io.local.backend import LocalBackend
        from tao_data_io.local.settings import LocalSettings

        LocalBackend(LocalSettings(run_root=str(tmp_path / "local"))).cancel("local/loud-forward")


def test_a_negative_poll_interval_of_the_collect_flow_names_the_parameter(
        prefect_harness: None, no_cloud: None, tmp_path: Path) -> None:
    """collect-tao-job does not check poll_seconds: -1 (or NaN) fails after the first poll with
    time.sleep's bare "ValueError: sleep length must be non-negative" (0 busy-polls the backend
    and the record store), where the CLI refuses the same value up front naming --poll-seconds."""
    target, records = fake_target(tmp_path, polls_until_done=10**6), records_block(tmp_path / "jobs")
    assert submit_tao_job(_args_request(job_id="poll-negative"), target=target, records=records,
                          return_state=True).is_completed()
    state = collect_tao_job("poll-negative", target=target, records=records, poll_seconds=-1,
                            max_wait_seconds=5, return_state=True)
    assert state.is_failed()
    assert "poll_seconds" in str(state.message), state.message
