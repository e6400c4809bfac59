"""The flows' typed parameters, on the Prefect server: the deployment's schema is the request's
form (every field described, the blocks as pickers), and what it refuses is refused when a run
is *created* — a misspelt field, a wrong type, a well-known credential's shape anywhere in the
request — so it never reaches a worker and is never stored as a run's parameters. A reference to
a saved block passes the server's check (Prefect's ``oneOf`` of a block and a reference) and is
loaded by the flow. On the worker, a parameter holding one of its credential values fails the run
with the run's stored parameters replaced by a masked copy."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from prefect.blocks.core import Block
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
from prefect.exceptions import PrefectHTTPStatusError
from pydantic import Field

from blocks import JobRecords, LocalTarget, S3EnvCredentials
from flows.common import load_block
from flows.run import run_tao_job
from flows.submit import submit_tao_job
from tao_data_io.errors import UsageError

from .flow_helpers import local_target, name, records_block
from .helpers import args_request

#: Shapes of real credentials (made up, of the right form), as a user might paste them.
ACCESS_KEY = "AKIA" + "Q2XM7TZ4W5R6N3PL"
HF_TOKEN = "hf_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7"
NGC_KEY = "nvapi-" + "Zx9Yw8Vu7Ts6Rq5Po4Nm3Lk2Ji1Hg0FeDcBa98765"
USERINFO = "https://someone:hunter22@registry.example.com/v2/"


@pytest.fixture(scope="module")
def submit_deployment(prefect_harness: None) -> UUID:
    """submit-tao-job as a deployment (no worker: what matters is what the server accepts)."""
    return submit_tao_job.to_deployment(name=f"forms-{name()}").apply()


def _create(deployment_id: UUID, **parameters: Any) -> UUID:
    with get_client(sync_client=True) as client:
        return client.create_flow_run_from_deployment(deployment_id, parameters=parameters).id


def _refused(deployment_id: UUID, **parameters: Any) -> str:
    """The server's refusal of a run with ``parameters``, after checking it created no run."""
    with get_client(sync_client=True) as client:
        before = len(client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id]))))
        with pytest.raises(PrefectHTTPStatusError) as refused:
            client.create_flow_run_from_deployment(deployment_id, parameters=parameters)
        after = len(client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id]))))
    assert refused.value.response.status_code == 409 and after == before
    return refused.value.response.json()["detail"]


def _described(schema: dict[str, Any], definitions: dict[str, Any], seen: set[str]) -> list[str]:
    """The properties of ``schema`` and of every model it refers to that have no description."""
    missing = []
    for field, prop in schema.get("properties", {}).items():
        if not prop.get("description"):
            missing.append(f"{schema.get('title')}.{field}")
        refs = [prop.get("$ref"), *(branch.get("$ref") for branch in prop.get("anyOf", [])),
                prop.get("items", {}).get("$ref")]
        for ref in filter(None, refs):
            model = ref.rsplit("/", 1)[-1]
            if model not in seen and model in definitions:
                seen.add(model)
                missing += _described(definitions[model], definitions, seen)
    return missing


def test_the_submit_form_is_the_request_model_with_every_field_described_and_blocks_as_pickers(
        submit_deployment: UUID) -> None:
    with get_client(sync_client=True) as client:
        schema = client.read_deployment(submit_deployment).parameter_openapi_schema
    definitions = schema["definitions"]
    request = schema["properties"]["request"]
    assert {"$ref": "#/definitions/JobRequest"} in request["anyOf"]
    assert _described(definitions["JobRequest"], definitions, set()) == []
    pickers = {field: {branch["$ref"].rsplit("/", 1)[-1] for branch in schema["properties"][field]["anyOf"]
                       if "$ref" in branch}
               for field in ("target", "records", "s3_credentials", "hf_credentials", "ngc_credentials")}
    assert pickers == {"target": {"LocalTarget", "KubernetesTarget"}, "records": {"JobRecords"},
                       "s3_credentials": {"S3EnvCredentials"}, "hf_credentials": {"HuggingFaceEnvCredentials"},
                       "ngc_credentials": {"NGCEnvCredentials"}}
    assert all(definitions[block].get("block_type_slug") for found in pickers.values() for block in found)


@pytest.mark.parametrize(("mistake", "field"), [
    ({"imgae": "tao:6"}, "imgae"),  # a misspelt field: the model is closed
    ({"compute_shape": {"gpus": "eight"}}, "compute_shape"),  # a wrong type
    ({"mode": "train"}, "mode"),  # a word the field does not take
])
def test_a_bad_request_is_refused_when_the_run_is_created(submit_deployment: UUID, mistake: dict[str, Any],
                                                           field: str) -> None:
    assert field in _refused(submit_deployment, request=args_request(**mistake))


def test_a_request_missing_a_required_field_is_refused_when_the_run_is_created(submit_deployment: UUID) -> None:
    request = args_request()
    del request["image"]
    assert "image" in _refused(submit_deployment, request=request)


@pytest.mark.parametrize("credential", [ACCESS_KEY, HF_TOKEN, NGC_KEY, USERINFO], ids=["aws", "hf", "ngc", "url"])
@pytest.mark.parametrize("where", ["spec", "inputs", "environment", "args", "request_path"])
def test_a_well_known_credential_shape_anywhere_is_refused_when_the_run_is_created(
        submit_deployment: UUID, credential: str, where: str) -> None:
    """Whoever's credential it is: the server refuses it before any worker, and stores no run."""
    if where == "spec":
        parameters = {"request": args_request(mode="config", args=None, command="t -e {config_path}",
                                              config_format="yaml",
                                              spec={"train": {"notes": ["ok", {"deep": f"key {credential} here"}]}})}
    elif where == "inputs":
        parameters = {"request": args_request(inputs=[{"source": f"s3://b/{credential}/"}])}
    elif where == "environment":
        parameters = {"request": args_request(environment={"REGISTRY": credential})}
    elif where == "args":
        parameters = {"request": args_request(args=["--token", credential])}
    else:
        parameters = {"request_path": f"examples/{credential}.yaml"}
    _refused(submit_deployment, **parameters)


def test_a_request_without_a_credential_shape_is_accepted_by_the_server(submit_deployment: UUID) -> None:
    """The guard is not a blanket refusal: look-alikes that are not credentials pass (a short
    AKIA word, an hf:// URI, a URL without a password, a 40-hex digest)."""
    request = args_request(args=["--note", "AKIA-short", "--model", "hf://org/repo", "--sha", "a" * 40],
                           environment={"MIRROR": "https://user@mirror.example.com/"})
    assert _create(submit_deployment, request=request)


def test_a_reference_to_a_saved_block_passes_the_server_and_the_flow_loads_it(
        submit_deployment: UUID, tmp_path: Path) -> None:
    """What the run form's picker sends: ``{"$ref": {"block_document_id": …}}``, for every block
    parameter — accepted when the run is created, and loaded by the flow as the saved block."""
    target = Block.load(local_target(tmp_path))
    records = Block.load(records_block(tmp_path / "jobs"))
    credentials = S3EnvCredentials()
    credentials.save(name())
    refs = {key: {"$ref": {"block_document_id": str(block._block_document_id)}}
            for key, block in (("target", target), ("records", records), ("s3_credentials", credentials))}
    assert _create(submit_deployment, request=args_request(), **refs)
    assert load_block(refs["target"], LocalTarget, "target").settings == target.settings
    assert load_block(refs["records"], JobRecords, "records").location == records.location
    with pytest.raises(UsageError, match="records the block the form picked is a JobRecords, not a LocalTarget"):
        load_block(refs["records"], LocalTarget, "records")


class OpenBlock(Block):
    """A block whose fields are all optional and whose schema admits unknown fields: Prefect's own
    default, without :data:`blocks.picker.PICKABLE`."""

    _block_type_slug = "tao-test-open-block"
    note: str | None = Field(None, description="anything")


def test_a_block_schema_open_to_unknown_fields_makes_the_server_refuse_every_reference_to_it(
        prefect_harness: None) -> None:
    """Why the blocks close their schema: the server checks a reference against oneOf [the block,
    a reference], and an open, all-optional block matches both (Prefect issue #14393)."""
    from prefect import flow

    @flow(name=f"open-block-{name()}", validate_parameters=False)
    def takes(block: OpenBlock | None = None) -> None:
        del block

    OpenBlock().save(saved := name())
    ref = {"$ref": {"block_document_id": str(OpenBlock.load(saved)._block_document_id)}}
    detail = _refused(takes.to_deployment(name="open").apply(), block=ref)
    assert "valid under each of" in detail


def test_a_parameter_holding_a_worker_credential_value_fails_and_the_stored_parameters_are_masked(
        prefect_harness: None, no_cloud: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A value of no well-known shape that the worker holds (its MY_TEAM_TOKEN) reaches the
    worker; the run fails naming the field, and the parameters the server keeps hold it masked."""
    secret = "team-secret-9f8e7d6c5b4a"
    monkeypatch.setenv("MY_TEAM_TOKEN", secret)
    state = submit_tao_job(args_request(environment={"NOTE": secret}), target=local_target(tmp_path),
                           records=records_block(tmp_path / "jobs"), return_state=True)
    assert state.is_failed() and "request.environment.NOTE" in str(state.message)
    with get_client(sync_client=True) as client:
        stored = client.read_flow_run(state.state_details.flow_run_id)
    assert secret not in repr(stored.parameters) and secret not in str(stored.state.message)
    assert "***MY_TEAM_TOKEN***" in repr(stored.parameters)


@pytest.mark.parametrize(("flow_name", "parameters"), [
    ("collect", {"job_id": ACCESS_KEY}), ("cancel", {"job_id": "j", "reason": f"rotated {HF_TOKEN}"}),
    ("submit", {"target": f"tao-local-target/{NGC_KEY}"}),
    ("submit", {"request": args_request(environment={ACCESS_KEY: "1"})}),  # a mapping's key
])
def test_a_credential_shape_in_any_parameter_is_refused_when_the_run_is_created(
        prefect_harness: None, flow_name: str, parameters: dict[str, Any]) -> None:
    from flows.cancel import cancel_tao_job
    from flows.collect import collect_tao_job

    flows = {"collect": collect_tao_job, "cancel": cancel_tao_job, "submit": submit_tao_job}
    _refused(flows[flow_name].to_deployment(name=f"shapes-{name()}").apply(), **parameters)


@pytest.mark.parametrize("text", ["KEY_" + ACCESS_KEY, "é" + ACCESS_KEY, f"token={HF_TOKEN}ä"])
def test_a_credential_shape_next_to_any_character_but_a_letter_or_digit_is_found_by_both_engines(text: str) -> None:
    """Python's ``\b`` knows Unicode letters and JavaScript's does not: the shapes' edges are
    ASCII lookarounds, so the loader refuses what the server and the UI refuse."""
    import re

    from tao_data_io.credentials import CREDENTIAL_SHAPES, credential_shape_fields

    assert credential_shape_fields({"note": text}) == ["note"]
    assert re.search(CREDENTIAL_SHAPES, ACCESS_KEY + "X") is None  # a longer word is not a key


def test_a_job_id_holding_a_worker_credential_never_names_the_collect_run(
        prefect_harness: None, no_cloud: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Prefect names a run before its first line; a job id that is not a valid id, or is one of
    the worker's credential values, is not shown in the name, and the stored parameters are masked."""
    from flows.collect import collect_tao_job

    secret = "abcdef-0123456789-team"  # a valid job id, and the worker's credential
    monkeypatch.setenv("MY_TEAM_TOKEN", secret)
    state = collect_tao_job(secret, target=local_target(tmp_path), records=records_block(tmp_path / "jobs"),
                            return_state=True)
    assert state.is_failed()
    with get_client(sync_client=True) as client:
        stored = client.read_flow_run(state.state_details.flow_run_id)
    assert secret not in stored.name and secret not in repr(stored.parameters)
    assert secret not in str(stored.state.message)


def test_a_block_parameter_holding_a_worker_credential_is_masked_before_any_block_is_loaded(
        prefect_harness: None, no_cloud: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "team-secret-9f8e7d6c5b4a"
    monkeypatch.setenv("MY_TEAM_TOKEN", secret)
    state = submit_tao_job(args_request(), target=local_target(tmp_path), records=records_block(tmp_path / "jobs"),
                           s3_credentials=f"tao-s3-credentials/{secret}", return_state=True)
    assert state.is_failed() and "s3_credentials" in str(state.message)
    with get_client(sync_client=True) as client:
        stored = client.read_flow_run(state.state_details.flow_run_id)
    assert secret not in repr(stored.parameters) and secret not in str(stored.state.message)


def test_a_request_given_both_ways_or_as_text_names_the_parameter_to_use(
        prefect_harness: None, no_cloud: None, tmp_path: Path) -> None:
    target, records = local_target(tmp_path), records_block(tmp_path / "jobs")
    both = submit_tao_job(args_request(), request_path="examples/args-mode.yaml", target=target, records=records,
                          return_state=True)
    assert both.is_failed() and "one of the two" in str(both.message)
    text = run_tao_job("examples/args-mode.yaml", target=target, records=records, return_state=True)
    assert text.is_failed() and "request_path" in str(text.message)
