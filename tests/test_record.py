"""The durable job record: the CLI verbs as a user runs them, the state machine, and the store's
promises under SIGKILL and concurrent writers (no lost update, no corrupt document, no secret) —
each over both storages: a directory and an S3 prefix on the embedded server (real HTTP)."""

from __future__ import annotations

import json
import random
import re
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tao_data_io.errors import CredentialError, UsageError
from tao_data_io.fs.temp import lock_tag, temp_path_for
from tao_data_io.records import (DamagedRecordError, JobRecord, RecordConflictError, RecordStore, Retry,
                               network_and_action, open_for)
from tao_data_io.records.directory import DirectoryStorage
from tao_data_io.records.model import validated
from tao_data_io.records.storage import RECORD_LIMIT_BYTES
from tao_data_io.records.s3 import RECORDS, S3Storage
from tao_data_io.request import JobRequest

from .helpers import run_cli

JOB = dict(backend="k8s", image="nvcr.io/nvidia/tao/tao-toolkit:5.5.0-pyt", network_arch="dino",
           action="train", results_dir="/results/dino")
OPEN_ARGS = ["--backend", "kubernetes", "--image", "nvcr.io/nvidia/tao/tao-toolkit:5.5.0-pyt",
             "--network-arch", "dino", "--action", "train", "--results-dir", "/results/dino"]


@dataclass(frozen=True)
class Place:
    """Where a test keeps its records, and what a child process needs in its environment to
    reach them (besides the location itself)."""

    root: str
    env: dict[str, str]

    def store(self) -> RecordStore:
        return RecordStore(self.root)

    def cli_env(self) -> dict[str, str]:
        return {**self.env, "TAO_DATA_IO_RECORDS": self.root}


@pytest.fixture(params=["directory", "s3"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Place:
    if request.param == "directory":
        return Place(str(tmp_path / "jobs"), {})
    env = request.getfixturevalue("s3_env")  # also puts the credentials in this process's environment
    return Place(request.getfixturevalue("s3_prefix"), dict(env))


def append_upload(entry: dict[str, Any]) -> Callable[[JobRecord], JobRecord]:
    return lambda record: record.model_copy(update={"uploads": [*record.uploads, entry]})


def stored_bytes(store: RecordStore, job_id: str) -> bytes:
    document = store.storage.read(job_id)
    assert document is not None
    return document.data


def put_raw(store: RecordStore, name: str, data: bytes) -> None:
    """Write a document beside the records behind the store's back (a hand edit, a bad copy)."""
    storage = store.storage
    if isinstance(storage, S3Storage):
        storage.client.put_object(Bucket=storage.bucket, Key=f"{storage.url.key}{RECORDS}{name}", Body=data)
    else:
        assert isinstance(storage, DirectoryStorage)
        storage.root.mkdir(parents=True, exist_ok=True)
        (storage.root / name).write_bytes(data)


# --------------------------------------------------------------------------- the CLI
def test_open_mark_show_list_through_the_cli(place: Place) -> None:
    env = place.cli_env()
    opened = run_cli("record", "open", *OPEN_ARGS, "--storage-tier", "B", "--storage-reason", "dataset 40 GB", env=env)
    assert opened.returncode == 0, opened.stderr
    job_id = opened.stdout.strip()
    assert opened.stdout == job_id + "\n" and re.fullmatch(r"tao-\d{8}-[0-9a-f]{10}", job_id)

    running = run_cli("record", "mark", job_id, "--state", "RUNNING", "--backend-ref", f"tao-jobs/{job_id}",
                      "--reporter", "agent", "--message", "pod started", env=env)
    assert running.returncode == 0, running.stderr
    done = run_cli("record", "mark", job_id, "--state", "COMPLETE", "--reporter", "flow", env=env)
    assert done.returncode == 0, done.stderr

    shown = run_cli("record", "show", job_id, env=env)
    assert shown.returncode == 0, shown.stderr
    assert f"tao-jobs/{job_id}" in shown.stdout and "tier B — dataset 40 GB" in shown.stdout
    history_lines = shown.stdout.split("history:\n")[1].splitlines()
    assert [line.split()[1:3] for line in history_lines] == [["PENDING", "cli"], ["RUNNING", "agent"],
                                                             ["COMPLETE", "flow"]]
    assert "pod started" in history_lines[1]

    document = json.loads(run_cli("record", "show", job_id, "--json", "--root", place.root, env=place.env).stdout)
    assert document["schema_version"] == "1" and document["state"] == "COMPLETE"
    assert document["backend_ref"] == f"tao-jobs/{job_id}" and document["created_at"].endswith("Z")
    assert [step["state"] for step in document["history"]] == ["PENDING", "RUNNING", "COMPLETE"]
    assert JobRecord.model_validate_json(stored_bytes(place.store(), job_id)).model_dump(mode="json") == document

    listed = run_cli("record", "list", env=env)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split() == [job_id, "COMPLETE", "B", document["updated_at"][:19] + "Z", "train"]
    assert run_cli("record", "list", "--state", "RUNNING", env=env).stdout == ""
    assert run_cli("record", "list", "--state", "COMPLETE", env=env).stdout == listed.stdout


def test_directory_records_are_private_files_readable_by_hand(tmp_path: Path) -> None:
    store = RecordStore(tmp_path / "jobs")
    job_id = store.open(**JOB).job_id
    path = tmp_path / "jobs" / f"{job_id}.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert JobRecord.model_validate_json(path.read_bytes()) == store.get(job_id)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["open", *OPEN_ARGS, "--job-id", "Job_42"], "--job-id 'Job_42' is not a valid job id"),
        (["open", *OPEN_ARGS, "--job-id", "../../etc/passwd"], "'../../etc/passwd' is not a valid job id"),
        (["open", *OPEN_ARGS, "--job-id", "a" * 53], "1-52 lowercase"),
        (["open", *OPEN_ARGS, "--storage-reason", "big"], "--storage-reason 'big' comes without a storage_tier"),
        (["open", *OPEN_ARGS, "--job-id", "tao-1", "--image", "other:1"], "--job-id 'tao-1' already names a different"),
        (["open", *OPEN_ARGS[2:], "--backend", "k8s"], "--backend 'k8s' is not known here: use 'local', "
                                                         "'kubernetes', 'docker' or 'slurm'"),
        (["mark", "tao-1", "--state", "DONE"], "invalid choice: 'DONE'"),
        (["mark", "tao-1", "--state", "RUNNING", "--backend-ref", "job\nid"], "--backend-ref 'job\\nid' must be 1-512 "
                                                                            "printable characters on one line"),
        (["mark", "tao-1", "--state", "RUNNING", "--backend-ref", "x" * 513], "must be 1-512 printable"),
        (["mark", "tao-1", "--state", "RUNNING", "--backend-ref", " "], "--backend-ref ' ' must be 1-512 printable "
                                                                       "characters, not blank nor padded with spaces"),
        (["mark", "tao-1", "--state", "RUNNING", "--backend-ref", "toy:1 "], "not blank nor padded with spaces"),
        (["show", "tao-missing"], "no job record 'tao-missing': looked for"),
        (["list", "--state", "DONE"], "invalid choice: 'DONE'"),
    ],
)
def test_bad_input_exits_2_naming_the_value(tmp_path: Path, args: list[str], expected: str) -> None:
    store = RecordStore(tmp_path)
    store.open(**JOB, job_id="tao-1")
    result = run_cli("record", *args, "--root", str(tmp_path), env={})
    assert result.returncode == 2
    assert result.stderr.startswith("error:") and expected in result.stderr
    assert [record.job_id for record in store.list_records()] == ["tao-1"]


def test_listing_a_directory_that_does_not_exist_is_an_error_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "typo"
    result = run_cli("record", "list", "--root", str(missing), env={})
    assert result.returncode == 2 and f"--root '{missing}' does not exist" in result.stderr
    from_env = run_cli("record", "list", env={"TAO_DATA_IO_RECORDS": str(missing)})
    assert from_env.returncode == 2 and f"TAO_DATA_IO_RECORDS '{missing}' does not exist" in from_env.stderr
    assert not missing.exists()


def test_a_record_opened_in_one_process_is_read_in_another_with_only_the_variable(s3_env: dict[str, str],
                                                                                   s3_prefix: str) -> None:
    env = {**s3_env, "TAO_DATA_IO_RECORDS": s3_prefix}  # what every pod of a flow gets
    opened = run_cli("record", "open", *OPEN_ARGS, "--job-id", "tao-pods", env=env)
    assert opened.returncode == 0, opened.stderr
    marked = run_cli("record", "mark", "tao-pods", "--state", "RUNNING", "--reporter", "agent", env=env)
    assert marked.returncode == 0, marked.stderr
    shown = run_cli("record", "show", "tao-pods", "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    assert [step["state"] for step in json.loads(shown.stdout)["history"]] == ["PENDING", "RUNNING"]
    running = run_cli("record", "list", "--state", "RUNNING", env=env)
    assert running.stdout.split()[:3] == ["tao-pods", "RUNNING", "-"]


# --------------------------------------------------------------------------- the state machine
def test_terminal_state_is_final_and_the_same_terminal_state_is_a_no_op(place: Place) -> None:
    store = place.store()
    job_id = store.open(**JOB).job_id
    store.mark(job_id, "RUNNING", reporter="agent")
    store.mark(job_id, "ERROR", reporter="agent", message="OOMKilled")
    before = stored_bytes(store, job_id)

    refused = run_cli("record", "mark", job_id, "--state", "RUNNING", "--root", place.root, env=place.env)
    assert refused.returncode == 2 and refused.stderr.startswith("error:")
    assert "already ERROR" in refused.stderr and "final" in refused.stderr
    again = run_cli("record", "mark", job_id, "--state", "ERROR", "--reporter", "flow", "--root", place.root,
                    env=place.env)
    assert again.returncode == 0, again.stderr

    assert stored_bytes(store, job_id) == before
    with pytest.raises(UsageError, match="already ERROR"):
        store.mark(job_id, "COMPLETE", reporter="flow")
    assert [step.state for step in store.get(job_id).history] == ["PENDING", "RUNNING", "ERROR"]


def test_missing_job_names_the_id_and_where_it_looked(tmp_path: Path, s3_env: dict[str, str], s3_prefix: str) -> None:
    for root in (tmp_path, tmp_path / "not-yet"):
        looked = f"no job record 'tao-nope': looked for {root / 'tao-nope.json'}"
        with pytest.raises(UsageError, match=re.escape(looked)):
            RecordStore(root).mark("tao-nope", "RUNNING", reporter="cli")
    assert not (tmp_path / "not-yet").exists()
    with pytest.raises(UsageError, match=re.escape(f"looked for {s3_prefix}p/records/tao-nope.json (records are "
                                                   f"read from root '{s3_prefix}p/'")):
        RecordStore(f"{s3_prefix}p").get("tao-nope")


def test_history_is_in_report_order_and_repeated_reports_do_not_flood_it(place: Place) -> None:
    store = place.store()
    job_id = store.open(**JOB, reporter="flow").job_id
    store.mark(job_id, "RUNNING", reporter="agent", backend_ref="tao/job-1")
    store.mark(job_id, "RUNNING", reporter="agent")  # a heartbeat: nothing new
    store.mark(job_id, "RUNNING", reporter="agent", message="epoch 3/10")
    store.mark(job_id, "CANCELED", reporter="cli", message="stopped by user")
    store.mark(job_id, "CANCELED", reporter="flow")
    record = store.get(job_id)
    assert [(s.state, s.reporter, s.message) for s in record.history] == [
        ("PENDING", "flow", "opened"), ("RUNNING", "agent", None), ("RUNNING", "agent", "epoch 3/10"),
        ("CANCELED", "cli", "stopped by user")]
    assert [s.at for s in record.history] == sorted(s.at for s in record.history)
    assert record.updated_at == record.history[-1].at and record.message == "stopped by user"
    assert record.backend_ref == "tao/job-1"

    store.open(**JOB, job_id="other")
    store.mark("other", "RUNNING", reporter="agent", backend_ref="tao/other")
    with pytest.raises(UsageError, match="already runs as 'tao/other'; refusing backend_ref 'tao/other-2'"):
        store.mark("other", "RUNNING", reporter="agent", backend_ref="tao/other-2")


def test_open_is_idempotent_for_the_same_job_and_refuses_a_different_one(place: Place) -> None:
    store = place.store()
    first = store.open(**JOB, job_id="tao-retry")
    store.mark("tao-retry", "RUNNING", reporter="agent")
    retried = store.open(**JOB, job_id="tao-retry")
    assert retried.state == "RUNNING" and retried.created_at == first.created_at and len(retried.history) == 2
    with pytest.raises(UsageError, match=r"job_id 'tao-retry' already names a different job \(image is"):
        store.open(**{**JOB, "image": "other:1"}, job_id="tao-retry")
    assert store.get("tao-retry") == retried


def test_one_id_opened_by_many_writers_at_once_is_one_job(place: Place) -> None:
    writers = 6
    stores = [place.store() for _ in range(writers)]
    start = threading.Barrier(writers)

    def open_same(store: RecordStore) -> JobRecord:
        start.wait()
        return store.open(**JOB, job_id="tao-twice", reporter="flow")

    with ThreadPoolExecutor(writers) as pool:
        opened = list(pool.map(open_same, stores))
    assert all(record == opened[0] for record in opened)  # one creation; everyone else got it back
    assert [r.job_id for r in stores[0].list_records()] == ["tao-twice"]

    images = [f"image:{n}" for n in range(writers)]
    start.reset()

    def open_different(store: RecordStore, image: str) -> str:
        start.wait()
        try:
            return store.open(**{**JOB, "image": image}, job_id="tao-rivals").image
        except UsageError as exc:
            assert "job_id 'tao-rivals' already names a different job (image is" in str(exc)
            return "refused"

    with ThreadPoolExecutor(writers) as pool:
        outcomes = list(pool.map(open_different, stores, images))
    winners = [outcome for outcome in outcomes if outcome != "refused"]
    assert len(winners) == 1 and stores[0].get("tao-rivals").image == winners[0]


def test_update_changes_route_and_uploads_but_not_state_identity_or_tier(place: Place) -> None:
    store = place.store()
    job_id = store.open(**JOB).job_id
    routed = store.update(job_id, lambda r: r.model_copy(update={
        "output_route": {"route": "s3", "destination": "s3://results/dino/", "reason": "tier B"}}))
    assert routed.output_route is not None and routed.output_route.destination == "s3://results/dino/"
    store.update(job_id, append_upload({"files": 3, "bytes": 1024}))
    for field, value in (("state", "COMPLETE"), ("job_id", "tao-elsewhere"), ("history", []), ("storage_tier", "B")):
        with pytest.raises(UsageError, match=f"may not change {field}"):
            store.update(job_id, lambda r, f=field, v=value: r.model_copy(update={f: v}))
    assert store.get(job_id).uploads == [{"files": 3, "bytes": 1024}] and store.get(job_id).state == "PENDING"


def test_the_tier_is_decided_once_after_open(place: Place) -> None:
    store = place.store()
    opened = store.open(**JOB, job_id="tao-tier")
    assert opened.storage_tier is None and opened.storage_reason is None
    decided = store.set_tier("tao-tier", "B", "dataset 40 GB")
    assert (decided.storage_tier, decided.storage_reason) == ("B", "dataset 40 GB")
    assert store.set_tier("tao-tier", "B", "asked again") == decided  # a retried step changes nothing
    with pytest.raises(UsageError, match=r"already has storage tier 'B' \(dataset 40 GB\); refusing tier 'C'"):
        store.set_tier("tao-tier", "C", None)
    with pytest.raises(UsageError, match="tier 'D' is not a storage tier: use one of A, B, C"):
        store.set_tier("tao-tier", "D", None)
    # Open with a tier is open, then set_tier: a retry with another tier is refused alike.
    assert store.open(**JOB, job_id="tao-tier", storage_tier="B") == decided
    with pytest.raises(UsageError, match="refusing tier 'A'"):
        store.open(**JOB, job_id="tao-tier", storage_tier="A")
    assert store.get("tao-tier") == decided

    store.open(**JOB, job_id="tao-done")
    store.mark("tao-done", "COMPLETE", reporter="agent")
    with pytest.raises(UsageError, match="already COMPLETE, a final state; refusing to set its storage tier to 'A'"):
        store.set_tier("tao-done", "A", None)


def test_a_credential_value_is_refused_while_its_name_is_fine(place: Place, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "nvapi-wJalrXUtnFEMI-K7MDENG-bPxRfiCY"
    monkeypatch.setenv("NGC_API_KEY", secret)
    store = place.store()
    with pytest.raises(UsageError) as caught:
        store.open(**{**JOB, "image": secret})
    assert "'image'" in str(caught.value) and secret not in str(caught.value)

    job_id = store.open(**JOB).job_id
    with pytest.raises(UsageError, match="field 'storage_reason'"):
        store.set_tier(job_id, "B", f"chosen with {secret}")
    store.set_tier(job_id, "B", "credentials come from NGC_API_KEY")
    before = stored_bytes(store, job_id)
    for change in (append_upload({"report": f"uploaded with key {secret}"}), append_upload({secret: 1})):
        with pytest.raises(UsageError, match=r"'uploads\[0\]") as caught:
            store.update(job_id, change)
        assert secret not in str(caught.value)
    with pytest.raises(UsageError, match="'message' holds"):
        store.mark(job_id, "ERROR", reporter="agent", message=secret)
    assert stored_bytes(store, job_id) == before

    result = run_cli("record", "open", *OPEN_ARGS[:-1], f"/results/{secret}", "--root", place.root,
                     env={**place.env, "NGC_API_KEY": secret})
    assert result.returncode == 2 and "'results_dir'" in result.stderr and secret not in result.stderr
    assert [record.job_id for record in store.list_records()] == [job_id]


def test_list_skips_and_reports_damaged_records_and_ignores_what_is_not_a_record(place: Place) -> None:
    store = place.store()
    good = store.open(**JOB).job_id
    put_raw(store, "tao-broken.json", b'{"schema_version": "1", "job_id": "tao-bro')
    put_raw(store, f".{good}.json.x1y2.tmp", b"{")  # a killed writer's leftover
    put_raw(store, "Not_A_Job.json", b"{}")
    result = run_cli("record", "list", "--json", "--root", place.root, env=place.env)
    assert result.returncode == 1
    assert [doc["job_id"] for doc in json.loads(result.stdout)] == [good]
    assert "tao-broken.json" in result.stderr and "Not_A_Job" not in result.stderr and ".tmp" not in result.stderr
    damaged: list[tuple[str, str]] = []
    assert [r.job_id for r in store.list_records(on_damaged=lambda where, why: damaged.append((where, why)))] == [good]
    assert [where for where, _ in damaged] == [store.storage.where("tao-broken")]
    with pytest.raises(DamagedRecordError, match="tao-broken.json is not a valid job record"):
        store.mark("tao-broken", "RUNNING", reporter="agent")  # reported, never overwritten


def test_a_record_larger_than_any_record_is_refused_without_reading_it_whole(place: Place) -> None:
    """A document under a record's name that is bigger than a record can be (a bad copy, a hand
    edit, someone else's object) is reported as damaged from its size, never read into memory
    whole, never overwritten — and listing the rest goes on."""
    store = place.store()
    good = store.open(**JOB).job_id
    huge = RECORD_LIMIT_BYTES + 1
    put_raw(store, "tao-huge.json", b'{"schema_version": "1", "note": "' + b"x" * huge + b'"}')
    with pytest.raises(DamagedRecordError,
                       match=rf"tao-huge.json is larger than a job record may be .*{RECORD_LIMIT_BYTES}"):
        store.get("tao-huge")
    assert [r.job_id for r in store.list_records(on_damaged=lambda where, why: None)] == [good]


# --------------------------------------------------------------------------- crashes and concurrency
_WRITER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from tao_data_io.records import RecordStore

    store = RecordStore(Path(sys.argv[1]))
    ids = [f"kill-{n}" for n in range(3)]
    for job_id in ids:
        store.open(backend="k8s", image="i", network_arch="a", action="train", results_dir="/r", job_id=job_id)
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
    records = store.list_records(on_damaged=lambda where, reason: damaged.append(reason))
    assert damaged == [] and [r.job_id for r in records] == ["kill-0", "kill-1", "kill-2"]
    for path in tmp_path.glob("*.json"):
        if not path.name.startswith("."):  # a killed writer's temp file may be half written: that is its job
            json.loads(path.read_text())
    # The lock died with its holder, and the next writer clears that job's leftovers.
    temp_path_for(tmp_path / "kill-0.json", lock_tag(tmp_path / ".kill-0.lock")).write_text('{"half": ')
    for record in records:
        store.update(record.job_id, append_upload({"after": "kill"}))
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == [
        "kill-0.json", "kill-1.json", "kill-2.json"]


_MARKER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from tao_data_io.records import RecordStore

    root, signals, worker = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    store = RecordStore(root)
    (signals / f"ready-{worker}").touch()
    while not (signals / "go").exists():
        time.sleep(0.001)
    for n in range(5):
        store.mark("tao-shared", "RUNNING", reporter=f"worker-{worker}", message=f"{worker}/{n}")
""")


def test_concurrent_marks_from_ten_processes_are_all_kept(place: Place, tmp_path: Path) -> None:
    store = place.store()
    store.open(**JOB, job_id="tao-shared")
    signals = tmp_path / "signals"
    signals.mkdir()
    workers = [str(n) for n in range(10)]
    children = [subprocess.Popen([sys.executable, "-c", _MARKER, place.root, str(signals), worker])
                for worker in workers]
    while not all((signals / f"ready-{worker}").exists() for worker in workers):
        assert all(child.poll() is None for child in children), "a marker died before starting"
        time.sleep(0.01)
    (signals / "go").touch()
    assert [child.wait() for child in children] == [0] * len(workers)
    history = store.get("tao-shared").history
    assert [step.state for step in history] == ["PENDING"] + ["RUNNING"] * 50
    for worker in workers:  # every report kept, each process's in its own order
        assert [step.message for step in history if step.reporter == f"worker-{worker}"] == [
            f"{worker}/{n}" for n in range(5)]


# --------------------------------------------------------------------------- S3 specifics
def s3_store(prefix: str, **kwargs: Any) -> RecordStore:
    return RecordStore(prefix, **kwargs)


def test_seaweedfs_honours_the_conditional_writes_the_s3_backend_relies_on(s3_env: dict[str, str],
                                                                          s3_prefix: str) -> None:
    storage = s3_store(s3_prefix).storage
    assert storage.create("tao-cond", b"{}") is True
    assert storage.create("tao-cond", b"{}") is False  # If-None-Match: * on an existing object → 412
    first = storage.read("tao-cond")
    assert first is not None and first.version
    assert storage.replace("tao-cond", b'{"v": 2}', first.version) is True
    assert storage.replace("tao-cond", b'{"v": 3}', first.version) is False  # If-Match on a stale ETag → 412
    assert storage.replace("tao-gone", b"{}", first.version) is False
    current = storage.read("tao-cond")
    assert current is not None and current.data == b'{"v": 2}'


def put_statuses(store: RecordStore) -> list[int]:
    """The HTTP status of every PUT this store's client makes from now on (botocore's event hook)."""
    statuses: list[int] = []
    store.storage.client.meta.events.register(
        "after-call.s3.PutObject", lambda http_response, **_: statuses.append(http_response.status_code))
    return statuses


def test_two_writers_racing_both_updates_are_kept(s3_env: dict[str, str], s3_prefix: str) -> None:
    first, second = s3_store(s3_prefix), s3_store(s3_prefix)
    first.open(**JOB, job_id="tao-race")
    statuses = put_statuses(first)
    seen: list[int] = []

    def overtaken_once(record: JobRecord) -> JobRecord:
        seen.append(len(record.uploads))
        if len(seen) == 1:  # the second writer lands between the first's read and its write
            second.update("tao-race", append_upload({"by": "second"}))
        return record.model_copy(update={"uploads": [*record.uploads, {"by": "first"}]})

    first.update("tao-race", overtaken_once)
    assert seen == [0, 1]  # refused, re-read, applied again to what the second writer left
    assert [status for status in statuses if status == 412] == [412]
    assert [u["by"] for u in first.get("tao-race").uploads] == ["second", "first"]


def test_a_writer_that_always_loses_gives_up_with_a_clear_error(s3_env: dict[str, str], s3_prefix: str) -> None:
    loser, other = s3_store(s3_prefix, retry=Retry(attempts=3, first_pause=0.01, max_pause=0.01)), s3_store(s3_prefix)
    loser.open(**JOB, job_id="tao-busy")

    def always_overtaken(record: JobRecord) -> JobRecord:
        other.update("tao-busy", append_upload({"by": "other"}))
        return record.model_copy(update={"uploads": [*record.uploads, {"by": "loser"}]})

    with pytest.raises(RecordConflictError, match=r"job 'tao-busy': 3 attempts to write its record at "
                                                  rf"{s3_prefix}records/tao-busy.json each found it changed"):
        loser.update("tao-busy", always_overtaken)
    assert [u["by"] for u in other.get("tao-busy").uploads] == ["other"] * 3


def test_a_write_whose_answer_was_lost_is_not_applied_twice(s3_env: dict[str, str], s3_prefix: str) -> None:
    store = s3_store(s3_prefix)
    store.open(**JOB, job_id="tao-lost")
    resent: list[str] = []

    def lose_first_answer(response: Any, request_dict: dict[str, Any], **_: Any) -> float | None:
        # As if the connection dropped after the server applied the PUT: botocore sends it again.
        if (not resent and response is not None and response[0].status_code == 200
                and "tao-lost.json" in request_dict["url"]):
            resent.append(request_dict["url"])
            return 0
        return None

    store.storage.client.meta.events.register("needs-retry.s3.PutObject", lose_first_answer)
    updated = store.update("tao-lost", append_upload({"n": 1}))
    assert resent and updated.uploads == [{"n": 1}] and store.get("tao-lost") == updated


def markers(store: RecordStore) -> dict[str, list[str]]:
    """state → job ids filed under it in the S3 index."""
    storage = store.storage
    assert isinstance(storage, S3Storage)
    listed = storage.client.list_objects_v2(Bucket=storage.bucket, Prefix=f"{storage.url.key}by-state/")
    found: dict[str, list[str]] = {}
    for item in listed.get("Contents", []):
        state, job_id = item["Key"].split("/")[-2:]
        found.setdefault(state, []).append(job_id)
    return found


def test_listing_by_state_reads_only_the_records_filed_under_it(s3_env: dict[str, str], s3_prefix: str) -> None:
    store = s3_store(s3_prefix)
    ids = [store.open(**JOB, job_id=f"tao-{n}").job_id for n in range(8)]
    for job_id in ids[:5]:
        store.mark(job_id, "RUNNING", reporter="agent")
    for job_id in ids[2:5]:
        store.mark(job_id, "COMPLETE", reporter="agent")
    assert markers(store) == {"COMPLETE": ids[2:5], "PENDING": ids[5:], "RUNNING": ids[:2]}

    gets: list[str] = []
    store.storage.client.meta.events.register(
        "before-send.s3", lambda request, **_: gets.append(request.url) if request.method == "GET" else None)
    assert [record.job_id for record in store.list_records(state="RUNNING")] == ids[:2]
    assert len(gets) == 3 and "list-type=2" in gets[0]  # one listing of the RUNNING markers…
    assert [url.rsplit("/", 1)[1] for url in gets[1:]] == ["tao-0.json", "tao-1.json"]  # …and those two records
    gets.clear()
    assert len(store.list_records()) == 8 and len(gets) == 1 + 8 + 1  # records, each record, the index


def test_the_state_index_heals_after_a_crash(s3_env: dict[str, str], s3_prefix: str) -> None:
    store = s3_store(s3_prefix)
    storage = store.storage
    assert isinstance(storage, S3Storage)
    for job_id in ("tao-a", "tao-b", "tao-c"):
        store.open(**JOB, job_id=job_id)
    store.mark("tao-b", "COMPLETE", reporter="agent")
    store.mark("tao-c", "RUNNING", reporter="agent")

    def put_marker(state: str, job_id: str) -> None:
        storage.client.put_object(Bucket=storage.bucket, Key=f"{storage.url.key}by-state/{state}/{job_id}", Body=b"")

    # Writers killed between a record and its marker: b's RUNNING marker left behind, c's gone,
    # c's PENDING marker back; and a marker whose record was removed by hand.
    put_marker("RUNNING", "tao-b")
    storage.client.delete_object(Bucket=storage.bucket, Key=f"{storage.url.key}by-state/RUNNING/tao-c")
    put_marker("PENDING", "tao-c")
    put_marker("RUNNING", "tao-gone")

    assert store.list_records(state="RUNNING") == []  # c is missed until the index heals…
    assert "RUNNING" not in markers(store)  # …b is final elsewhere and tao-gone has no record: both dropped
    assert [record.job_id for record in store.list_records(state="PENDING")] == ["tao-a"]
    assert markers(store)["PENDING"] == ["tao-a", "tao-c"]  # c may become PENDING again: only a full read knows

    assert len(store.list_records()) == 3  # a full listing makes the index agree with the records
    assert markers(store) == {"COMPLETE": ["tao-b"], "PENDING": ["tao-a"], "RUNNING": ["tao-c"]}
    assert [record.job_id for record in store.list_records(state="RUNNING")] == ["tao-c"]

    storage.client.delete_object(Bucket=storage.bucket, Key=f"{storage.url.key}by-state/PENDING/tao-a")
    store.update("tao-a", append_upload({"n": 1}))  # and a job's next write re-files it
    assert markers(store)["PENDING"] == ["tao-a"]


# --------------------------------------------------------------------------- where records live
def test_the_location_comes_from_the_argument_then_the_variables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 s3_env: dict[str, str], s3_prefix: str) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TAO_DATA_IO_RECORDS", raising=False)
    monkeypatch.delenv("TAO_DATA_IO_JOBS_DIR", raising=False)
    assert RecordStore().location == str(tmp_path / "home" / ".tao-data-io" / "jobs")

    monkeypatch.setenv("TAO_DATA_IO_JOBS_DIR", str(tmp_path / "legacy"))  # the name from before S3
    job_id = RecordStore().open(**JOB).job_id
    assert (tmp_path / "legacy" / f"{job_id}.json").is_file()
    monkeypatch.setenv("TAO_DATA_IO_RECORDS", str(tmp_path / "legacy"))
    assert RecordStore().get(job_id).job_id == job_id  # both naming one place is fine
    monkeypatch.setenv("TAO_DATA_IO_RECORDS", s3_prefix.rstrip("/"))
    with pytest.raises(UsageError, match=f"TAO_DATA_IO_RECORDS '{s3_prefix.rstrip('/')}' and the legacy "
                                         f"TAO_DATA_IO_JOBS_DIR '{tmp_path / 'legacy'}' name different places"):
        RecordStore()
    monkeypatch.delenv("TAO_DATA_IO_JOBS_DIR")
    assert RecordStore().location == s3_prefix and isinstance(RecordStore().storage, S3Storage)

    assert RecordStore(tmp_path / "arg").location == str(tmp_path / "arg")  # the argument wins
    assert RecordStore(str(tmp_path / "arg")).location == str(tmp_path / "arg")
    elsewhere = RecordStore(environ={"TAO_DATA_IO_RECORDS": str(tmp_path / "given")})
    assert elsewhere.location == str(tmp_path / "given")  # environ replaces os.environ entirely
    with pytest.raises(CredentialError, match="set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"):
        RecordStore(s3_prefix, environ={})


# --------------------------------------------------------------------------- the record of a request
@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("dino train -e /specs/train.yaml", ("dino", "train")),
        (["classification_pyt", "dataset_convert", "-e", "{config_path}"], ("classification_pyt", "dataset_convert")),
        ("/opt/scripts/run.sh --epochs 3", ("run.sh", "run")),
        ("python3 /workspace/train.py", ("python3", "run")),
        ("python3.10 -m tao.train", ("python3.10", "run")),
        ("torchrun --nproc_per_node 8 train.py", ("torchrun", "run")),
        ("nvidia-smi", ("nvidia-smi", "run")),
        ("dino -e spec.yaml", ("dino", "run")),
        ("dino specs/train.yaml", ("dino", "run")),
    ],
)
def test_network_and_action_come_from_the_first_words_of_the_command(command: str | list[str],
                                                                     expected: tuple[str, str]) -> None:
    assert network_and_action(command) == expected


@pytest.mark.parametrize(("command", "expected"), [("", "command '' is empty"), ([], "command [] is empty"),
                                                   ("dino train -e 'spec", "balance its quotes")])
def test_a_command_without_words_is_refused(command: str | list[str], expected: str) -> None:
    with pytest.raises(UsageError, match=re.escape(expected)):
        network_and_action(command)


def test_open_for_a_request_is_idempotent_on_its_job_id(tmp_path: Path) -> None:
    store = RecordStore(tmp_path)
    document = {"schema_version": "1", "job_id": "tao-req", "image": "nvcr.io/nvidia/tao/tao-toolkit:5.5.0-pyt",
                "command": "dino train -e {config_path}", "mode": "config", "config_format": "yaml",
                "spec": {"train": {"num_epochs": 3}},
                "outputs": {"results_dir": "/results/dino", "upload_excludes": ["*.tmp", "checkpoints/*.ckpt"]}}
    request = JobRequest.model_validate(document)
    record = open_for(request, backend="k8s", reporter="flow", store=store)
    assert (record.job_id, record.image, record.network_arch, record.action, record.results_dir) == (
        "tao-req", request.image, "dino", "train", "/results/dino")
    assert record.upload_excludes == ["*.tmp", "checkpoints/*.ckpt"] and record.storage_tier is None
    assert record.backend == "k8s" and record.history[0].reporter == "flow"
    assert open_for(request, backend="k8s", store=store) == record  # a retried submit: the same job
    # Nothing launched yet (a submit that failed staging): the changed request takes the job over,
    # keeping the history, dropping what was decided for the old one.
    store.set_tier("tao-req", "B", "staged for the first request")
    changed = open_for(request.model_copy(update={"image": "other:1"}), backend="k8s", store=store)
    assert changed.image == "other:1" and changed.request_digest != record.request_digest
    assert changed.storage_tier is None and changed.state == "PENDING" and len(changed.history) == 2
    assert "changed request" in str(changed.history[-1].message)
    # Once a launch began, another request is another job.
    store.update("tao-req", lambda current: current.model_copy(update={"backend_config": {"namespace": "tao"}}))
    with pytest.raises(UsageError, match="job_id 'tao-req' already names a different job .* was launched"):
        open_for(request, backend="k8s", store=store)

    minted = open_for(JobRequest.model_validate({**document, "job_id": None}), backend="k8s", store=store)
    assert re.fullmatch(r"tao-\d{8}-[0-9a-f]{10}", minted.job_id)
    assert sorted(r.job_id for r in store.list_records()) == sorted(["tao-req", minted.job_id])


def test_a_record_from_a_newer_version_reads_and_keeps_its_new_fields(
        place: Place, monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers, pods and laptops upgrade one at a time. A field a newer version adds to a record
    (within schema_version "1", additions only) must not make an older reader call the record
    damaged, and must survive that reader's writes: it is the newer version's data."""
    store = place.store()
    job_id = store.open(**JOB).job_id
    document = {**store.get(job_id).model_dump(mode="json"), "added_later": {"by": "a newer tao-data-io"}}
    put_raw(store, f"{job_id}.json", json.dumps(document).encode())
    assert store.get(job_id).state == "PENDING"
    store.mark(job_id, "RUNNING", reporter="agent")
    kept = json.loads(store.get(job_id).encode())
    assert kept["state"] == "RUNNING" and kept["added_later"] == {"by": "a newer tao-data-io"}
    # A newer field is data like any other: a credential value there is still refused.
    secret = "sk-record-newer-field-0123456789"
    monkeypatch.setenv("TAO_TEST_RECORD_SECRET_KEY", secret)
    with pytest.raises(UsageError, match="holds the value of a credential"):
        validated({**kept, "added_later": secret})


def test_a_record_that_calls_its_backend_platform_still_reads(place: Place) -> None:
    """Records written before the word was settled call the backend ``platform``: such a record
    reads, is still the same job to a retried open, and is written back with the one word."""
    store = place.store()
    job_id = store.open(**JOB).job_id
    document = store.get(job_id).model_dump(mode="json")
    document["platform"] = document.pop("backend")
    put_raw(store, f"{job_id}.json", json.dumps(document).encode())
    assert store.get(job_id).backend == JOB["backend"]
    assert store.open(**JOB, job_id=job_id).job_id == job_id  # the same job: nothing refused, nothing new
    store.mark(job_id, "RUNNING", reporter="agent")
    written = json.loads(stored_bytes(store, job_id))
    assert written["backend"] == JOB["backend"] and "platform" not in written


def test_a_history_that_calls_its_reporter_source_still_reads(place: Place) -> None:
    """A history written before the word was settled says who reported each change as ``source``
    (the word for an input's URI): it reads, and is written back with the one word."""
    store = place.store()
    job_id = store.open(**JOB, reporter="flow").job_id
    document = store.get(job_id).model_dump(mode="json")
    for step in document["history"]:
        step["source"] = step.pop("reporter")
    put_raw(store, f"{job_id}.json", json.dumps(document).encode())
    assert [step.reporter for step in store.get(job_id).history] == ["flow"]
    store.mark(job_id, "RUNNING", reporter="agent")
    written = json.loads(stored_bytes(store, job_id))
    assert [step["reporter"] for step in written["history"]] == ["flow", "agent"]
    assert not any("source" in step for step in written["history"])


def test_a_pods_copy_of_a_record_keeps_what_its_uploads_are_held_to(tmp_path: Path) -> None:
    """A pod's resyncs and final upload read the copy of the record it imported: the copy lost the
    job's ``results_limit`` (its uploads ran with no limit at all), its ``forward_env`` (masked by
    name) and its request's digest."""
    submitted = RecordStore(tmp_path / "submitter")
    submitted.open(job_id="held-job", results_limit="4Mi", forward_env=["HF_TOKEN"], request_digest="ab" * 32, **JOB)
    imported = run_cli("record", "import", str(tmp_path / "submitter" / "held-job.json"), "--root",
                       str(tmp_path / "pod"), env={})
    assert imported.returncode == 0, imported.stderr
    copy = RecordStore(tmp_path / "pod").get("held-job")
    assert (copy.results_limit, copy.forward_env, copy.request_digest) == ("4Mi", ["HF_TOKEN"], "ab" * 32)


@pytest.mark.parametrize("ref", ["12345", "tao/job-1", "c0ffee1234abcd", "slurm:4242.0"],
                         ids=["slurm-job-id", "kubernetes", "container-id", "with-colon"])
def test_a_record_keeps_each_backends_own_ref(tmp_path: Path, ref: str) -> None:
    """The record keeps the backend's own text (a SLURM job id, a container id, a Kubernetes
    NAMESPACE/NAME): the backend parses it, not the record."""
    store = RecordStore(tmp_path)
    store.open(**JOB, job_id="tao-1")
    assert store.mark("tao-1", "RUNNING", reporter="agent", backend_ref=ref).backend_ref == ref
