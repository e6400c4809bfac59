"""CLI benchmark: the ``tao-data-io`` command against the ``s5cmd`` binary, both as processes.

What a shell, a cron line or a SLURM epilogue pays is the whole process: interpreter start-up,
imports, set-up and the requests. This benchmark times exactly that, side by side against one
embedded SeaweedFS server, A/B interleaved (the order alternates every repetition), medians of
``--reps``, once direct and once through ``latency_proxy.py`` (a separate process adding a delay
to every request: real S3 has latency, a zero-latency server hides serial requests).

Cases (ratio = tao-data-io wall time / s5cmd's, lower is better):

* ``help``           — ``tao-data-io --help`` against ``s5cmd --help`` (start-up alone);
* ``small-download`` — ``tao-data-io sync s3://…/small/ DIR`` against ``s5cmd cp 's3://…/small/*' DIR/``,
  2,000 × 16 KiB into an empty directory;
* ``small-upload``   — ``tao-data-io sync DIR s3://…/P/`` against ``s5cmd cp 'DIR/*' s3://…/P/``, to a new prefix;
* ``resync``         — a job's results directory of 2,000 files of which 20 changed since the last
  run: ``tao-data-io resync --settle-seconds 0`` (the job record, its lock, the route, the upload
  and the record's uploads entry) against ``s5cmd sync --exclude '.tao/*' DIR/ s3://…/P/``; each
  repetition rewrites 20 files, then runs each contender. Checked: each uploads exactly the 20.

    .venv/bin/python bench/cli_start.py --reps 5 --latency 0,20

The command is ``python -m tao_data_io.cli`` from the repository root (the code under test),
which is what the ``tao-data-io`` entry point runs. ``--before DIR`` adds the command run from
another checkout (an older commit) as a third contender, for a before/after table from one run::

    mkdir /tmp/before && git archive 22535f4 | tar -x -C /tmp/before
    .venv/bin/python bench/cli_start.py --reps 5 --before /tmp/before
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
from pathlib import Path

from transfer import BUCKET, KIB, Target, make_files, put_tree, start_proxy  # bench/ is sys.path[0]
from tao_data_io.embedded.s3 import EmbeddedS3
from tao_data_io.records import RecordStore
from tao_data_io.routing import decide_route, record_route
from tao_data_io.transfer.s5cmd_executor import s5cmd_binary

OURS = [sys.executable, "-m", "tao_data_io.cli"]
FILES, SIZE, CHANGED = 2000, 16 * KIB, 20


def s5cmd(target: Target, *args: str) -> list[str]:
    return [s5cmd_binary(), "--endpoint-url", str(target.credentials.endpoint_url), "--numworkers", "256", *args]


class Bench:
    """Data, environment and one timed run per (case, contender). ``checkouts`` maps each
    tao-data-io contender to the checkout its command runs from; every other contender is s5cmd."""

    def __init__(self, server: EmbeddedS3, work: Path, checkouts: dict[str, Path]) -> None:
        self.server, self.work, self.checkouts = server, work, checkouts
        self.source, self.results = work / "small-src", work / "results"
        self.jobs = RecordStore(work / "jobs")
        self.runs = 0
        self.checks: list[str] = []

    def prepare(self) -> None:
        make_files(self.source, FILES, SIZE)
        put_tree(self.server.credentials, self.source, "small")
        shutil.copytree(self.source, self.results)
        make_files(self.results / ".tao", 1, 64)  # TAO's own state: never uploaded by anyone
        direct = Target("direct", self.server.credentials)
        # Untimed: each contender's first resync fills its prefix (and our digest cache).
        for name in self.checkouts:
            self.jobs.open(job_id=self.job(name), backend="bench", image="tao", network_arch="dino",
                           action="train", storage_tier="B", results_dir=str(self.results))
            # As submit does: the route is decided once and recorded (s3://BUCKET/results/JOB/).
            record_route(self.jobs, self.job(name), decide_route(self.job(name), {"S3_BUCKET_NAME": BUCKET}))
        for name in [*self.checkouts, "s5cmd"]:
            self.run(name, self.resync_argv(name, direct), self.env(name, direct))

    def job(self, name: str) -> str:
        return "bench-cli-" + "".join(c if c.isalnum() else "-" for c in name)

    def resync_argv(self, name: str, target: Target) -> list[str]:
        if name in self.checkouts:
            return [*OURS, "resync", "--job-id", self.job(name), "--results-dir", str(self.results),
                    "--settle-seconds", "0"]
        return s5cmd(target, "sync", "--exclude", ".tao/*", f"{self.results}/", f"s3://{BUCKET}/s5cmd-resync/")

    def run(self, name: str, argv: list[str], env: dict[str, str]) -> str:
        """Run one contender to completion (exit 0 required), ours from its checkout; its stdout."""
        return subprocess.run(argv, env=env, cwd=self.checkouts.get(name), check=True, capture_output=True,
                              text=True).stdout

    def env(self, name: str, target: Target) -> dict[str, str]:
        return {**target.env(), "S3_BUCKET_NAME": BUCKET, "TAO_DATA_IO_RECORDS": self.jobs.location,
                "XDG_CACHE_HOME": str(self.work / f"cache-{self.job(name)}")}

    def change_results(self) -> None:
        """Rewrite 20 result files after a pause: S3's LastModified is 1 s coarse, and s5cmd
        sync uploads a same-size file only when it is newer than the object."""
        time.sleep(1.1)
        for i in range(0, FILES, FILES // CHANGED):
            (self.results / f"d{i % 20:02d}" / f"f{i:06d}.bin").write_bytes(os.urandom(SIZE))

    def timed(self, case: str, name: str, target: Target) -> float:
        """Run ``name`` on ``case`` once; wall seconds of the process alone."""
        self.runs += 1
        out, ours = self.work / f"out-{self.runs}", name in self.checkouts
        if case == "help":
            argv = [*OURS, "--help"] if ours else [s5cmd_binary(), "--help"]
        elif case == "small-download":
            argv = ([*OURS, "sync", f"s3://{BUCKET}/small/", str(out)] if ours
                    else s5cmd(target, "cp", f"s3://{BUCKET}/small/*", f"{out}/"))
        elif case == "small-upload":
            prefix = f"s3://{BUCKET}/up-{self.runs}/"
            argv = ([*OURS, "sync", str(self.source), prefix] if ours else
                    s5cmd(target, "cp", f"{self.source}/*", prefix))
        else:
            argv = self.resync_argv(name, target)
        uploads_before = len(self.jobs.get(self.job(name)).uploads) if ours else 0
        started = time.perf_counter()
        stdout = self.run(name, argv, self.env(name, target))
        seconds = time.perf_counter() - started
        shutil.rmtree(out, ignore_errors=True)
        if case == "resync":
            if ours:
                uploads = self.jobs.get(self.job(name)).uploads
                moved = int(uploads[-1]["uploaded_files"]) if len(uploads) > uploads_before else 0  # type: ignore[arg-type]
            else:
                moved = sum(line.startswith("cp ") for line in stdout.splitlines())
            if moved != CHANGED:
                self.checks.append(f"{name} resync ({target.label}) uploaded {moved}, not {CHANGED}")
        return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--cases", default="help,small-download,small-upload,resync")
    parser.add_argument("--latency", default="0,20", help="comma-separated ms per request (0 = direct)")
    parser.add_argument("--before", type=Path, metavar="DIR",
                        help="also run the command from this checkout (an older commit), as 'tao-data-io before'")
    args = parser.parse_args()
    checkouts = {"tao-data-io": Path(__file__).resolve().parent.parent}
    if args.before:
        checkouts = {"tao-data-io before": args.before.resolve(), **checkouts}
    contenders = [*checkouts, "s5cmd"]
    cases = [c for c in args.cases.split(",") if c]
    work = Path(tempfile.mkdtemp(prefix="tao-bench-cli-"))
    times: dict[tuple[str, str, str], list[float]] = {}
    try:
        with EmbeddedS3(work / "s3") as server:
            server.create_bucket(BUCKET)
            bench = Bench(server, work, checkouts)
            bench.prepare()
            for delay in (int(x) for x in args.latency.split(",")):
                proxy, target = start_proxy(server, delay) if delay else (None, Target("direct", server.credentials))
                try:
                    for case in cases:
                        if case == "help" and delay:
                            continue  # no request: latency cannot matter
                        for rep in range(args.reps):
                            if case == "resync":
                                bench.change_results()
                            for name in contenders[rep % len(contenders):] + contenders[:rep % len(contenders)]:
                                seconds = bench.timed(case, name, target)
                                times.setdefault((case, target.label, name), []).append(seconds)
                                print(f"  {case:15} {target.label:18} {name:18} {seconds:6.3f}s", flush=True)
                finally:
                    if proxy is not None:
                        proxy.terminate()
                        proxy.wait()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nall as processes; medians of {args.reps}, interleaved (the order rotates every repetition); "
          "ratio = wall time / s5cmd's (lower is better)\n")
    print("| case | latency | " + " | ".join(contenders) + " |\n|---|---|" + "---|" * len(contenders))
    for case, label in dict.fromkeys((case, label) for case, label, _ in times):
        medians = [statistics.median(times[(case, label, name)]) for name in contenders]
        print(f"| {case} | {label} | " + " | ".join(f"{m:.3f}s ({m / medians[-1]:.2f}×)" for m in medians) + " |")
    print("\nchecks: " + ("; ".join(bench.checks) if bench.checks else
                         f"every resync uploaded exactly the {CHANGED} changed files"))
    if bench.checks:
        sys.exit(1)


if __name__ == "__main__":
    main()
