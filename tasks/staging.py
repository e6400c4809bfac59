"""The staging steps as tasks: one task run per input (its own progress, its own retries), the
config, and the staging map with a table of what moved — or, when the cluster stages, its plan.

Why per input: a 40 GiB dataset and a 200 MiB model are separate things to watch and to retry;
when the dataset's transfer hits a throttling storm, only it runs again — and the core's
``stage_input`` is idempotent, so the retry moves only what the failed attempt did not.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from prefect import get_run_logger, runtime
from prefect.artifacts import create_table_artifact
from prefect.utilities.annotations import BaseAnnotation

from tao_data_io.reporting import ProgressCallback
from tao_data_io.request import JobRequest
from tao_data_io.staging import stage
from tao_data_io.staging.layout import PlannedInput
from tao_data_io.staging.stage_map import StagedSource, StagingMap
from tao_data_io.transfer.engine import TransferEngine
from tao_data_io.transfer.shard import Shard
from tasks.policy import CLUSTER, QUICK, TRANSFER, step
from tasks.progress import ProgressArtifact
from tasks.reports import staged_rows


def _input_run_name() -> str:
    """``stage-input-<job>-<source>``: the job is the staging directory's name (the parameters here are
    as passed, still wrapped by the runner's ``opaque``)."""
    parameters = {name: value.unwrap() if isinstance(value, BaseAnnotation) else value
                  for name, value in runtime.task_run.parameters.items()}
    return f"stage-input-{Path(parameters['staging_dir']).name}-{parameters['planned'].source}"


@step(timeout_seconds=TRANSFER, task_run_name=_input_run_name)
def stage_input(planned: PlannedInput, staging_dir: Path, *,
                engine: TransferEngine | Callable[[], TransferEngine] | None = None,
                environ: Mapping[str, str] | None = None, progress: ProgressCallback | None = None,
                shard: Shard | None = None) -> StagedSource:
    """Stage one input under the job's staging directory, showing its progress."""
    with ProgressArtifact(f"staging {planned.source} → {planned.container_path}") as shown:
        staged = stage.stage_input(planned, staging_dir, engine=engine, environ=environ, progress=shown.callback,
                                   shard=shard)
    get_run_logger().info("%s", staged.describe())
    return staged


@step(timeout_seconds=QUICK, task_run_name="stage-config-{request.job_id}")
def stage_config(request: JobRequest, staging_dir: Path, **options: Any) -> StagedSource:
    """Materialize the config with every remote URI rewritten to where the job sees it."""
    staged = stage.stage_config(request, staging_dir, **options)
    get_run_logger().info("%s", staged.describe())
    return staged


@step(timeout_seconds=QUICK, task_run_name="publish-map-{request.job_id}")
def publish_map(request: JobRequest, staging_dir: Path, sources: list[StagedSource], **options: Any) -> StagingMap:
    """Write the staging map and show what was staged, as a table."""
    return _shown(stage.publish_map(request, staging_dir, sources, **options))


@step(timeout_seconds=CLUSTER, task_run_name="plan-stage-{request.job_id}")
def plan_stage(request: JobRequest, staging_dir: Path, **options: Any) -> StagingMap:
    """For a backend that stages on the cluster: the map it will produce and the config, nothing moved."""
    return _shown(stage.plan_stage(request, staging_dir, **options))


def _shown(staging_map: StagingMap) -> StagingMap:
    create_table_artifact(staged_rows(staging_map.sources), key=f"staged-{staging_map.job_id}",
                          description=f"Inputs of job {staging_map.job_id}: {staging_map.describe()}")
    get_run_logger().info("%s", staging_map.describe())
    return staging_map
