"""Every block meets Prefect's own standard: Prefect's ``BlockStandardTestSuite`` runs over each
(a description, a documentation URL, every field described, a code example that imports and
loads the block, a square logo of a sensible size), the credential blocks are Prefect's
``CredentialsBlock``s, and each code example runs as written once a block of that name is saved.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import pytest
from prefect.blocks.abstract import CredentialsBlock, ObjectStorageBlock
from prefect.filesystems import WritableFileSystem
from prefect.testing.standard_test_suites import BlockStandardTestSuite
from prefect.testing.standard_test_suites import blocks as standard_suite

from blocks import (DockerTarget, HuggingFaceEnvCredentials, JobRecords, KubernetesTarget, LocalTarget,
                    NGCEnvCredentials, S3EnvCredentials, SLURMTarget, TaoS3Bucket)
from blocks.presentation import LOGO_FILE, LOGO_URL
from tao_data_io.embedded.s3 import EmbeddedS3
from tao_data_io.backends.docker.settings import DockerSettings
from tao_data_io.backends.kubernetes.settings import KubernetesSettings
from tao_data_io.backends.local.settings import LocalSettings
from tao_data_io.backends.slurm.settings import SlurmSettings

from .fake_registries import FakeRegistries
from .flow_helpers import REPO, name

EVERY_BLOCK = [S3EnvCredentials, HuggingFaceEnvCredentials, NGCEnvCredentials, LocalTarget, KubernetesTarget,
               DockerTarget, SLURMTarget, JobRecords, TaoS3Bucket]


def _logo_from_the_tree(url: str) -> io.BytesIO:
    """What the logo URL serves: the file in this tree it is the raw URL of (this machine has no
    internet). Any other URL is refused, so a block pointing elsewhere fails the suite."""
    assert url == LOGO_URL and LOGO_URL.endswith("/main/" + LOGO_FILE.relative_to(REPO).as_posix()), url
    return io.BytesIO(LOGO_FILE.read_bytes())


class TestEveryBlockMeetsPrefectsStandard(BlockStandardTestSuite):
    @pytest.fixture(params=EVERY_BLOCK, ids=lambda block: block.__name__)
    def block(self, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> type:
        monkeypatch.setattr(standard_suite, "urlopen", _logo_from_the_tree)
        return request.param


#: The longest description Prefect's v2 UI shows whole on a block's catalog card (six lines) in a
#: 1,024-pixel-wide window, as measured there; the browser suite checks the cards themselves.
CARD_CHARACTERS = 140


@pytest.mark.parametrize("block", EVERY_BLOCK, ids=lambda block: block.__name__)
def test_a_blocks_description_fits_its_catalog_card(block: type) -> None:
    description = block.get_description()
    assert len(description) <= CARD_CHARACTERS, f"{len(description)} characters: {description}"


def test_the_logo_test_runs_here_rather_than_being_skipped() -> None:
    assert standard_suite.HAS_PIL, "pillow (a test extra) is what the suite's logo check needs"


@pytest.mark.parametrize("block", [S3EnvCredentials, HuggingFaceEnvCredentials, NGCEnvCredentials])
def test_the_credential_blocks_are_prefects_credentials_blocks(block: type) -> None:
    assert issubclass(block, CredentialsBlock)


def test_the_bucket_block_is_prefects_object_storage_and_a_result_store() -> None:
    assert issubclass(TaoS3Bucket, ObjectStorageBlock) and issubclass(TaoS3Bucket, WritableFileSystem)
    assert {"read-path", "write-path"} <= set(TaoS3Bucket.get_block_capabilities())


def test_the_s3_form_is_five_names_and_one_switch_with_no_markup_in_its_help() -> None:
    """Nine optional fields with one long help each became the five AWS names (their defaults)
    and a switch for TAO's legacy names; no description holds markup a form would mangle."""
    properties = S3EnvCredentials.model_json_schema()["properties"]
    assert list(properties) == ["access_key_id_env", "secret_access_key_env", "session_token_env", "endpoint_url_env",
                                "region_env", "read_legacy_names"]
    assert [spec["default"] for spec in properties.values()][:5] == [
        "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION"]
    for block in EVERY_BLOCK:
        for field, spec in block.model_json_schema()["properties"].items():
            # CommonMark: '*', '`' and brackets are markup anywhere, '_' only where it opens or closes a word.
            assert not re.search(r"[\[\]*`]|(?<!\w)_|_(?!\w)", spec.get("description", "")), (block.__name__, field)


# ----------------------------------------------------------------------------- the examples run
@pytest.fixture
def example_world(prefect_harness: None, s3_server: EmbeddedS3, s3_env: dict[str, str], bucket: str, s3_client: Any,
                  tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[type, tuple[Any, dict[str, str]]]:
    """For each block: a saved instance the example can load, and what its placeholders stand for
    here (a user replaces them the same way)."""
    registries = FakeRegistries().__enter__()
    registries.add_hub_repo("tao-test/tiny", {"main": {"config.json": b"{}"}})
    registries.add_ngc_version("nvidia/tao/tiny", "1.0", {"model.onnx": b"onnx"}, key="ngc-key-for-tests-0123456789")
    for variable, value in {"HF_ENDPOINT": registries.url, "NGC_API_URL": registries.url,
                            "NGC_AUTH_URL": registries.url, "NGC_KEY": "ngc-key-for-tests-0123456789"}.items():
        monkeypatch.setenv(variable, value)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    s3_client.put_object(Bucket=bucket, Key="team/datasets/coco/images/1.jpg", Body=b"jpeg")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "model.pth").write_bytes(b"weights")
    (tmp_path / "jobs").mkdir()
    monkeypatch.chdir(tmp_path)
    yield {
        S3EnvCredentials: (S3EnvCredentials(), {}),
        HuggingFaceEnvCredentials: (HuggingFaceEnvCredentials(), {"ORG/MODEL": "tao-test/tiny"}),
        NGCEnvCredentials: (NGCEnvCredentials(), {"ORG/TEAM/MODEL:VERSION": "nvidia/tao/tiny:1.0"}),
        LocalTarget: (LocalTarget(settings=LocalSettings(run_root=str(tmp_path / "runs"))), {}),
        KubernetesTarget: (KubernetesTarget(settings=KubernetesSettings(namespace="tao")), {}),
        DockerTarget: (DockerTarget(settings=DockerSettings(run_root=str(tmp_path / "docker"))), {}),
        SLURMTarget: (SLURMTarget(settings=SlurmSettings(run_root=str(tmp_path / "slurm"))), {}),
        JobRecords: (JobRecords(location=str(tmp_path / "jobs")), {}),
        TaoS3Bucket: (TaoS3Bucket(bucket_name=bucket, bucket_folder="team"), {}),
    }
    registries.__exit__(None, None, None)


@pytest.mark.parametrize("block", EVERY_BLOCK, ids=lambda block: block.__name__)
def test_every_code_example_runs_as_written(block: type, example_world: dict[type, tuple[Any, dict[str, str]]],
                                            tmp_path: Path) -> None:
    instance, placeholders = example_world[block]
    saved = name()
    instance.save(saved)
    code = block.get_code_example().removeprefix("```python\n").removesuffix("\n```").replace("BLOCK_NAME", saved)
    for placeholder, value in placeholders.items():
        code = code.replace(placeholder, value)
    namespace: dict[str, Any] = {}
    exec(compile(code, f"<{block.__name__} code example>", "exec"), namespace)
    if block is S3EnvCredentials:
        assert namespace["client"].list_buckets()["Buckets"]
    if block is TaoS3Bucket:
        assert (tmp_path / "coco" / "images" / "1.jpg").read_bytes() == b"jpeg"
        assert namespace["tao_s3_bucket"].read_path("runs/run-1/model.pth") == b"weights"
