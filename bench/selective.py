"""Selective-download benchmark: the two targets of the annotation-selective issue.

1. **Selective download** of ``--references`` objects from a bucket of ``--objects`` objects:
   the request count must track the references (no listing), and the wall time must be within
   1.2× of downloading the same files with the engine directly — ``engine.sync`` of a prefix
   holding just those files (one listing, then GETs). Also shown: ``download_keys`` with the
   keys given (no annotation to read). Medians of ``--reps``, order rotated each repetition.
   Requests are counted in a separate pass through a counting HTTP proxy (a Python proxy
   would slow the timed runs, so those go direct).
2. **Key extraction** from a ``--rows``-row parquet annotation (with a wide caption column the
   projection must skip): under 3 s and under 500 MB peak RSS, measured in a child process
   (``RUSAGE_CHILDREN`` of a wrapper whose only child is the extraction). Two shapes: every
   row a distinct file (worst case), and ten rows per file. CPU seconds are shown beside wall
   seconds because they do not grow when other work shares the machine.

    .venv/bin/python bench/selective.py    # the issue's sizes (populating 50,000 objects takes a while)
    .venv/bin/python bench/selective.py --objects 5000 --rows 200000 --reps 3   # quick
"""

from __future__ import annotations

import argparse
import dataclasses
import http.client
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

from tao_data_io.embedded.s3 import EmbeddedS3
from tao_data_io.staging.selective import selective_download
from tao_data_io.transfer.engine import TransferEngine
from tao_data_io.transfer.options import TransferOptions

BUCKET = "bench"
RSS_LIMIT_MIB, SECONDS_LIMIT, RATIO_LIMIT = 500, 3.0, 1.2

# The extraction child, and the wrapper that reports its peak RSS via RUSAGE_CHILDREN (the
# wrapper has no other child, so the maximum is the extraction's own).
EXTRACT = ("import json, sys, time\n"
           "from tao_data_io.staging.selective import read_references\n"
           "started, cpu = time.perf_counter(), time.process_time()\n"
           "refs = read_references(sys.argv[1], ['clip'])\n"
           "print(json.dumps({'seconds': time.perf_counter() - started, 'cpu': time.process_time() - cpu,\n"
           "                  'references': len(refs)}))\n")
WRAPPER = ("import json, resource, subprocess, sys\n"
           "out = subprocess.run([sys.executable, '-c', sys.argv[1], sys.argv[2]], capture_output=True, text=True,"
           " check=True)\n"
           "result = json.loads(out.stdout)\n"
           "result['max_rss_mib'] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024\n"
           "print(json.dumps(result))\n")


# --------------------------------------------------------------------------- request counting
class CountingProxy:
    """Forward HTTP to the server on loopback, counting requests by kind (list, head, get)."""

    def __init__(self, upstream: str) -> None:
        target = urlsplit(upstream)
        self.counts: Counter[str] = Counter()
        lock = threading.Lock()
        counts = self.counts
        local = threading.local()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_: object) -> None:
                pass

            def forward(self) -> None:
                parts = urlsplit(self.path)
                kind = self.command.lower()
                if kind == "get" and "/" not in parts.path.strip("/"):  # a bucket-level GET
                    kind = "list" if not parts.query or "list-type" in parts.query or "prefix" in parts.query \
                        else "bucket-" + parts.query.split("=")[0]
                with lock:
                    counts[kind] += 1
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                if not hasattr(local, "conn"):
                    local.conn = http.client.HTTPConnection(target.hostname or "127.0.0.1", target.port, timeout=60)
                conn = local.conn
                conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                for name, value in self.headers.items():
                    conn.putheader(name, value)  # Host included: the signature covers it
                conn.endheaders(body)
                response = conn.getresponse()
                data = response.read()
                self.send_response_only(response.status, response.reason)
                for name, value in response.getheaders():
                    if name.lower() not in ("transfer-encoding", "content-length", "connection"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(data) if self.command != "HEAD" else
                                                       response.getheader("Content-Length") or 0))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def take(self) -> dict[str, int]:
        taken = dict(self.counts)
        self.counts.clear()
        return taken

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# --------------------------------------------------------------------------- target 1
def populate(server: EmbeddedS3, work: Path, objects: int, references: int, size: int) -> list[str]:
    """``dataset/`` holds ``objects`` clips (1 KiB fillers, ``size`` for the referenced ones);
    ``subset/`` holds just the referenced ones, for the engine-direct baseline."""
    rng = random.Random(7)
    names = [f"clips/shard-{i % 500:03d}/clip-{i:06d}.mp4" for i in range(objects)]
    chosen = sorted(rng.sample(names, references))
    picked = set(chosen)
    tree, subset = work / "tree", work / "subset"
    for name in names:
        for root in (tree, subset) if name in picked else (tree,):
            path = root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(rng.randbytes(size) if name in picked else rng.randbytes(1024))
    engine = TransferEngine(server.credentials)
    for root, prefix in ((tree, "dataset"), (subset, "subset")):
        started = time.monotonic()
        summary = engine.sync(str(root), f"s3://{BUCKET}/{prefix}/")
        assert summary.ok, summary.failed[:3]
        print(f"  uploaded {summary.transferred_files + summary.unchanged_files} objects to {prefix}/ "
              f"in {time.monotonic() - started:.1f}s", flush=True)
        shutil.rmtree(root)
    return chosen


def write_annotation(path: Path, references: list[str]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"clip": references, "caption": [f"caption for {r}" for r in references]}), path)
    return path


def contenders(engine: TransferEngine, annotation: Path, chosen: list[str]) -> dict[str, Callable[[Path], int]]:
    """Each downloads the referenced files into a fresh directory and returns how many moved."""
    return {
        "selective_download": lambda dest: selective_download(
            engine, str(annotation), ["clip"], BUCKET, "dataset", dest).summary.transferred_files,
        "download_keys (keys given)": lambda dest: engine.download_keys(
            BUCKET, [(f"dataset/{r}", r) for r in chosen], dest, TransferOptions()).transferred_files,
        "engine sync of the subset prefix": lambda dest: engine.sync(
            f"s3://{BUCKET}/subset/", str(dest)).transferred_files,
    }


def bench_download(args: argparse.Namespace, work: Path) -> list[str]:
    lines = []
    with EmbeddedS3(work / "s3") as server:
        server.create_bucket(BUCKET)
        print(f"populating {args.objects} objects …", flush=True)
        chosen = populate(server, work, args.objects, args.references, args.size)
        annotation = write_annotation(work / "train.parquet", chosen)

        runs = contenders(TransferEngine(server.credentials), annotation, chosen)
        times: dict[str, list[float]] = {name: [] for name in runs}
        names = list(runs)
        for rep in range(args.reps + 1):  # the first round warms the server and is not counted
            for name in names[rep % len(names):] + names[:rep % len(names)]:
                dest = work / "dest"
                shutil.rmtree(dest, ignore_errors=True)
                started = time.perf_counter()
                moved = runs[name](dest)
                elapsed = time.perf_counter() - started
                assert moved == len(chosen), (name, moved)
                if rep:
                    times[name].append(elapsed)

        proxy = CountingProxy(server.endpoint_url)
        try:
            through = dataclasses.replace(server.credentials, endpoint_url=proxy.url)
            counted = contenders(TransferEngine(through), annotation, chosen)
            requests = {}
            for name, run in counted.items():
                for phase in ("first", "rerun"):
                    dest = work / "dest"
                    if phase == "first":
                        shutil.rmtree(dest, ignore_errors=True)
                    proxy.take()
                    run(dest)
                    requests[(name, phase)] = proxy.take()
        finally:
            proxy.close()
    base = statistics.median(times["engine sync of the subset prefix"])
    lines.append(f"1) {args.references} references from a bucket of {args.objects} objects "
                 f"({args.size // 1024} KiB each referenced), median of {args.reps}")
    lines.append(f"   {'contender':34} {'seconds':>8} {'vs sync':>8}   requests first run      | rerun")
    for name in runs:
        median = statistics.median(times[name])
        first, rerun = (_fmt(requests[(name, phase)]) for phase in ("first", "rerun"))
        lines.append(f"   {name:34} {median:8.3f} {median / base:7.2f}×   {first:22} | {rerun}")
    ratio = statistics.median(times["selective_download"]) / base
    listed = (requests[("selective_download", "first")].get("list", 0)
              + requests[("selective_download", "rerun")].get("list", 0))
    lines.append(f"   target: selective ≤ {RATIO_LIMIT}× sync → {ratio:.2f}×"
                 f" {'OK' if ratio <= RATIO_LIMIT else 'MISSED'}; "
                 f"no listing → {listed} list requests {'OK' if not listed else 'MISSED'}")
    return lines


def _fmt(counts: dict[str, int]) -> str:
    return " ".join(f"{kind}={counts[kind]}" for kind in sorted(counts)) or "none"


# --------------------------------------------------------------------------- target 2
def bench_extraction(args: argparse.Namespace, work: Path) -> list[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    lines = [f"2) key extraction from a {args.rows}-row parquet annotation (clip + ~120-byte caption columns)",
             f"   {'shape':28} {'references':>10} {'seconds':>8} {'cpu s':>6} {'peak RSS':>10}"]
    for shape, per_file in (("every row a distinct file", 1), ("ten rows per file", 10)):
        path = work / f"annotation-{per_file}.parquet"
        clips = [f"clips/shard-{(i // per_file) % 1000:04d}/clip-{i // per_file:07d}.mp4" for i in range(args.rows)]
        captions = [f"row {i}: a person walks a dog across a busy street while it rains, camera pans left, "
                    f"then zooms in on the dog" for i in range(args.rows)]
        pq.write_table(pa.table({"clip": clips, "caption": captions}), path)
        del clips, captions
        out = subprocess.run([sys.executable, "-c", WRAPPER, EXTRACT, str(path)], capture_output=True, text=True,
                             check=True)
        result = json.loads(out.stdout)
        verdict = "OK" if result["seconds"] < SECONDS_LIMIT and result["max_rss_mib"] < RSS_LIMIT_MIB else "MISSED"
        lines.append(f"   {shape:28} {result['references']:>10} {result['seconds']:8.2f} {result['cpu']:6.2f} "
                     f"{result['max_rss_mib']:7.0f} MiB  {verdict} (< {SECONDS_LIMIT:.0f} s, < {RSS_LIMIT_MIB} MB)")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=50_000, help="objects in the bucket (default 50000)")
    parser.add_argument("--references", type=int, default=500, help="objects the annotation references (default 500)")
    parser.add_argument("--size", type=int, default=64 * 1024, help="bytes per referenced object (default 64 KiB)")
    parser.add_argument("--rows", type=int, default=1_000_000,
                        help="rows of the extraction annotation (default 1000000)")
    parser.add_argument("--reps", type=int, default=3, help="timed repetitions (default 3)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tao-data-io-bench-selective-") as scratch:
        work = Path(scratch)
        lines = bench_extraction(args, work) + [""] + bench_download(args, work)
    print("\n" + "\n".join(lines))


if __name__ == "__main__":
    main()
