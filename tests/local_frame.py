"""Shared by the local frame's tests: a plan as ``build_plan`` makes it (the training stand-in in
config mode, or a script in args mode, with a staged folder and a ``/control`` directory for
markers), and waiting for a local job's state."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import tao_data_io
from tao_data_io.launch.backend import JobStatus
from tao_data_io.launch.plan import LaunchPlan, build_plan
from tao_data_io.backends.local.backend import LocalBackend
from tao_data_io.records import JobRecord, OutputRoute
from tao_data_io.request import JobRequest
from tao_data_io.staging.stage_map import StagedSource, StagingMap
from tao_data_io.tier import TierDecision

from .helpers import wait_for

REPO = Path(__file__).resolve().parents[1]
STAND_IN = REPO / "examples" / "stand_in"
#: Where the supervisor imports tao-data-io from.
PACKAGE_ROOT = Path(tao_data_io.__file__).resolve().parents[1]
CONFIG = "/tao-action-config/spec.yaml"
DATA = "/tao-inputs/s3/bkt/data"
S3_ROUTE = OutputRoute(route="s3", destination="s3://bkt/results/job-1/", reason="S3_BUCKET_NAME is set")
#: sh that says, for each argument, whether that path exists in the frame.
VISIBILITY = 'for p in "$@"; do if [ -e "$p" ]; then echo "visible $p"; else echo "absent $p"; fi; done'


def make_plan(tmp_path: Path, job_id: str = "job-1", *, script: str | None = None, script_args: list[str] | None = None,
              command: list[str] | None = None, environment: dict[str, str] | None = None,
              mounts: list[dict[str, Any]] | None = None, forward_env: list[str] | None = None, nodes: int = 1,
              network: bool = False, route: OutputRoute = S3_ROUTE, environ: dict[str, str] | None = None,
              results_dir: str = "/results", shape: dict[str, Any] | None = None) -> LaunchPlan:
    """A plan as build_plan makes it: a staged folder (one file) under ``tmp_path/stage``; the
    stand-in in config mode by default, ``/bin/sh -c script`` or ``command`` in args mode; a
    read-write ``/control`` from ``tmp_path/control-<job id>`` for markers and hold files, which
    the job's user can write."""
    stage = tmp_path / "stage"
    (stage / "s3/bkt/data").mkdir(parents=True, exist_ok=True)
    (stage / "s3/bkt/data/part-0.bin").write_bytes(b"training bytes")
    control = tmp_path / f"control-{job_id}"
    control.mkdir(exist_ok=True)
    control.chmod(0o1777)  # a read-write mount: writable by the job's user, whoever that is
    sources = [StagedSource(source="s3://bkt/data/", kind="folder", sub_path="s3/bkt/data", container_path=DATA,
                            local_path=str(stage / "s3/bkt/data"), files=1, bytes=14)]
    fields: dict[str, Any]
    if script is None and command is None:
        (stage / "config").mkdir(exist_ok=True)
        (stage / "config/spec.yaml").write_text("train:\n  epochs: 1\n")
        sources.append(StagedSource(source="config:sha256:0", kind="config", sub_path="config/spec.yaml",
                                    container_path=CONFIG, local_path=str(stage / "config/spec.yaml"), files=1,
                                    bytes=20))
        fields = {"mode": "config", "command": "sh /stand-in/train.sh -e {config_path}", "config_format": "yaml",
                  "spec": {"train": {"epochs": 1}}}
        environment = {"EPOCHS": "1", "EPOCH_SECONDS": "0", "TRAIN_INPUTS": DATA, "MARKER_DIR": "/control",
                       **(environment or {})}
    else:
        fields = {"mode": "args", "command": command or ["/bin/sh", "-c"],
                  "args": [] if command else [script, "frame", *(script_args or [])]}
    request = JobRequest.model_validate({
        "schema_version": "1", "image": "nvcr.io/nvidia/tao/tao-toolkit:6.0.0-pyt", **fields,
        "environment": environment or {}, "forward_env": forward_env or [], "network": network,
        "outputs": {"results_dir": results_dir}, "inputs": [{"source": "s3://bkt/data/", "kind": "folder"}],
        "compute_shape": {"gpus": 1, "nodes": nodes, "shm_size": "64Mi", **(shape or {})},
        "mounts": [{"source": str(STAND_IN), "target": "/stand-in"},
                   {"source": str(control), "target": "/control", "read_only": False}, *(mounts or [])]})
    staging_map = StagingMap(job_id=job_id, staging_dir=str(stage), inputs_root="/tao-inputs", sources=sources)
    now = datetime.now(timezone.utc)
    record = JobRecord(job_id=job_id, backend="local", image=request.image, network_arch="stand-in", action="train",
                       storage_tier="B", results_dir=results_dir, state="PENDING", created_at=now, updated_at=now)
    return build_plan(request, staging_map, TierDecision(tier="B", reason="local"), record, route, environ=environ)


def control(tmp_path: Path, job_id: str = "job-1") -> Path:
    return tmp_path / f"control-{job_id}"


def wait_state(backend: LocalBackend, ref: str, *states: str) -> JobStatus:
    def reached() -> JobStatus | None:
        status = backend.status(ref)
        return status if status.state in states else None

    return wait_for(f"{ref} to be {'/'.join(states)} (last: {backend.status(ref).describe()})", reached)


def finished(backend: LocalBackend, ref: str) -> JobStatus:
    return wait_state(backend, ref, "COMPLETE", "ERROR", "CANCELED")
