"""A TAO job's whole life from the shell, in the real local frame over the embedded S3 server:
``submit`` stages from S3, verifies inside the frame and starts the stand-in; ``collect --wait``
uploads its results with ``.tao/`` and the declared excludes left out — also after a failure."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from tao_data_io.backends.local.settings import LocalSettings
from tao_data_io.records import RecordStore

from .helpers import args_request, held_request, needs_bwrap, run_cli, wait_cli_state, write_request

STAND_IN = Path(__file__).resolve().parent.parent / "examples" / "stand_in"

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


def _request(tmp_path: Path, bucket: str, job_id: str, **environment: str) -> Path:
    request = {
        "schema_version": "1", "job_id": job_id, "image": "nvcr.io/nvidia/tao/tao-toolkit:6.0.0-pyt",
        "mode": "config", "config_format": "yaml", "command": "sh /stand-in/train.sh -e {config_path}",
        "spec": {"dataset": {"images": f"s3://{bucket}/ds/images/"}, "train": {"num_epochs": 2}},
        "mounts": [{"source": str(STAND_IN), "target": "/stand-in"}],
        "environment": {"EPOCHS": "2", "EPOCH_SECONDS": "0", "TRAIN_INPUTS": f"/tao-inputs/s3/{bucket}/ds/images",
                        **environment},
        "outputs": {"results_dir": "/results", "upload_excludes": ["train.log"]},
    }
    path = tmp_path / f"{job_id}.yaml"
    path.write_text(yaml.safe_dump(request))
    return path


@pytest.fixture
def env(s3_server: Any, bucket: str, s3_client: Any, tmp_path: Path) -> dict[str, str]:
    for i in range(3):
        s3_client.put_object(Bucket=bucket, Key=f"ds/images/img{i}.jpg", Body=b"jpeg" * 100)
    return {**s3_server.env(), "S3_BUCKET_NAME": bucket, "TAO_DATA_IO_JOBS_DIR": str(tmp_path / "jobs"),
            "TAO_DATA_IO_WORKDIR": str(tmp_path / "work"), "HOME": str(tmp_path)}


def _uploaded(s3_client: Any, bucket: str, job_id: str) -> list[str]:
    listed = s3_client.list_objects_v2(Bucket=bucket, Prefix=f"results/{job_id}/")
    return sorted(obj["Key"].removeprefix(f"results/{job_id}/") for obj in listed.get("Contents", []))


def test_submit_then_collect_runs_the_job_and_uploads_its_results(env: dict[str, str], bucket: str, s3_client: Any,
                                                                  tmp_path: Path) -> None:
    submitted = run_cli("submit", "--request", str(_request(tmp_path, bucket, "cli-ok")), env=env)
    assert submitted.returncode == 0, submitted.stderr
    assert submitted.stdout.strip() == "cli-ok" and "verified inside the frame" in submitted.stderr

    collected = run_cli("collect", "--job-id", "cli-ok", "--wait", "--poll-seconds", "0.2", "--json", env=env)
    assert collected.returncode == 0, collected.stderr
    logs = run_cli("logs", "--job-id", "cli-ok", "--tail", "50", env=env)
    assert logs.returncode == 0 and "epoch 2/2 done" in logs.stdout, logs.stdout + logs.stderr
    outcome = json.loads(collected.stdout)
    assert outcome["state"] == "COMPLETE" and outcome["upload"]["summary"]["transferred_files"] == 3
    assert _uploaded(s3_client, bucket, "cli-ok") == ["checkpoint_epoch_1.pth", "checkpoint_epoch_2.pth",
                                                      "status.json"]  # no .tao/, no train.log
    record = RecordStore(tmp_path / "jobs").get("cli-ok")
    assert record.state == "COMPLETE" and record.verify is not None and record.verify["ok"]
    assert [t.state for t in record.history] == ["PENDING", "PENDING", "RUNNING", "COMPLETE"]  # opened, launched…
    status = run_cli("status", "--job-id", "cli-ok", env=env)
    assert status.returncode == 0 and status.stdout.startswith("COMPLETE")
    assert record.backend_config == LocalSettings(run_root=str(tmp_path / "work")).model_dump()


def test_a_job_gets_the_hosts_network_only_with_allow_network(env: dict[str, str], bucket: str,
                                                              tmp_path: Path) -> None:
    request = _request(tmp_path, bucket, "cli-net")
    asking = yaml.safe_load(request.read_text())
    request.write_text(yaml.safe_dump({**asking, "network": True}))
    refused = run_cli("submit", "--request", str(request), env=env)
    assert refused.returncode == 2
    assert "allow_network is off" in refused.stderr and "(--allow-network)" in refused.stderr
    assert RecordStore(tmp_path / "jobs").get("cli-net").backend_ref is None  # nothing was launched
    allowed = run_cli("submit", "--request", str(request), "--allow-network", env=env)
    assert allowed.returncode == 0, allowed.stderr
    assert RecordStore(tmp_path / "jobs").get("cli-net").backend_config == LocalSettings(
        run_root=str(tmp_path / "work"), allow_network=True).model_dump()
    collected = run_cli("collect", "--job-id", "cli-net", "--wait", "--poll-seconds", "0.2", env=env)
    assert collected.returncode == 0, collected.stderr


def test_a_failing_job_still_uploads_and_collect_says_why(env: dict[str, str], bucket: str, s3_client: Any,
                                                          tmp_path: Path) -> None:
    request = _request(tmp_path, bucket, "cli-fail", FAIL_AFTER_EPOCH="1", FAIL_EXIT_CODE="7")
    assert run_cli("submit", "--request", str(request), env=env).returncode == 0
    collected = run_cli("collect", "--job-id", "cli-fail", "--wait", "--poll-seconds", "0.2", env=env)
    assert collected.returncode == 1, collected.stderr
    assert "ERROR" in collected.stdout and "exit code 7" in collected.stdout
    assert "last lines of the log" in collected.stdout
    assert "checkpoint_epoch_1.pth" in _uploaded(s3_client, bucket, "cli-fail")


def test_an_empty_input_fails_verify_and_the_command_never_starts(env: dict[str, str], bucket: str,
                                                                  tmp_path: Path) -> None:
    request = _request(tmp_path, bucket, "cli-unverified", TRAIN_INPUTS="/data/missing", MARKER_DIR="/results")
    (tmp_path / "empty").mkdir()
    data = yaml.safe_load(request.read_text())
    data["mounts"].append({"source": str(tmp_path / "empty"), "target": "/data/missing"})
    request.write_text(yaml.safe_dump(data))
    result = run_cli("submit", "--request", str(request), env=env)
    assert result.returncode != 0 and "/data/missing" in result.stderr
    record = RecordStore(tmp_path / "jobs").get("cli-unverified")
    assert record.state == "ERROR" and "/data/missing" in json.dumps(record.verify)
    assert not (tmp_path / "work" / "cli-unverified" / "results" / "started").exists()  # never started
    # A source that does not exist on this host is refused before anything is created.
    data["job_id"] = "cli-no-source"
    data["mounts"][-1]["source"] = str(tmp_path / "not-here")
    request.write_text(yaml.safe_dump(data))
    result = run_cli("submit", "--request", str(request), env=env)
    assert result.returncode == 2 and "not-here" in result.stderr


def test_logs_follow_shows_what_the_job_prints_until_it_ends(env: dict[str, str], bucket: str,
                                                              tmp_path: Path) -> None:
    request = _request(tmp_path, bucket, "cli-follow", EPOCHS="4", EPOCH_SECONDS="0.5")
    assert run_cli("submit", "--request", str(request), env=env).returncode == 0
    followed = run_cli("logs", "--job-id", "cli-follow", "--follow", env=env)
    assert followed.returncode == 0, followed.stderr
    epochs = [line for line in followed.stdout.splitlines() if line.startswith("train.sh") and "done" in line]
    assert epochs == [f"train.sh[rank 0]: epoch {n}/4 done" for n in range(1, 5)] + ["train.sh[rank 0]: done"]


# ----------------------------------------------------------------------------- cancel and collect say what happened
@needs_bwrap
def test_cancel_with_the_wrong_workdir_does_not_record_a_running_job_canceled(
        cli_env: dict[str, str], bucket: str, tmp_path: Path) -> None:
    """``cancel`` without the job's ``--workdir`` finds no run directory; that is an error naming
    where to look, never a final CANCELED recorded for a job that goes on running."""
    workdir = str(tmp_path / "elsewhere")
    request = held_request(tmp_path, bucket, "wd-cancel")
    assert run_cli("submit", "--request", str(request), "--workdir", workdir, env=cli_env).returncode == 0
    try:
        wait_cli_state("wd-cancel", cli_env, "RUNNING", "--workdir", workdir)
        canceled = run_cli("cancel", "--job-id", "wd-cancel", env=cli_env)  # forgot --workdir
        still = run_cli("status", "--job-id", "wd-cancel", "--workdir", workdir, env=cli_env).stdout
        record = RecordStore(tmp_path / "jobs").get("wd-cancel")
        assert not (canceled.returncode == 0 and still.startswith("RUNNING")), (
            f"cancel said {canceled.stdout.strip()!r} (exit 0) but the job is {still.strip()!r}")
        assert record.state != "CANCELED" or not still.startswith("RUNNING")
    finally:
        run_cli("cancel", "--job-id", "wd-cancel", "--workdir", workdir, env=cli_env)


@needs_bwrap
def test_collect_names_each_file_it_did_not_upload_and_why(cli_env: dict[str, str], tmp_path: Path) -> None:
    """``collect`` names each result it left out, with its reason, as ``upload-results`` does: a
    name an S3 key here cannot carry (a control character) is skipped once with the fix — never
    a failure every rerun repeats — and so is the out-of-tree symlink; the rest is uploaded."""
    request = write_request(tmp_path / "bad-names.yaml", args_request(
        job_id="bad-names", command=["sh", "-c", ("cd /results && echo ok > good.txt"
                                                  " && printf x > \"$(printf 'bad\\nname')\""
                                                  " && ln -s /etc/hostname escapes")]))
    assert run_cli("submit", "--request", str(request), env=cli_env).returncode == 0
    collected = run_cli("collect", "--job-id", "bad-names", "--wait", "--poll-seconds", "0.2", env=cli_env)
    assert collected.returncode == 0, collected.stdout + collected.stderr
    said = collected.stdout + collected.stderr
    assert "bad\\nname: its name holds a control character" in said and "rename it" in said, said
    assert "escapes" in said, f"the skipped symlink is not reported: {said!r}"
    again = run_cli("collect", "--job-id", "bad-names", "--wait", "--poll-seconds", "0.2", env=cli_env)
    assert again.returncode == 0, again.stdout + again.stderr  # nothing left to retry


def test_cancel_of_a_completed_job_does_not_say_canceled(tmp_path: Path) -> None:
    """``cancel`` of a job that already completed says so; it never prints CANCELED for it, and the
    record stays COMPLETE."""
    env = {"TAO_DATA_IO_RECORDS": str(tmp_path / "jobs"), "TAO_DATA_IO_WORKDIR": str(tmp_path / "work"),
           "HOME": str(tmp_path)}
    assert run_cli("record", "open", "--job-id", "done-1", "--backend", "local", "--image", "i", "--network-arch",
                   "a", "--action", "b", "--results-dir", "/results", env=env).returncode == 0
    assert run_cli("record", "mark", "done-1", "--state", "RUNNING", "--backend-ref", "local/done-1",
                   env=env).returncode == 0
    assert run_cli("record", "mark", "done-1", "--state", "COMPLETE", env=env).returncode == 0
    canceled = run_cli("cancel", "--job-id", "done-1", env=env)
    assert RecordStore(tmp_path / "jobs").get("done-1").state == "COMPLETE"
    assert "CANCELED" not in canceled.stdout, canceled.stdout


def test_a_claim_the_local_backend_cannot_mount_is_refused_before_anything_is_written(env: dict[str, str],
                                                                                      bucket: str,
                                                                                      tmp_path: Path) -> None:
    request = _request(tmp_path, bucket, "cli-claim")
    asking = yaml.safe_load(request.read_text())
    request.write_text(yaml.safe_dump({**asking, "storage": {"pvc_claim": "tao-data"}}))
    refused = run_cli("submit", "--request", str(request), env=env)
    assert refused.returncode == 2 and "storage.pvc_claim 'tao-data' names a volume claim, which the local backend " \
                                       "does not mount" in refused.stderr
    assert not (tmp_path / "jobs").exists() or not any((tmp_path / "jobs").iterdir())  # no record, nothing staged
    assert not (tmp_path / "work" / "cli-claim").exists()
