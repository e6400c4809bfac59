"""The flows against the session's Prefect test server, with the embedded S3 server and either
the fake backend (a cluster that remembers its jobs across flow runs) or the real local frame.

What they prove: submit stages each input in a task run of its own with progress, a table and
a launch report; a verify failure fails the flow before the command starts; a failed job's
results are still uploaded and the collect flow fails with the analysis; transient faults (503s
from a proxy in front of S3, a flaky backend API) are retried by the task and the flow succeeds;
bad input fails at once; overlapping resyncs are safe; and the CLI's composition and the flows
end with the same record.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

from bench.latency_proxy import LatencyProxy
from flows import common
from flows.collect import collect_tao_job
from flows.resync import resync_tao_outputs
from flows.submit import submit_tao_job
from tao_data_io.embedded.s3 import EmbeddedS3
from tao_data_io.backends.local.backend import LocalBackend
from tao_data_io.runner import Runner, direct
from tao_data_io.verbs import collect, resync, submit
from tasks.runner import prefect_runner
from tao_data_io.backends.local.settings import LocalSettings
from tao_data_io.records import JobRecord, RecordStore
from tao_data_io.request import parse_request
from tao_data_io import steps

from .fake_backend import FakeBackend
from .flow_helpers import (REPO, artifacts, by_key, fake_request, fake_target, local_target, name, records_block,
                           results_keys, stand_in_request, task_runs)
from .helpers import args_request, wait_for

pytestmark = pytest.mark.usefixtures("prefect_harness")

T = TypeVar("T")


# ----------------------------------------------------------------------------- the fake backend
def test_submit_stages_each_input_in_its_own_task_run_and_collect_uploads(env: dict[str, str], bucket: str,
                                                                         s3_client: Any, tmp_path: Path) -> None:
    target, records = fake_target(tmp_path), records_block(tmp_path / "jobs")
    state = submit_tao_job(fake_request(bucket, "job-ok"), target=target, records=records, return_state=True)
    assert state.is_completed(), state.message
    assert state.result() == {"job_id": "job-ok", "backend_ref": "fake/job-ok", "tier": "B", "started": True,
                              "verified_checks": 4}
    folder, model = f"stage-input-job-ok-s3://{bucket}/data/", f"stage-input-job-ok-s3://{bucket}/models/model.bin"
    runs = task_runs(state, folder, model, "stage-config-job-ok", "open-record-job-ok", "decide-tier-job-ok",
                     "publish-map-job-ok", "route-outputs-job-ok", "start-job-ok", "confirm-job-ok")
    assert all(run.state is not None and run.state.is_completed() and run.run_count == 1 for run in runs.values())
    found = artifacts(state)
    progress = sorted((a.description or "", a.data) for a in found if a.type == "progress")
    assert progress == [(f"staging s3://{bucket}/data/ → /data: 3 of 3 files, 6.0 KiB of 6.0 KiB", 100.0),
                        (f"staging s3://{bucket}/models/model.bin → /tao-inputs/s3/{bucket}/models/model.bin: "
                         "1 of 1 files, 13 B of 13 B", 100.0)]
    table = by_key(found, "staged-job-ok")
    assert [row["kind"] for row in json.loads(str(table.data))] == ["folder", "file", "config"]
    assert "**Storage tier B**" in str(by_key(found, "launch-job-ok").data)
    record = RecordStore(tmp_path / "jobs").get("job-ok")
    assert (record.state, record.storage_tier, record.history[-1].reporter) == ("RUNNING", "B", "flow")

    state = collect_tao_job("job-ok", target=target, records=records, poll_seconds=0.05, return_state=True)
    assert state.is_completed(), state.message
    assert state.result()["state"] == "COMPLETE"
    assert results_keys(s3_client, bucket, "job-ok") == {"checkpoint_epoch_1.pth", "status.json"}
    report = str(by_key(artifacts(state), "results-job-ok").data)
    assert "2 excluded" in report and "`*.tmp` (the request's upload_excludes)" in report
    record = RecordStore(tmp_path / "jobs").get("job-ok")
    assert record.state == "COMPLETE" and record.uploads[-1]["final"] is True


def test_a_cluster_that_stages_itself_gets_a_planned_staging_map(env: dict[str, str], bucket: str,
                                                                  tmp_path: Path) -> None:
    target, records = fake_target(tmp_path, stages_on_host=False), records_block(tmp_path / "jobs")
    state = submit_tao_job(fake_request(bucket, "job-planned"), target=target, records=records, return_state=True)
    assert state.is_completed(), state.message
    runs = task_runs(state, "plan-stage-job-planned", "start-job-planned")
    assert not any(name.startswith("stage-input-job-planned-") for name in runs)  # nothing staged here
    rows = json.loads(str(by_key(artifacts(state), "staged-job-planned").data))
    assert [row["moved"] for row in rows][:2] == ["planned: staged on the cluster"] * 2
    assert rows[2]["kind"] == "config" and str(rows[2]["moved"]).startswith("moved 1 files")  # the config, here
    assert not (tmp_path / "work" / "job-planned" / "s3").exists()


def test_a_verify_failure_fails_the_flow_before_the_command_starts(env: dict[str, str], bucket: str,
                                                                   tmp_path: Path) -> None:
    target, records = fake_target(tmp_path, verify_ok=False), records_block(tmp_path / "jobs")
    state = submit_tao_job(fake_request(bucket, "job-unverified"), target=target, records=records,
                           return_state=True)
    assert state.is_failed() and "verify failed inside the frame" in str(state.message)
    assert task_runs(state, "confirm-job-unverified")["confirm-job-unverified"].run_count == 1  # not retried
    report = str(by_key(artifacts(state), "launch-job-unverified").data)
    assert "NOT STARTED: verify failed" in report and "- **FAIL** `/data` " in report
    record = RecordStore(tmp_path / "jobs").get("job-unverified")
    assert record.state == "ERROR" and record.verify is not None and record.verify["ok"] is False
    assert not (tmp_path / "fake-results" / "job-unverified").exists()  # the command never ran


def test_a_failed_job_still_uploads_and_the_collect_flow_fails_with_the_analysis(env: dict[str, str], bucket: str,
                                                                                  s3_client: Any,
                                                                                  tmp_path: Path) -> None:
    target, records = fake_target(tmp_path, outcome="ERROR"), records_block(tmp_path / "jobs")
    assert submit_tao_job(fake_request(bucket, "job-bad"), target=target, records=records, return_state=True
                          ).is_completed()
    state = collect_tao_job("job-bad", target=target, records=records, poll_seconds=0.05, return_state=True)
    assert state.is_failed()
    assert ("job job-bad ended ERROR: ERR_PROGRAM: the command exited 3 — read the last lines of the log; its "
            f"results were uploaded to s3://{bucket}/results/job-bad/") in str(state.message)
    assert results_keys(s3_client, bucket, "job-bad") == {"checkpoint_epoch_1.pth", "status.json"}
    found = artifacts(state)
    assert "fake log line 5" in str(by_key(found, "failure-job-bad").data)
    assert "uploaded 2 files" in str(by_key(found, "results-job-bad").data)
    record = RecordStore(tmp_path / "jobs").get("job-bad")
    assert record.state == "ERROR" and record.uploads[-1]["job_state"] == "ERROR"


def test_transient_faults_are_retried_by_the_task_and_the_flow_succeeds(env: dict[str, str], bucket: str,
                                                                         s3_server: EmbeddedS3, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Two 503s from a proxy in front of S3 (each client tries once: AWS_MAX_ATTEMPTS=1, so the
    fault reaches the task), and a backend API that fails the first submit with a 503."""
    target, records = fake_target(tmp_path, fail_submits=1), records_block(tmp_path / "jobs")
    request = {**fake_request(bucket, "job-flaky"), "spec": {"train": {"epochs": 1}}}  # one input: the folder
    with LatencyProxy("127.0.0.1", s3_server.port, delay_s=0, fail_first=2) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{proxy.port}")
        monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
        state = submit_tao_job(request, target=target, records=records, return_state=True)
        assert proxy.failed == 2
    assert state.is_completed(), state.message
    folder = f"stage-input-job-flaky-s3://{bucket}/data/"
    runs = task_runs(state, folder, "start-job-flaky")
    assert runs[folder].run_count >= 2 and runs["start-job-flaky"].run_count == 2
    assert len(list((tmp_path / "work" / "job-flaky" / "s3" / bucket / "data").iterdir())) == 3


def test_a_non_retryable_error_fails_at_once(env: dict[str, str], bucket: str, tmp_path: Path) -> None:
    target, records = fake_target(tmp_path), records_block(tmp_path / "jobs")
    request = {**fake_request(bucket, "job-missing"), "spec": {"train": {"epochs": 1}},
               "inputs": [{"source": f"s3://{bucket}/no-such.bin", "kind": "file", "target": "/data/x.bin"}]}
    state = submit_tao_job(request, target=target, records=records, return_state=True)
    assert state.is_failed() and "does not exist (404)" in str(state.message)
    name_ = f"stage-input-job-missing-s3://{bucket}/no-such.bin"
    assert task_runs(state, name_)[name_].run_count == 1
    record = RecordStore(tmp_path / "jobs").get("job-missing")  # ERROR and why; a fixed request can rerun it
    assert record.state == "ERROR" and "does not exist (404)" in (record.message or "")


def test_overlapping_resyncs_are_safe(env: dict[str, str], bucket: str, s3_client: Any, tmp_path: Path) -> None:
    target, records = fake_target(tmp_path, polls_until_done=10**6), records_block(tmp_path / "jobs")
    assert submit_tao_job(fake_request(bucket, "job-long"), target=target, records=records, return_state=True
                          ).is_completed()
    results = tmp_path / "fake-results" / "job-long"
    for index in range(200):
        (results / "checkpoints").mkdir(parents=True, exist_ok=True)
        (results / "checkpoints" / f"step-{index:04d}.pth").write_bytes(os.urandom(512))
    (results / ".tao").mkdir()
    (results / ".tao" / "state.json").write_text("{}")
    store = RecordStore(tmp_path / "jobs")

    with store.upload_lock("job-long", wait=True):  # another upload of the job is running
        held = resync_tao_outputs(target=target, records=records, settle_seconds=0)
    assert held["jobs"] == 1 and held["outcomes"]["job-long"]["status"] == "busy"

    outcomes: list[dict[str, Any]] = []
    runs = [threading.Thread(target=lambda: outcomes.append(resync_tao_outputs(target=target, records=records,
                                                                              settle_seconds=0)))
            for _ in range(2)]
    for run in runs:
        run.start()
    for run in runs:
        run.join()
    assert sorted(outcome["outcomes"]["job-long"]["status"] for outcome in outcomes) in (
        ["busy", "uploaded"], ["uploaded", "uploaded"])
    assert len(results_keys(s3_client, bucket, "job-long")) == 200  # every checkpoint, never .tao/
    again = resync_tao_outputs(target=target, records=records, settle_seconds=0)["outcomes"]["job-long"]
    assert again["summary"]["transferred_files"] == 0 and again["summary"]["unchanged_files"] == 200
    entries = store.get("job-long").uploads
    assert sum(entry["uploaded_files"] for entry in entries) == 200  # each file uploaded once


def test_a_collect_of_a_job_that_never_launched_or_has_not_ended_is_not_completed(
        env: dict[str, str], bucket: str, tmp_path: Path) -> None:
    """A green collect means the job ended and its results were collected. A submit that failed
    on a missing input, and a job still running when the wait gave up, fail the collect with the
    reason (the job keeps running: collect again later)."""
    target, records = fake_target(tmp_path, polls_until_done=10**6), records_block(tmp_path / "jobs")
    missing = fake_request(bucket, "never-launched", inputs=[{"source": f"s3://{bucket}/nothing/", "kind": "folder",
                                                               "target": "/data"}])
    assert submit_tao_job(missing, target=target, records=records, return_state=True).is_failed()
    assert RecordStore(tmp_path / "jobs").get("never-launched").state == "ERROR"
    state = collect_tao_job("never-launched", target=target, records=records, poll_seconds=0.01, return_state=True)
    assert state.is_failed() and "holds no object" in str(state.message), state.message

    assert submit_tao_job(fake_request(bucket, "still-running"), target=target, records=records,
                          return_state=True).is_completed()
    state = collect_tao_job("still-running", target=target, records=records, poll_seconds=0.01,
                            max_wait_seconds=0.2, return_state=True)
    assert state.is_failed(), state.message
    assert "still RUNNING" in str(state.message) and "collect again later" in str(state.message)
    assert RecordStore(tmp_path / "jobs").get("still-running").state == "RUNNING"


# ----------------------------------------------------------------------------- one composition
class Recording:
    """A runner that notes each step's name, then runs it with ``inner``."""

    def __init__(self, inner: Runner) -> None:
        self.inner = inner
        self.steps: list[str] = []

    def __call__(self, step: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        self.steps.append(f"{step.__module__}.{step.__qualname__}")
        return self.inner(step, *args, **kwargs)


def test_the_flows_run_the_verbs_steps_each_as_its_task(env: dict[str, str], bucket: str, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's verbs (run directly) and the flows (the same verbs, with the Prefect runner) run the
    same steps in the same order — and in a flow, every step is a task run of its own."""
    direct_run = Recording(direct)
    fake = FakeBackend(tmp_path / "cli-results", results={"checkpoint_epoch_1.pth": b"w"})
    fake.stages_on_host = True
    store = RecordStore(tmp_path / "cli-jobs")
    submit(parse_request(fake_request(bucket, "steps-cli")), fake, store, staging_root=tmp_path / "cli-work",
           owner="a-watcher", run=direct_run)  # a flow is its job's owner
    collect("steps-cli", fake, store, poll_seconds=0.01, owner="a-watcher", run=direct_run)
    resync(store, fake, run=direct_run)

    flow_run = Recording(prefect_runner)
    monkeypatch.setattr(common, "RUN", flow_run)
    target, records = fake_target(tmp_path), records_block(tmp_path / "jobs")
    states = [submit_tao_job(fake_request(bucket, "steps-flow"), target=target, records=records, return_state=True),
              collect_tao_job("steps-flow", target=target, records=records, poll_seconds=0.01, return_state=True),
              resync_tao_outputs(target=target, records=records, return_state=True)]
    assert all(state.is_completed() for state in states), [state.message for state in states]

    assert flow_run.steps == direct_run.steps
    assert "tao_data_io.staging.stage.stage_input" in flow_run.steps and "tao_data_io.steps.confirm" in flow_run.steps
    with get_client(sync_client=True) as client:
        ran = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(
            any_=[state.state_details.flow_run_id for state in states])))
    # The collect flow reads the record for its log mask before the verb starts: one task more.
    assert len(ran) == len(flow_run.steps) + 1
    # The graph's edges are what each step got from another: stage ∥ stage → map → plan → start → confirm.
    by_name = {run.name: run for run in ran}

    def upstream(name: str, parameter: str) -> set[str]:
        ids = {item.id for item in by_name[name].task_inputs[parameter]}
        return {run.name for run in ran if run.id in ids}

    staged = {f"stage-input-steps-flow-s3://{bucket}/data/", f"stage-input-steps-flow-s3://{bucket}/models/model.bin"}
    assert upstream("publish-map-steps-flow", "sources") == staged | {"stage-config-steps-flow"}
    assert upstream("build-plan-steps-flow", "staging_map") == {"publish-map-steps-flow"}
    assert upstream("start-steps-flow", "plan") == {"build-plan-steps-flow"}
    assert upstream("confirm-steps-flow", "submission") == {"start-steps-flow"}


def test_no_link_to_a_task_survives_that_prefect_cannot_verify(prefect_harness: None, tmp_path: Path) -> None:
    """Prefect links a result's fields to their task by ``id()``; a freed list's address reused by
    another task's argument would draw an edge from the wrong task. After each step only the
    links Prefect can verify (weak references to whole results) are left, and those still draw
    the edge to the step that made the argument."""
    from prefect import flow
    from prefect.context import FlowRunContext

    store = RecordStore(str(tmp_path / "jobs"))
    unverified: list[int] = []

    @flow
    def reads() -> None:
        request = parse_request(args_request(job_id="linked"))
        record = prefect_runner(steps.open_record, request, FakeBackend(str(tmp_path / "r")), store, reporter="test")
        links = FlowRunContext.get().run_results
        unverified.append(sum(1 for entry in links.values() if entry[2] is None))
        assert links[id(record)][2]() is record  # the whole result: linked, and checked

    reads()
    assert unverified == [0]


def test_a_step_without_a_task_is_refused_by_name() -> None:
    def unwrapped_step() -> None:
        """A step a verb might gain without its task."""

    with pytest.raises(TypeError, match="unwrapped_step has no task in tasks.runner.TASKS"):
        prefect_runner(unwrapped_step)


# ----------------------------------------------------------------------------- the local frame
def normalized(record: JobRecord, root: Path) -> dict[str, Any]:
    """A record with what must differ between two runs of one request taken out: the job id, times
    (of its changes, uploads and attempts),
    who wrote each change, who watches the job and how far its log was followed (a flow does both),
    the directory each composition ran
    in, and the backend's own settings (the local target allows no network by default, the CLI's
    backend does)."""
    text = (record.model_dump_json().replace(record.claimant(), "job-x@created").replace(record.job_id, "job-x")
            .replace(str(root), "/root-of-the-run"))
    data = JobRecord.model_validate_json(text).model_dump(mode="json")
    for varying in ("created_at", "updated_at", "backend_config", "owner", "log_cursor"):
        data.pop(varying)
    data["history"] = [(entry["state"], entry["message"]) for entry in data["history"]]
    for entry in data["uploads"]:
        for varying in ("at", "started_at", "results_dir"):
            entry.pop(varying)
    for attempt in data["attempts"]:
        attempt.pop("started_at"), attempt.pop("ended_at")
    return data


def test_the_cli_pipeline_and_the_flows_end_with_equivalent_records(env: dict[str, str], bucket: str,
                                                                     sandbox: None, tmp_path: Path) -> None:
    cli, flow = tmp_path / "cli", tmp_path / "flow"
    cli_store, cli_backend = RecordStore(cli / "jobs"), LocalBackend(LocalSettings(run_root=str(cli / "local")))
    submit(parse_request(stand_in_request(bucket, "same-cli")), cli_backend, cli_store, staging_root=cli / "work")
    assert collect("same-cli", cli_backend, cli_store, poll_seconds=0.05).state == "COMPLETE"

    target, records = local_target(flow), records_block(flow / "jobs")
    assert submit_tao_job(stand_in_request(bucket, "same-flow"), target=target, records=records,
                          return_state=True).is_completed()
    state = collect_tao_job("same-flow", target=target, records=records, poll_seconds=0.05, return_state=True)
    assert state.is_completed(), state.message

    from_cli, from_flows = cli_store.get("same-cli"), RecordStore(flow / "jobs").get("same-flow")
    assert from_cli.state == from_flows.state == "COMPLETE"
    assert {entry.reporter for entry in from_cli.history} == {"cli"}
    assert {entry.reporter for entry in from_flows.history} == {"flow"}
    assert normalized(from_cli, cli) == normalized(from_flows, flow)


def test_no_secret_reaches_prefect_or_the_record_store(env: dict[str, str], bucket: str, sandbox: None,
                                                       tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Flows run with credentials the job forwards and a job that prints one; then every place
    Prefect keeps things is searched for every value."""
    secrets = {"HF_TOKEN": f"hf_{os.urandom(12).hex()}", "NGC_KEY": f"nvapi-{os.urandom(12).hex()}"}
    for variable, value in secrets.items():
        monkeypatch.setenv(variable, value)
    secrets.update({name_: env[name_] for name_ in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")})
    forward = sorted(secrets)
    target, records = local_target(tmp_path), records_block(tmp_path / "jobs")

    ok = stand_in_request(bucket, "secret-ok", forward_env=forward)
    assert submit_tao_job(ok, target=target, records=records, return_state=True).is_completed()
    assert collect_tao_job("secret-ok", target=target, records=records, poll_seconds=0.05,
                           return_state=True).is_completed()
    loud = {"schema_version": "1", "job_id": "secret-loud", "image": "tao:6", "mode": "args",
            "command": ["/bin/sh", "-c"], "args": ['echo "token is $HF_TOKEN, key is $AWS_SECRET_ACCESS_KEY"; exit 3'],
            "forward_env": forward}
    assert submit_tao_job(loud, target=target, records=records, return_state=True).is_completed()
    failed = collect_tao_job("secret-loud", target=target, records=records, poll_seconds=0.05, return_state=True)
    assert failed.is_failed()
    assert "***HF_TOKEN***" in str(by_key(artifacts(failed), "failure-secret-loud").data)  # the job's own line, masked
    bad = {**ok, "job_id": "secret-bad", "inputs": [{"source": f"s3://{bucket}/none.bin", "kind": "file"}]}
    assert submit_tao_job(bad, target=target, records=records, return_state=True).is_failed()

    places = prefect_places() + [(str(path), path.read_bytes()) for path in (tmp_path / "jobs").rglob("*")
                                 if path.is_file()]
    assert any("secret-loud" in where for where, _ in places)  # the search does see the runs
    leaks = [(where, variable) for where, data in places for variable, value in secrets.items()
             if value.encode() in data]
    assert leaks == []


def prefect_places() -> list[tuple[str, bytes]]:
    """Everything Prefect keeps, as (where, bytes): its database files, every block document with
    secrets included, every log and artifact through the API, and result storage on disk."""
    from prefect.logging.handlers import APILogHandler
    from prefect.settings import get_current_settings

    APILogHandler().flush()
    settings = get_current_settings()
    url = settings.server.database.connection_url
    database = Path((url.get_secret_value() if hasattr(url, "get_secret_value") else str(url)).split(":///", 1)[1])
    places = [(str(path), path.read_bytes()) for path in database.parent.glob(database.name + "*")]
    places += [(str(path), path.read_bytes()) for path in Path(settings.home).rglob("*") if path.is_file()]
    with get_client(sync_client=True) as client:
        logs = wait_for("the flow runs' logs", lambda: every(client.read_logs) or None)
        places += [(f"block document {doc.name}", repr(doc.data).encode())
                   for doc in every(lambda **page: client.read_block_documents(include_secrets=True, **page))]
        places += [(f"log of run {log.flow_run_id}", log.message.encode()) for log in logs]
        places += [(f"artifact {a.key or a.id}", f"{a.description} {a.data}".encode())
                   for a in every(client.read_artifacts)]
        places += [(f"flow run {run.name}", run.model_dump_json().encode()) for run in every(client.read_flow_runs)]
    assert logs
    return places


def every(read: Callable[..., list[T]], page: int = 200) -> list[T]:
    """All of a paged API listing (the server answers at most 200 at a time)."""
    items: list[T] = []
    while True:
        batch = read(offset=len(items), limit=page)
        items += batch
        if len(batch) < page:
            return items


@pytest.fixture(autouse=True)
def _no_stray_jobs(tmp_path: Path) -> Iterator[None]:
    """Nothing a failed test started in the local frame outlives it."""
    yield
    for root in (tmp_path / "local", tmp_path / "cli" / "local", tmp_path / "flow" / "local"):
        backend = LocalBackend(LocalSettings(run_root=str(root)))
        for run in root.glob("*/run"):
            backend.cancel(f"local/{run.parent.name}")


# ----------------------------------------------------------------------------- blocks on the API
def test_the_blocks_register_as_the_docs_say_with_the_console_script_and_store_names_only(tmp_path: Path) -> None:
    """``prefect block register -m blocks`` cannot work from the console script (its import path
    is its own directory, not the project's); the documented ``--file blocks/__init__.py`` does."""
    import subprocess
    import sys

    from prefect.settings import PREFECT_API_URL

    console_script = Path(sys.executable).with_name("prefect")
    done = subprocess.run([str(console_script), "block", "register", "--file", "blocks/__init__.py"], cwd=REPO,
                          env={**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value())}, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Successfully registered 9 blocks" in done.stdout
    with get_client(sync_client=True) as client:
        for slug in ("tao-s3-credentials", "tao-hugging-face-credentials", "tao-ngc-credentials", "tao-local-target",
                     "tao-kubernetes-target", "tao-docker-target", "tao-slurm-target", "tao-job-records",
                     "tao-s3-bucket"):
            block_type = client.read_block_type_by_slug(slug)
            assert block_type.logo_url and block_type.documentation_url and block_type.code_example, slug
            fields = client.get_most_recent_block_schema_for_block_type(block_type.id).fields
            assert fields["secret_fields"] == [] and all(
                spec.get("title") and spec.get("description") for spec in fields["properties"].values()), slug

    from blocks import S3EnvCredentials

    block = name()
    S3EnvCredentials(secret_access_key_env="TEAM_S3_SECRET").save(block)
    assert S3EnvCredentials.load(block).secret_access_key_env == "TEAM_S3_SECRET"
    with get_client(sync_client=True) as client:
        stored = client.read_block_document_by_name(block, "tao-s3-credentials", include_secrets=True).data
    assert stored["secret_access_key_env"] == "TEAM_S3_SECRET" and all(
        value is None or isinstance(value, bool) or isinstance(value, str) and value.isidentifier()
        for value in stored.values())
