"""Watching a job from Prefect while it trains: the collect run shows what the job prints as it
prints it (in order, once) and TAO's own progress from its status.json — a progress artifact
(epochs of max, time left, KPIs) and a KPI table epoch by epoch — for a real job in the local
frame."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

from flows.collect import collect_tao_job
from flows.submit import submit_tao_job
from tasks.reports import training_key

from .helpers import args_request, wait_for
from .flow_helpers import artifacts, by_key, local_target, records_block, stand_in_request

pytestmark = pytest.mark.usefixtures("prefect_harness")


def test_the_collect_run_shows_the_jobs_log_and_taos_progress_while_it_trains(
        env: dict[str, str], bucket: str, sandbox: None, tmp_path: Path) -> None:
    target, records = local_target(tmp_path), records_block(tmp_path / "jobs")
    request = stand_in_request(bucket, "watched-job")
    request["environment"] = {**request["environment"], "EPOCHS": "6", "EPOCH_SECONDS": "0.4"}
    assert submit_tao_job(request, target=target, records=records, return_state=True).is_completed()
    state = collect_tao_job("watched-job", target=target, records=records, poll_seconds=0.3, return_state=True)
    assert state.is_completed(), state.message

    def printed_logs() -> list[str] | None:  # the run's logs reach the server a moment after the run returns
        with get_client(sync_client=True) as client:
            logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(
                any_=[state.state_details.flow_run_id])))
        found = [log.message for log in sorted(logs, key=lambda log: log.timestamp) if "printed:" in log.message]
        return found if any("epoch 6/6 done" in message for message in found) else None

    printed = wait_for("the job's last lines in the run's logs", printed_logs)
    assert len(printed) >= 2  # shown as it came, not once at the end
    lines = [line for message in printed for line in message.splitlines()[1:]]
    epochs = [line for line in lines if "epoch" in line and "done" in line and line.startswith("| train.sh")]
    assert epochs == [f"| train.sh[rank 0]: epoch {n}/6 done" for n in range(1, 7)]  # in order, each once, the job's

    found = artifacts(state)
    progress = [a for a in found if a.type == "progress" and "training of job watched-job" in (a.description or "")]
    assert len(progress) == 1 and progress[0].data == 100.0
    assert "epoch 6 of 6" in str(progress[0].description) and "SUCCESS" in str(progress[0].description)
    table = json.loads(str(by_key(found, training_key("watched-job")).data))
    assert [row["epoch"] for row in table] == [1, 2, 3, 4, 5, 6]
    assert all(set(row) == {"epoch", "loss", "accuracy"} for row in table)
    assert table[0]["loss"] > table[-1]["loss"]


def test_what_the_job_writes_in_status_json_is_masked_before_it_becomes_an_artifact(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The run's log mask covers the training artifacts too: status.json is the job's, and a job
    may write what it is given into a message or a KPI."""
    import logging

    import tasks.progress as progress
    from tao_data_io.launch.training import read_training_status
    from tasks.masking import mask_run_logs

    secret = "hf_" + "k" * 34
    sent: list[Any] = []

    class RecordingClient:  # what reaches the Prefect API, recorded instead of sent
        def __enter__(self) -> RecordingClient:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def create_artifact(self, artifact: Any) -> Any:
            sent.append(artifact)
            return type("Created", (), {"id": uuid.uuid4()})()

        def update_artifact(self, artifact_id: Any, artifact: Any) -> None:
            sent.append(artifact)

    monkeypatch.setattr(progress, "get_client", lambda sync_client: RecordingClient())
    monkeypatch.setattr(progress, "get_run_logger", lambda: logging.getLogger("test"))
    mask_run_logs({"HF_TOKEN": secret}, secret_names=["HF_TOKEN"])  # what the collect flow installs
    status = read_training_status((json.dumps({"epoch": 1, "max_epoch": 2, "status": "RUNNING",
                                               "message": f"login {secret}", "kpi": {secret: secret}}) + "\n").encode())
    assert status is not None
    with progress.TrainingArtifacts("job-1") as training:
        training.show(status)
    shown = " ".join(f"{artifact.description} {artifact.data}" for artifact in sent)
    assert len(sent) == 2 and secret not in shown and "login" in shown


@pytest.mark.parametrize("text", ["é" * 10, "€" * 7, "a😀" * 5, "plain"])
@pytest.mark.parametrize("limit", [4, 5, 6, 7, 11])
def test_a_log_followed_in_pieces_comes_out_whole_even_when_a_piece_ends_inside_a_character(
        tmp_path: Path, text: str, limit: int) -> None:
    from tao_data_io.launch.joblog import JobLog, lines_since

    log = tmp_path / "rank-0.log"
    log.write_bytes((text + "\n").encode())
    shown, offset = "", 0
    while True:
        piece, after = lines_since(JobLog(log, None), offset, limit=limit, start_bytes=1024)
        if after == offset:
            break
        shown, offset = shown + piece, after
    assert shown == text + "\n"


def test_what_the_job_prints_is_marked_as_its_own_and_drives_no_terminal_in_the_runs_logs(
        no_cloud: None, sandbox: None, tmp_path: Path) -> None:
    """A job that prints a line made to look like Prefect's own, and escape sequences: in the run's
    logs each of its lines is marked as the job's, and no control character is left as is."""
    forged = "12:00:00.000 | INFO    | Flow run 'forged' - Finished in state Completed()"
    script = f"printf '%s\\n' \"{forged}\"; printf 'title \\033]0;owned\\007 clear \\033[2J red \\033[31mred\\r\\n'"
    target, records = local_target(tmp_path), records_block(tmp_path / "jobs")
    request = args_request(job_id="forging-job", command=["/bin/sh", "-c", script])
    assert submit_tao_job(request, target=target, records=records, return_state=True).is_completed()
    state = collect_tao_job("forging-job", target=target, records=records, poll_seconds=0.3, return_state=True)
    assert state.is_completed(), state.message

    def printed_logs() -> list[str] | None:
        with get_client(sync_client=True) as client:
            logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(
                any_=[state.state_details.flow_run_id])))
        messages = [log.message for log in logs]
        return messages if any(message.startswith("job forging-job: COMPLETE") for message in messages) else None

    messages = wait_for("the watch's last log line", printed_logs)
    printed = [message for message in messages if "printed:" in message]
    job_lines = [line for message in printed for line in message.splitlines()[1:]]
    assert job_lines == [f"| {forged}", "| title \\x1b]0;owned\\x07 clear \\x1b[2J red \\x1b[31mred\\r"]
    assert not [message for message in messages if "\x1b" in message or "\x07" in message or "\r" in message]
