"""pull-model against a fake Hub and a fake NGC on 127.0.0.1, driven by the real clients:
verification against what the registry reports, atomic publishing, reruns that move nothing,
hostile file names, and credentials that are named but never printed."""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tao_data_io.errors import TransferError, UnsafePathError, UsageError
from tao_data_io.fs.confinement import STATE_DIR_NAME
from tao_data_io.fs.locks import destination_lock_path
from tao_data_io.fs.state import state_dir_for
from tao_data_io.fs.temp import lock_tag, temp_path_for
from tao_data_io.staging.pretrained import pull_model
from tao_data_io.uris import HF_SHAPE, NGC_SHAPE, HFModelURI, NGCModelURI, parse_model_uri

from .fake_registries import FakeRegistries
from .helpers import run_cli, temp_leftovers, tree_digest

REPO = "tao-test/tiny-model"
V1 = {
    "config.json": b'{"arch": "resnet18"}',
    "README.md": b"# tiny model\n",
    "model.safetensors": bytes(range(256)) * 40,
    "onnx/model.onnx": b"onnx-v1",
}
MAIN = {
    **V1,
    "config.json": b'{"arch": "resnet34"}',
    "model.safetensors": bytes(reversed(range(256))) * 50,
    "onnx/model.onnx": b"onnx-v2",
    "onnx/extra.txt": b"extra",
}
NGC_MODEL = "nvidia/tao/pretrained_resnet18"
NGC_KEY_VALUE = "ngc-key-for-tests-0123456789"
NGC_FILES = {
    "resnet18.hdf5": bytes(range(256)) * 30,
    "experiment.yaml": b"model: resnet18\n",
    "labels/classes.txt": b"car\nperson\n",
    "README.md": b"# resnet18\n",
}


def digests(files: dict[str, bytes]) -> dict[str, str]:
    return {path: hashlib.sha256(data).hexdigest() for path, data in files.items()}


def marker(dest: Path) -> dict:  # type: ignore[type-arg]
    return json.loads((state_dir_for(dest) / "model.json").read_text())


@pytest.fixture
def fake() -> Iterator[FakeRegistries]:
    with FakeRegistries() as registries:
        yield registries


@pytest.fixture
def hub_env(fake: FakeRegistries, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The Hub settings a user would export: the fake as HF_ENDPOINT and a private HF_HOME.

    In-process pulls read HF_ENDPOINT/HF_TOKEN from this mapping; huggingface_hub read HF_HOME at
    import, so its cache path (looked up at call time) is pointed into tmp_path as well."""
    import huggingface_hub.constants

    home = tmp_path / "hf-home"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(home / "hub"))
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    return {"HF_ENDPOINT": fake.url, "HF_HOME": str(home)}


@pytest.fixture
def ngc_env(fake: FakeRegistries, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    for name in ("NGC_KEY", "NGC_API_URL", "NGC_AUTH_URL"):
        monkeypatch.delenv(name, raising=False)
    return {"NGC_API_URL": fake.url, "NGC_AUTH_URL": fake.url, "NGC_KEY": NGC_KEY_VALUE}


@pytest.fixture
def refs(fake: FakeRegistries) -> dict[str, str]:
    """The tiny repo: branch main and tag v1.0, model.safetensors stored in LFS."""
    return fake.add_hub_repo(REPO, {"main": MAIN, "v1.0": V1}, lfs={"model.safetensors"})


# --- Hugging Face Hub ---------------------------------------------------------------------------


def test_hub_pull_verifies_every_file_and_publishes_with_a_marker(fake: FakeRegistries, hub_env: dict[str, str],
                                                                  refs: dict[str, str], tmp_path: Path) -> None:
    dest = tmp_path / "models" / "tiny"
    result = pull_model(f"hf://{REPO}", dest, environ=hub_env)
    assert tree_digest(dest) == digests(MAIN)
    assert result.revision == refs["main"] and result.downloaded
    assert sorted(result.fetched) == sorted(result.files) == sorted(MAIN)
    assert result.bytes == result.fetched_bytes == sum(len(data) for data in MAIN.values())
    recorded = {entry["path"]: entry for entry in marker(dest)["files"]}
    assert marker(dest)["revision"] == refs["main"]
    assert recorded["model.safetensors"]["digest"] == "sha256:" + hashlib.sha256(MAIN["model.safetensors"]).hexdigest()
    assert recorded["config.json"]["digest"].startswith("git-blob-sha1:")
    assert all(fake.downloads[f"hf:{REPO}/{path}"] == 1 for path in MAIN)
    assert sorted(os.listdir(dest.parent)) == [".tao-data-io", "tiny"] and temp_leftovers(tmp_path / "models") == []
    assert fake.unexpected == []


def test_hub_subpath_pulls_only_that_folder(fake: FakeRegistries, hub_env: dict[str, str], refs: dict[str, str],
                                            tmp_path: Path) -> None:
    result = pull_model(f"hf://{REPO}/onnx", tmp_path / "d", environ=hub_env)
    assert tree_digest(tmp_path / "d") == digests({k: v for k, v in MAIN.items() if k.startswith("onnx/")})
    assert sorted(result.files) == ["onnx/extra.txt", "onnx/model.onnx"] and fake.count("hf") == 2


def test_hub_revision_pins_a_tag_or_a_commit(fake: FakeRegistries, hub_env: dict[str, str], refs: dict[str, str],
                                             tmp_path: Path) -> None:
    dest = tmp_path / "d"
    tagged = pull_model(f"hf://{REPO}@v1.0", dest, environ=hub_env)
    assert tagged.revision == refs["v1.0"] and tree_digest(dest) == digests(V1)
    # Moving the same destination to another commit fetches only what differs: README.md is the
    # same bytes in both revisions and is recognised by its git blob id, not refetched.
    moved = pull_model(f"hf://{REPO}@{refs['main']}", dest, environ=hub_env)
    assert moved.revision == refs["main"] and tree_digest(dest) == digests(MAIN)
    assert "README.md" not in moved.fetched and fake.downloads[f"hf:{REPO}/README.md"] == 1


def test_hub_rerun_moves_nothing(fake: FakeRegistries, hub_env: dict[str, str], refs: dict[str, str],
                                 tmp_path: Path) -> None:
    dest = tmp_path / "d"
    pull_model(f"hf://{REPO}", dest, environ=hub_env)
    before, tree = Counter(fake.downloads), tree_digest(dest)
    again = pull_model(f"hf://{REPO}", dest, environ=hub_env)
    assert not again.downloaded and again.fetched == () and again.revision == refs["main"]
    assert fake.downloads == before and tree_digest(dest) == tree


def test_hub_damaged_file_is_refetched(fake: FakeRegistries, hub_env: dict[str, str], refs: dict[str, str],
                                       tmp_path: Path) -> None:
    dest = tmp_path / "d"
    pull_model(f"hf://{REPO}", dest, environ=hub_env)
    (dest / "model.safetensors").write_bytes(b"truncated")
    again = pull_model(f"hf://{REPO}", dest, environ=hub_env)
    assert again.fetched == ("model.safetensors",) and tree_digest(dest) == digests(MAIN)
    assert fake.downloads[f"hf:{REPO}/model.safetensors"] == 2 and fake.downloads[f"hf:{REPO}/config.json"] == 1


def test_hub_files_the_marker_does_not_vouch_for_are_hashed(fake: FakeRegistries, hub_env: dict[str, str],
                                                            refs: dict[str, str], tmp_path: Path) -> None:
    dest = tmp_path / "d"
    pull_model(f"hf://{REPO}", dest, environ=hub_env)
    (state_dir_for(dest) / "model.json").unlink()
    (dest / "config.json").write_bytes(b'{"arch": "resnet99"}')  # same size, other bytes
    again = pull_model(f"hf://{REPO}", dest, environ=hub_env)
    assert again.fetched == ("config.json",) and tree_digest(dest) == digests(MAIN)
    assert marker(dest)["revision"] == refs["main"]


def test_hub_missing_revision_is_a_usage_error_naming_it(hub_env: dict[str, str], refs: dict[str, str],
                                                         tmp_path: Path) -> None:
    with pytest.raises(UsageError) as info:
        pull_model(f"hf://{REPO}@no-such-branch", tmp_path / "d", environ=hub_env)
    assert "'no-such-branch'" in str(info.value) and f"'{REPO}'" in str(info.value)
    assert not (tmp_path / "d").exists()


def test_hub_token_is_sent_and_a_refusal_names_hf_token_never_its_value(fake: FakeRegistries, hub_env: dict[str, str],
                                                                         tmp_path: Path) -> None:
    right = "hf_the_right_token_000000"
    fake.add_hub_repo("tao-test/private", {"main": {"weights.bin": b"private"}}, token=right)
    pulled = pull_model("hf://tao-test/private", tmp_path / "ok", environ={**hub_env, "HF_TOKEN": right})
    assert pulled.files == ("weights.bin",)

    secret = "hf_secret_value_that_must_not_leak_1234"
    dest = tmp_path / "d"
    wrong = run_cli("pull-model", "hf://tao-test/private", "--dest", str(dest), env={**hub_env, "HF_TOKEN": secret})
    anonymous = run_cli("pull-model", "hf://tao-test/private", "--dest", str(dest), env=hub_env)
    for result in (wrong, anonymous):
        output = result.stdout + result.stderr
        assert result.returncode == 2 and result.stderr.startswith("error:") and "HF_TOKEN" in result.stderr
        # Never printed — not even masked by the redactor.
        assert secret not in output and "***" not in output
    assert "refused HF_TOKEN" in wrong.stderr and "anonymous access" in anonymous.stderr
    assert not dest.exists()


@pytest.mark.parametrize("hostile", ["../evil", "weights/../../evil", "/tmp/evil", ".tao-data-io/model.json"])
def test_hub_hostile_file_name_is_refused_and_nothing_is_written(fake: FakeRegistries, hub_env: dict[str, str],
                                                                 tmp_path: Path, hostile: str) -> None:
    fake.add_hub_repo("tao-test/hostile", {"main": {"config.json": b"{}", hostile: b"pwned"}})
    area = tmp_path / "area"
    with pytest.raises(UnsafePathError) as info:
        pull_model("hf://tao-test/hostile", area / "d", environ=hub_env)
    assert repr(hostile) in str(info.value)
    assert fake.count("hf") == 0 and not area.exists()
    assert not [p for p in tmp_path.rglob("*") if p.name == "evil"]


def test_cli_pull_model_json_then_a_rerun_that_moves_nothing(fake: FakeRegistries, hub_env: dict[str, str],
                                                             refs: dict[str, str], tmp_path: Path) -> None:
    dest = tmp_path / "d"
    first = run_cli("pull-model", f"hf://{REPO}@v1.0", "--dest", str(dest), "--json", env=hub_env)
    assert first.returncode == 0, first.stderr
    data = json.loads(first.stdout)
    assert data["downloaded"] is True and data["revision"] == refs["v1.0"] and sorted(data["fetched"]) == sorted(V1)
    second = run_cli("pull-model", f"hf://{REPO}@v1.0", "--dest", str(dest), env=hub_env)
    assert second.returncode == 0 and "already complete, nothing fetched" in second.stdout
    assert fake.count("hf") == len(V1) and tree_digest(dest) == digests(V1)


# --- NGC ----------------------------------------------------------------------------------------


def test_ngc_pull_lists_every_page_and_verifies_every_file(fake: FakeRegistries, ngc_env: dict[str, str],
                                                           tmp_path: Path) -> None:
    """Four files at two per page; downloads go through a redirect to signed storage, which the
    fake refuses if the bearer token follows it."""
    fake.add_ngc_version(NGC_MODEL, "resnet18", NGC_FILES, key=NGC_KEY_VALUE)
    dest = tmp_path / "ptm" / "resnet18"
    result = pull_model(f"ngc://{NGC_MODEL}:resnet18", dest, environ=ngc_env)
    assert tree_digest(dest) == digests(NGC_FILES) and result.revision == "resnet18" and result.downloaded
    assert fake.count("ngc") == len(NGC_FILES)
    assert fake.token_scopes == [["group/ngc:nvidia", "group/ngc:nvidia/tao"]]
    assert {entry["path"]: entry["digest"] for entry in marker(dest)["files"]}["resnet18.hdf5"] == \
        "sha256:" + hashlib.sha256(NGC_FILES["resnet18.hdf5"]).hexdigest()
    assert sorted(os.listdir(dest.parent)) == [".tao-data-io", "resnet18"] and fake.unexpected == []


def test_ngc_rerun_without_team_moves_nothing(fake: FakeRegistries, ngc_env: dict[str, str], tmp_path: Path) -> None:
    fake.add_ngc_version("myorg/detector", "1.0", NGC_FILES, key=NGC_KEY_VALUE)
    pull_model("ngc://myorg/detector:1.0", tmp_path / "d", environ=ngc_env)
    again = pull_model("ngc://myorg/detector:1.0", tmp_path / "d", environ=ngc_env)
    assert not again.downloaded and fake.count("ngc") == len(NGC_FILES)
    assert fake.token_scopes[0] == ["group/ngc:myorg"]


def test_ngc_files_without_a_listed_digest_are_trusted_only_for_the_same_version(
        fake: FakeRegistries, ngc_env: dict[str, str], tmp_path: Path) -> None:
    """Without a sha256 only the marker of the very same version may vouch for a file."""
    for version, weights in (("1.0", b"weights-1"), ("2.0", b"weights-2")):
        fake.add_ngc_version("myorg/detector", version, {"w.bin": weights}, key=NGC_KEY_VALUE).report_sha256 = False
    pull_model("ngc://myorg/detector:1.0", tmp_path / "d", environ=ngc_env)
    assert not pull_model("ngc://myorg/detector:1.0", tmp_path / "d", environ=ngc_env).downloaded
    upgraded = pull_model("ngc://myorg/detector:2.0", tmp_path / "d", environ=ngc_env)
    assert upgraded.fetched == ("w.bin",) and (tmp_path / "d" / "w.bin").read_bytes() == b"weights-2"


@pytest.mark.parametrize("served", [bytes(256) * 30, b"short"], ids=["same-size-wrong-bytes", "wrong-size"])
def test_ngc_wrong_bytes_are_detected_and_nothing_is_published(fake: FakeRegistries, ngc_env: dict[str, str],
                                                               tmp_path: Path, served: bytes) -> None:
    version = fake.add_ngc_version(NGC_MODEL, "resnet18", NGC_FILES, key=NGC_KEY_VALUE)
    version.served["resnet18.hdf5"] = served
    dest = tmp_path / "ptm" / "resnet18"
    with pytest.raises(TransferError) as info:
        pull_model(f"ngc://{NGC_MODEL}:resnet18", dest, environ=ngc_env)
    assert "resnet18.hdf5" in str(info.value) and "nothing was published" in str(info.value)
    assert not dest.exists() and os.listdir(dest.parent) == [STATE_DIR_NAME]  # its lock, beside: nothing else
    del version.served["resnet18.hdf5"]  # the registry recovers: a rerun converges
    pull_model(f"ngc://{NGC_MODEL}:resnet18", dest, environ=ngc_env)
    assert tree_digest(dest) == digests(NGC_FILES)


def test_ngc_transient_503_is_retried(fake: FakeRegistries, ngc_env: dict[str, str], tmp_path: Path) -> None:
    version = fake.add_ngc_version(NGC_MODEL, "resnet18", NGC_FILES, key=NGC_KEY_VALUE)
    version.fail_next["experiment.yaml"] = 1
    pull_model(f"ngc://{NGC_MODEL}:resnet18", tmp_path / "d", environ=ngc_env)
    assert tree_digest(tmp_path / "d") == digests(NGC_FILES)


def test_ngc_unknown_version_is_a_usage_error_naming_it(fake: FakeRegistries, ngc_env: dict[str, str],
                                                        tmp_path: Path) -> None:
    fake.add_ngc_version(NGC_MODEL, "resnet18", NGC_FILES, key=NGC_KEY_VALUE)
    with pytest.raises(UsageError) as info:
        pull_model(f"ngc://{NGC_MODEL}:resnet99", tmp_path / "d", environ=ngc_env)
    assert f"ngc://{NGC_MODEL}:resnet99" in str(info.value) and not (tmp_path / "d").exists()


def test_ngc_refused_or_missing_key_names_ngc_key_never_its_value(fake: FakeRegistries, ngc_env: dict[str, str],
                                                                  tmp_path: Path) -> None:
    fake.add_ngc_version(NGC_MODEL, "resnet18", NGC_FILES, key=NGC_KEY_VALUE)
    secret = "nvapi-wrong-key-that-must-not-leak-42"
    args = ("pull-model", f"ngc://{NGC_MODEL}:resnet18", "--dest", str(tmp_path / "d"))
    refused = run_cli(*args, env={**ngc_env, "NGC_KEY": secret})
    missing = run_cli(*args, env={k: v for k, v in ngc_env.items() if k != "NGC_KEY"})
    for result in (refused, missing):
        output = result.stdout + result.stderr
        assert result.returncode == 2 and result.stderr.startswith("error:") and "NGC_KEY" in result.stderr
        assert secret not in output and NGC_KEY_VALUE not in output and "***" not in output
    assert "refused NGC_KEY" in refused.stderr and "NGC_KEY is not set" in missing.stderr
    assert fake.count("ngc") == 0 and not (tmp_path / "d").exists()


# --- URIs and destinations ---------------------------------------------------------------------------


@pytest.mark.parametrize(("uri", "fragment"), [
    ("ngc://nvidia/tao/model", "':version' is missing"),
    ("ngc://nvidia/model:", "version ''"),
    ("ngc://model:1.0", "1 segment"),
    ("ngc://a/b/c/d:1.0", "4 segment"),
    ("ngc://nvidia//model:1.0", "segment is empty"),
    ("ngc://nvidia/tao/mo del:1.0", "'mo del'"),
    ("hf://just-a-name", "organisation and a repository"),
    ("hf://org/repo@", "revision after '@' is empty"),
    ("hf:///repo", "org is empty"),
    ("hf://org/re--po", "'re--po'"),
    ("hf://org/repo/../../etc", "'..'"),
])
def test_malformed_uris_name_the_uri_and_the_expected_shape(uri: str, fragment: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_model_uri(uri)
    shape = NGC_SHAPE if uri.startswith("ngc") else HF_SHAPE
    assert repr(uri) in str(info.value) and shape in str(info.value) and fragment in str(info.value)


def test_unknown_scheme_names_both_shapes_and_the_cli_exits_2(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as info:
        parse_model_uri("s3://bucket/model")
    assert HF_SHAPE in str(info.value) and NGC_SHAPE in str(info.value)
    result = run_cli("pull-model", "ngc://nvidia/model", "--dest", str(tmp_path / "d"), env={})
    assert result.returncode == 2 and result.stderr.startswith("error: model URI 'ngc://nvidia/model'")


@pytest.mark.parametrize(("uri", "parsed"), [
    ("hf://org/repo", HFModelURI("org/repo")),
    ("hf://org/repo@refs%2Fpr%2F3/onnx/", HFModelURI("org/repo", "refs/pr/3", "onnx")),
    ("hf://org/repo@refs/pr/3/onnx", HFModelURI("org/repo", "refs/pr/3", "onnx")),
    ("ngc://nvidia/tao/pretrained_resnet18:resnet18", NGCModelURI("nvidia", "tao", "pretrained_resnet18", "resnet18")),
    ("ngc://myorg/detector:1.0", NGCModelURI("myorg", None, "detector", "1.0")),
])
def test_well_formed_uris_parse(uri: str, parsed: HFModelURI | NGCModelURI) -> None:
    assert parse_model_uri(uri) == parsed


def test_destination_that_is_a_file_is_a_usage_error(hub_env: dict[str, str], refs: dict[str, str],
                                                     tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"not a directory")
    with pytest.raises(UsageError, match="not a directory"):
        pull_model(f"hf://{REPO}", tmp_path / "f", environ=hub_env)


def test_a_killed_runs_staging_is_removed_and_a_neighbours_is_not(hub_env: dict[str, str], refs: dict[str, str],
                                                                    tmp_path: Path) -> None:
    # A killed pull's, under d's lock:
    ours = temp_path_for(tmp_path / "d", lock_tag(destination_lock_path(tmp_path / "d")))
    neighbours = temp_path_for(tmp_path / "x.d", lock_tag(destination_lock_path(tmp_path / "x.d")))
    for staging in (ours, neighbours):
        (staging / "onnx").mkdir(parents=True)
        (staging / "onnx" / "model.onnx").write_bytes(b"half")
    pull_model(f"hf://{REPO}", tmp_path / "d", environ=hub_env)
    assert not ours.exists() and neighbours.exists() and tree_digest(tmp_path / "d") == digests(MAIN)
