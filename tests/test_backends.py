"""The backend registry and the settings models it builds backends from: each backend's settings
are declared once (the backend records them, the registry rebuilds from that record, the block
embeds them), and a job record written before ``workdir_root`` became ``run_root`` still reaches
its job."""

from __future__ import annotations

from pathlib import Path

import pytest

from tao_data_io.backends import backend_for, settings_from
from tao_data_io.errors import UsageError
from tao_data_io.local.backend import LocalBackend
from tao_data_io.local.settings import LocalSettings
from tao_data_io.records import RecordStore
from tao_data_io.steps import backend_of


def test_a_local_backends_recorded_config_is_its_settings_and_rebuilds_an_equal_backend() -> None:
    config = {"run_root": "/srv/tao/runs", "allow_network": True}
    backend = backend_for("local", config)
    assert backend.config() == config  # every setting recorded, none dropped, none added
    again = backend_for("local", backend.config())
    assert type(again) is type(backend) and again.config() == backend.config()


def test_the_local_backend_is_built_from_its_settings_model() -> None:
    local = LocalSettings(run_root="/srv/runs")
    assert LocalBackend(local).settings == local and LocalBackend(local).config() == local.model_dump(mode="json")


def test_an_old_local_record_with_workdir_root_rebuilds_its_backend(tmp_path: Path) -> None:
    """Records written before the rename keep the run root as ``workdir_root``: migrated as they
    are read; a run root given now (``--workdir`` on a later verb) wins over the recorded one."""
    store = RecordStore(tmp_path / "jobs")
    store.open(job_id="old-job", platform="local", image="tao", network_arch="dino", action="train",
               results_dir="/results")
    old = {"workdir_root": str(tmp_path / "runs"), "allow_network": True}
    record = store.update("old-job", lambda current: current.model_copy(update={"backend_config": old}))
    backend = backend_of(record)
    assert isinstance(backend, LocalBackend)
    assert backend.config() == {"run_root": str(tmp_path / "runs"), "allow_network": True}
    assert backend_of(record, {"run_root": str(tmp_path / "elsewhere")}).config()["run_root"] == str(
        tmp_path / "elsewhere")


def test_the_fake_is_no_platform_of_the_product() -> None:
    with pytest.raises(UsageError, match="platform 'fake' is not a backend: use local or kubernetes"):
        backend_for("fake", {"results_root": "/tmp/results"})


def test_a_refused_setting_is_named() -> None:
    with pytest.raises(UsageError, match="run_root: 'runs' is not absolute"):
        settings_from("local", {"run_root": "runs"})
    with pytest.raises(UsageError, match="unknown field 'run_roots': did you mean 'run_root'"):
        settings_from("local", {"run_roots": "/srv/runs"})
