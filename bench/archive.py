"""Archive benchmark: extracting a tar.gz from S3, against what users do today.

Targets (issue "Input staging"): extracting a 200 MB tar.gz from S3 costs at most one full read
of the archive, and a rerun costs one HEAD. Contenders, side by side in one run, A/B
interleaved, medians of ``--reps``:

* ``tao-data-io extract`` — one streaming GET piped into the tar reader, marker-guarded;
* ``s5cmd cp`` + ``tar -xzf`` — download the archive to disk, then extract (two passes over it).

Requests and bytes are counted with botocore's ``before-send``/``after-call`` events on the
client handed to the extractor (no patching).

    .venv/bin/python bench/archive.py --size-mb 200 --reps 3
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import statistics
import subprocess
import tarfile
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from tao_data_io.staging.archive import extract_archive
from tao_data_io.embedded.s3 import EmbeddedS3
from tao_data_io.transfer.client import make_s3_client
from tao_data_io.transfer.engine import TransferEngine
from tao_data_io.transfer.s5cmd_executor import s5cmd_binary

BUCKET = "bench-archive"
MIB = 1024 * 1024


def make_archive(path: Path, size_mb: int) -> None:
    """A tar.gz of ~size_mb MB: incompressible members so the archive is as big as its content."""
    with tarfile.open(path, "w:gz", compresslevel=1) as tar:
        for i in range(size_mb // 4):
            data = os.urandom(4 * MIB)
            info = tarfile.TarInfo(f"data/part-{i:04d}.bin")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def counting_engine(server: EmbeddedS3) -> tuple[TransferEngine, Counter[str]]:
    """An engine whose S3 requests (the archive's GETs and HEADs go through its client) are counted."""
    engine = TransferEngine(server.credentials)
    counts: Counter[str] = Counter()

    def before_send(request: Any, **_: Any) -> None:
        counts[request.method] += 1

    engine.client.meta.events.register("before-send.s3", before_send)
    return engine, counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=int, default=200)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tao-bench-archive-"))
    times: dict[str, list[float]] = {"tao-data-io extract": [], "s5cmd cp + tar -xzf": []}
    try:
        with EmbeddedS3(work / "s3") as server:
            server.create_bucket(BUCKET)
            archive = work / "data.tar.gz"
            make_archive(archive, args.size_mb)
            size = archive.stat().st_size
            make_s3_client(server.credentials).upload_file(str(archive), BUCKET, "data.tar.gz")
            archive.unlink()
            uri = f"s3://{BUCKET}/data.tar.gz"
            env = {"PATH": os.environ["PATH"], **server.env()}
            first_counts: Counter[str] = Counter()
            for rep in range(args.reps):
                for name in (list(times) if rep % 2 == 0 else list(reversed(times))):
                    dest = work / f"out-{rep}-{len(times[name])}-{name[:3]}"
                    started = time.perf_counter()
                    if name.startswith("tao"):
                        engine, counts = counting_engine(server)
                        extract_archive(uri, dest, engine=engine)
                        first_counts = counts
                    else:
                        subprocess.run([s5cmd_binary(), "--endpoint-url", server.endpoint_url, "cp", uri,
                                        str(work / "dl.tgz")], env=env, check=True, stdout=subprocess.DEVNULL)
                        dest.mkdir()
                        subprocess.run(["tar", "-xzf", str(work / "dl.tgz"), "-C", str(dest)], check=True)
                        (work / "dl.tgz").unlink()
                    times[name].append(time.perf_counter() - started)
                    shutil.rmtree(dest, ignore_errors=True) if rep < args.reps - 1 else None
            # The rerun on the last tao-data-io destination.
            last = sorted(work.glob("out-*-tao"))[-1]
            engine, rerun_counts = counting_engine(server)
            started = time.perf_counter()
            result = extract_archive(uri, last, engine=engine)
            rerun = time.perf_counter() - started
    finally:
        shutil.rmtree(work, ignore_errors=True)
    base = statistics.median(times["s5cmd cp + tar -xzf"])
    print(f"\narchive: {size / MIB:.0f} MiB tar.gz, medians of {args.reps}\n")
    print("| contender | wall | ratio |\n|---|---|---|")
    for name, values in times.items():
        print(f"| {name} | {statistics.median(values):.2f}s | {statistics.median(values) / base:.2f}× |")
    print(f"\nfirst extraction requests: {dict(first_counts)} (one GET = one full read of the archive)")
    print(f"rerun: {dict(rerun_counts)} in {rerun:.3f}s; extracted again: {result.extracted}")


if __name__ == "__main__":
    main()
