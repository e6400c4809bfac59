"""The flows' typed parameters, on the Prefect server: the deployment's schema is the request's
form (every field described, the blocks as pickers), and what it refuses is refused when a run
is *created* — a parameter the flow does not take, a misspelt field, a wrong type, a well-known
credential's shape anywhere in the request, keys included, a reference that is not a block's —
so it never reaches a worker and is never stored as a run's parameters. A reference to a saved
block passes the server's check (Prefect's ``oneOf`` of a block and a reference) and is loaded by
the flow. On the worker, a parameter holding one of its credential values fails the run with the
run's stored parameters replaced by a masked copy; so are those of a run that crashed before its
first line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from prefect.blocks.core import Block
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId, LogFilter, LogFilterFlowRunId
from prefect.exceptions import PrefectHTTPStatusError
from prefect.settings import PREFECT_API_URL
from pydantic import Field

from blocks import JobRecords, LocalTarget, S3EnvCredentials
from deployments.schemas import close_parameter_schemas
from flows.common import load_block
from flows.run import run_tao_job
from flows.submit import submit_tao_job
from tao_data_io.errors import UsageError
from tao_data_io.records import RecordStore

from .flow_helpers import REPO, deployed, fake_target, local_target, name, records_block
from .helpers import args_request, wait_for

#: Shapes of real credentials (made up, of the right form), as a user might paste them.
ACCESS_KEY = "AKIA" + "Q2XM7TZ4W5R6N3PL"
HF_TOKEN = "hf_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7"
NGC_KEY = "nvapi-" + "Zx9Yw8Vu7Ts6Rq5Po4Nm3Lk2Ji1Hg0FeDcBa98765"
USERINFO = "https://someone:hunter22@registry.example.com/v2/"
#: A value of the worker's own credential variable, of no well-known shape.
WORKER_SECRET = "team-secret-3c4d5e6f7a8b"


@pytest.fixture(scope="module")
def submit_deployment(prefect_harness: None) -> UUID:
    """submit-tao-job as a deployment (no worker: what matters is what the server accepts)."""
    return deployed(submit_tao_job)


def _create(deployment_id: UUID, **parameters: Any) -> UUID:
    with get_client(sync_client=True) as client:
        return client.create_flow_run_from_deployment(deployment_id, parameters=parameters).id


def _refused(deployment_id: UUID, **parameters: Any) -> str:
    """The server's refusal of a run with ``parameters``, after checking it created no run."""
    with get_client(sync_client=True) as client:
        runs = DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id]))
        before = len(client.read_flow_runs(deployment_filter=runs))
        with pytest.raises(PrefectHTTPStatusError) as refused:
            client.create_flow_run_from_deployment(deployment_id, parameters=parameters)
        after = len(client.read_flow_runs(deployment_filter=runs))
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
    assert pickers == {"target": {"LocalTarget", "KubernetesTarget", "DockerTarget", "SLURMTarget"},
                       "records": {"JobRecords"}, "s3_credentials": {"S3EnvCredentials"},
                       "hf_credentials": {"HuggingFaceEnvCredentials"}, "ngc_credentials": {"NGCEnvCredentials"}}
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
    """The refusal names the field, not the whole request dumped (what the server says when it
    cannot tell which branch of the parameter's ``anyOf`` was meant)."""
    request = args_request()
    del request["image"]
    refused = _refused(submit_deployment, request=request)
    assert "'image' is a required property" in refused and "not valid under any of" not in refused


def _form_request(schema: dict[str, Any], **typed: Any) -> dict[str, Any]:
    """What the run form sends as ``request`` from its JobRequest tab: each field the published
    schema gives a ``default`` filled with it — the form fills a property from its default and
    never from its ``const``, which it only shows as "cannot be changed" — then what was typed."""
    fields = schema["definitions"]["JobRequest"]["properties"]
    return {**{field: prop["default"] for field, prop in fields.items() if "default" in prop}, **typed}


@pytest.mark.parametrize("sent", ["form", "json"])
def test_the_request_a_user_fills_in_the_run_form_creates_a_run_that_completes(
        submit_deployment: UUID, no_cloud: None, tmp_path: Path, sent: str) -> None:
    """Issue 40, item 1: a user fills image, command and mode (args mode: its args too) in the
    request's JobRequest tab and leaves schema_version, shown as a const, alone — the form, or a
    user writing the request as JSON without it. The server creates the run, and the flow reads
    the request as version "1" and completes: the form submits a request, not only JSON mode
    with ``"schema_version": "1"`` or ``request_path``."""
    from prefect.flow_engine import load_flow_run, run_flow

    typed = {"image": "local", "command": "true", "mode": "args", "args": []}
    with get_client(sync_client=True) as client:
        schema = client.read_deployment(submit_deployment).parameter_openapi_schema
    request = _form_request(schema, **typed) if sent == "form" else typed
    run_id = _create(submit_deployment, request=request, target=fake_target(tmp_path),
                     records=records_block(tmp_path / "jobs"))
    state = run_flow(submit_tao_job, flow_run=load_flow_run(run_id), return_type="state")
    assert state.is_completed(), state.message
    job = RecordStore(tmp_path / "jobs").get(state.result()["job_id"])
    assert job.state == "RUNNING" and job.image == "local"


@pytest.mark.parametrize("credential", [ACCESS_KEY, HF_TOKEN, NGC_KEY, USERINFO], ids=["aws", "hf", "ngc", "url"])
@pytest.mark.parametrize("where", ["spec", "spec key", "spec list key", "inputs", "environment", "args",
                                   "request_path"])
def test_a_well_known_credential_shape_anywhere_is_refused_when_the_run_is_created(
        submit_deployment: UUID, credential: str, where: str) -> None:
    """Whoever's credential it is: the server refuses it before any worker, and stores no run."""
    if where == "spec":
        parameters = {"request": args_request(mode="config", args=None, command="t -e {config_path}",
                                              config_format="yaml",
                                              spec={"train": {"notes": ["ok", {"deep": f"key {credential} here"}]}})}
    elif where in ("spec key", "spec list key"):  # a key of a mapping deep in the spec, or in a list of it
        deep = {"train": {credential: 1}} if where == "spec key" else {"train": {"notes": [{credential: "x"}]}}
        parameters = {"request": args_request(mode="config", args=None, command="t -e {config_path}",
                                              config_format="yaml", spec=deep)}
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
    _refused(deployed(flows[flow_name]), **parameters)


@pytest.mark.parametrize("flow_name", ["submit", "run", "collect", "cancel", "resync"])
def test_a_parameter_the_flow_does_not_take_is_refused_when_the_run_is_created(prefect_harness: None,
                                                                                flow_name: str) -> None:
    """A run the flow could not even start (its worker would crash binding the parameters, before
    any mask) is never created: the server names the parameter, never its value."""
    from flows.cancel import cancel_tao_job
    from flows.collect import collect_tao_job
    from flows.resync import resync_tao_outputs

    flows = {"submit": submit_tao_job, "run": run_tao_job, "collect": collect_tao_job, "cancel": cancel_tao_job,
             "resync": resync_tao_outputs}
    required = {"job_id": "j"} if flow_name in ("collect", "cancel") else {}  # refused for what it sends, only
    detail = _refused(deployed(flows[flow_name]), **required, aws_key=ACCESS_KEY)
    assert "aws_key" in detail and ACCESS_KEY not in detail


def test_the_deploy_step_closes_this_projects_deployments_only_and_again_changes_nothing(
        prefect_harness: None) -> None:
    """``python -m deployments.schemas`` after ``prefect deploy``: the deployment Prefect wrote
    open is closed; another flow's deployment on the same server is left as it was."""
    from prefect import flow

    @flow(name=f"foreign-{name()}")
    def foreign(note: str = "") -> None:
        del note

    ours = submit_tao_job.to_deployment(name=f"open-{name()}").apply()  # as `prefect deploy` writes it
    theirs = foreign.to_deployment(name="open").apply()
    assert _create(ours, request=args_request(), aws_key="x")  # open: what the step is for
    said = close_parameter_schemas()
    with get_client(sync_client=True) as client:
        assert client.read_deployment(theirs).parameter_openapi_schema.get("additionalProperties") is None
        shown = f"submit-tao-job/{client.read_deployment(ours).name}"
    assert any(line.startswith(f"{shown}: closed;") or line == f"{shown}: closed" for line in said)
    assert "aws_key" in _refused(ours, request=args_request(), aws_key="x")
    assert close_parameter_schemas([ours])[0].startswith(f"{shown}: closed already")


def test_the_deploy_step_points_block_parameters_at_saved_blocks_so_the_form_opens_on_the_picker(
        prefect_harness: None, tmp_path: Path) -> None:
    """Prefect's run form draws a block parameter as the block's picker only when its value is a
    reference by id (``{"$ref": {"block_document_id": …}}``, what the picker sends); the
    ``TYPE/NAME`` text a deployment file can hold opens the text tab instead, and choosing the
    picker then lost the default. After the step the defaults are references to the same saved
    blocks, a block that is not saved is left as text and said, and the flow loads what it names."""
    target, records = local_target(tmp_path), records_block(tmp_path / "records")
    unsaved = f"tao-s3-credentials/unsaved-{name()}"
    ours = submit_tao_job.to_deployment(name=f"texts-{name()}", parameters={
        "target": target, "records": records, "s3_credentials": unsaved}).apply()
    said = " ".join(close_parameter_schemas([ours]))
    with get_client(sync_client=True) as client:
        parameters = client.read_deployment(ours).parameters
        ids = {text: str(client.read_block_document_by_name(text.split("/")[1], text.split("/")[0]).id)
               for text in (target, records)}
    assert parameters["target"] == {"$ref": {"block_document_id": ids[target]}}
    assert parameters["records"] == {"$ref": {"block_document_id": ids[records]}}
    assert parameters["s3_credentials"] == unsaved and f"s3_credentials: {unsaved} is not saved" in said
    picked = load_block(parameters["target"], LocalTarget, "target")
    assert picked.staging_root == Block.load(target).staging_root
    assert "picked" not in " ".join(close_parameter_schemas([ours]))  # again: nothing left to pick


@pytest.mark.parametrize("reference", [
    {"block_document_id": ACCESS_KEY}, ACCESS_KEY, {"note": ACCESS_KEY},
    {"block_document_slug": f"tao-local-target/{ACCESS_KEY}"}, {"block_document_id": "not-an-id"},
], ids=["id", "bare", "other-key", "slug", "not-an-id"])
@pytest.mark.parametrize("where", ["target", "records.bucket"])
def test_a_block_reference_that_is_not_a_block_document_id_is_refused_when_the_run_is_created(
        submit_deployment: UUID, reference: Any, where: str) -> None:
    """A reference is a saved block's id (what the form's picker sends) or its ``TYPE/NAME``; any
    other text in it — a parameter's or a nested block's — is refused like any other text."""
    ref = {"$ref": reference}
    parameters = {"target": ref} if where == "target" else {"records": {"bucket": ref}}
    assert where.split(".")[0] in _refused(submit_deployment, request=args_request(), **parameters)


@pytest.fixture
def served_submit(prefect_harness: None, tmp_path: Path) -> Any:
    """submit-tao-job served by a runner in a process of its own, as a worker runs deployments —
    with a credential of the worker's own (``MY_TEAM_TOKEN``) in its environment."""
    environ = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value()), "PREFECT_RUNNER_POLL_FREQUENCY": "1",
               "PYTHONPATH": str(REPO), "MY_TEAM_TOKEN": WORKER_SECRET}
    served = f"crash-{name()}"
    code = ("from flows.submit import submit_tao_job; "
            f"submit_tao_job.serve(name={served!r}, print_starting_message=False)")
    runner = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=environ, start_new_session=True,
                              stdout=(tmp_path / "runner.log").open("w"), stderr=subprocess.STDOUT)
    yield f"submit-tao-job/{served}"
    if runner.poll() is None:
        os.killpg(runner.pid, signal.SIGTERM)
        runner.wait(30)


def test_a_run_that_crashes_before_its_body_leaves_no_credential_in_what_the_server_keeps(
        served_submit: str) -> None:
    """A run created past the schema (``enforce_parameter_schema: false``, which the API lets any
    caller ask for, or a deployment made before its schema was closed) with a parameter the flow
    does not take crashes before the flow's first line, where nothing of ours masks. Its
    ``on_crashed`` hook, which the worker runs, replaces the stored parameters with a masked copy:
    the run, its logs and its events hold neither a key's shape nor the worker's value."""

    def deployment() -> Any:
        with get_client(sync_client=True) as client:
            try:
                return client.read_deployment_by_name(served_submit)
            except Exception:  # noqa: BLE001 - not served yet
                return None

    deployment_id = wait_for("the served deployment", deployment).id
    with get_client(sync_client=True) as client:
        created = client.request("POST", "/deployments/{id}/create_flow_run", path_params={"id": deployment_id},
                                 json={"parameters": {"request_path": "examples/args-mode.yaml", "aws_key": ACCESS_KEY,
                                                      "team_note": WORKER_SECRET},
                                       "enforce_parameter_schema": False})
    run_id = UUID(created.json()["id"])

    def read() -> Any:
        with get_client(sync_client=True) as client:
            return client.read_flow_run(run_id)

    wait_for("the run to crash", lambda: read().state.is_crashed() or None, deadline_s=90)
    stored = wait_for("the crashed run's parameters masked", lambda: (
        run if ACCESS_KEY not in repr((run := read()).parameters) else None), deadline_s=30)
    assert stored.parameters == {"request_path": "examples/args-mode.yaml", "aws_key": "***CREDENTIAL***",
                                 "team_note": "***MY_TEAM_TOKEN***"}
    shown = f"{stored.name} {stored.state.message}"
    assert ACCESS_KEY not in shown and WORKER_SECRET not in shown

    def events() -> list[dict[str, Any]] | None:  # the server stores events a moment after they happen
        with get_client(sync_client=True) as client:
            found = client.request("POST", "/events/filter", json={
                "filter": {"any_resource": {"id": [f"prefect.flow-run.{run_id}"]}}, "limit": 50}).json()["events"]
        return found if any(event["event"] == "prefect.flow-run.Crashed" for event in found) else None

    kept_events = wait_for("the run's Crashed event", events)
    with get_client(sync_client=True) as client:
        logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])))
    kept = json.dumps([log.message for log in logs]) + json.dumps(kept_events)
    assert ACCESS_KEY not in kept and WORKER_SECRET not in kept


@pytest.mark.parametrize("text", ["KEY_" + ACCESS_KEY, "é" + ACCESS_KEY, f"token={HF_TOKEN}ä"])
def test_a_credential_shape_next_to_any_character_but_a_letter_or_digit_is_found_by_both_engines(text: str) -> None:
    """Python's ``\b`` knows Unicode letters and JavaScript's does not: the shapes' edges are
    ASCII lookarounds, so the loader refuses what the server and the UI refuse."""
    import re

    from tao_data_io.redaction import CREDENTIAL_SHAPES, credential_shape_fields

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


#: An AWS secret access key: 40 characters of no shape a pattern could tell from any other text.
SECRET_ACCESS_KEY = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


@pytest.mark.parametrize("name", ["AWS_SECRET_ACCESS_KEY", "MY_TEAM_TOKEN", "db_password", "NGC_API_KEY"])
def test_a_value_under_a_credentials_name_in_environment_is_refused_when_the_run_is_created(
        submit_deployment: UUID, name: str) -> None:
    """A credential's value has no shape to know it by, but its name has: a request's
    ``environment`` may not hold a variable a credential's name calls (forward_env names it
    instead), so the server refuses the run before it stores its parameters, as the worker would."""
    refused = _refused(submit_deployment, request=args_request(environment={name: SECRET_ACCESS_KEY}))
    assert name in refused
    assert _create(submit_deployment, request=args_request(environment={"EPOCHS": "3", "BATCH_SIZE": "8"}))


def test_a_value_pasted_into_a_credential_blocks_name_field_is_refused_by_the_form(prefect_harness: None) -> None:
    """The block's form checks each field against the block's schema on the server before it
    saves (``/ui/schemas/validate``, what the UI calls): a field that holds a variable's NAME
    takes only a name, so a key pasted there — of any shape — is refused before it is stored."""
    import httpx

    schema = S3EnvCredentials.model_json_schema()

    def errors(**fields: str) -> list[Any]:
        reply = httpx.post(f"{PREFECT_API_URL.value()}/ui/schemas/validate",
                           json={"schema": schema, "values": fields}, timeout=30)
        reply.raise_for_status()
        return reply.json()["errors"]

    assert errors(secret_access_key_env="MY_TEAM_S3_SECRET", region_env="AWS_REGION") == []
    refused = errors(secret_access_key_env=SECRET_ACCESS_KEY)
    assert [error["property"] for error in refused] == ["secret_access_key_env"], refused
