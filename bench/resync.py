"""Resync benchmark: ``tao-data-io resync`` against ``aws s3 sync`` on a results tree of 10,000
files of which 50 are new — the steady state of a schedule that resyncs a running job.

Both contenders are separate processes started the same way (interpreter start-up counts for
both), syncing the same local tree to their own prefix of one embedded SeaweedFS server, A/B
interleaved (the order alternates every repetition), medians of ``--reps``. Each repetition
writes 50 new files, times both, then deletes them locally (remote objects stay; neither tool
deletes), so every run sees exactly 10,000 unchanged + 50 new files. Runs once direct and once
through ``bench/latency_proxy.py`` (a separate process adding 20 ms per request: real S3 has
latency, and a zero-latency server hides serial requests).

Checks: our resync uploads exactly the 50 (from the job record's uploads entry), ``aws`` prints
exactly 50 ``upload:`` lines, and both prefixes end with the same number of objects.

awscli comes with the bench extra (``make bench`` installs it into ``.venv``):

    .venv/bin/python bench/resync.py --reps 3 --latency 0,20
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from latency_proxy import spawn as spawn_proxy  # bench/ is sys.path[0] when run as a script
from tao_data_io.embedded.s3 import EmbeddedS3
from tao_data_io.outputs import results_filter
from tao_data_io.records import RecordStore
from tao_data_io.transfer.client import make_s3_client
from tao_data_io.transfer.engine import TransferEngine
from tao_data_io.transfer.options import TransferOptions

BUCKET = "bench"
JOB_ID = "bench-resync"
AWS_PREFIX = "aws-sync"
CONTENDERS = ("tao-data-io resync", "aws s3 sync")


def make_files(root: Path, names: list[str], size: int) -> None:
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size))


def ours(env: dict[str, str], results: Path, jobs: RecordStore) -> int:
    """One resync through the CLI; returns the files it uploaded, read from the job record."""
    before = len(jobs.get(JOB_ID).uploads)
    subprocess.run([sys.executable, "-m", "tao_data_io.cli", "resync", "--job-id", JOB_ID, "--results-dir",
                    str(results), "--settle-seconds", "0"], env=env, check=True, stdout=subprocess.DEVNULL)
    uploads = jobs.get(JOB_ID).uploads
    return int(uploads[-1]["uploaded_files"]) if len(uploads) > before else 0  # type: ignore[arg-type]


def aws(env: dict[str, str], results: Path, jobs: RecordStore) -> int:
    """One ``aws s3 sync`` with the same exclude; returns the files it uploaded (its upload: lines)."""
    executable = shutil.which("aws", path=str(Path(sys.executable).parent)) or "aws"
    out = subprocess.run([executable, "s3", "sync", str(results), f"s3://{BUCKET}/{AWS_PREFIX}/", "--exclude", ".tao/*",
                          "--no-progress", "--endpoint-url", env["AWS_ENDPOINT_URL"]],
                         env=env, check=True, capture_output=True, text=True).stdout
    return sum(line.startswith("upload:") for line in out.splitlines())


RUNNERS: dict[str, Callable[[dict[str, str], Path, RecordStore], int]] = {CONTENDERS[0]: ours, CONTENDERS[1]: aws}


def count_objects(server: EmbeddedS3, prefix: str) -> int:
    paginator = make_s3_client(server.credentials).get_paginator("list_objects_v2")
    return sum(page.get("KeyCount", 0) for page in paginator.paginate(Bucket=BUCKET, Prefix=prefix))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--new", type=int, default=50)
    parser.add_argument("--size", type=int, default=4096, help="bytes per file")
    parser.add_argument("--latency", default="0,20", help="comma-separated ms per request (0 = direct)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tao-bench-resync-"))
    # Our digest cache lives in $XDG_CACHE_HOME: keep it in the scratch dir, warm across runs as
    # it is for a real schedule (the first resync of a job hashes, later ones do not).
    os.environ["XDG_CACHE_HOME"] = str(work / "cache")
    results, jobs = work / "results", RecordStore(work / "jobs")
    times: dict[tuple[str, str], list[float]] = {}
    checks: list[str] = []
    try:
        with EmbeddedS3(work / "s3") as server:
            server.create_bucket(BUCKET)
            make_files(results, [f"ckpt/d{i % 50:02d}/f{i:06d}.bin" for i in range(args.files)], args.size)
            make_files(results, [".tao/status.json", ".tao/token"], 64)
            jobs.open(job_id=JOB_ID, backend="bench", image="tao", network_arch="dino", action="train",
                      storage_tier="B", results_dir=str(results))
            base_env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"),
                        "XDG_CACHE_HOME": os.environ["XDG_CACHE_HOME"], "S3_BUCKET_NAME": BUCKET,
                        "TAO_DATA_IO_RECORDS": jobs.location}
            # Untimed: the job's first resync (fills our prefix and digest cache) and the same
            # tree under aws's prefix, written after the files so aws sees them as current.
            assert ours({**base_env, **server.env()}, results, jobs) == args.files
            options = TransferOptions(filter=results_filter())  # the same .tao/* exclude
            assert TransferEngine(server.credentials).sync(str(results), f"s3://{BUCKET}/{AWS_PREFIX}/", options).ok
            rep_number = 0
            for delay in (int(x) for x in args.latency.split(",")):
                proxy, endpoint = spawn_proxy(server.port, delay) if delay else (None, server.endpoint_url)
                label = f"+{delay} ms/request" if delay else "direct"
                env = {**base_env, **server.env(), "AWS_ENDPOINT_URL": endpoint}
                try:
                    for rep in range(args.reps):
                        rep_number += 1
                        new = [f"ckpt/new/r{rep_number:02d}/f{i:03d}.bin" for i in range(args.new)]
                        make_files(results, new, args.size)
                        order = CONTENDERS if rep % 2 == 0 else CONTENDERS[::-1]
                        for name in order:
                            started = time.perf_counter()
                            uploaded = RUNNERS[name](env, results, jobs)
                            seconds = time.perf_counter() - started
                            times.setdefault((label, name), []).append(seconds)
                            print(f"  {label:16} rep {rep + 1}  {name:20} {seconds:6.2f}s  uploaded {uploaded}",
                                  flush=True)
                            if uploaded != args.new:
                                checks.append(f"{name} ({label}, rep {rep + 1}) uploaded {uploaded}, not {args.new}")
                        shutil.rmtree(results / "ckpt" / "new")
                finally:
                    if proxy is not None:
                        proxy.terminate()
                        proxy.wait()
            expected = args.files + args.new * rep_number
            for prefix in (f"results/{JOB_ID}/", f"{AWS_PREFIX}/"):
                found = count_objects(server, prefix)
                if found != expected:
                    checks.append(f"{prefix} holds {found} objects, expected {expected}")
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(f"\nresync of {args.files:,} unchanged + {args.new} new files ({args.size} B each); medians of "
          f"{args.reps}, A/B interleaved; ratio = tao-data-io / aws (lower is better)\n")
    print(f"| latency | {CONTENDERS[0]} | {CONTENDERS[1]} | ratio |\n|---|---|---|---|")
    for label in dict.fromkeys(label for label, _ in times):
        ours_s, aws_s = (statistics.median(times[(label, name)]) for name in CONTENDERS)
        print(f"| {label} | {ours_s:.2f}s | {aws_s:.2f}s | {ours_s / aws_s:.2f}× |")
    print("\nchecks: " + ("; ".join(checks) if checks else
                         f"every run uploaded exactly {args.new}; both prefixes hold the same objects"))
    if checks:
        sys.exit(1)


if __name__ == "__main__":
    main()
