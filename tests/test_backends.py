"""The backend registry and the settings models it builds backends from: each backend's settings
are declared once (the backend records them, the registry rebuilds from that record, the block
embeds them), a later verb rebuilds a job's backend from its record, and a bad setting is the
same usage error whichever way it was given."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from blocks import KubernetesTarget
from tao_data_io.backends import backend_for, declarations, settings_from
from tao_data_io.backends.docker.backend import DockerBackend
from tao_data_io.backends.docker.settings import DockerSettings
from tao_data_io.errors import UsageError
from tao_data_io.backends.kubernetes.backend import KubernetesBackend
from tao_data_io.backends.kubernetes.settings import KubernetesSettings
from tao_data_io.backends.local.backend import LocalBackend
from tao_data_io.backends.local.settings import LocalSettings
from tao_data_io.backends.slurm.backend import SlurmBackend
from tao_data_io.backends.slurm.settings import SlurmSettings
from tao_data_io.backends.kubernetes.names import DNS_LABEL_RULE
from tao_data_io.records import RecordStore
from tao_data_io.steps import backend_of

from .helpers import run_cli

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
KUBERNETES = {"namespace": "tao", "context": "prod", "pvc_claim": "tao-data", "credential_secret": "team-s3",
              "image_pull_secrets": ["ngc-pull", "stager-pull"], "stager_image": "registry.example.com/stager:1",
              "ttl_seconds": 60, "shm_size": "16Gi", "shards": 2, "node_selector": {"gpu": "a100"},
              "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
              "records_url": "s3://tao-records/jobs/", "resync_seconds": 60,
              "training_security": "restricted", "training_user": 1000, "capacity": "queued",
              "pending_timeout": 900.0, "queue_name": "gpu-queue", "priority_class": "tao-high",
              "exclusive_topology": "topology.kubernetes.io/zone", "labels": {"team": "vision"},
              "annotations": {"example.com/cost-centre": "ml-42"}, "service_account": "tao-runner",
              "cloud_identity": True, "collective_probe": False, "cancel_grace_seconds": 30}


@pytest.mark.parametrize(("backend_name", "config"), [
    ("local", {"run_root": "/srv/tao/runs", "allow_network": True, "run_as_user": 1000, "run_as_group": 1000,
               "log_limit": "16Mi"}),
    ("kubernetes", KUBERNETES),
    ("docker", {"docker_host": "unix:///run/user/1000/docker.sock", "run_root": "/srv/tao/docker",
                "allow_network": True, "run_as_user": 1000, "run_as_group": 1000, "gpu_devices": ["0", "GPU-8a1c-44"],
                "pids_limit": 4096, "log_limit": "16Mi", "cancel_grace_seconds": 10}),
    ("slurm", {"slurm_conf": "/etc/slurm/slurm.conf", "run_root": "/lustre/tao/runs",
               "shared_roots": ["/lustre/datasets"], "container_runtime": "bubblewrap", "partition": "gpu",
               "account": "vision", "qos": "normal", "reservation": "tao", "exclusive": True, "gres_name": "gpu",
               "extra_options": {"constraint": "ib"}, "allow_network": False, "run_as_user": 1000,
               "run_as_group": 1000, "pending_timeout": 86400.0, "cancel_grace_seconds": 10}),
], ids=["local", "kubernetes", "docker", "slurm"])
def test_a_backends_recorded_config_is_its_settings_and_rebuilds_an_equal_backend(backend_name: str,
                                                                                 config: dict[str, Any]) -> None:
    backend = backend_for(backend_name, config)
    assert backend.config() == config  # every setting recorded, none dropped, none added
    again = backend_for(backend_name, backend.config())
    assert type(again) is type(backend) and again.config() == backend.config()


def test_the_backends_are_built_from_their_settings_model() -> None:
    local, kubernetes = LocalSettings(run_root="/srv/runs"), KubernetesSettings(**KUBERNETES)
    assert LocalBackend(local).settings == local and LocalBackend(local).config() == local.model_dump(mode="json")
    assert KubernetesBackend(kubernetes).config() == kubernetes.model_dump(mode="json")
    docker = DockerSettings(run_root="/srv/docker", docker_host="unix:///var/run/docker.sock")
    assert DockerBackend(docker).config() == docker.model_dump(mode="json")
    slurm = SlurmSettings(run_root="/lustre/runs", slurm_conf="/etc/slurm/slurm.conf")
    assert SlurmBackend(slurm).config() == slurm.model_dump(mode="json")
    assert ((LocalBackend.name, KubernetesBackend.name, DockerBackend.name, SlurmBackend.name)
            == ("local", "kubernetes", "docker", "slurm") == tuple(declarations()))


def test_a_run_root_given_now_wins_over_the_recorded_one(tmp_path: Path) -> None:
    """A later verb rebuilds the job's backend from its record; a run root given then
    (``--workdir``) wins over the recorded one."""
    store = RecordStore(tmp_path / "jobs")
    store.open(job_id="old-job", backend="local", image="tao", network_arch="dino", action="train",
               results_dir="/results")
    recorded = {"run_root": str(tmp_path / "runs"), "allow_network": True}
    record = store.update("old-job", lambda current: current.model_copy(update={"backend_config": recorded}))
    backend = backend_of(record)
    assert isinstance(backend, LocalBackend)
    assert backend.config() == LocalSettings(run_root=str(tmp_path / "runs"), allow_network=True).model_dump()
    assert backend_of(record, {"run_root": str(tmp_path / "elsewhere")}).config()["run_root"] == str(
        tmp_path / "elsewhere")


def test_the_fake_is_no_backend_of_the_product() -> None:
    with pytest.raises(UsageError,
                       match="backend 'fake' is not known here: use 'local', 'kubernetes', 'docker' or 'slurm'"):
        backend_for("fake", {"results_root": "/tmp/results"})


def test_a_bad_namespace_is_one_usage_error_from_the_registry_the_block_and_the_cli(tmp_path: Path) -> None:
    refusal = f"namespace 'Tao' is not a DNS label: {DNS_LABEL_RULE}"
    with pytest.raises(UsageError) as raised:
        backend_for("kubernetes", {"namespace": "Tao"})
    assert str(raised.value) == f"the kubernetes backend's settings:\n  namespace: {refusal}"
    with pytest.raises(ValidationError) as in_block:  # Prefect builds blocks with pydantic: its error, our cause
        KubernetesTarget(settings={"namespace": "Tao"})
    cause = in_block.value.errors()[0]["ctx"]["error"]
    assert isinstance(cause, UsageError) and str(cause) == refusal
    shell = run_cli("submit", "--backend", "kubernetes", "--namespace", "Tao", "--request",
                    str(EXAMPLES / "tier-c.yaml"), env={"HOME": str(tmp_path)})
    assert shell.returncode == 2 and f"--{refusal}" in shell.stderr  # the field, shown as its flag


def test_each_refused_setting_is_named_and_no_input_is_echoed() -> None:
    with pytest.raises(UsageError) as raised:
        settings_from("kubernetes", {"ttl_seconds": "an hour", "shards": 0})
    message = str(raised.value)
    assert "ttl_seconds: Input should be a valid integer" in message and "shards: shards 0 must be 1 to 1000" in message
    assert "an hour" not in message
    with pytest.raises(UsageError, match="unknown field 'kubeconfig'"):  # its path stays on the machine that submits
        settings_from("kubernetes", {"kubeconfig": "/home/me/.kube/config"})
    with pytest.raises(UsageError, match="run_root: 'runs' is not absolute"):
        settings_from("local", {"run_root": "runs"})
    with pytest.raises(UsageError, match="unknown field 'run_roots': did you mean 'run_root'"):
        settings_from("local", {"run_roots": "/srv/runs"})


def test_a_queue_name_is_refused_where_it_cannot_be_the_jobs_queue_label() -> None:
    """Issue 39 (cosmetic): queue_name becomes the Jobs' ``kueue.x-k8s.io/queue-name`` label, and a
    label value is at most 63 characters (apimachinery IsValidLabelValue), though a LocalQueue's
    own name may be a 253-character subdomain: refused at the setting, not by the API server."""
    long = "q" * 64
    with pytest.raises(UsageError, match=f"queue_name {long!r} is 64 characters.*at most 63"):
        settings_from("kubernetes", {"capacity": "queued", "queue_name": long})
    assert settings_from("kubernetes", {"capacity": "queued", "queue_name": "q" * 63})
