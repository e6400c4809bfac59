"""The durable job record: the CLI verbs as a user runs them, the state machine, and the store's
promises under SIGKILL and concurrent writers (no lost update, no corrupt file, no secret)."""

from __future__ import annotations

import json
import random
import re
import signal
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tao_data_io.errors import UsageError
from tao_data_io.fs import temp_path_for
from tao_data_io.record import JobRecord, RecordStore

from .helpers import run_cli

JOB = dict(platform="k8s", image="nvcr.io/nvidia/tao/tao-toolkit:5.5.0-pyt", network_arch="dino",
           action="train", storage_tier="B", results_dir="/results/dino")
OPEN_ARGS = ["--platform", "k8s", "--image", "nvcr.io/nvidia/tao/tao-toolkit:5.5.0-pyt", "--network-arch", "dino",
             "--action", "train", "--storage-tier", "B", "--results-dir", "/results/dino"]


def append_upload(entry: dict[str, Any]) -> Callable[[JobRecord], JobRecord]:
    return lambda record: record.model_copy(update={"uploads": [*record.uploads, entry]})


def test_open_mark_show_list_through_the_cli(tmp_path: Path) -> None:
    env = {"TAO_DATA_IO_JOBS_DIR": str(tmp_path / "jobs")}
    opened = run_cli("record", "open", *OPEN_ARGS, "--storage-reason", "dataset 40 GB", env=env)
    assert opened.returncode == 0, opened.stderr
    job_id = opened.stdout.strip()
    assert opened.stdout == job_id + "\n" and re.fullmatch(r"tao-\d{8}-[0-9a-f]{10}", job_id)

    running = run_cli("record", "mark", job_id, "--state", "RUNNING", "--backend-ref", f"tao-jobs/{job_id}",
                      "--source", "agent", "--message", "pod started", env=env)
    assert running.returncode == 0, running.stderr
    done = run_cli("record", "mark", job_id, "--state", "COMPLETE", "--source", "flow", env=env)
    assert done.returncode == 0, done.stderr

    shown = run_cli("record", "show", job_id, env=env)
    assert shown.returncode == 0, shown.stderr
    assert f"tao-jobs/{job_id}" in shown.stdout and "tier B — dataset 40 GB" in shown.stdout
    history_lines = shown.stdout.split("history:\n")[1].splitlines()
    assert [line.split()[1:3] for line in history_lines] == [["PENDING", "cli"], ["RUNNING", "agent"],
                                                             ["COMPLETE", "flow"]]
    assert "pod started" in history_lines[1]

    document = json.loads(run_cli("record", "show", job_id, "--json", "--root", str(tmp_path / "jobs"), env={}).stdout)
    assert document["schema_version"] == "1" and document["state"] == "COMPLETE"
    assert document["backend_ref"] == f"tao-jobs/{job_id}" and document["created_at"].endswith("Z")
    assert [step["state"] for step in document["history"]] == ["PENDING", "RUNNING", "COMPLETE"]

    listed = run_cli("record", "list", env=env)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split() == [job_id, "COMPLETE", "B", document["updated_at"][:19] + "Z", "train"]

    path = tmp_path / "jobs" / f"{job_id}.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert JobRecord.model_validate_json(path.read_bytes()).model_dump(mode="json") == document


def test_terminal_state_is_final_and_the_same_terminal_state_is_a_no_op(tmp_path: Path) -> None:
    store = RecordStore(tmp_path)
    job_id = store.open(**JOB).job_id
    store.mark(job_id, "RUNNING", source="agent")
    store.mark(job_id, "ERROR", source="agent", message="OOMKilled")
    before = (tmp_path / f"{job_id}.json").read_bytes()

    refused = run_cli("record", "mark", job_id, "--state", "RUNNING", "--root", str(tmp_path), env={})
    assert refused.returncode == 2 and refused.stderr.startswith("error:")
    assert "already ERROR" in refused.stderr and "final" in refused.stderr
    again = run_cli("record", "mark", job_id, "--state", "ERROR", "--source", "flow", "--root", str(tmp_path), env={})
    assert again.returncode == 0, again.stderr

    assert (tmp_path / f"{job_id}.json").read_bytes() == before
    with pytest.raises(UsageError, match="already ERROR"):
        store.mark(job_id, "COMPLETE", source="flow")
    assert [step.state for step in store.get(job_id).history] == ["PENDING", "RUNNING", "ERROR"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["open", *OPEN_ARGS, "--job-id", "Job_42"], "--job-id 'Job_42' is not a valid job id"),
        (["open", *OPEN_ARGS, "--job-id", "../../etc/passwd"], "'../../etc/passwd' is not a valid job id"),
        (["open", *OPEN_ARGS, "--job-id", "a" * 53], "1-52 lowercase"),
        (["mark", "tao-1", "--state", "DONE"], "invalid choice: 'DONE'"),
        (["mark", "tao-1", "--state", "RUNNING", "--backend-ref", "no-slash"], "--backend-ref 'no-slash'"),
        (["mark", "tao-1", "--state", "RUNNING", "--backend-ref", "Tao/job"], "--backend-ref 'Tao/job'"),
        (["show", "tao-missing"], "no job record 'tao-missing': looked for"),
    ],
)
def test_bad_input_exits_2_naming_the_value(tmp_path: Path, args: list[str], expected: str) -> None:
    RecordStore(tmp_path).open(**JOB, job_id="tao-1")
    result = run_cli("record", *args, "--root", str(tmp_path), env={})
    assert result.returncode == 2
    assert result.stderr.startswith("error:") and expected in result.stderr
    assert sorted(p.name for p in tmp_path.glob("*.json")) == ["tao-1.json"]


def test_missing_job_names_the_id_and_where_it_looked(tmp_path: Path) -> None:
    for root in (tmp_path, tmp_path / "not-yet"):
        with pytest.raises(UsageError, match=re.escape(f"no job record 'tao-nope': looked for {root / 'tao-nope.json'}")):
            RecordStore(root).mark("tao-nope", "RUNNING", source="cli")
    assert not (tmp_path / "not-yet").exists()


def test_history_is_in_report_order_and_repeated_reports_do_not_flood_it(tmp_path: Path) -> None:
    store = RecordStore(tmp_path)
    job_id = store.open(**JOB, source="flow").job_id
    store.mark(job_id, "RUNNING", source="agent", backend_ref="tao/job-1")
    store.mark(job_id, "RUNNING", source="agent")  # a heartbeat: nothing new
    store.mark(job_id, "RUNNING", source="agent", message="epoch 3/10")
    store.mark(job_id, "CANCELED", source="cli", message="stopped by user")
    store.mark(job_id, "CANCELED", source="flow")
    record = store.get(job_id)
    assert [(s.state, s.source, s.message) for s in record.history] == [
        ("PENDING", "flow", None), ("RUNNING", "agent", None), ("RUNNING", "agent", "epoch 3/10"),
        ("CANCELED", "cli", "stopped by user")]
    assert [s.at for s in record.history] == sorted(s.at for s in record.history)
    assert record.updated_at == record.history[-1].at and record.message == "stopped by user"
    assert record.backend_ref == "tao/job-1"

    store.open(**JOB, job_id="other")
    store.mark("other", "RUNNING", source="agent", backend_ref="tao/other")
    with pytest.raises(UsageError, match="already runs as 'tao/other'; refusing backend_ref 'tao/other-2'"):
        store.mark("other", "RUNNING", source="agent", backend_ref="tao/other-2")


def test_open_is_idempotent_for_the_same_job_and_refuses_a_different_one(tmp_path: Path) -> None:
    store = RecordStore(tmp_path)
    first = store.open(**JOB, job_id="tao-retry")
    store.mark("tao-retry", "RUNNING", source="agent")
    retried = store.open(**JOB, job_id="tao-retry")
    assert retried.state == "RUNNING" and retried.created_at == first.created_at and len(retried.history) == 2
    with pytest.raises(UsageError, match=r"already names a different job \(image is"):
        store.open(**{**JOB, "image": "other:1"}, job_id="tao-retry")
    assert store.get("tao-retry") == retried


def test_update_changes_route_and_uploads_but_not_state_or_identity(tmp_path: Path) -> None:
    store = RecordStore(tmp_path)
    job_id = store.open(**JOB).job_id
    routed = store.update(job_id, lambda r: r.model_copy(update={
        "output_route": {"route": "s3", "destination": "s3://results/dino/", "reason": "tier B"}}))
    assert routed.output_route is not None and routed.output_route.destination == "s3://results/dino/"
    store.update(job_id, append_upload({"files": 3, "bytes": 1024}))
    for field, value in (("state", "COMPLETE"), ("job_id", "tao-elsewhere"), ("history", [])):
        with pytest.raises(UsageError, match=f"may not change {field}"):
            store.update(job_id, lambda r, f=field, v=value: r.model_copy(update={f: v}))
    assert store.get(job_id).uploads == [{"files": 3, "bytes": 1024}] and store.get(job_id).state == "PENDING"


def test_a_credential_value_is_refused_while_its_name_is_fine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "wJalrXUtnFEMI-K7MDENG-bPxRfiCY"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    store = RecordStore(tmp_path)
    with pytest.raises(UsageError) as caught:
        store.open(**{**JOB, "image": secret})
    assert "'image'" in str(caught.value) and secret not in str(caught.value)

    job_id = store.open(**JOB, storage_reason="credentials come from AWS_SECRET_ACCESS_KEY").job_id
    before = (tmp_path / f"{job_id}.json").read_bytes()
    for change in (append_upload({"report": f"uploaded with key {secret}"}), append_upload({secret: 1})):
        with pytest.raises(UsageError, match=r"'uploads\[0\]") as caught:
            store.update(job_id, change)
        assert secret not in str(caught.value)
    with pytest.raises(UsageError, match="field 'message'"):
        store.mark(job_id, "ERROR", source="agent", message=secret)
    assert (tmp_path / f"{job_id}.json").read_bytes() == before

    result = run_cli("record", "open", *OPEN_ARGS[:-1], f"/results/{secret}", "--root", str(tmp_path),
                     env={"AWS_SECRET_ACCESS_KEY": secret})
    assert result.returncode == 2 and "'results_dir'" in result.stderr and secret not in result.stderr
    assert len(list(tmp_path.glob("*.json"))) == 1


def test_list_skips_and_reports_damaged_files_and_ignores_what_is_not_a_record(tmp_path: Path) -> None:
    store = RecordStore(tmp_path)
    good = store.open(**JOB).job_id
    (tmp_path / "tao-broken.json").write_text('{"schema_version": "1", "job_id": "tao-bro')
    (tmp_path / f".{good}.json.x1y2.tmp").write_text("{")  # a killed writer's leftover
    (tmp_path / "Not_A_Job.json").write_text("{}")
    result = run_cli("record", "list", "--json", "--root", str(tmp_path), env={})
    assert result.returncode == 1
    assert [doc["job_id"] for doc in json.loads(result.stdout)] == [good]
    assert "tao-broken.json" in result.stderr and "Not_A_Job" not in result.stderr and ".tmp" not in result.stderr


_WRITER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from tao_data_io.record import RecordStore

    store = RecordStore(Path(sys.argv[1]))
    ids = [f"kill-{n}" for n in range(3)]
    for job_id in ids:
        store.open(platform="k8s", image="i", network_arch="a", action="train", storage_tier="A",
                   results_dir="/r", job_id=job_id)
    print("ready", flush=True)
    n = 0
    while True:
        for job_id in ids:
            entry = {"n": n, "pad": "x" * 4000}
            store.update(job_id, lambda r: r.model_copy(update={"uploads": [*r.uploads, entry][-40:]}))
        n += 1
""")


def test_sigkill_during_writes_never_leaves_a_damaged_record(tmp_path: Path) -> None:
    rng = random.Random()
    for _ in range(6):
        child = subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path)], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        assert child.stdout is not None and child.stderr is not None
        # A writer that cannot even reopen its records after the last kill says why on stderr.
        assert child.stdout.readline() == "ready\n", child.stderr.read()
        time.sleep(rng.uniform(0.0, 0.2))
        child.send_signal(signal.SIGKILL)
        assert child.wait() == -signal.SIGKILL
        child.stdout.close()
        child.stderr.close()

    damaged: list[str] = []
    store = RecordStore(tmp_path)
    records = store.list_records(on_damaged=lambda path, reason: damaged.append(reason))
    assert damaged == [] and [r.job_id for r in records] == ["kill-0", "kill-1", "kill-2"]
    for path in tmp_path.glob("*.json"):
        json.loads(path.read_text())
    # The lock died with its holder, and the next writer clears that job's leftovers.
    temp_path_for(tmp_path / "kill-0.json").write_text('{"half": ')
    for record in records:
        store.update(record.job_id, append_upload({"after": "kill"}))
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == [
        "kill-0.json", "kill-1.json", "kill-2.json"]


_MARKER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from tao_data_io.record import RecordStore

    root, worker = Path(sys.argv[1]), sys.argv[2]
    store = RecordStore(root)
    (root / f"ready-{worker}").touch()
    while not (root / "go").exists():
        time.sleep(0.001)
    for n in range(50):
        store.update("tao-shared", lambda r: r.model_copy(update={"uploads": [*r.uploads, {"w": worker, "n": n}]}))
""")


def test_concurrent_updates_from_two_processes_lose_nothing(tmp_path: Path) -> None:
    store = RecordStore(tmp_path)
    store.open(**JOB, job_id="tao-shared")
    children = [subprocess.Popen([sys.executable, "-c", _MARKER, str(tmp_path), worker]) for worker in ("a", "b")]
    while not all((tmp_path / f"ready-{worker}").exists() for worker in ("a", "b")):
        time.sleep(0.005)
    (tmp_path / "go").touch()
    assert [child.wait() for child in children] == [0, 0]
    uploads = store.get("tao-shared").uploads
    assert len(uploads) == 100
    assert sorted((u["w"], u["n"]) for u in uploads) == sorted((w, n) for w in "ab" for n in range(50))
    for worker in "ab":  # each process's entries stay in its own order
        assert [u["n"] for u in uploads if u["w"] == worker] == list(range(50))


def test_root_defaults_to_the_environment_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TAO_DATA_IO_JOBS_DIR", str(tmp_path / "from-env"))
    job_id = RecordStore().open(**JOB).job_id
    assert (tmp_path / "from-env" / f"{job_id}.json").is_file()
    monkeypatch.delenv("TAO_DATA_IO_JOBS_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert RecordStore().root == tmp_path / "home" / ".tao-data-io" / "jobs"
