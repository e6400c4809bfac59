"""The signed ListObjectsV2 fast path: the signature AWS documents, the same listing boto3 gives
(hostile keys and pagination included), and None — so the engine lists through boto3 — whenever
the fast path cannot be sure of giving that answer."""

from __future__ import annotations

import calendar
import datetime
from pathlib import Path
from collections.abc import Iterator
from typing import Any

import botocore.auth
import pytest
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from tao_data_io.credentials import S3Credentials
from tao_data_io.embedded.s3 import EmbeddedS3
from tao_data_io.transfer.client import make_s3_client
from tao_data_io.transfer.engine import TransferEngine
from tao_data_io.transfer.listing import list_remote, listing_from_pages
from tao_data_io.transfer.signed_list import list_pages, sign
from tao_data_io.uris import S3Url

from .helpers import write_tree


def test_signature_is_the_one_the_aws_documentation_gives() -> None:
    # "GET Bucket (List Objects)" in the S3 SigV4 documentation (header-based auth examples).
    credentials = S3Credentials("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
    now = calendar.timegm((2013, 5, 24, 0, 0, 0))
    headers = sign(credentials, "GET", "examplebucket.s3.amazonaws.com", "/", "max-keys=2&prefix=J", now)
    assert headers["Authorization"].endswith(
        "Signature=34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7")


def test_signature_with_a_session_token_and_an_awkward_prefix_matches_botocore(monkeypatch: pytest.MonkeyPatch) -> None:
    credentials = S3Credentials("AKIDEXAMPLE", "secret/with+chars", session_token="token+/=", region="eu-west-3")
    when = datetime.datetime(2026, 1, 2, 3, 4, 5)
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: when)
    query = "continuation-token=1%2Fab%2B%3D&encoding-type=url&list-type=2&max-keys=1000&prefix=a%20b%2Bc%2F%C3%BC%2A"
    request = AWSRequest(method="GET", url=f"http://127.0.0.1:9000/bucket?{query}")
    botocore.auth.S3SigV4Auth(Credentials("AKIDEXAMPLE", "secret/with+chars", "token+/="), "s3",
                              "eu-west-3").add_auth(request)
    ours = sign(credentials, "GET", "127.0.0.1:9000", "/bucket", query, calendar.timegm(when.timetuple()))
    assert ours["Authorization"] == request.headers["Authorization"]


class Handover:
    """The fallback: records the continuation token boto3 would list from, and lists nothing."""

    def __init__(self) -> None:
        self.tokens: list[str | None] = []

    def __call__(self, token: str | None) -> Iterator[dict[str, Any]]:
        self.tokens.append(token)
        yield {"Contents": [], "handed over": token}


def handed_over(credentials: S3Credentials, bucket: str, prefix: str, **kwargs: Any) -> list[str | None]:
    """The tokens the listing handed to boto3 from ([] when the fast path answered whole)."""
    handover = Handover()
    list(list_pages(credentials, bucket, prefix, fallback=handover, **kwargs))
    return handover.tokens


def assert_listed_as_boto3_lists(credentials: S3Credentials, bucket: str, prefix: str, **kwargs: Any) -> None:
    handover = Handover()
    pages = list(list_pages(credentials, bucket, prefix, environ={}, fallback=handover, **kwargs))
    assert handover.tokens == [], "the fast path should have answered"
    assert listing_from_pages(pages, prefix) == list_remote(make_s3_client(credentials), S3Url(bucket, prefix))


def test_same_listing_as_boto3_for_hostile_keys_across_pages(moto_credentials: S3Credentials) -> None:
    client = make_s3_client(moto_credentials)
    client.create_bucket(Bucket="signed-list")
    keys = ["p/../evil", "p//abs", "p/\x01ctl", "p/./dot", "p/dir/", "p/sp ace", "p/pct%20x", "p/plus+x", "p/ü",
            "p/q?x&y=z", "p/star*", "p/ok.txt", "other/not-listed"]
    for key in keys:
        client.put_object(Bucket="signed-list", Key=key, Body=b"x")
    assert_listed_as_boto3_lists(moto_credentials, "signed-list", "p/", page_size=3)


def test_a_grouped_listing_names_what_boto3_names_across_pages(moto_credentials: S3Credentials) -> None:
    client = make_s3_client(moto_credentials)
    client.create_bucket(Bucket="signed-list-grouped")
    keys = ["p/../evil", "p//abs", "p/\x01ctl/x", "p/sp ace/x", "p/pct%20x/y", "p/plus+x/z", "p/ü/w", "p/q?x&y=z",
            "p/a-b", "p/a/c", "p/a/d/e", "p/dir/", "p/top", "other/not-listed"]
    for key in keys:
        client.put_object(Bucket="signed-list-grouped", Key=key, Body=b"x")
    handover = Handover()
    ours = list(list_pages(moto_credentials, "signed-list-grouped", "p/", environ={}, fallback=handover, page_size=3,
                           delimiter="/"))
    assert handover.tokens == [], "the fast path should have answered"
    theirs = list(client.get_paginator("list_objects_v2").paginate(Bucket="signed-list-grouped", Prefix="p/",
                                                                   Delimiter="/", PaginationConfig={"PageSize": 3}))
    assert [[common["Prefix"] for common in page.get("CommonPrefixes", ())] for page in ours] == [
        [common["Prefix"] for common in page.get("CommonPrefixes", ())] for page in theirs]
    assert [[item["Key"] for item in page["Contents"]] for page in ours] == [
        [item["Key"] for item in page.get("Contents", ())] for page in theirs]


def test_same_listing_as_boto3_on_seaweedfs(s3_credentials: S3Credentials, s3_client, bucket: str,  # type: ignore[no-untyped-def]
                                            tmp_path: Path) -> None:
    write_tree(tmp_path / "src", {f"d{i % 3}/f {i}+ü.bin": bytes([i]) * i for i in range(7)})
    assert TransferEngine(s3_credentials).sync(str(tmp_path / "src"), f"s3://{bucket}/data/").ok
    s3_client.put_object(Bucket=bucket, Key="data/marker/", Body=b"")
    assert_listed_as_boto3_lists(s3_credentials, bucket, "data/", page_size=2)
    assert_listed_as_boto3_lists(s3_credentials, bucket, "nothing-here/")


def test_a_sync_lists_without_botocore(s3_credentials: S3Credentials, s3_client, bucket: str,  # type: ignore[no-untyped-def]
                                       tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_CONFIG_FILE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    s3_client.put_object(Bucket=bucket, Key="p/a.txt", Body=b"a")
    with TransferEngine(s3_credentials) as engine:
        assert engine.sync(f"s3://{bucket}/p/", str(tmp_path / "d")).transferred == ["a.txt"]
        assert engine.sync(f"s3://{bucket}/p/", str(tmp_path / "d")).unchanged_files == 1
        assert "client" not in vars(engine)  # no boto3 client was ever built


@pytest.mark.parametrize("case", ["wrong secret", "no such bucket", "nothing listening"])
def test_any_failure_hands_the_listing_to_boto3_which_explains(case: str, s3_server: EmbeddedS3, bucket: str) -> None:
    credentials, name = s3_server.credentials, bucket
    if case == "wrong secret":
        credentials = S3Credentials(credentials.access_key_id, "wrong-secret", endpoint_url=credentials.endpoint_url)
    elif case == "no such bucket":
        name = "no-such-bucket-here"
    else:
        credentials = S3Credentials("k", "s", endpoint_url="http://127.0.0.1:9")
    assert handed_over(credentials, name, "p/", environ={}) == [None]


@pytest.mark.parametrize("environ", [
    {"HTTPS_PROXY": "http://proxy.internal:3128"},
    {"http_proxy": "http://proxy.internal:3128", "NO_PROXY": "s3.example.org"},
    {"AWS_CONFIG_FILE": __file__},  # any existing config file: botocore would read it
], ids=["proxy", "proxy not bypassed", "config file"])
def test_settings_botocore_would_honour_send_the_listing_to_boto3(environ: dict[str, str]) -> None:
    credentials = S3Credentials("k", "s", endpoint_url="http://127.0.0.1:9")  # never contacted
    assert handed_over(credentials, "bucket", "p/", environ=environ) == [None]


def test_a_proxy_bypassed_for_the_endpoint_does_not_matter(s3_server: EmbeddedS3, bucket: str) -> None:
    environ = {"HTTP_PROXY": "http://proxy.invalid:3128", "NO_PROXY": "127.0.0.1,localhost"}
    assert list(list_pages(s3_server.credentials, bucket, "p/", environ=environ, fallback=Handover())) == [
        {"Contents": [], "IsTruncated": False}]


def test_an_unreadable_ca_bundle_is_left_to_boto3_to_report(tmp_path: Path) -> None:
    credentials = S3Credentials("k", "s", endpoint_url="https://127.0.0.1:9")
    assert handed_over(credentials, "bucket", "p/", environ={"AWS_CA_BUNDLE": str(tmp_path / "missing.pem")}) == [None]
