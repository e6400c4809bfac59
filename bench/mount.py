"""Mount vs stage: the evidence behind the storage tiers.

What users would do instead of staging is mount the bucket with FUSE and let the data loader
read through it every epoch. This measures both on the same dataset (2,000 × 16 KiB by default)
against the embedded SeaweedFS server, direct and behind the 20 ms/request latency proxy:

* **s3fs** (Debian's ``s3fs`` package): mount the bucket, then read every file of the dataset
  once per epoch with 8 reader threads (like a data loader's workers), ``--epochs`` times.
  s3fs runs with its defaults (no local disk cache), as a user who just mounts would;
* **stage + local**: the transfer engine syncs the prefix to a local directory once, then the
  same 8 threads read it ``--epochs`` times from local disk.

It prints each time and the break-even number of epochs: the smallest N for which
``stage + N × local epoch`` ≤ ``N × s3fs epoch``. bench/README.md ("Staging against a FUSE mount") and
``tao_data_io.tier.TIER_C_BYTES_PER_SECOND`` quote a run of this script.

Needs ``/dev/fuse`` and ``s3fs`` (``apt-get install -y s3fs``); run as root (``allow_other`` is
not used, so the reading process must be the mounting user).

    .venv/bin/python bench/mount.py --epochs 5 --latency 0,20
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from latency_proxy import spawn as spawn_proxy  # bench/ is sys.path[0] when run as a script
from tao_data_io.credentials import S3Credentials
from tao_data_io.embedded.s3 import EmbeddedS3
from tao_data_io.transfer.engine import TransferEngine

BUCKET = "bench"
PREFIX = "dataset"
READERS = 8
KIB = 1024


def make_dataset(root: Path, count: int, size: int) -> None:
    for index in range(count):
        path = root / f"class{index % 20:02d}" / f"img{index:06d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size))


def read_epoch(root: Path, names: list[str]) -> int:
    """Read every file once with READERS threads; return the bytes read (a data loader's epoch)."""

    def read(name: str) -> int:
        with open(root / name, "rb") as handle:
            return len(handle.read())

    with ThreadPoolExecutor(READERS) as pool:
        return sum(pool.map(read, names))


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def mount_s3fs(credentials: S3Credentials, mountpoint: Path) -> None:
    """Mount the bucket with s3fs (path-style, plain HTTP, credentials only in its environment)."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    env = {"PATH": os.environ["PATH"], "AWS_ACCESS_KEY_ID": credentials.access_key_id,
           "AWS_SECRET_ACCESS_KEY": credentials.secret_access_key}
    subprocess.run(["s3fs", BUCKET, str(mountpoint), "-o", f"url={credentials.endpoint_url}", "-o",
                    "use_path_request_style", "-o", f"endpoint={credentials.region}", "-o", "nonempty"],
                   env=env, check=True)
    for _ in range(100):
        if os.path.ismount(mountpoint):
            return
        time.sleep(0.1)
    raise RuntimeError(f"s3fs did not mount {mountpoint}")


def unmount(mountpoint: Path) -> None:
    subprocess.run(["fusermount", "-u", str(mountpoint)], check=False)


def drop_page_cache() -> None:
    """Best effort: make the first local epoch read the disk, not memory (needs root)."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        pass


def run(target: S3Credentials, work: Path, names: list[str], epochs: int, label: str) -> dict[str, object]:
    mountpoint = work / "mnt"
    mount_s3fs(target, mountpoint)
    try:
        fuse_epochs = [timed(lambda: read_epoch(mountpoint / PREFIX, names)) for _ in range(epochs)]
    finally:
        unmount(mountpoint)
    local = work / f"staged-{label}"
    shutil.rmtree(local, ignore_errors=True)
    with TransferEngine(target) as engine:
        holder: dict[str, int] = {}
        stage_seconds = timed(lambda: holder.update(
            bytes=engine.sync(f"s3://{BUCKET}/{PREFIX}/", str(local)).transferred_bytes))
    drop_page_cache()
    local_epochs = [timed(lambda: read_epoch(local, names)) for _ in range(epochs)]
    return {"label": label, "fuse": fuse_epochs, "stage": stage_seconds, "staged_bytes": holder["bytes"],
            "local": local_epochs}


def break_even(result: dict[str, object]) -> int | None:
    """Smallest N with stage + N × local ≤ N × fuse (medians per epoch); None if never."""
    fuse = statistics.median(result["fuse"])  # type: ignore[arg-type]
    local = statistics.median(result["local"])  # type: ignore[arg-type]
    if fuse <= local:
        return None
    return max(1, math.ceil(float(result["stage"]) / (fuse - local)))  # type: ignore[arg-type]


def report(results: list[dict[str, object]], count: int, size: int) -> str:
    lines = [f"dataset: {count:,} × {size // KIB} KiB, {READERS} reader threads; times in seconds", "",
             "| latency | s3fs epoch 1 | s3fs epochs 2+ (median) | stage once | staging MB/s | local epoch 1 | "
             "local epochs 2+ (median) | break-even epochs |", "|---|---|---|---|---|---|---|---|"]
    for result in results:
        fuse, local = result["fuse"], result["local"]
        assert isinstance(fuse, list) and isinstance(local, list)
        rate = int(result["staged_bytes"]) / float(result["stage"]) / 1024**2  # type: ignore[arg-type]
        even = break_even(result)
        lines.append(f"| {result['label']} | {fuse[0]:.2f} | {statistics.median(fuse[1:] or fuse):.2f} | "
                     f"{result['stage']:.2f} | {rate:.1f} | {local[0]:.3f}"
                     f" | {statistics.median(local[1:] or local):.3f} | {even if even is not None else 'never'} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--size-kib", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--latency", default="0,20", help="comma-separated ms per request (0 = direct)")
    args = parser.parse_args()
    if shutil.which("s3fs") is None or not os.path.exists("/dev/fuse"):
        sys.exit("needs s3fs and /dev/fuse: apt-get install -y s3fs")
    work = Path(tempfile.mkdtemp(prefix="tao-bench-mount-"))
    results = []
    try:
        with EmbeddedS3(work / "s3") as server:
            server.create_bucket(BUCKET)
            make_dataset(work / "src", args.files, args.size_kib * KIB)
            names = sorted(p.relative_to(work / "src").as_posix() for p in (work / "src").rglob("*") if p.is_file())
            with TransferEngine(server.credentials) as engine:
                assert engine.sync(str(work / "src"), f"s3://{BUCKET}/{PREFIX}/").ok
            for delay in (int(x) for x in args.latency.split(",")):
                proxy = None
                creds = server.credentials
                if delay:
                    proxy, endpoint = spawn_proxy(server.port, delay)
                    creds = S3Credentials(creds.access_key_id, creds.secret_access_key, endpoint_url=endpoint,
                                          region=creds.region)
                label = f"+{delay} ms/request" if delay else "direct"
                try:
                    result = run(creds, work, names, args.epochs, label)
                finally:
                    if proxy:
                        proxy.terminate()
                        proxy.wait()
                results.append(result)
                print(f"  {label}: s3fs {[round(x, 2) for x in result['fuse']]}, stage {result['stage']:.2f}, "
                      f"local {[round(x, 3) for x in result['local']]}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print()
    print(report(results, args.files, args.size_kib * KIB))


if __name__ == "__main__":
    main()
