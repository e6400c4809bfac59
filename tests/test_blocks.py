"""The Prefect layer's blocks, without a Prefect server: credential blocks hold variable names
only and resolve them by the core's rules; targets build the core's backends; the records block
opens the core's store. (Saving, loading and registering them against an API: test_flows.py.)"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from blocks import (DockerTarget, HuggingFaceEnvCredentials, JobRecords, KubernetesTarget, LocalTarget,
                    NGCEnvCredentials, S3EnvCredentials)
from blocks.credentials import CredentialSet
from tao_data_io.errors import CredentialError, UsageError
from tao_data_io.backends.kubernetes.settings import KubernetesSettings
from tao_data_io.backends.local.backend import LocalBackend
from tao_data_io.backends.docker.settings import DockerSettings
from tao_data_io.backends.local.settings import LocalSettings

ALL_BLOCKS = [S3EnvCredentials, HuggingFaceEnvCredentials, NGCEnvCredentials, LocalTarget, KubernetesTarget,
              DockerTarget, JobRecords]
CREDENTIAL_BLOCKS = [S3EnvCredentials, HuggingFaceEnvCredentials, NGCEnvCredentials]


@pytest.mark.parametrize("block", ALL_BLOCKS)
def test_every_field_says_what_it_is_and_none_holds_a_secret(block: type) -> None:
    schema = block.model_json_schema()
    assert schema.get("secret_fields", []) == []
    for name, field in block.model_fields.items():
        assert field.title and field.description, name
        assert SecretStr not in (getattr(field.annotation, "__args__", ()) or (field.annotation,)), name
    assert block.get_block_type_slug().startswith("tao-") and block.get_description()


@pytest.mark.parametrize("block", CREDENTIAL_BLOCKS)
def test_credential_blocks_store_names_that_are_variable_names(block: type) -> None:
    field = next(iter(block.model_fields))
    with pytest.raises(ValidationError, match="is not a valid variable name"):
        block(**{field: "not a name"})
    dumped = block().model_dump()
    assert all(value is None or isinstance(value, bool) or isinstance(value, str) and value.isidentifier()
               for key, value in dumped.items() if key != "block_type_slug")


@pytest.mark.parametrize("block", CREDENTIAL_BLOCKS)
@pytest.mark.parametrize("name", ["PATH", "LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONPATH", "BASH_ENV"])
def test_a_credential_block_refuses_a_variable_that_controls_processes(block: type, name: str) -> None:
    """A credential block's names are put into the environment the job's tools run with: PATH or
    LD_PRELOAD there steers which programs run and what they load, not which key is used."""
    field = next(iter(block.model_fields))
    with pytest.raises(ValidationError, match=rf"{name}.*controls how programs run"):
        block(**{field: name})


def test_s3_defaults_are_the_aws_names_with_the_legacy_ones_behind_them() -> None:
    env = {"ACCESS_KEY": "legacy-id-1", "SECRET_KEY": "legacy-secret-1", "S3_ENDPOINT_URL": "http://127.0.0.1:9",
           "CLOUD_REGION": "eu-west-3"}
    resolved = S3EnvCredentials().credentials(env)
    assert (resolved.access_key_id, resolved.secret_access_key, resolved.endpoint_url, resolved.region,
            resolved.source) == ("legacy-id-1", "legacy-secret-1", "http://127.0.0.1:9", "eu-west-3", "legacy")
    both = {**env, "AWS_ACCESS_KEY_ID": "aws-id-1", "AWS_SECRET_ACCESS_KEY": "aws-secret-1"}
    assert S3EnvCredentials().credentials(both).access_key_id == "aws-id-1"  # the core's precedence


def test_s3_names_of_the_workers_own_are_mapped_in_memory_and_nothing_else_leaks_in() -> None:
    block = S3EnvCredentials(access_key_id_env="TEAM_S3_ID", secret_access_key_env="TEAM_S3_SECRET",
                             read_legacy_names=False)
    env = {"TEAM_S3_ID": "team-id-1", "TEAM_S3_SECRET": "team-secret-1",
           "AWS_ACCESS_KEY_ID": "someone-elses", "ACCESS_KEY": "legacy-elses", "PATH": "/usr/bin"}
    seen = block.environ(env)
    assert seen["AWS_ACCESS_KEY_ID"] == "team-id-1" and seen["AWS_SECRET_ACCESS_KEY"] == "team-secret-1"
    assert "ACCESS_KEY" not in seen and seen["PATH"] == "/usr/bin"
    assert env["AWS_ACCESS_KEY_ID"] == "someone-elses"  # the given environment is untouched
    with pytest.raises(CredentialError, match="AWS_SECRET_ACCESS_KEY"):
        block.credentials({"TEAM_S3_ID": "team-id-1"})


def test_an_s3_block_saved_with_a_field_per_legacy_name_loads_with_them_folded_and_loses_none() -> None:
    """Saved before the form was grouped: four ``*_legacy_env`` fields. TAO's own names (or none)
    fold into the switch; a legacy name changed to another cannot be kept by it, so loading
    refuses it, naming the field and the fix — the worker never silently reads another variable."""
    saved = {"access_key_id_env": "AWS_ACCESS_KEY_ID", "access_key_id_legacy_env": "ACCESS_KEY",
             "secret_access_key_legacy_env": "SECRET_KEY"}  # the other two absent: that form's defaults
    assert S3EnvCredentials.model_validate(saved).read_legacy_names is True
    none = {name: None for name in ("access_key_id_legacy_env", "secret_access_key_legacy_env",
                                    "endpoint_url_legacy_env", "region_legacy_env")}
    assert S3EnvCredentials.model_validate(none).read_legacy_names is False
    assert "access_key_id_legacy_env" not in S3EnvCredentials.model_validate(saved).model_dump()
    with pytest.raises(ValidationError, match="secret_access_key_legacy_env 'TEAM_OLD_SECRET'.*set the matching field"):
        S3EnvCredentials.model_validate({"secret_access_key_legacy_env": "TEAM_OLD_SECRET"})
    # One legacy name cleared, the others kept: the switch would read S3_ENDPOINT_URL again (another store).
    with pytest.raises(ValidationError, match="endpoint_url_legacy_env cleared but not the other legacy names"):
        S3EnvCredentials.model_validate({**saved, "endpoint_url_legacy_env": None})


@pytest.mark.parametrize("value", ["AKIAIOSFODNN7EXAMPLE", "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
                                   "hf_abcdefghijklmnopqrstuvwxyzABCDEFGH"])
def test_a_credential_pasted_into_a_name_field_is_refused_before_prefect_could_store_it(value: str) -> None:
    """Refused by the block on the worker, and by the form's schema before the UI saves it."""
    import jsonschema

    with pytest.raises(ValidationError, match="holds a credential's value .* not a variable name"):
        S3EnvCredentials(access_key_id_env=value)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"access_key_id_env": value}, S3EnvCredentials.model_json_schema())
    jsonschema.validate({"access_key_id_env": "TEAM_S3_ID"}, S3EnvCredentials.model_json_schema())


#: A made-up AWS secret key with no ``/`` or ``+`` (3 real ones in 10): a valid variable name by
#: its characters alone.
_SLASHLESS_SECRET = "Hx7qP2vL9mKc4Rt8Wn3Zb6" + "Yd1Fg5Js0Ua7Ve4Xo2Lq"


def test_a_slashless_secret_key_pasted_into_a_name_field_is_refused_and_long_names_are_kept() -> None:
    with pytest.raises(ValidationError, match="holds a credential's value .* not a variable name"):
        S3EnvCredentials(secret_access_key_env=_SLASHLESS_SECRET)
    for name in ("MY_TEAM_S3_SECRET_ACCESS_KEY_FOR_THE_TRAINING_CLUSTER", "MyCompanyS3SecretKey2024",
                 "AWSSECRETACCESSKEYFORTHETRAININGCLUSTER2", "awssecretaccesskeyforthetrainingcluster2"):
        assert S3EnvCredentials(secret_access_key_env=name).secret_access_key_env == name


def test_prefects_server_as_the_demo_starts_it_refuses_a_block_save_with_a_pasted_key() -> None:
    """deployments.server's check, before Prefect's server stores a block document (Prefect checks
    none against its schema, and its v2 UI's form checks nothing): a creation or an update whose
    name field holds a key is answered 422 naming the field, never the value, and never reaches
    Prefect; the form's validation call is answered with the field's error; any other request,
    and a save of names, reaches it with its body as it came."""
    import asyncio
    import json

    from deployments.server import RefusePastedCredentials

    reached: list[tuple[str, bytes]] = []

    async def prefect(scope: dict, receive: object, send: object) -> None:
        message = await receive()  # type: ignore[operator]
        reached.append((scope["path"], message["body"]))

    def call(method: str, path: str, body: dict) -> list[dict]:
        sent: list[dict] = []
        raw = json.dumps(body).encode()
        chunks = [{"type": "http.request", "body": raw[:10], "more_body": True},
                  {"type": "http.request", "body": raw[10:], "more_body": False}]

        async def receive() -> dict:
            return chunks.pop(0)

        async def send(message: dict) -> None:
            sent.append(message)

        asyncio.run(RefusePastedCredentials(prefect)({"type": "http", "method": method, "path": path}, receive, send))
        return sent

    block_id = "8405dafe-822e-4c8d-8227-3b5087253a3b"
    for method, path in (("POST", "/api/block_documents/"), ("PATCH", f"/api/block_documents/{block_id}")):
        answer = call(method, path, {"name": "pasted", "data": {"secret_access_key_env": "Hx7qP2vL9/mKc4Rt8+Wn3Zb6",
                                                               "access_key_id_env": "AWS_ACCESS_KEY_ID"}})
        assert answer[0]["status"] == 422
        detail = json.loads(answer[1]["body"])["detail"]
        assert "secret_access_key_env must be the NAME" in detail and "access_key_id_env" not in detail
        assert "Hx7q" not in detail
    assert reached == []
    named = {"name": "ok", "data": {"secret_access_key_env": "TEAM_SECRET"}}
    for method, path in (("POST", "/api/block_documents/"), ("PATCH", f"/api/block_documents/{block_id}"),
                         ("POST", "/api/block_documents/filter"), ("POST", "/api/flow_runs/")):
        call(method, path, named if "filter" not in path else {"data": {"key_env": "AKIA" + "Q2XM7TZ4W5R6N3PL"}})
    assert [path for path, _ in reached] == ["/api/block_documents/", f"/api/block_documents/{block_id}",
                                            "/api/block_documents/filter", "/api/flow_runs/"]
    assert json.loads(reached[0][1]) == named
    # The form's own check, before it saves (the v2 UI sends the values as the schema too): the
    # field is said invalid there, in the answer Prefect gives (``build_error_obj``).
    pasted = {"secret_access_key_env": "Hx7qP2vL9/mKc4Rt8+Wn3Zb6", "access_key_id_env": "AWS_ACCESS_KEY_ID"}
    answer = call("POST", "/api/ui/schemas/validate", {"schema": pasted, "values": pasted})
    assert answer[0]["status"] == 200 and len(reached) == 4
    said = json.loads(answer[1]["body"])
    assert said["valid"] is False and [error["property"] for error in said["errors"]] == ["secret_access_key_env"]
    assert said["errors"][0]["errors"][0].startswith("must be the NAME") and "Hx7q" not in answer[1]["body"].decode()
    call("POST", "/api/ui/schemas/validate", {"schema": {}, "values": {"secret_access_key_env": "TEAM_SECRET"}})
    assert [path for path, _ in reached][4:] == ["/api/ui/schemas/validate"]


def test_the_credential_blocks_give_clients_from_the_workers_variables(s3_env: dict[str, str]) -> None:
    """Prefect's CredentialsBlock interface: ``get_client``. S3 gives a boto3 client (as
    prefect-aws's ``AwsCredentials.get_client("s3")``); the registries give the core's client of
    one model; a client of another kind is refused naming the argument."""
    assert S3EnvCredentials().get_client("s3").list_buckets()["ResponseMetadata"]["HTTPStatusCode"] == 200
    with pytest.raises(UsageError, match="client_type 'ec2'.*S3 clients only"):
        S3EnvCredentials().get_client("ec2")
    with pytest.raises(UsageError, match="model 'ngc://nvidia/tao/m:1' is not in this block's registry: give a hf://"):
        HuggingFaceEnvCredentials().get_client("ngc://nvidia/tao/m:1")
    with pytest.raises(UsageError, match="give a ngc:// URI"):
        NGCEnvCredentials().get_client("hf://org/repo")


def test_a_credential_set_reads_every_value_from_the_environment_it_was_given() -> None:
    hf = HuggingFaceEnvCredentials(token_env="AWS_SECRET_ACCESS_KEY")  # odd, but it must not chain
    s3 = S3EnvCredentials(secret_access_key_env="MY_SECRET", read_legacy_names=False)
    env = {"AWS_SECRET_ACCESS_KEY": "original-1", "MY_SECRET": "mine-1", "NGC_TOKEN_VAR": "ngc-1"}
    seen = CredentialSet.of([s3, hf, NGCEnvCredentials(key_env="NGC_TOKEN_VAR"), None]).environ(env)
    assert (seen["AWS_SECRET_ACCESS_KEY"], seen["HF_TOKEN"], seen["NGC_KEY"]) == ("mine-1", "original-1", "ngc-1")


def test_prefect_aws_credentials_are_built_in_memory_from_the_core_credentials() -> None:
    env = {"AWS_ACCESS_KEY_ID": "id-1", "AWS_SECRET_ACCESS_KEY": "secret-1", "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}
    aws = S3EnvCredentials().aws_credentials(env)
    assert aws.aws_secret_access_key is not None and aws.aws_secret_access_key.get_secret_value() == "secret-1"
    assert aws.aws_client_parameters.endpoint_url == "http://127.0.0.1:9"
    assert "secret-1" not in repr(aws) and aws._block_document_id is None  # never saved


def test_the_local_target_builds_the_local_backend(tmp_path: Path) -> None:
    target = LocalTarget(settings=LocalSettings(run_root=str(tmp_path / "runs"), allow_network=True))
    backend = target.backend()
    assert isinstance(backend, LocalBackend)
    assert backend.run_root == tmp_path / "runs" and backend.settings.allow_network
    assert LocalTarget().backend().settings.allow_network is False  # off unless the operator turns it on
    for bad in ({"staging_root": "relative/dir"}, {"settings": {"run_root": "relative/dir"}}):
        with pytest.raises(ValidationError, match="is not absolute"):
            LocalTarget(**bad)


@pytest.mark.parametrize(("target", "model"), [(LocalTarget, LocalSettings), (KubernetesTarget, KubernetesSettings),
                                               (DockerTarget, DockerSettings)])
def test_a_target_embeds_its_backends_settings_model_and_adds_only_its_staging_root(target: type,
                                                                                    model: type) -> None:
    """The block declares no setting of its own backend: its fields are the staging root and the
    settings model, whose fields each say what they are in the UI form."""
    assert set(target.model_fields) == {"staging_root", "settings"}
    assert target.model_fields["settings"].annotation is model
    for name, field in model.model_fields.items():
        assert field.title and field.description, name
        assert SecretStr not in (getattr(field.annotation, "__args__", ()) or (field.annotation,)), name
    schema = target.model_json_schema()
    assert set(schema["definitions"][model.__name__]["properties"]) == set(model.model_fields)


def test_the_kubernetes_target_checks_its_settings_by_the_renderers_rules() -> None:
    for bad, match in [({"namespace": "Not_A_Label"}, "namespace 'Not_A_Label' is not a DNS label"),
                       ({"ttl_seconds": -1}, "ttl_seconds -1 must be 0 to"),
                       ({"shm_size": "16GB"}, "shm_size '16GB' is not a binary quantity")]:
        with pytest.raises(ValidationError, match=match):
            KubernetesTarget(settings=bad)


def test_the_kubernetes_target_builds_the_kubernetes_backend_from_its_settings() -> None:
    target = KubernetesTarget(settings=KubernetesSettings(namespace="tao", context="prod", pvc_claim="tao-data",
                                                          stager_image="registry/stager:1",
                                                          image_pull_secrets=["ngc-pull"]))
    backend = target.backend()
    assert backend.name == "kubernetes" and not backend.capabilities.stages_on_host
    assert backend.config() == target.settings.model_dump(mode="json")


def test_the_kubernetes_target_names_the_extra_on_a_worker_without_the_kubernetes_client(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "kubernetes", None)  # the client is not installed on this worker
    # Imported afresh, without it:
    for module in ("tao_data_io.backends.kubernetes.backend", "tao_data_io.backends.kubernetes.api"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    with pytest.raises(UsageError, match=r"the kubernetes backend needs .kubernetes., which this host lacks: "
                                         r"install tao-data-io\[kubernetes\]"):
        KubernetesTarget(settings=KubernetesSettings(namespace="tao")).backend()


def test_the_records_block_opens_a_directory_or_a_bucket(tmp_path: Path) -> None:
    assert JobRecords(location=str(tmp_path / "jobs")).store().location == str(tmp_path / "jobs")
    assert JobRecords(location="~/jobs").store().location == str(Path("~/jobs").expanduser())
    assert JobRecords(location="s3://bkt1/jobs/").location == "s3://bkt1/jobs/"
    for bad in ("relative/jobs", "s3://Bad_Bucket/jobs/"):
        with pytest.raises(ValidationError):
            JobRecords(location=bad)
