"""Credentials come from the environment only; legacy names are mapped in memory; values never leak."""

from __future__ import annotations

import logging
import os

import pytest

from tao_data_io.credentials import s3_credentials_from_env
from tao_data_io.redaction import RedactingFilter, Redactor
from tao_data_io.errors import CredentialError, UsageError


def test_aws_names_win_over_legacy() -> None:
    env = {"AWS_ACCESS_KEY_ID": "AKIAOFFICIAL", "AWS_SECRET_ACCESS_KEY": "official-secret",
           "ACCESS_KEY": "legacy-id", "SECRET_KEY": "legacy-secret", "AWS_ENDPOINT_URL": "http://x:1"}
    creds = s3_credentials_from_env(env)
    assert (creds.access_key_id, creds.secret_access_key, creds.source) == ("AKIAOFFICIAL", "official-secret", "aws")
    assert creds.endpoint_url == "http://x:1"


def test_legacy_names_are_mapped_in_memory_and_environ_is_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("ACCESS_KEY", "legacy-key-id")
    monkeypatch.setenv("SECRET_KEY", "legacy-secret-value")
    monkeypatch.setenv("S3_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("CLOUD_REGION", "eu-west-3")
    before = dict(os.environ)

    creds = s3_credentials_from_env()

    assert dict(os.environ) == before
    assert creds.source == "legacy"
    kwargs = creds.boto3_kwargs()
    assert kwargs["aws_access_key_id"] == "legacy-key-id"
    assert kwargs["aws_secret_access_key"] == "legacy-secret-value"
    assert kwargs["endpoint_url"] == "http://127.0.0.1:9"
    assert kwargs["region_name"] == "eu-west-3"
    child = creds.child_env({"PATH": "/bin", "UNRELATED_TOKEN": "do-not-forward"})
    assert child["AWS_SECRET_ACCESS_KEY"] == "legacy-secret-value"
    assert "UNRELATED_TOKEN" not in child


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({}, ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "ACCESS_KEY", "SECRET_KEY"]),
        ({"AWS_ACCESS_KEY_ID": "id-only-value"}, ["AWS_SECRET_ACCESS_KEY", "SECRET_KEY"]),
        ({"SECRET_KEY": "secret-only-value"}, ["AWS_ACCESS_KEY_ID", "ACCESS_KEY"]),
    ],
)
def test_missing_credential_message_names_the_variable(env: dict[str, str], named: list[str]) -> None:
    with pytest.raises(CredentialError) as info:
        s3_credentials_from_env(env)
    for name in named:
        assert name in str(info.value)
    for value in env.values():
        assert value not in str(info.value)


@pytest.mark.parametrize(("value", "attempts"), [(None, None), ("", None), ("1", 1), ("3", 3), ("100", 100)])
def test_aws_max_attempts_bounds_every_client(value: str | None, attempts: int | None) -> None:
    from tao_data_io.transfer.client import MAX_ATTEMPTS, make_s3_client
    from tao_data_io.transfer.obstore_executor import _retry
    from tao_data_io.transfer.s5cmd_executor import RETRY_COUNT, S5cmdExecutor

    env = {"AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "secret", "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
           **({"AWS_MAX_ATTEMPTS": value} if value is not None else {})}
    creds = s3_credentials_from_env(env)
    assert creds.max_attempts == attempts
    assert make_s3_client(creds).meta.config.retries["total_max_attempts"] == (attempts or MAX_ATTEMPTS + 1)
    assert _retry(creds)["max_retries"] == (attempts - 1 if attempts else 10)
    argv = S5cmdExecutor(creds).argv()
    assert argv[argv.index("--retry-count") + 1] == str(attempts - 1 if attempts else RETRY_COUNT)


@pytest.mark.parametrize("value", ["0", "-1", "two", "101", "1.5"])
def test_a_bad_aws_max_attempts_names_the_variable(value: str) -> None:
    with pytest.raises(UsageError, match=f"AWS_MAX_ATTEMPTS '{value}' is not a number of attempts"):
        s3_credentials_from_env({"AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "secret",
                                 "AWS_MAX_ATTEMPTS": value})


def test_repr_never_shows_secret_values() -> None:
    creds = s3_credentials_from_env({"AWS_ACCESS_KEY_ID": "AKIAREPRTEST", "AWS_SECRET_ACCESS_KEY": "s3cr3t-value"})
    assert "s3cr3t-value" not in repr(creds) and "AKIAREPRTEST" not in repr(creds)


def test_redactor_masks_every_credential_value_and_names_it() -> None:
    env = {"AWS_SECRET_ACCESS_KEY": "abcdef123456", "HF_TOKEN": "hf_abcdefgh", "MY_DB_PASSWORD": "hunter2hunter",
           "PATH": "/usr/bin:/bin", "SHORT_TOKEN": "x1"}
    redact = Redactor(env)
    text = "key=abcdef123456 hf=hf_abcdefgh db=hunter2hunter path=/usr/bin:/bin x1"
    out = redact(text)
    assert "abcdef123456" not in out and "hf_abcdefgh" not in out and "hunter2hunter" not in out
    assert "***AWS_SECRET_ACCESS_KEY***" in out and "***HF_TOKEN***" in out
    assert "/usr/bin:/bin" in out and out.endswith("x1")


def test_redacting_log_filter(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("tao_data_io.test_redact")
    handler_filter = RedactingFilter(Redactor({"NGC_KEY": "nvapi-supersecret"}))
    logger.addFilter(handler_filter)
    try:
        with caplog.at_level(logging.INFO, logger=logger.name):
            logger.info("calling registry with %s", "nvapi-supersecret")
            try:
                raise RuntimeError("refused nvapi-supersecret")
            except RuntimeError:
                logger.exception("the call failed")
    finally:
        logger.removeFilter(handler_filter)
    assert "nvapi-supersecret" not in caplog.text
    assert "***NGC_KEY***" in caplog.text and "RuntimeError: refused ***NGC_KEY***" in caplog.text


def test_redactor_masks_the_userinfo_of_every_url() -> None:
    """A password in an endpoint's userinfo is a credential, whatever variable holds the URL and
    wherever the URL is quoted (an error message, a per-object line, a log record)."""
    env = {"AWS_ENDPOINT_URL": "https://minio:p%40ss-w0rd-1@s3.internal:9000", "HF_ENDPOINT": "https://hf.example",
           "NGC_API_URL": "https://ngc-user:ngc-pass-2@api.ngc.example/v2"}
    redact = Redactor(env)
    text = ("cannot reach https://minio:p%40ss-w0rd-1@s3.internal:9000/bucket; GET "
            "https://ngc-user:ngc-pass-2@api.ngc.example/v2/models failed; retrying with p@ss-w0rd-1 and ngc-pass-2; "
            "also http://someone:other-secret@10.0.0.1/x and ftp://tok3n@host/; keep https://hf.example/api and a@b.c")
    out = redact(text)
    for secret in ("p%40ss-w0rd-1", "p@ss-w0rd-1", "ngc-pass-2", "other-secret", "tok3n"):
        assert secret not in out
    assert "https://***USERINFO***@s3.internal:9000/bucket" in out and "http://***USERINFO***@10.0.0.1/x" in out
    assert "https://hf.example/api" in out and "a@b.c" in out


def test_the_s5cmd_child_gets_the_endpoint_through_its_environment_only() -> None:
    """argv is readable by every local user (``ps``, ``/proc/PID/cmdline``); the environment is not."""
    from tao_data_io.transfer.s5cmd_executor import S5cmdExecutor

    credentials = s3_credentials_from_env({"AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": "secret-value",
                                           "AWS_ENDPOINT_URL": "http://user:hunter2-pass@127.0.0.1:9000"})
    argv = S5cmdExecutor(credentials).argv()
    assert not any("hunter2-pass" in arg or "127.0.0.1" in arg for arg in argv)
    assert credentials.child_env({})["S3_ENDPOINT_URL"] == "http://user:hunter2-pass@127.0.0.1:9000"


def test_core_messages_and_repr_name_endpoints_without_their_password() -> None:
    """Messages the core builds around an endpoint may be shown where no redactor runs (an
    orchestrator's UI); they, and the credentials' repr, never carry the URL's userinfo."""
    from botocore.exceptions import EndpointConnectionError

    from tao_data_io.staging.pretrained.hub import HubRegistry
    from tao_data_io.staging.pretrained.ngc import NGCRegistry
    from tao_data_io.transfer.client import explain
    from tao_data_io.uris import parse_model_uri

    endpoint = "http://tao:pw-in-url-1@127.0.0.1:1"
    credentials = s3_credentials_from_env({"AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": "secret-value",
                                           "AWS_ENDPOINT_URL": endpoint})
    unreachable = explain(EndpointConnectionError(endpoint_url=endpoint), bucket="b", endpoint_url=endpoint)
    for text in (repr(credentials), str(unreachable)):
        assert "pw-in-url-1" not in text and "***USERINFO***@127.0.0.1:1" in text
    hub = HubRegistry(parse_model_uri("hf://org/repo"), {"HF_ENDPOINT": endpoint})  # type: ignore[arg-type]
    ngc = NGCRegistry(parse_model_uri("ngc://org/model:v1"), {"NGC_KEY": "nvapi-key", "NGC_API_URL": endpoint,  # type: ignore[arg-type]
                                                              "NGC_AUTH_URL": endpoint})
    for text in (hub.where, ngc.api_shown, ngc.authn_shown):  # what their messages quote
        assert "pw-in-url-1" not in text and "***USERINFO***@127.0.0.1:1" in text
