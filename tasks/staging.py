"""The staging steps as tasks: one task run per input (its own progress, its own retries), the
config, and the staging map with a table of what moved.

Why per input: a 40 GiB dataset and a 200 MiB model are separate things to watch and to retry;
when the dataset's transfer hits a throttling storm, only it runs again — and the core's
``stage_input`` is idempotent, so the retry moves only what the failed attempt did not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import get_run_logger
from prefect.artifacts import create_table_artifact

from blocks.credentials import CredentialSet
from tao_data_io import steps
from tao_data_io.launch.backend import Backend
from tao_data_io.request import JobRequest
from tao_data_io.staging.layout import PlannedInput
from tao_data_io.staging.stage import publish_map, stage_config, stage_input
from tao_data_io.staging.stage_map import StagedSource, StagingMap
from tasks.policy import CLUSTER, QUICK, TRANSFER, step
from tasks.progress import ProgressArtifact
from tasks.reports import staged_rows


@step("stage-input", timeout_seconds=TRANSFER, task_run_name="stage-{job_id}-{planned[source]}")
def stage_one(planned: dict[str, Any], workdir: Path, credentials: CredentialSet, job_id: str) -> dict[str, Any]:
    """Stage one input under the job's workdir, showing its progress."""
    one = PlannedInput.model_validate(planned)
    with ProgressArtifact(f"staging {one.source} → {one.container_path}") as progress:
        staged = stage_input(one, workdir, environ=credentials.environ(), progress=progress.callback)
    get_run_logger().info("%s", staged.describe())
    return staged.to_dict()


@step("stage-config", timeout_seconds=QUICK, task_run_name="stage-config-{request[job_id]}")
def stage_job_config(request: dict[str, Any], workdir: Path) -> dict[str, Any]:
    """Materialize the config with every remote URI rewritten to where the job sees it."""
    staged = stage_config(JobRequest.model_validate(request), workdir)
    get_run_logger().info("%s", staged.describe())
    return staged.to_dict()


@step("publish-staging-map", timeout_seconds=QUICK, task_run_name="staging-map-{request[job_id]}")
def publish_staging_map(request: dict[str, Any], workdir: Path, sources: list[dict[str, Any]]) -> dict[str, Any]:
    """Write the staging map and show what was staged, as a table."""
    return _published(publish_map(JobRequest.model_validate(request), workdir,
                                  [StagedSource.model_validate(source) for source in sources]))


@step("plan-staging", timeout_seconds=CLUSTER, task_run_name="plan-staging-{request[job_id]}")
def plan_staging(request: dict[str, Any], backend: Backend, workdir: Path,
                 credentials: CredentialSet) -> dict[str, Any]:
    """For a backend that stages on the cluster: the map it will produce and the config, nothing moved."""
    return _published(steps.stage_inputs(JobRequest.model_validate(request), backend, workdir,
                                            environ=credentials.environ()))


def _published(staging_map: StagingMap) -> dict[str, Any]:
    create_table_artifact(staged_rows(staging_map.sources), key=f"staged-{staging_map.job_id}",
                          description=f"Inputs of job {staging_map.job_id}: {staging_map.describe()}")
    get_run_logger().info("%s", staging_map.describe())
    return staging_map.to_dict()
