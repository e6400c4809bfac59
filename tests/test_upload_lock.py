"""The per-job upload lock across processes: a ``flock`` beside directory records, a lease object
beside S3 records (real HTTP against the embedded server). What must hold: one holder at a time;
a second caller that may not wait leaves at once; a live holder keeps its lease by renewing it; a
killed holder's lease expires and is taken over; a resync in another process sees the lease."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tao_data_io.embedded.s3 import EmbeddedS3
from tao_data_io.errors import UsageError
from tao_data_io.records import RecordStore
from tao_data_io.records.s3 import S3Storage
from tao_data_io.credentials import s3_credentials_from_env
from tao_data_io.transfer.activity import Activity
from tao_data_io.transfer.engine import TransferEngine
from tao_data_io.transfer.options import TransferOptions
from tao_data_io.transfer.upload import upload_digest_path
from tao_data_io.transfer.listing import s3_time_ns
from tao_data_io.uris import S3Url

from .helpers import run_cli, write_tree

JOB = dict(backend="k8s", image="nvcr.io/nvidia/tao/tao-toolkit:5.5.0-pyt", network_arch="dino",
           action="train", results_dir="/results/dino")
#: Long enough for a renewal every second on a loaded 2-core machine; short enough to wait out.
SHORT_LEASE = 3.0

_HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from tao_data_io.records import RecordStore
    from tao_data_io.transfer.activity import Activity

    root, job_id, seconds, release = sys.argv[1], sys.argv[2], float(sys.argv[3]), Path(sys.argv[4])
    moving, activity = sys.argv[5] == "moving", Activity()
    with RecordStore(root).upload_lock(job_id, wait=False, lease_seconds=seconds, activity=activity) as held:
        print("held" if held else "busy", flush=True)
        while held and not release.exists():
            if moving:  # bytes move: what an upload's reads and sends report
                activity.beat()
            time.sleep(0.01)
    print("released", flush=True)
""")


@contextmanager
def holder(root: str, job_id: str, tmp_path: Path, seconds: float = SHORT_LEASE,
           progress: str = "moving") -> Iterator[subprocess.Popen[str]]:
    """Another process holding the job's upload lock until ``tmp_path/release`` exists; its
    upload makes progress all along, or (``progress="stuck"``) none at all while it lives."""
    child = subprocess.Popen([sys.executable, "-c", _HOLDER, root, job_id, str(seconds), str(tmp_path / "release"),
                              progress], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stderr is not None
    try:
        assert child.stdout.readline() == "held\n", child.stderr.read()
        yield child
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
        child.stdout.close()
        child.stderr.close()


@pytest.fixture(params=["directory", "s3"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "directory":
        return str(tmp_path / "jobs")
    request.getfixturevalue("s3_env")  # the credentials, in this process and its children
    return str(request.getfixturevalue("s3_prefix"))


def lease(store: RecordStore, job_id: str) -> dict[str, Any] | None:
    """The lease object as the server has it: its body, Last-Modified and the server's clock."""
    storage = store.storage
    assert isinstance(storage, S3Storage)
    try:
        answer = storage.client.get_object(Bucket=storage.bucket, Key=f"{storage.url.key}locks/{job_id}.upload")
    except storage.client.exceptions.NoSuchKey:
        return None
    return {"body": json.loads(answer["Body"].read()), "written": s3_time_ns(answer["LastModified"]),
            "now": s3_time_ns(answer["ResponseMetadata"]["HTTPHeaders"]["date"])}


def test_one_holder_at_a_time_across_processes(root: str, tmp_path: Path) -> None:
    store = RecordStore(root)
    store.open(**JOB, job_id="tao-up")
    with holder(root, "tao-up", tmp_path) as child:
        with store.upload_lock("tao-up", wait=False) as held:
            assert held is False
        (tmp_path / "release").touch()
        assert child.stdout is not None and child.stdout.readline() == "released\n"
    told: list[str] = []
    with store.upload_lock("tao-up", wait=False, on_wait=told.append) as held:
        assert held is True and told == []
    if isinstance(store.storage, S3Storage):
        assert lease(store, "tao-up") is None  # released by deleting it


def test_a_live_holder_keeps_its_lease_by_renewing_it(s3_env: dict[str, str], s3_prefix: str, tmp_path: Path) -> None:
    root = s3_prefix
    store = RecordStore(root)
    with holder(root, "tao-renew", tmp_path):
        first = lease(store, "tao-renew")
        assert first is not None and first["body"]["lease_seconds"] == SHORT_LEASE
        expiry = first["written"] + SHORT_LEASE * 1e9
        deadline = time.monotonic() + 60
        while (now := lease(store, "tao-renew")) is not None and now["now"] <= expiry:  # server time, not ours
            assert time.monotonic() < deadline, "the server's clock did not pass the first expiry"
            time.sleep(0.2)
        assert now is not None and now["written"] > first["written"]  # renewed…
        with store.upload_lock("tao-renew", wait=False) as held:
            assert held is False  # …so still held after its first expiry


def test_a_killed_holders_lease_expires_and_is_taken_over(s3_env: dict[str, str], s3_prefix: str,
                                                          tmp_path: Path) -> None:
    root = s3_prefix
    store = RecordStore(root)
    with holder(root, "tao-dead", tmp_path) as child:
        child.kill()  # no release, no renewal: only expiry can free the lease
        child.wait()
    told: list[str] = []
    with store.upload_lock("tao-dead", wait=False) as held:
        assert held is False
    with store.upload_lock("tao-dead", wait=True, on_wait=told.append) as held:
        assert held is True
        taken = lease(store, "tao-dead")
        assert taken is not None and taken["body"]["lease_seconds"] == 120  # ours now, with the default lease
    assert len(told) == 2 and "another upload of job tao-dead holds the lease" in told[0]
    assert "waiting for it to finish" in told[0]
    assert f"lapsed: its holder died or made no progress for {SHORT_LEASE:g}s" in told[1]
    assert lease(store, "tao-dead") is None


def test_a_resync_in_another_process_leaves_while_the_lease_is_held(s3_server: EmbeddedS3, s3_env: dict[str, str],
                                                                    s3_prefix: str, shared_bucket: str,
                                                                    tmp_path: Path) -> None:
    root = s3_prefix
    store = RecordStore(root)
    store.open(**JOB, job_id="tao-sync")
    results = tmp_path / "results"
    write_tree(results, {"model.pth": b"weights"})
    env = {**s3_server.env(), "S3_BUCKET_NAME": shared_bucket, "TAO_DATA_IO_RECORDS": root,
           "XDG_CACHE_HOME": str(tmp_path / "cache")}
    resync = ("resync", "--job-id", "tao-sync", "--results-dir", str(results), "--settle-seconds", "0")
    with store.upload_lock("tao-sync", wait=False) as held:
        assert held
        busy = run_cli(*resync, env=env)
        assert busy.returncode == 0, busy.stderr
        assert "holds the lock" in busy.stdout and store.get("tao-sync").uploads == []
    done = run_cli(*resync, env=env)
    assert done.returncode == 0, done.stderr
    assert [entry["uploaded_files"] for entry in store.get("tao-sync").uploads] == [1]


def test_a_lease_must_last_some_time(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="lease_seconds 0 is not usable: give a positive number of seconds"):
        RecordStore(tmp_path).upload_lock("tao-up", wait=False, lease_seconds=0)


def test_a_holder_that_makes_no_progress_loses_the_lock_after_its_lease(root: str, tmp_path: Path) -> None:
    """Alive but stuck — in a read that never returns (a hung NFS server, a FIFO), a send that
    never ends: no byte moves, so the lock is not renewed, and after ``lease_seconds`` another
    upload breaks it, saying so, instead of waiting behind it forever (and ``collect`` behind that)."""
    store = RecordStore(root)
    told: list[str] = []
    with holder(root, "tao-stuck", tmp_path, progress="stuck") as child:
        started = time.monotonic()
        while True:
            with store.upload_lock("tao-stuck", wait=False, on_wait=told.append) as held:
                if held:
                    break
            assert time.monotonic() - started < 10 * SHORT_LEASE, "a holder making no progress kept the lock"
            time.sleep(0.1)
        assert child.poll() is None  # the holder still lives: its lock was broken, not dropped
    assert len(told) == 1 and "made no progress" in told[0] and "tao-stuck" in told[0], told


def test_a_released_lock_file_carries_no_lease(tmp_path: Path) -> None:
    """A lease left in a released file would let a waiter judge the next holder by it — and break
    that holder in the moment before it writes its own."""
    store = RecordStore(tmp_path / "jobs")
    with store.upload_lock("tao-gone", wait=False, lease_seconds=SHORT_LEASE) as held:
        assert held
        assert json.loads((tmp_path / "jobs" / ".tao-gone.upload.lock").read_bytes())["lease_seconds"] == SHORT_LEASE
    assert (tmp_path / "jobs" / ".tao-gone.upload.lock").read_bytes() == b""


def test_a_holder_whose_bytes_move_keeps_the_lock_past_its_lease(root: str, tmp_path: Path) -> None:
    store = RecordStore(root)
    with holder(root, "tao-moving", tmp_path):
        time.sleep(2.5 * SHORT_LEASE)
        with store.upload_lock("tao-moving", wait=False) as held:
            assert held is False


def test_an_upload_beats_for_every_chunk_it_sends_not_every_file(s3_env: dict[str, str], shared_bucket: str,
                                                                  tmp_path: Path) -> None:
    """One 50 GB checkpoint makes no per-file progress for an hour: the lock needs each chunk."""
    class Counted(Activity):
        beats = 0

        def beat(self) -> None:
            type(self).beats += 1
            super().beat()

    write_tree(tmp_path / "results", {"model.pth": b"w" * (10 * 1024 * 1024 + 1)})  # 11 chunks of at most 1 MiB
    with TransferEngine(s3_credentials_from_env(s3_env)) as engine:
        summary = engine.upload_directory(tmp_path / "results", S3Url(shared_bucket, "beats/"),
                                          TransferOptions(activity=Counted()))
    assert summary.ok and summary.transferred_files == 1
    assert Counted.beats >= 11
    # Deciding it again without the digest cache hashes it (another pod, a lost cache): 11 chunks
    # read, no byte sent — still progress.
    cache = upload_digest_path(tmp_path / "results")
    for part in cache.parent.glob(cache.name + "*"):  # the store and its WAL
        part.unlink()
    Counted.beats = 0
    with TransferEngine(s3_credentials_from_env(s3_env)) as engine:
        again = engine.upload_directory(tmp_path / "results", S3Url(shared_bucket, "beats/"),
                                        TransferOptions(activity=Counted()))
    assert again.ok and again.unchanged_files == 1 and Counted.beats >= 11
