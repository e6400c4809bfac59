"""What the Kubernetes tests share: a request, its plan and record as a test builds them, the stager
image they name, and the names the API server takes."""

from __future__ import annotations

import re
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any

from tao_data_io.launch.plan import LaunchPlan, build_plan
from tao_data_io.records import JobRecord, OutputRoute
from tao_data_io.request import JobRequest
from tao_data_io.staging.stage import plan_stage
from tao_data_io.tier import TierDecision

from . import helpers

S3_ROUTE = OutputRoute(route="s3", destination="s3://tao-results/results/{id}/", reason="S3_BUCKET_NAME is set")
STAGER = "registry.example.com/tao-data-io-stager:0.1.0"
#: A Service name: a DNS-1035 label, which begins with a letter.
DNS_1035 = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
#: Ids an earlier scheme gave one name: L's ConfigMap and Secret names, truncated to 52 with a
#: hash of L, were ``M-files`` and ``M2-credentials`` for these valid ids M and M2.
LONG_ID = "longjob-" + "a" * 44
ITS_FILES_BASE = "longjob-aaaaaaaaaaaaaaaaaaaaaaaaaaa-92fb6e432f"
ITS_CREDENTIALS_BASE = "longjob-aaaaaaaaaaaaaaaaaaaaa-92fb6e432f"


def record_for(job_id: str, tier: str, results_limit: str | None = None) -> JobRecord:
    now = datetime.now(timezone.utc)
    return JobRecord(job_id=job_id, backend="kubernetes", image="img", network_arch="dino", action="train",
                     storage_tier=tier, results_dir="/results", state="PENDING", created_at=now, updated_at=now,
                     results_limit=results_limit)


def plan_for(request: JobRequest, tmp_path: Path, tier: str, route: OutputRoute | None = None,
             environ: dict[str, str] | None = None) -> tuple[LaunchPlan, JobRecord]:
    job_id = request.job_id or "example-job"
    record = record_for(job_id, tier, request.outputs.results_limit)  # as records.from_request opens it
    staging_map = plan_stage(request, tmp_path / "plan", environ=environ or {})
    route = route or S3_ROUTE.model_copy(update={"destination": f"s3://tao-results/results/{job_id}/"})
    plan = build_plan(request, staging_map, TierDecision(tier=tier, reason="test"), record, route,
                      environ=environ or {})
    return plan, record


#: The job the renderer's tests start from: args mode, one S3 input, the S3 keys forwarded.
ARGS_JOB: dict[str, Any] = {"schema_version": "1", "job_id": "job-1", "image": "tao:6", "mode": "args",
                            "command": ["train"], "args": [], "inputs": [{"source": "s3://bkt-1/data/"}],
                            "forward_env": ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]}
#: tests/helpers.req over :data:`ARGS_JOB`.
req = partial(helpers.req, ARGS_JOB)
