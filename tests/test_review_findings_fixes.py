"""Findings of an adversarial review of the fixes in 30783fb (masking of failures, reopening a
PENDING job for a changed request, the launch claim, `_known`, `seconds_within`), one test per
finding, each written to fail on the code it was found in for the reason its docstring gives."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from prefect.client.orchestration import get_client

from flows.submit import submit_tao_job

from .flow_helpers import name, records_block
from .test_review_findings_prefect import _args_request, _local, no_cloud  # noqa: F401 (no_cloud: a fixture)

#: A credential value with a backslash, as strong passwords and tokens may have.
BACKSLASH_SECRET = "pw_Attack\\Fix7f3c9a1bQz"


# --------------------------------------------------------------------------------------------------
def test_a_credential_value_quoted_with_repr_is_still_masked_in_the_flow_run_state(
        prefect_harness: None, no_cloud: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The redactor only matches a credential value verbatim, but messages quote values with
    ``!r`` (request field errors, KeyError, OSError filenames), which doubles a backslash (and
    escapes a quote or a control character), so such a value reaches the failed flow run's
    state message in Prefect's database unmasked."""
    monkeypatch.setenv("HF_TOKEN", BACKSLASH_SECRET)
    request = tmp_path / "request.yaml"
    request.write_text(yaml.safe_dump(_args_request(inputs=[{"source": BACKSLASH_SECRET}])))
    state = submit_tao_job(str(request), target=_local(tmp_path), records=records_block(tmp_path / "jobs"),
                           return_state=True)
    assert state.is_failed()
    assert "inputs[0].source" in str(state.message)
    with get_client(sync_client=True) as client:
        stored = client.read_flow_run(state.state_details.flow_run_id).state
    assert stored is not None
    assert "Fix7f3c9a1bQz" not in str(stored.message), stored.message


def test_a_masked_failure_can_be_read_back_from_the_flow_runs_persisted_result(
        prefect_harness: None, no_cloud: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A flow persists its result as JSON, and Prefect's JSON decoder rebuilds an exception as
    ``cls(message)``; MaskedError's keyword-only ``retryable`` makes that a TypeError, so reading a
    failed flow run's result back (a parent flow, ``run_deployment(...).result()``) breaks exactly
    when masking worked."""
    secret = "pw_AttackFixRoundTrip9c1e"
    monkeypatch.setenv("HF_TOKEN", secret)

    def boom(*args: Any) -> Any:
        raise KeyError(secret)  # a library's error quoting a value, as any step might meet

    monkeypatch.setattr("flows.submit.prepare", boom)
    state = submit_tao_job(_args_request(), target=_local(tmp_path), records=records_block(tmp_path / "jobs"),
                           return_state=True)
    assert state.is_failed() and secret not in str(state.message)
    with get_client(sync_client=True) as client:
        stored = client.read_flow_run(state.state_details.flow_run_id).state
    assert stored is not None
    error = stored.result(raise_on_failure=False)
    assert isinstance(error, Exception) and "KeyError" in str(error) and secret not in str(error)


def test_a_job_whose_submit_failed_before_anything_ran_may_be_opened_again_for_a_fixed_request(
        tmp_path: Path) -> None:
    """The launch claim pins backend_config before the backend is asked, and a record with one
    counts as launched; so when the backend's submit then refuses before anything exists (a
    forward_env variable not set here: "a missing one fails before anything exists"), the request
    fixed under the same job id is refused as "PENDING and was launched" — a job that never ran,
    stuck under its id for good."""
    from tao_data_io.errors import CredentialError
    from tao_data_io.local.backend import LocalBackend
    from tao_data_io.local.settings import LocalSettings
    from tao_data_io.verbs import submit
    from tao_data_io.records import RecordStore
    from tao_data_io.request import parse_request

    store = RecordStore(tmp_path / "jobs")
    backend = LocalBackend(LocalSettings(run_root=str(tmp_path / "local")))
    first = parse_request(_args_request(job_id="job-fixed-env", forward_env=["TAO_ATTACK_UNSET_TOKEN"]), environ={})
    with pytest.raises(CredentialError, match="TAO_ATTACK_UNSET_TOKEN"):
        submit(first, backend, store, staging_root=tmp_path / "work", environ={})
    record = store.get("job-fixed-env")
    assert record.state == "ERROR" and record.backend_ref is None  # nothing was launched, and the record says why
    assert "TAO_ATTACK_UNSET_TOKEN" in (record.message or "")
    fixed = parse_request(_args_request(job_id="job-fixed-env"), environ={})  # forward_env dropped: the fix
    done = submit(fixed, backend, store, staging_root=tmp_path / "work", environ={})
    assert done.started


@pytest.mark.parametrize("value", [True, False])
def test_a_bool_is_not_a_number_of_seconds(value: bool) -> None:
    """``seconds_within`` checks ``isinstance(value, int | float)``, which a bool passes (True is 1,
    False is 0), so a core caller's ``poll_seconds=True`` polls every second and ``settle_seconds=False``
    uploads files still being written instead of being refused as a type mistake (the flows' float
    parameters coerce a bool before the core sees it, so only core callers are affected)."""
    from tao_data_io.errors import UsageError
    from tao_data_io.vocabulary import POLL_SECONDS_BOUNDS, SETTLE_SECONDS_BOUNDS, seconds_within

    for bounds in (POLL_SECONDS_BOUNDS, SETTLE_SECONDS_BOUNDS):
        if bounds[0] <= int(value):
            with pytest.raises(UsageError, match="must be a number of seconds"):
                seconds_within(value, bounds, name="poll_seconds")


def test_a_job_id_equal_to_a_block_mapped_credential_value_never_names_the_flow_run(
        prefect_harness: None, no_cloud: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The submit flow's run name is now computed with ``os.environ``, but a credential whose
    variable the S3 credentials block names (any name, such as ``TEAM_S3_SK``) is only known as a
    credential once the blocks load; so a job_id equal to its value still names the stored flow
    run ``submit-<value>`` although the flow refuses the request for holding it."""
    from blocks.credentials import S3EnvCredentials

    value = "zz-team-store-value-42"  # a lowercase secret (MinIO-style) is a valid job id
    monkeypatch.setenv("TEAM_S3_ID", "team-access-id-1")
    monkeypatch.setenv("TEAM_S3_SK", value)
    block = name()
    S3EnvCredentials(access_key_id_env="TEAM_S3_ID", secret_access_key_env="TEAM_S3_SK").save(block)
    request = tmp_path / "request.yaml"
    request.write_text(yaml.safe_dump(_args_request(job_id=value)))
    state = submit_tao_job(str(request), target=_local(tmp_path), records=records_block(tmp_path / "jobs"),
                           s3_credentials=f"tao-s3-credentials/{block}", return_state=True)
    assert state.is_failed() and "holds the value of a credential" in str(state.message)
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(state.state_details.flow_run_id)
    assert value not in run.name
