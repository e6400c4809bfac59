"""What Prefect costs on top of the core: per flow and per task, the submit flow against the same
verb run directly (``tao_data_io.verbs``), and the resync flow against ``tao-data-io resync``.

Everything runs against a local Prefect server (the test harness's: the same server app on
127.0.0.1 with SQLite, analytics off) and the embedded SeaweedFS server, on this machine, A/B
interleaved (the order alternates every repetition), medians of ``--reps``.

1. **Overhead.** An empty flow, and a flow of ``--tasks`` no-op tasks made with the layer's own
   ``tasks.policy.step`` (retry condition, timeout, no cache), both with the flow options ours
   use (a persisted JSON result); per task = (with tasks − empty) / tasks. With Prefect's flow
   heartbeat on (what a deployment run has: a sync flow joins the heartbeat thread at exit) and
   off (what the tests set).
2. **Submit.** The demo's request (a folder, an annotation-selective input, an archive, a model
   from the hub stand-in, the config; the stand-in in the local frame): ``submit-tao-job``
   in-process against ``verbs.submit``, each on a fresh job id (so each stages everything).
3. **Resync.** ``--files`` results (1,000 and 10,000) of a RUNNING job in the local frame (the
   demo's, held before its first epoch) of which ``--changed`` change before every run:
   ``tao-data-io resync`` (a process, as a schedule runs it),
   ``resync-tao-outputs`` in a fresh process (what a deployment run adds: Prefect's imports and
   the run's API calls) and in-process (heartbeat on and off), and ``steps.resync_job`` in-process
   (the core alone). Target: the flow adds a fixed start-up, not a per-file cost — the same
   difference at both sizes.
4. **Watch.** The demo's job of ``--job-seconds`` (an epoch a second, a line of log and of
   ``status.json`` each) collected by ``verbs.collect`` directly (nothing shown) and by
   ``collect-tao-job`` (its log streamed into the run, the progress and KPI artifacts kept
   current): how long the job itself took (RUNNING to its end in its record), and the HTTP
   requests the flow run's process sent to the Prefect API while the job ran, per minute of job
   (the same flow on a job that had already ended is subtracted). Target: the same job time,
   a few requests a minute.

    .venv/bin/python bench/flows.py --reps 5
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# flows/ tasks/ blocks/ deployments/ load from the checkout, as Prefect's flow runs load them; first
# on the path, so ``flows`` is the package and not this file.
sys.path.insert(0, str(REPO))
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
#: A Prefect home of the run's own (results of the measured flows), unless the caller gave one.
OWN_HOME = None if "PREFECT_HOME" in os.environ else tempfile.mkdtemp(prefix="tao-bench-flows-prefect-")
if OWN_HOME is not None:
    os.environ["PREFECT_HOME"] = OWN_HOME
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")

from prefect import flow  # noqa: E402 - the environment above must be set first
from prefect.settings import (PREFECT_API_URL, PREFECT_FLOWS_HEARTBEAT_FREQUENCY,  # noqa: E402 - as above
                              temporary_settings)
from prefect.testing.utilities import prefect_test_harness  # noqa: E402 - as above

from blocks import JobRecords, LocalTarget  # noqa: E402 - after the path and the environment above
from deployments.dataset import MODEL_REPO, build  # noqa: E402 - after the path and the environment above
from deployments.demo import demo_request  # noqa: E402 - after the path and the environment above
from deployments.model_hub import ModelHub  # noqa: E402 - after the path and the environment above
from flows.resync import resync_tao_outputs  # noqa: E402 - after the path and the environment above
from flows.submit import submit_tao_job  # noqa: E402 - after the path and the environment above
from tao_data_io import steps, verbs  # noqa: E402 - after the path and the environment above
from tao_data_io.embedded.s3 import EmbeddedS3  # noqa: E402 - after the path and the environment above
from tao_data_io.backends.local.backend import LocalBackend  # noqa: E402 - after the path and the environment above
from tao_data_io.backends.local.settings import LocalSettings  # noqa: E402 - after the path and the environment above
from tao_data_io.records import RecordStore  # noqa: E402 - after the path and the environment above
from tao_data_io.request import parse_request  # noqa: E402 - after the path and the environment above
from tao_data_io.transfer.engine import TransferEngine  # noqa: E402 - after the path and the environment above
from tao_data_io.transfer.options import TransferOptions  # noqa: E402 - after the path and the environment above
from tao_data_io.uris import parse_s3_url  # noqa: E402 - after the path and the environment above
from tasks.policy import step  # noqa: E402 - after the path and the environment above

BUCKET = "bench-flows"
RESYNC_JOB = "bench-resync"


@step(timeout_seconds=60)
def no_op(index: int) -> int:
    return index


@flow(persist_result=True, result_serializer="json")
def empty_flow() -> None:
    return None


@flow(persist_result=True, result_serializer="json")
def tasks_flow(count: int) -> None:
    for index in range(count):
        no_op(index)


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def median(values: list[float]) -> str:
    return f"{statistics.median(values):.3f}s"


def overhead(reps: int, tasks: int) -> list[str]:
    rows = ["| flow heartbeat | empty flow | flow of %d tasks | per task |" % tasks, "|---|---|---|---|"]
    for label, frequency in (("on (deployment runs)", 30), ("off (tests)", None)):
        with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: frequency}):
            empty_flow(), tasks_flow(1)  # warm: imports, first client
            empties, fulls = [], []
            for rep in range(reps):
                runs = [("empty", lambda: empty_flow()), ("full", lambda: tasks_flow(tasks))]
                for name, run in runs if rep % 2 == 0 else runs[::-1]:
                    (empties if name == "empty" else fulls).append(timed(run))
        per_task = (statistics.median(fulls) - statistics.median(empties)) / tasks
        rows.append(f"| {label} | {median(empties)} | {median(fulls)} | {per_task * 1000:.1f} ms |")
    return rows


@contextmanager
def demo_data(work: Path) -> Iterator[None]:
    """The demo's dataset in the bucket and its model on a hub stand-in (deployments/demo.py), for
    the parts that run the demo's job in the local frame."""
    local_tree, model = build(work / "dataset")
    with TransferEngine(s3_credentials()) as engine:
        engine.upload_directory(local_tree, parse_s3_url(f"s3://{BUCKET}/"), TransferOptions())
    hub = ModelHub({MODEL_REPO: model})
    threading.Thread(target=hub.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
    os.environ.update({"HF_ENDPOINT": hub.url, "HF_HOME": str(work / "hf-home")})
    try:
        yield
    finally:
        hub.shutdown()


def demo_job(job_id: str, **environment: str) -> dict[str, object]:
    """The demo's request (deployments/demo.py), its stand-in's environment overridden."""
    document = demo_request(job_id, BUCKET)
    document["environment"] = {**document["environment"], **environment}
    return document


def submit_comparison(work: Path, reps: int) -> list[str]:
    LocalTarget(settings=LocalSettings(run_root=str(work / "flow-local")),
                staging_root=str(work / "flow-work")).save("bench", overwrite=True)
    JobRecords(location=str(work / "flow-jobs")).save("bench", overwrite=True)
    backend, store = LocalBackend(LocalSettings(run_root=str(work / "cli-local"))), RecordStore(work / "cli-jobs")
    times: dict[str, list[float]] = {"verbs.submit": [], "submit-tao-job flow": [],
                                     "submit-tao-job flow, heartbeat off": []}

    def request(job_id: str) -> dict[str, object]:
        return demo_job(job_id, EPOCHS="1", EPOCH_SECONDS="0")

    def by_pipeline(job_id: str) -> None:
        verbs.submit(parse_request(request(job_id)), backend, store, staging_root=work / "cli-work")

    def by_flow(job_id: str) -> None:
        state = submit_tao_job(request(job_id), target="tao-local-target/bench", records="tao-job-records/bench",
                               return_state=True)
        assert state.is_completed(), state.message

    def by_flow_without_heartbeat(job_id: str) -> None:
        with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
            by_flow(job_id)

    runs = {"verbs.submit": by_pipeline, "submit-tao-job flow": by_flow,
            "submit-tao-job flow, heartbeat off": by_flow_without_heartbeat}
    by_pipeline("warm-cli"), by_flow("warm-flow")
    for rep in range(reps):
        for number, name in enumerate(list(runs) if rep % 2 == 0 else list(runs)[::-1]):
            times[name].append(timed(lambda name=name, number=number: runs[name](f"bench-{rep}-{number}")))
    base = statistics.median(times["verbs.submit"])
    rows = ["| composition | wall time | vs the verb run directly |", "|---|---|---|"]
    rows += [f"| {name} | {median(values)} | +{statistics.median(values) - base:.2f}s |"
             for name, values in times.items()]
    return rows


def resync_comparison(work: Path, reps: int, files: int, changed: int, size: int) -> list[str]:
    """A RUNNING job of the local frame (the demo's, held before its first epoch) whose results
    directory the benchmark fills with ``files`` files, and rewrites ``changed`` of them before
    every run."""
    job_id = f"{RESYNC_JOB}-{files}"
    hold = work / f"resync-hold-{files}"
    hold.mkdir()
    (hold / ".keep").write_text("")  # verify refuses an empty mount
    settings = LocalSettings(run_root=str(work / f"resync-local-{files}"))
    backend, jobs = LocalBackend(settings), RecordStore(work / f"resync-jobs-{files}")
    request = demo_job(job_id, HOLD_FILE="/hold/go")
    request["mounts"] = [*request["mounts"], {"source": str(hold), "target": "/hold"}]  # type: ignore[list-item]
    submitted = verbs.submit(parse_request(request), backend, jobs, staging_root=work / f"resync-work-{files}")
    results = Path(backend.results_path(submitted.backend_ref) or "")
    assert jobs.get(job_id).state == "RUNNING" and results.is_dir(), (jobs.get(job_id).state, results)
    for index in range(files):
        path = results / f"ckpt/d{index % 50:02d}/f{index:06d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size))
    LocalTarget(settings=settings, staging_root=str(work / f"resync-work-{files}")).save(f"bench-{files}",
                                                                                        overwrite=True)
    JobRecords(location=jobs.location).save(f"resync-{files}", overwrite=True)
    env = {**os.environ, "TAO_DATA_IO_RECORDS": jobs.location, "XDG_CACHE_HOME": str(work / "cache"),
           "PREFECT_API_URL": str(PREFECT_API_URL.value())}
    os.environ["XDG_CACHE_HOME"] = env["XDG_CACHE_HOME"]  # one digest cache for every contender, warm
    flow_args = dict(target=f"tao-local-target/bench-{files}", records=f"tao-job-records/resync-{files}",
                     settle_seconds=0)

    def cli() -> None:
        subprocess.run([sys.executable, "-m", "tao_data_io.cli", "resync", "--job-id", job_id, "--results-dir",
                        str(results), "--settle-seconds", "0"], env=env, check=True, stdout=subprocess.DEVNULL)

    def flow_process() -> None:
        code = ("import sys; sys.path.insert(0, %r); "
                "from flows.resync import resync_tao_outputs; resync_tao_outputs(**%r)") % (str(REPO), flow_args)
        subprocess.run([sys.executable, "-c", code], env=env, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)

    def flow_in_process() -> None:
        resync_tao_outputs(**flow_args)  # type: ignore[arg-type]

    def flow_without_heartbeat() -> None:
        with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
            flow_in_process()

    def core() -> None:
        steps.resync_job(job_id, backend, jobs, settle_seconds=0)

    contenders = {"tao-data-io resync (a process)": cli, "resync-tao-outputs flow (a process)": flow_process,
                  "resync-tao-outputs flow (in-process)": flow_in_process,
                  "resync-tao-outputs flow (in-process, heartbeat off)": flow_without_heartbeat,
                  "steps.resync_job (in-process)": core}
    cli()  # untimed: the first upload of every file, and a warm digest cache
    times: dict[str, list[float]] = {name: [] for name in contenders}
    moved: dict[str, list[int]] = {name: [] for name in contenders}
    try:
        measure(reps, files, changed, size, results, jobs, job_id, contenders, times, moved)
    finally:
        backend.cancel(submitted.backend_ref)
    rows = [f"| resync of {files:,} files, {changed} changed | wall time | uploaded per run |", "|---|---|---|"]
    rows += [f"| {name} | {median(times[name])} | {sorted(set(moved[name]))} |" for name in contenders]
    return rows


def measure(reps: int, files: int, changed: int, size: int, results: Path, jobs: RecordStore, job_id: str,
            contenders: dict[str, Callable[[], None]], times: dict[str, list[float]],
            moved: dict[str, list[int]]) -> None:
    """Each contender in turn (the order alternates every repetition), after ``changed`` files of
    the results were rewritten: its wall time, and how many files its upload moved."""
    for rep in range(reps):
        for number, name in enumerate(list(contenders) if rep % 2 == 0 else list(contenders)[::-1]):
            for index in range(changed):  # the job rewrote some of its checkpoints
                (results / f"ckpt/d{index % 50:02d}/f{(rep * 997 + number * 101 + index * 31) % files:06d}.bin"
                 ).write_bytes(os.urandom(size))
            before = len(jobs.get(job_id).uploads)
            times[name].append(timed(contenders[name]))
            uploads = jobs.get(job_id).uploads
            moved[name].append(int(uploads[-1]["uploaded_files"]) if len(uploads) > before else 0)  # type: ignore[arg-type]


class _Requests:
    """Counts the HTTP requests this process sends through httpx (the Prefect client's, the log
    worker's included), by wrapping ``send`` of both clients while it is entered."""

    def __init__(self) -> None:
        self.count = 0
        self._saved: list[tuple[type, Callable[..., object]]] = []

    def __enter__(self) -> _Requests:
        import httpx

        for cls in (httpx.Client, httpx.AsyncClient):
            original = cls.send
            self._saved.append((cls, original))
            if cls is httpx.Client:
                def send(client, request, *a, _original=original, **k):  # type: ignore[no-untyped-def]
                    self.count += 1
                    return _original(client, request, *a, **k)
            else:
                async def send(client, request, *a, _original=original, **k):  # type: ignore[no-untyped-def]
                    self.count += 1
                    return await _original(client, request, *a, **k)
            cls.send = send  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        for cls, original in self._saved:
            cls.send = original  # type: ignore[method-assign]


def watch_comparison(work: Path, reps: int, job_seconds: int) -> list[str]:
    from flows.collect import collect_tao_job

    LocalTarget(settings=LocalSettings(run_root=str(work / "watch-local")), staging_root=str(work / "watch-work")).save(
        "bench-watch", overwrite=True)
    JobRecords(location=str(work / "watch-jobs")).save("bench-watch", overwrite=True)
    backend = LocalBackend(LocalSettings(run_root=str(work / "watch-local")))
    store = RecordStore(work / "watch-jobs")
    target, records = "tao-local-target/bench-watch", "tao-job-records/bench-watch"

    def launched(job_id: str, seconds: int) -> str:
        request = demo_job(job_id, EPOCHS=str(max(seconds, 1)), EPOCH_SECONDS="1")
        verbs.submit(parse_request(request), backend, store, staging_root=work / "watch-work")
        return job_id

    def job_time(job_id: str) -> float:
        history = store.get(job_id).history
        started = next(entry.at for entry in history if entry.state == "RUNNING")
        return (history[-1].at - started).total_seconds()

    def by_verb(job_id: str) -> int:
        verbs.collect(job_id, backend, store, poll_seconds=2)
        return 0

    def by_flow(job_id: str) -> int:
        with _Requests() as requests:
            state = collect_tao_job(job_id, target=target, records=records, poll_seconds=2, return_state=True)
        assert state.is_completed(), state.message
        return requests.count

    ended = launched("watch-ended", 0)
    by_verb(ended)  # ended before the flow looks: what a collect costs without a job to watch
    idle = by_flow(ended)
    times: dict[str, list[float]] = {"verbs.collect": [], "collect-tao-job": []}
    calls: list[float] = []
    for rep in range(reps):
        order = [("verbs.collect", by_verb), ("collect-tao-job", by_flow)]
        for number, (name, collect) in enumerate(order if rep % 2 == 0 else order[::-1]):
            job_id = launched(f"watch-{rep}-{number}", job_seconds)
            sent = collect(job_id)
            times[name].append(job_time(job_id))
            if name == "collect-tao-job":
                calls.append((sent - idle) / (job_time(job_id) / 60))
    rows = ["| watched by | the job's own time (RUNNING → end) | API requests per minute of job |", "|---|---|---|"]
    rows.append(f"| verbs.collect (nothing shown) | {median(times['verbs.collect'])} | — |")
    rows.append(f"| collect-tao-job (log + progress + KPIs) | {median(times['collect-tao-job'])} | "
                f"{statistics.median(calls):.1f} |")
    rows.append(f"\n(a collect of a job already ended sends {idle} requests: set-up, records, upload, report)")
    return rows


def s3_credentials():  # type: ignore[no-untyped-def]
    from tao_data_io.credentials import s3_credentials_from_env

    return s3_credentials_from_env()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--files", default="1000,10000", help="comma-separated sizes of the results tree")
    parser.add_argument("--changed", type=int, default=50)
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--job-seconds", type=int, default=30, help="how long the watched job trains")
    parser.add_argument("--only", choices=("overhead", "submit", "resync", "watch"), action="append",
                        help="run only these parts (repeatable; default: all)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tao-bench-flows-"))
    try:
        run(work, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if OWN_HOME is not None:
            shutil.rmtree(OWN_HOME, ignore_errors=True)


def run(work: Path, args: argparse.Namespace) -> None:
    parts = set(args.only or ("overhead", "submit", "resync", "watch"))
    with EmbeddedS3(work / "s3") as server, prefect_test_harness(server_startup_timeout=120):
        server.create_bucket(BUCKET)
        os.environ.update({**server.env(), "S3_BUCKET_NAME": BUCKET})
        if "overhead" in parts:
            print("\n".join(overhead(args.reps, args.tasks)), end="\n\n", flush=True)
        if parts & {"submit", "watch", "resync"}:
            with demo_data(work):
                run_jobs(work, args, parts)


def run_jobs(work: Path, args: argparse.Namespace, parts: set[str]) -> None:
    if "submit" in parts:
        print("\n".join(submit_comparison(work, args.reps)), end="\n\n", flush=True)
    if "watch" in parts:
        print("\n".join(watch_comparison(work, args.reps, args.job_seconds)), end="\n\n", flush=True)
    if "resync" in parts:
        for files in (int(count) for count in args.files.split(",")):
            print("\n".join(resync_comparison(work, args.reps, files, args.changed, args.size)), end="\n\n",
                  flush=True)


if __name__ == "__main__":
    main()
