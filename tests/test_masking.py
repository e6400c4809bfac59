"""No credential value in Prefect: the values of the worker's credentials — those the blocks map
and those a request forwards, whatever they are called — never reach a flow run's stored state,
its name, its persisted result or an artifact, even when a user pastes one into the wrong field;
what fails is still named (the field, the line), with the value masked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

from flows.collect import collect_tao_job
from flows.submit import submit_tao_job

from .flow_helpers import artifacts, local_target, name, records_block
from .helpers import args_request, wait_for

#: A credential value as a careless user might paste it into the wrong field of a request.
SECRET = "hf_AttackPrefectSecret7f3c9a1b"
#: A credential value with a backslash, as strong passwords and tokens may have.
BACKSLASH_SECRET = "pw_Attack\\Fix7f3c9a1bQz"


def _submit_file(tmp_path: Path, text: str) -> Any:
    """submit-tao-job of a request file holding ``text``, on a local target: its final state."""
    request = tmp_path / "request.yaml"
    request.write_text(text)
    return submit_tao_job(request_path=str(request), target=local_target(tmp_path),
                          records=records_block(tmp_path / "jobs"), return_state=True)


def _stored(state: Any) -> Any:
    """The state Prefect stored for the flow run: what its API and database hold."""
    with get_client(sync_client=True) as client:
        return client.read_flow_run(state.state_details.flow_run_id).state


def test_a_request_file_error_never_puts_a_credential_value_into_the_flow_run_state(
        prefect_harness: None, no_cloud: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A request file whose invalid field holds a credential value fails submit-tao-job naming the
    field; the message Prefect stores as the flow run's state (where no log filter reaches) holds
    the value masked."""
    monkeypatch.setenv("HF_TOKEN", SECRET)
    state = _submit_file(tmp_path, yaml.safe_dump(args_request(inputs=[{"source": SECRET}])))
    assert state.is_failed()
    assert "inputs[0].source" in str(state.message)  # the field is named...
    stored = _stored(state)
    assert stored is not None and SECRET not in str(stored.message)  # ...but the value must not be stored


def test_a_yaml_syntax_error_never_puts_a_credential_value_into_the_flow_run_state(
        prefect_harness: None, no_cloud: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """PyYAML's error quotes the offending line; a syntax error on a line holding a credential value
    fails the flow with the line and column, and no part of the value reaches the stored state."""
    monkeypatch.setenv("HF_TOKEN", SECRET)
    state = _submit_file(tmp_path, f"schema_version: '1'\nimage: local\nspec: {{note: {SECRET}\n")
    assert state.is_failed() and "not valid YAML" in str(state.message)
    stored = _stored(state)
    assert stored is not None and SECRET[:16] not in str(stored.message)


def test_a_credential_value_quoted_with_repr_is_still_masked_in_the_flow_run_state(
        prefect_harness: None, no_cloud: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Messages quote values with ``!r`` (request field errors, KeyError, OSError file names), which
    doubles a backslash: a credential value with one is masked in its quoted form too."""
    monkeypatch.setenv("HF_TOKEN", BACKSLASH_SECRET)
    state = _submit_file(tmp_path, yaml.safe_dump(args_request(inputs=[{"source": BACKSLASH_SECRET}])))
    assert state.is_failed()
    assert "inputs[0].source" in str(state.message)
    stored = _stored(state)
    assert stored is not None
    assert "Fix7f3c9a1bQz" not in str(stored.message), stored.message


def test_a_masked_failure_can_be_read_back_from_the_flow_runs_persisted_result(
        prefect_harness: None, no_cloud: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A flow persists its result as JSON, and Prefect rebuilds an exception from its message: a
    failure whose message was masked reads back (a parent flow, ``run_deployment(...).result()``) as
    the masked error."""
    secret = "pw_AttackFixRoundTrip9c1e"
    monkeypatch.setenv("HF_TOKEN", secret)

    def boom(*args: Any) -> Any:
        raise KeyError(secret)  # a library's error quoting a value, as any step might meet

    monkeypatch.setattr("flows.submit.prepare", boom)
    state = submit_tao_job(args_request(), target=local_target(tmp_path), records=records_block(tmp_path / "jobs"),
                           return_state=True)
    assert state.is_failed() and secret not in str(state.message)
    stored = _stored(state)
    assert stored is not None
    error = stored.result(raise_on_failure=False)
    assert isinstance(error, Exception) and "KeyError" in str(error) and secret not in str(error)


def test_a_job_id_equal_to_a_credential_value_never_names_the_flow_run(
        prefect_harness: None, no_cloud: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The submit flow names its run from the request only once the request is checked against the
    environment's credentials: a job id equal to a credential value is refused, and the stored run
    name never holds it."""
    value = "zz-credential-value-42"  # a lowercase secret (MinIO-style) is a valid job id
    monkeypatch.setenv("MY_STORE_SECRET_KEY", value)
    request = tmp_path / "request.yaml"
    request.write_text(yaml.safe_dump(args_request(job_id=value)))
    state = submit_tao_job(request_path=str(request), target=local_target(tmp_path),
                           records=records_block(tmp_path / "jobs"), return_state=True)
    assert state.is_failed() and "holds the value of a credential" in str(state.message)
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(state.state_details.flow_run_id)
    assert value not in run.name


def test_a_job_id_equal_to_a_block_mapped_credential_value_never_names_the_flow_run(
        prefect_harness: None, no_cloud: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A credential whose variable only the S3 credentials block names (``TEAM_S3_SK``) is known once
    the blocks load; a job id equal to its value is refused, and the stored run name never holds it."""
    from blocks.credentials import S3EnvCredentials

    value = "zz-team-store-value-42"  # a lowercase secret (MinIO-style) is a valid job id
    monkeypatch.setenv("TEAM_S3_ID", "team-access-id-1")
    monkeypatch.setenv("TEAM_S3_SK", value)
    block = name()
    S3EnvCredentials(access_key_id_env="TEAM_S3_ID", secret_access_key_env="TEAM_S3_SK").save(block)
    request = tmp_path / "request.yaml"
    request.write_text(yaml.safe_dump(args_request(job_id=value)))
    state = submit_tao_job(request_path=str(request), target=local_target(tmp_path),
                           records=records_block(tmp_path / "jobs"), s3_credentials=f"tao-s3-credentials/{block}",
                           return_state=True)
    assert state.is_failed() and "holds the value of a credential" in str(state.message)
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(state.state_details.flow_run_id)
    assert value not in run.name


def test_a_forwarded_credential_printed_by_the_job_is_masked_in_the_failure_artifact(
        prefect_harness: None, no_cloud: None, sandbox: None, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The failure report masks the job's log tail with every value the request forwards, whatever its
    variable is called (``forward_env: [WANDB_KEY]``), not only names that look secret."""
    value = "wandb-credential-0123456789"
    monkeypatch.setenv("WANDB_KEY", value)
    target, records = local_target(tmp_path), records_block(tmp_path / "jobs")
    loud = args_request(job_id="loud-forward", command=["/bin/sh", "-c"], args=['echo "key is $WANDB_KEY"; exit 3'],
                         forward_env=["WANDB_KEY"])
    try:
        assert submit_tao_job(loud, target=target, records=records, return_state=True).is_completed()
        failed = collect_tao_job("loud-forward", target=target, records=records, poll_seconds=0.05,
                                 return_state=True)
        assert failed.is_failed()
        # Read by the collect run's id: an unfiltered read is one page of every artifact of the
        # session's server, which this one falls off once enough tests have run.
        found = [a for a in artifacts(failed) if a.key == "failure-loud-forward"]
        assert found and "key is" in str(found[0].data)
        assert value not in str(found[0].data)
    finally:
        from tao_data_io.backends.local.backend import LocalBackend
        from tao_data_io.backends.local.settings import LocalSettings

        LocalBackend(LocalSettings(run_root=str(tmp_path / "local"))).cancel("local/loud-forward")


def test_a_forwarded_variables_value_in_the_request_parameter_is_masked_where_prefect_stores_it(
        prefect_harness: None, no_cloud: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A request parameter holding the value of one of its own forward_env variables — a plain
    name, WANDB_KEY — fails the run, and the parameters the server keeps are masked."""
    value = "wandb-stored-parameter-0123456789"
    monkeypatch.setenv("WANDB_KEY", value)
    leaky = args_request(job_id="leaky-forward", args=["--key", value], forward_env=["WANDB_KEY"])
    state = submit_tao_job(leaky, target=local_target(tmp_path), records=records_block(tmp_path / "jobs"),
                           return_state=True)
    assert state.is_failed()
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(state.state_details.flow_run_id)
    assert value not in str(run.parameters) and value not in str(run.state.message if run.state else "")
    assert "***WANDB_KEY***" in str(run.parameters)


def _run(state: Any) -> Any:
    with get_client(sync_client=True) as client:
        return client.read_flow_run(state.state_details.flow_run_id)


def test_no_part_of_a_credential_value_given_as_a_path_names_the_flow_run(
        prefect_harness: None, no_cloud: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run that does not know its job yet is named by its request file's name; a secret given as
    the path (AWS secret keys hold '/') must not leave its tail there."""
    value = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", value)
    state = submit_tao_job(request_path=value, target=local_target(tmp_path), records=records_block(tmp_path / "jobs"),
                           return_state=True)
    assert state.is_failed()
    run = _run(state)
    assert not any(part in run.name for part in value.split("/")), run.name
    assert run.name.startswith("submit: request_path masked, ")


def test_the_credentials_of_a_records_bucket_block_are_masked_and_refused_in_parameters_too(
        prefect_harness: None, no_cloud: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from blocks import JobRecords, S3EnvCredentials, TaoS3Bucket

    value = "TeamRecordsBucketSecretValue0042"
    monkeypatch.setenv("TEAM_RECORDS_ID", "team-records-id-1")
    monkeypatch.setenv("TEAM_RECORDS_SK", value)
    records = name()
    JobRecords(bucket=TaoS3Bucket(bucket_name="records-bkt", bucket_folder="r", credentials=S3EnvCredentials(
        access_key_id_env="TEAM_RECORDS_ID", secret_access_key_env="TEAM_RECORDS_SK"))).save(records)
    state = submit_tao_job(request_path=f"requests/{value}", target=local_target(tmp_path),
                           records=f"tao-job-records/{records}", return_state=True)
    assert state.is_failed() and "holds a credential" in str(state.message)
    run = _run(state)
    assert value not in run.name and value not in repr(run.parameters) and value not in str(run.state.message)


def test_a_block_saved_by_an_older_form_that_no_longer_loads_fails_the_run_saying_why_and_how_to_fix_it(
        prefect_harness: None, no_cloud: None, tmp_path: Path) -> None:
    """Prefect says only 'failed validation' (and suggests validate=False, which crashes on a
    model-level error): the run fails with the block's own refusal instead."""
    from prefect.client.schemas.actions import BlockDocumentCreate

    from blocks import S3EnvCredentials

    S3EnvCredentials.register_type_and_schema()
    saved = name()
    with get_client(sync_client=True) as client:
        block_type = client.read_block_type_by_slug("tao-s3-credentials")
        schema = client.get_most_recent_block_schema_for_block_type(block_type.id)
        client.create_block_document(BlockDocumentCreate(  # what the earlier form saved: a legacy name of the team's
            name=saved, data={"access_key_id_env": "AWS_ACCESS_KEY_ID", "access_key_id_legacy_env": "TEAM_OLD_KEY"},
            block_type_id=block_type.id, block_schema_id=schema.id))
    state = submit_tao_job(args_request(), target=local_target(tmp_path), records=records_block(tmp_path / "jobs"),
                           s3_credentials=f"tao-s3-credentials/{saved}", return_state=True)
    message = str(state.message)
    assert state.is_failed() and message.startswith(f"s3_credentials tao-s3-credentials/{saved}: the saved block "
                                                    "does not load as it is"), message
    assert "access_key_id_legacy_env 'TEAM_OLD_KEY'" in message and "Save it again" in message


def test_a_failure_whose_cause_quotes_a_credential_leaves_no_trace_of_it_in_the_run_logs(
        prefect_harness: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Our own errors are masked in place, but the exception they were raised from is logged with
    them (the traceback's chain), before any flow installed its log mask."""
    from prefect import flow

    from tao_data_io.errors import TransferError
    from tasks.masking import masking_failures

    value = "zz-chain-secret-value-77"
    monkeypatch.setenv("MY_STORE_SECRET_KEY", value)

    @flow
    @masking_failures
    def failing() -> None:
        try:
            {}[value]
        except KeyError as exc:
            raise TransferError(f"could not read {value}") from exc

    state = failing(return_state=True)
    assert state.is_failed() and value not in str(state.message)

    def logged() -> list[Any] | None:
        with get_client(sync_client=True) as client:
            logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(
                any_=[state.state_details.flow_run_id])))
        return logs if any("Finished in state" in log.message for log in logs) else None

    logs = wait_for("the run's last log line", logged)
    assert any("Traceback" in log.message for log in logs)  # the chain is logged: it must hold no value
    assert not [log.message for log in logs if value in log.message]


def test_a_forwarded_credential_the_job_prints_across_a_look_or_writes_in_status_json_is_masked_whole(
        prefect_harness: None, no_cloud: None, sandbox: None, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The job prints the value of what it is given in a line longer than one look at its log takes,
    across where that look ends, and writes it into status.json past where a text is cut for
    display: the run's logs and its training artifacts hold no piece of it."""
    import threading

    from tao_data_io.launch.backend import FOLLOW_BYTES
    from tao_data_io.records import RecordStore

    value = "wandb-" + "Fw7dCutSecret" * 3 + "-0"  # 47 characters
    monkeypatch.setenv("WANDB_KEY", value)
    control = tmp_path / "control"
    control.mkdir()
    control.chmod(0o1777)
    script = ("echo ready; while [ ! -e /control/go ]; do sleep 0.1; done; "
              "m=$(head -c 150 /dev/zero | tr '\\0' m); n=$(head -c 60 /dev/zero | tr '\\0' n); "
              "printf '{\"status\": \"RUNNING\", \"epoch\": 1, \"max_epoch\": 2, \"message\": \"%s%s\", "
              "\"kpi\": {\"note\": \"%s%s\"}}\\n' \"$m\" \"$WANDB_KEY\" \"$n\" \"$WANDB_KEY\" "
              "> \"$TAO_RESULTS_DIR/status.json\"; "
              f"yes A | head -c {FOLLOW_BYTES - 20} | tr '\\n' ' '; printf %s \"$WANDB_KEY\"; echo; echo done")
    request = args_request(job_id="cut-secret", command=["/bin/sh", "-c", script], forward_env=["WANDB_KEY"],
                           mounts=[{"source": str(control), "target": "/control", "read_only": False}])
    target, records = local_target(tmp_path), records_block(tmp_path / "jobs")
    try:
        assert submit_tao_job(request, target=target, records=records, return_state=True).is_completed()

        def release_after_the_first_look() -> None:  # the long line comes after a look has been made
            store = RecordStore(tmp_path / "jobs")
            wait_for("the collect run's first look", lambda: store.get("cut-secret").log_cursor)
            (control / "go").touch()

        releasing = threading.Thread(target=release_after_the_first_look, daemon=True)
        releasing.start()
        state = collect_tao_job("cut-secret", target=target, records=records, poll_seconds=0.3, max_wait_seconds=120,
                                return_state=True)
        releasing.join()
        assert state.is_completed(), state.message

        def logged() -> list[str] | None:  # the run's logs reach the server a moment after the run returns
            with get_client(sync_client=True) as client:
                logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(
                    any_=[state.state_details.flow_run_id])))
            messages = [log.message for log in sorted(logs, key=lambda log: log.timestamp)]
            return messages if any(message.startswith("job cut-secret: COMPLETE") for message in messages) else None

        messages = wait_for("the watch's last log line", logged)
        found = artifacts(state)
        shown = "\n".join(messages + [f"{a.description} {a.data}" for a in found])
        assert [value[i:i + 8] for i in range(len(value) - 7) if value[i:i + 8] in shown] == []
        printed = [line for message in messages if "printed:" in message for line in message.splitlines()[1:]]
        assert printed[-2:] == ["| ***WANDB_KEY***", "| done"]
        assert any("training of job cut-secret" in str(a.description) and "***WANDB_KEY***" in str(a.description)
                   for a in found)
    finally:
        from tao_data_io.backends.local.backend import LocalBackend
        from tao_data_io.backends.local.settings import LocalSettings

        LocalBackend(LocalSettings(run_root=str(tmp_path / "local"))).cancel("local/cut-secret")
