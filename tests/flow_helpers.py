"""What the flow tests share (they run against the session's Prefect test server): the fake
compute target and the blocks a test saves, the requests they submit, and reading back a flow
run's task runs and artifacts. The worker's environment is the ``env`` fixture (conftest.py)."""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any
from uuid import UUID

from prefect import Flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, FlowRunFilter, FlowRunFilterId
from prefect.client.schemas.objects import Artifact, TaskRun
from prefect.states import State
from pydantic import Field

from blocks import ComputeTarget, JobRecords, LocalTarget
from tao_data_io.launch.backend import Backend
from tao_data_io.backends.local.settings import LocalSettings

from .fake_backend import FakeBackend
from .helpers import wait_for

REPO = Path(__file__).resolve().parents[1]
_names = itertools.count()

#: One fake "cluster" per results root, shared by every flow run of a test (a real cluster
#: remembers its jobs between the submit and the collect flow; a fresh FakeBackend would not).
_CLUSTERS: dict[str, FakeBackend] = {}


class FakeTarget(ComputeTarget):
    """A compute target for the tests: the FakeBackend, told how to behave."""

    _block_type_name = "TAO Fake Target (tests)"
    _block_type_slug = "tao-fake-target"

    results_root: str = Field(title="Results root", description="Where the fake jobs write their results.")
    verify_ok: bool = Field(True, title="Verify passes", description="Whether the verify verdict passes.")
    outcome: str = Field("COMPLETE", title="Outcome", description="COMPLETE or ERROR.")
    polls_until_done: int = Field(1, title="Polls until done", description="Status polls before the end.")
    fail_submits: int = Field(0, title="Failed submits", description="Submits that fail with a retryable 503 first.")
    stages_on_host: bool = Field(True, title="Stages on this host", description="False: the cluster stages.")

    def backend(self) -> Backend:
        cluster = _CLUSTERS.setdefault(self.results_root, FakeBackend(
            self.results_root, verify_ok=self.verify_ok, outcome=self.outcome, exit_code=3,
            polls_until_done=self.polls_until_done, fail_submits=self.fail_submits,
            results={"checkpoint_epoch_1.pth": b"weights", "status.json": b"{}", "scratch.tmp": b"x",
                     ".tao/state.json": b"{}"}))
        cluster.stages_on_host = self.stages_on_host
        return cluster


def name() -> str:
    return f"t{next(_names)}-{os.getpid()}"


def fake_target(tmp_path: Path, **behaviour: Any) -> str:
    """Save a fake target block for this test; returns ``tao-fake-target/<name>``."""
    block = name()
    FakeTarget(results_root=str(tmp_path / "fake-results"), staging_root=str(tmp_path / "work"),
               **behaviour).save(block)
    return f"tao-fake-target/{block}"


def records_block(root: Path) -> str:
    block = name()
    JobRecords(location=str(root)).save(block)
    return f"tao-job-records/{block}"


def local_target(tmp_path: Path, sub: str = "local") -> str:
    """Save a local target block (run root ``tmp_path/<sub>``) for this test; returns ``tao-local-target/<name>``."""
    block = name()
    staging = tmp_path / ("work" if sub == "local" else f"work-{sub}")
    LocalTarget(settings=LocalSettings(run_root=str(tmp_path / sub)), staging_root=str(staging)).save(block)
    return f"tao-local-target/{block}"


def fake_request(bucket: str, job_id: str, **fields: Any) -> dict[str, Any]:
    """Config mode: a declared folder and a spec file (two inputs), and the config."""
    return {"schema_version": "1", "job_id": job_id, "image": "tao:6", "mode": "config", "config_format": "yaml",
            "command": "dino train -e {config_path}",
            "spec": {"train": {"epochs": 1, "pretrained_model_path": f"s3://{bucket}/models/model.bin"}},
            "inputs": [{"source": f"s3://{bucket}/data/", "kind": "folder", "target": "/data"}],
            "outputs": {"results_dir": "/results", "upload_excludes": ["*.tmp"]}, **fields}


def stand_in_request(bucket: str, job_id: str, **fields: Any) -> dict[str, Any]:
    """The training stand-in in the local frame, reading a staged folder and a staged file."""
    return {"schema_version": "1", "job_id": job_id, "image": "nvcr.io/nvidia/tao/tao-toolkit:6.0.0-pyt",
            "mode": "config", "config_format": "yaml", "command": "sh /stand-in/train.sh -e {config_path}",
            "spec": {"train": {"num_epochs": 1, "pretrained_model_path": f"s3://{bucket}/models/model.bin"}},
            "inputs": [{"source": f"s3://{bucket}/data/", "kind": "folder", "target": "/data"}],
            "mounts": [{"source": str(REPO / "examples" / "stand_in"), "target": "/stand-in"}],
            "environment": {"EPOCHS": "1", "EPOCH_SECONDS": "0",
                            "TRAIN_INPUTS": f"/data:/tao-inputs/s3/{bucket}/models/model.bin"},
            "outputs": {"results_dir": "/results"}, **fields}


def task_runs(state: State, *names: str) -> dict[str, TaskRun]:
    """The flow run's task runs by name, once every one of ``names`` is recorded (the server
    records task runs from events, a moment after the flow returns)."""
    flow_run_id = state.state_details.flow_run_id

    def read() -> dict[str, TaskRun] | None:
        with get_client(sync_client=True) as client:
            runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
        found = {run.name: run for run in runs}
        return found if set(names) <= set(found) and all(found[n].state and found[n].state.is_final()
                                                           for n in names) else None

    return wait_for(f"task runs {names}", read)


def artifacts(state: State) -> list[Artifact]:
    with get_client(sync_client=True) as client:
        return client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[state.state_details.flow_run_id])))


def by_key(found: list[Artifact], key: str) -> Artifact:
    return next(artifact for artifact in found if artifact.key == key)


def results_keys(s3_client: Any, bucket: str, job_id: str) -> set[str]:
    listed = s3_client.list_objects_v2(Bucket=bucket, Prefix=f"results/{job_id}/").get("Contents", [])
    return {item["Key"].removeprefix(f"results/{job_id}/") for item in listed}


def deployed(flow: Flow[..., Any]) -> UUID:
    """``flow`` as a deployment of its own (no worker: what matters is what the server accepts),
    its parameter schema closed as ``python -m deployments.schemas`` closes it after a deploy."""
    from deployments.schemas import close_parameter_schemas

    deployment_id = flow.to_deployment(name=f"deployed-{name()}").apply()
    close_parameter_schemas([deployment_id])
    return deployment_id
