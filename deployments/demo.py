"""The main job, ``make demo``: a real TAO-shaped job through Prefect, on this machine.

1. S3: the one you exported (``AWS_ENDPOINT_URL``, credentials and ``S3_BUCKET_NAME``), else the
   embedded server (SeaweedFS on 127.0.0.1, random credentials) with bucket ``tao-demo``;
2. a small dataset in it (PNG images, a parquet annotation, a calibration tar.gz) and a tiny
   model on a model hub stand-in (``HF_ENDPOINT``), see :mod:`deployments.dataset`;
3. Prefect's server (SQLite under ``.demo/prefect``, UI on), the ``tao-local`` process pool, the
   blocks (:mod:`deployments.blocks`: the local target, job records in the bucket, credential
   blocks that name variables), a worker, ``prefect deploy --all`` and its parameter schemas closed
   (:mod:`deployments.schemas`);
4. ``prefect deployment run submit-tao-job/local -p request_path=.demo/request.yaml`` — a config-mode
   request whose command is the training stand-in (``examples/stand_in/train.sh``, mounted into
   the local frame) — then ``collect-tao-job/local-collect``;
5. the job's record, where its results are, what was left out, and the UI's address.

Everything it starts it stops, unless ``--keep`` (``KEEP=1 make demo``): then it says how to stop
(``make demo-stop``). Credentials live only in the environment of the worker and its flow runs.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from uuid import UUID

import yaml

from deployments.dataset import MODEL_REPO, PREFIX, build
from deployments.server import LOGO_PATH
from deployments.stack import Service, Stack, free_port
from tao_data_io.credentials import S3Credentials, s3_credentials_from_env
from tao_data_io.redaction import is_secret_name
from tao_data_io.embedded.s3 import EmbeddedS3
from tao_data_io.records import JobRecord, RecordStore
from tao_data_io.reporting import human_size
from tao_data_io.request import parse_request
from tao_data_io.staging.layout import plan_inputs
from tao_data_io.transfer.engine import TransferEngine
from tao_data_io.transfer.options import TransferOptions
from tao_data_io.uris import parse_s3_url
from tao_data_io.vocabulary import ALWAYS_EXCLUDED, LOGO_URL_VARIABLE

CHECKOUT = Path(__file__).resolve().parents[1]
DEMO = CHECKOUT / ".demo"
EMBEDDED_BUCKET = "tao-demo"
POOL = "tao-local"
RECORDS_PREFIX = "tao-data-io/jobs/"


class Clock:
    def __init__(self) -> None:
        self.started = time.monotonic()

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:5.1f}s] {text}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deployments.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", action="store_true", help="leave the stack running (make demo-stop ends it)")
    parser.add_argument("--stop", action="store_true", help="stop what a --keep run left running")
    args = parser.parse_args(argv)
    stack = Stack(DEMO)
    if args.stop:
        print("\n".join(f"stopped {what}" for what in stack.stop()) or "nothing of the demo is running")
        return 0
    if stack.services():
        stack.stop()  # a previous --keep run
    shutil.rmtree(DEMO, ignore_errors=True)
    DEMO.mkdir(parents=True)
    clock = Clock()
    try:
        ok = run_demo(stack, clock)
    finally:
        if args.keep:
            print(f"\nThe stack is still running (KEEP=1). Talk to it from a shell: source {DEMO / 'prefect.env'}  "
                  f"(then .venv/bin/prefect deployment ls). Stop it with: make demo-stop   (logs: {DEMO}/*.log)")
        else:
            clock.say("stopped everything the demo started: " + ", ".join(stack.stop()))
    return 0 if ok else 1


def run_demo(stack: Stack, clock: Clock) -> bool:
    credentials, bucket = s3(stack, clock)
    local_tree, model = build(DEMO / "dataset")
    with TransferEngine(credentials) as engine:
        summary = engine.upload_directory(local_tree, parse_s3_url(f"s3://{bucket}/"), TransferOptions())
    clock.say(f"dataset in s3://{bucket}/{PREFIX}/: {summary.transferred_files} files uploaded "
              f"({human_size(summary.transferred_bytes)}), {summary.unchanged_files} already there")
    hub = stack.start_model_hub(without_credentials(os.environ), {MODEL_REPO: model})
    clock.say(f"model hub stand-in on {hub} serving hf://{MODEL_REPO}")

    port = free_port()
    env = worker_environment(credentials, bucket, hub, port)
    os.environ.update({name: value for name, value in env.items() if name.startswith("PREFECT_")})
    api = stack.start_prefect_server(without_credentials(env), port)  # only the worker reads credentials
    clock.say(f"Prefect server on {api} (SQLite in {DEMO / 'prefect'}; UI on)")
    # What a shell needs to talk to this server (KEEP=1): without it, `prefect deployment ls`
    # silently starts a server of its own on the same SQLite file and lists nothing.
    (DEMO / "prefect.env").write_text("".join(f"export {name}={env[name]}\n" for name in PREFECT_SHELL))
    prepare_prefect(bucket, env)
    clock.say(f"work pool {POOL!r}; block types registered; blocks saved: tao-local-target/local, "
              f"tao-docker-target/docker, tao-slurm-target/slurm, tao-job-records/local "
              f"(s3://{bucket}/{RECORDS_PREFIX}), "
              "the default credential blocks (names only)")
    stack.start_worker(env, POOL, CHECKOUT)
    clock.say("worker started (it polls every second)")
    if prefect(clock, env, "deploy", "--all", "--no-prompt", summary=_deployed).returncode != 0:
        return False
    from deployments.schemas import close_parameter_schemas

    said = close_parameter_schemas()
    clock.say(f"{len(said)} deployments' parameters settled (python -m deployments.schemas): schemas closed, "
              "block defaults picked by id, so the run form opens on each block's picker")
    for line in said:
        if "not saved" in line or "does not enforce" in line:
            clock.say(f"  {line}")

    job_id = f"demo-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}"
    request = DEMO / "request.yaml"
    request.write_text(yaml.safe_dump(demo_request(job_id, bucket), sort_keys=False))
    ran = run_deployment(clock, env, "submit-tao-job/local", f"request_path={request.relative_to(CHECKOUT)}")
    if ran:
        ran = run_deployment(clock, env, "collect-tao-job/local-collect", f"job_id={job_id}", "poll_seconds=1")
    report(job_id, bucket, credentials, api, clock)
    return ran


def s3(stack: Stack, clock: Clock) -> tuple[S3Credentials, str]:
    """The user's S3 when they exported it, else the embedded server (left running for the stack)."""
    if os.environ.get("AWS_ENDPOINT_URL") and os.environ.get("S3_BUCKET_NAME"):
        credentials = s3_credentials_from_env()
        bucket = os.environ["S3_BUCKET_NAME"]
        clock.say(f"using your S3 at {credentials.endpoint_url}, bucket s3://{bucket}/")
        return credentials, bucket
    server = EmbeddedS3(DEMO / "s3").start()
    assert server.pid is not None
    stack.remember(Service("s3", server.pid, "weed", str(DEMO / "s3" / "weed.log")))
    server.create_bucket(EMBEDDED_BUCKET)
    clock.say(f"embedded S3 (SeaweedFS) on {server.endpoint_url}, bucket s3://{EMBEDDED_BUCKET}/")
    return server.credentials, EMBEDDED_BUCKET


def without_credentials(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` less every variable named like a credential: what a service that reads no
    credential (Prefect's server, the model hub stand-in) is started with."""
    return {name: value for name, value in env.items() if not is_secret_name(name)}


#: The settings a user's shell needs to reach the demo's Prefect server.
PREFECT_SHELL = ("PREFECT_API_URL", "PREFECT_HOME")


def worker_environment(credentials: S3Credentials, bucket: str, hub: str, port: int) -> dict[str, str]:
    """What the Prefect server, the worker and so every flow run see: the S3 settings and
    credentials (by value, in the environment only), the results bucket, the hub stand-in."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("PREFECT_")}
    env.update({name: value for name, value in credentials.child_env(os.environ).items() if name.startswith("AWS_")})
    env.update({
        "S3_BUCKET_NAME": bucket, "HF_ENDPOINT": hub, "HF_HOME": str(DEMO / "hf-home"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "PREFECT_HOME": str(DEMO / "prefect"), "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_SERVER_UI_SHOW_PROMOTIONAL_CONTENT": "false",
        "PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_WORKER_PREFETCH_SECONDS": "5",
        "PREFECT_CLI_PROMPT": "false",
        # Served by the demo's Prefect server (deployments.server), so the UI shows it offline.
        LOGO_URL_VARIABLE: f"http://127.0.0.1:{port}{LOGO_PATH}",
    })
    return env


def prepare_prefect(bucket: str, env: Mapping[str, str]) -> None:
    """The work pool, through the API (what ``prefect work-pool create`` does), and the blocks."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists
    from prefect.workers.process import ProcessWorker

    with get_client(sync_client=True) as client:
        try:
            client.create_work_pool(WorkPoolCreate(name=POOL, type="process",
                                                   base_job_template=ProcessWorker.get_default_base_job_template()))
        except ObjectAlreadyExists:
            pass
    save_blocks(env, records=f"s3://{bucket}/{RECORDS_PREFIX}", run_root=DEMO / "local", staging_root=DEMO / "work")


def save_blocks(env: Mapping[str, str], *, records: str, run_root: Path, staging_root: Path) -> None:
    """Register the block types and save the deployments' blocks, replacing those of an earlier
    run: ``python -m deployments.blocks``, as a user runs it, in a process of its own so that the
    block types are registered with the logo URL ``env`` names (read where the blocks are
    imported)."""
    argv = [sys.executable, "-m", "deployments.blocks", "--records", records, "--run-root", str(run_root),
            "--staging-root", str(staging_root), "--overwrite"]
    done = subprocess.run(argv, env=without_credentials(env), cwd=CHECKOUT, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"python -m deployments.blocks failed:\n{(done.stdout + done.stderr)[-3000:]}")


def prefect(clock: Clock, env: Mapping[str, str], *args: str,
            summary: Callable[[str], str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a ``prefect`` command as a user types it, in the checkout, and show what it says — or,
    when it succeeded and ``summary`` is given, only that of it (``prefect deploy --all`` draws a
    dozen lines of boxes per deployment)."""
    clock.say("$ prefect " + " ".join(args))
    done = subprocess.run([sys.executable, "-m", "prefect", *args], env=dict(env), cwd=CHECKOUT,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True)
    said = (done.stdout + done.stderr).strip()
    print(textwrap.indent(summary(said) if summary is not None and done.returncode == 0 else said, "    "), flush=True)
    return done


def _deployed(said: str) -> str:
    """What ``prefect deploy --all`` made, one line: the deployments it names as created or updated."""
    names = re.findall(r"Deployment '([^']+)' successfully (?:created|updated)", said)
    return f"deployed: {', '.join(names)}" if names else said


def run_deployment(clock: Clock, env: Mapping[str, str], deployment: str, *parameters: str) -> bool:
    """``prefect deployment run DEPLOYMENT -p …``, then follow the run's logs to its end."""
    done = prefect(clock, env, "deployment", "run", deployment, *(arg for p in parameters for arg in ("-p", p)))
    found = re.search(r"UUID: ([0-9a-f-]{36})", done.stdout)
    if done.returncode != 0 or found is None:
        return False
    state = follow(UUID(found[1]))
    clock.say(f"{deployment}: {state}")
    return state == "Completed"


def follow(flow_run_id: UUID, quiet_s: float = 1.5) -> str:
    """Print the flow run's logs as they arrive (task runs by name) until it has ended and its
    process has sent its last lines; return the final state's name."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.client.schemas.sorting import LogSort

    shown, ended_at = 0, None
    with get_client(sync_client=True) as client:
        while True:
            run = client.read_flow_run(flow_run_id)
            logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])),
                                    sort=LogSort.TIMESTAMP_ASC, offset=shown)
            for log in logs:
                if not (log.task_run_id and log.message.startswith("Finished in state Completed")):
                    where = client.read_task_run(log.task_run_id).name if log.task_run_id else run.name
                    print(f"    {log.timestamp:%H:%M:%S} {where}: {log.message}", flush=True)
            shown += len(logs)
            if run.state is not None and run.state.is_final():
                ended_at = ended_at or time.monotonic()
                if time.monotonic() - ended_at > quiet_s and not logs:
                    return run.state.name
            time.sleep(0.5)


def demo_request(job_id: str, bucket: str) -> dict[str, Any]:
    """A config-mode request: a folder (through the spec), an annotation-selective input, an
    archive and a model; the command is the training stand-in, which reads every input in full."""
    data = f"s3://{bucket}/{PREFIX}"
    request: dict[str, Any] = {
        "schema_version": "1", "job_id": job_id, "image": "nvcr.io/nvidia/tao/tao-toolkit:6.0.0-pyt",
        "command": "sh /stand-in/train.sh -e {config_path}", "mode": "config", "config_format": "yaml",
        "spec": {"dataset": {"train_data_sources": [{"image_dir": f"{data}/images/train/"}], "num_classes": 3},
                 "train": {"num_epochs": 2, "pretrained_model_path": f"hf://{MODEL_REPO}@main"}},
        "inputs": [
            {"source": f"{data}/images/val/", "kind": "selective", "annotation": f"{data}/annotations/val.parquet",
             "keys": ["file_name"], "target": "/data/val"},
            {"source": f"{data}/calibration.tar.gz", "kind": "archive", "strip_components": 1,
             "target": "/data/calib"},
        ],
        "mounts": [{"source": str(CHECKOUT / "examples" / "stand_in"), "target": "/stand-in"}],
        "outputs": {"results_dir": "/results", "upload_excludes": ["*.partial"]},
        # Sized for a laptop: the local frame's /dev/shm and /tmp are memory (docs/local-frame.md).
        "compute_shape": {"shm_size": "1Gi", "ephemeral_storage": "1Gi"},
    }
    reads = ":".join(planned.container_path for planned in plan_inputs(parse_request(request, environ={})))
    request["environment"] = {"EPOCHS": "2", "EPOCH_SECONDS": "1", "TRAIN_INPUTS": reads}
    return request


def report(job_id: str, bucket: str, credentials: S3Credentials, api: str, clock: Clock) -> None:
    """The record, the results, what was left out, and where to look in the UI."""
    env = {**os.environ, **credentials.child_env(os.environ)}
    store = RecordStore(f"s3://{bucket}/{RECORDS_PREFIX}", environ=env)
    record = store.get(job_id)
    clock.say(f"job {job_id}: {record.state}" + (f" ({record.message})" if record.message else ""))
    print(record_summary(record, store.storage.where(job_id)))
    if record.output_route is not None and record.output_route.route == "s3":
        route = parse_s3_url(record.output_route.destination)
        with TransferEngine(credentials) as engine:
            listed = engine.client.list_objects_v2(Bucket=route.bucket, Prefix=route.key).get("Contents", [])
        print(f"  results in {record.output_route.destination}:")
        for item in listed:
            print(f"      {item['Key'].removeprefix(route.key):<28} {human_size(int(item['Size']))}")
    ui = api.removesuffix("/api")
    print(f"  the Prefect UI: {ui}/runs  (flow runs submit-{job_id} and collect-{job_id}: task runs, "
          "progress, the staged-inputs table, the launch report, the results report)")


def _clipped(text: str, width: int = 96) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def record_summary(record: JobRecord, where: str) -> str:
    lines = [f"  record: {where}", "  history (each state, who said it, and why):"]
    lines += [f"      {entry.state:<9} {entry.reporter:<5} {_clipped(entry.message or '')}" for entry in record.history]
    lines.append(f"  tier {record.storage_tier}: {record.storage_reason}")
    if record.verify is not None:
        checks = record.verify.get("checks") or []
        passed = sum(1 for check in checks if isinstance(check, dict) and check.get("ok"))
        lines.append(f"  verify (inside the frame): {passed} of {len(checks)} checks passed")
    if record.output_route is not None:
        lines.append(f"  output route {record.output_route.route}: {record.output_route.reason}")
    for entry in record.uploads:
        rules = ", ".join([f"{ALWAYS_EXCLUDED} (always)", *(f"{p} (declared)" for p in record.upload_excludes)])
        lines.append(f"  {entry['by']} after {entry['job_state']}: {entry['uploaded_files']} files uploaded, "
                     f"{entry['excluded_files']} excluded by {rules}, {entry['failed_files']} failed")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
