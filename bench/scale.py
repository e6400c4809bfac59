"""Scale benchmark: the ``tao-data-io`` command against ``s5cmd`` on N objects, with peak memory.

ImageNet's training split is 1.28 M files; the engine must stage and resync trees of that order
in bounded memory (a tier B stage pod has a memory limit) and at s5cmd's speed. Each case runs
every contender as a process, A/B interleaved, and reports wall time, the ratio to s5cmd
(lower is better), each process's own peak RSS (``wait4``'s ``ru_maxrss``: the process, not
its children — a command handing objects of 32 MiB and more to s5cmd counts itself only; the
objects here are small) and its CPU seconds (user + system): on a machine whose cores the
server shares, a client's CPU per object is time the server does not get.

Cases, each on a tree of ``--objects`` objects of ``--size`` bytes, ImageNet-shaped (1,280 files a
directory):

* ``download``  — into an empty directory: ``tao-data-io sync s3://…/P/ DIR`` against
  ``s5cmd cp 's3://…/P/*' DIR/``;
* ``resync``    — the same again, nothing changed: ``tao-data-io sync`` against ``s5cmd sync``;
* ``changed``   — ``--changed`` objects rewritten in the bucket first, then the same;
* ``upload``    — the downloaded tree to a new prefix: ``tao-data-io sync DIR s3://…/Q/`` against
  ``s5cmd cp 'DIR/*' s3://…/Q/``;
* ``upload-resync`` — the same again, nothing changed: against ``s5cmd sync``;
* ``shard``     — one shard of ``--shards`` into an empty directory (``tao-data-io sync --shard
  0/N``, a tier B stage pod of an Indexed Job): its memory against the whole download's. s5cmd
  has no shards, so this case has no s5cmd row;
* ``links``     — a dataset assembled with ``ln -s``: a local tree of ``--objects`` symlinks to
  images elsewhere, and a label file for every tenth, to a new prefix: ``tao-data-io sync`` (a
  symlink leaving the tree is skipped, each with its reason) against ``s5cmd cp
  --no-follow-symlinks`` (which skips them too). Every symlink waits for the whole tree to be
  seen before it can be decided: what that holds is this case's peak RSS.

The three resync cases (``resync``, ``changed``, ``upload-resync``) first run every contender
once, untimed, so that each timed run is a resync whatever ran before it.

The bucket is seeded once and kept (``--data``, the server's directory, reused by later runs with
the same ``--objects`` and ``--size``)::

    .venv/bin/python bench/scale.py --objects 10000
    .venv/bin/python bench/scale.py --objects 100000 --cases download,resync,changed
    .venv/bin/python bench/scale.py --objects 100000 --before /tmp/before   # a checkout to compare with

``--before DIR`` adds the command run from another checkout (``git archive COMMIT | tar -x -C DIR``)
as a contender, for a before/after table from one run (its upload cases read the tree its
download case wrote). ``--latency MS`` puts ``bench/latency_proxy.py`` between every contender and
the server, MS added to each request: here the server shares the client's two cores and answers a
listing page in a few milliseconds, where S3 takes tens.

A run's earlier download is set aside before the next (renamed under ``work/removed``), and what
was set aside is removed when the run ends: removing it right before the next download (as an
earlier version did) made every file that download created slower. ext4 skips an inode freed in
the last ``dirty_expire_centisecs`` (30 s) while it is still cached when it allocates one
(``recently_deleted`` in ``fs/ext4/ialloc.c``), so each create scanned the inode table past the
10,000 just freed: that scan was 23 % of the command's CPU samples under ``perf``, and it spread
the same download from 3.2 to 4.1 s. A download into a new directory is what the case measures;
a user who removes a tree and downloads it again at once pays that tax with any tool.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from transfer import BUCKET, Target, start_proxy  # bench/ is sys.path[0]
from tao_data_io.embedded.s3 import EmbeddedS3
from tao_data_io.transfer.client import make_s3_client
from tao_data_io.transfer.engine import TransferEngine
from tao_data_io.transfer.s5cmd_executor import s5cmd_binary

PER_DIRECTORY = 1280
CASES = ("download", "resync", "changed", "upload", "upload-resync", "shard", "links")
#: The cases that time a run over what a run before transferred: each contender runs once untimed first.
RESYNCS = ("resync", "changed", "upload-resync")
#: The ``links`` case: one label file (uploaded) for this many symlinks (skipped).
LINKS_PER_FILE = 10


def layout(index: int) -> str:
    return f"n{index // PER_DIRECTORY:05d}/img_{index:08d}.JPEG"


def timed(argv: list[str], env: dict[str, str], cwd: Path | None, work: Path) -> tuple[float, float, float]:
    """(wall seconds, peak RSS in MiB, CPU seconds) of one process run to its end, from GNU
    time's ``%M %U %S``: a child forked straight from this process would start its peak RSS at
    this process's size (Linux carries the parent's high-water mark through fork and exec)."""
    measured = work / "maxrss"
    started = time.perf_counter()
    done = subprocess.run(["/usr/bin/time", "-f", "%M %U %S", "-o", str(measured), *argv], env=env, cwd=cwd,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{argv[:4]} exited {done.returncode}: {done.stderr.decode(errors='replace')[-2000:]}")
    rss, user, system = measured.read_text().split()[-3:]
    return wall, int(rss) / 1024, float(user) + float(system)


class Bench:
    def __init__(self, server: EmbeddedS3, work: Path, objects: int, size: int, changed: int,
                 checkouts: dict[str, Path], shards: int = 4, target: Target | None = None) -> None:
        self.server, self.work, self.objects, self.size, self.changed = server, work, objects, size, changed
        self.shards = shards
        #: How the contenders reach the server (direct, or through the latency proxy).
        self.target = target or Target("direct", server.credentials)
        self.checkouts = checkouts
        self.prefix = f"scale-{objects}x{size}"
        self.removed = work / "removed"

    # ------------------------------------------------------------------ data
    def make_bucket(self) -> None:
        """The bucket, unless a run before made it (the server's directory is kept)."""
        client = make_s3_client(self.server.credentials)
        try:
            client.create_bucket(Bucket=BUCKET)
        except client.exceptions.ClientError:
            pass

    def seed(self) -> None:
        """Put the tree in the bucket unless a run before did (the listing's count says)."""
        client = make_s3_client(self.server.credentials)
        found = sum(page.get("KeyCount", 0) for page in client.get_paginator("list_objects_v2").paginate(
            Bucket=BUCKET, Prefix=self.prefix + "/"))
        if found == self.objects:
            print(f"bucket holds {found} objects under {self.prefix}/ already", flush=True)
            return
        local = self.work / "seed"
        shutil.rmtree(local, ignore_errors=True)
        for index in range(self.objects):
            path = local / layout(index)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(os.urandom(self.size))
        started = time.perf_counter()
        with TransferEngine(self.server.credentials) as engine:
            summary = engine.sync(str(local), f"s3://{BUCKET}/{self.prefix}/")
        if not summary.ok:
            raise RuntimeError(summary.failed[:3])
        print(f"seeded {self.objects} objects in {time.perf_counter() - started:.0f}s", flush=True)
        shutil.rmtree(local)

    def links(self) -> Path:
        """The ``links`` case's tree (made once): symlinks to where the images would be."""
        tree = self.work / f"links-{self.objects}"
        if not (tree / ".complete").exists():
            shutil.rmtree(tree, ignore_errors=True)
            for index in range(self.objects):
                path = tree / layout(index)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.symlink_to(f"/datasets/imagenet/{layout(index)}")
                if index % LINKS_PER_FILE == 0:
                    path.with_suffix(".txt").write_bytes(b"%d\n" % (index % 1000))
            (tree / ".complete").write_bytes(b"")
        return tree

    def rewrite(self, round_: int) -> None:
        """Rewrite ``changed`` objects spread over the tree (new bytes, same size)."""
        client = make_s3_client(self.server.credentials)
        step = max(1, self.objects // self.changed)
        for index in range(round_ % step, self.objects, step)[: self.changed]:
            client.put_object(Bucket=BUCKET, Key=f"{self.prefix}/{layout(index)}", Body=os.urandom(self.size))

    # ------------------------------------------------------------------ contenders
    def env(self, name: str) -> dict[str, str]:
        env = {**self.target.env(), "XDG_CACHE_HOME": str(self.work / "cache" / name)}
        if name in self.checkouts:
            env["PYTHONPATH"] = str(self.checkouts[name])
        return env

    def command(self, name: str, case: str) -> tuple[list[str], Path | None]:
        remote = f"s3://{BUCKET}/{self.prefix}/"
        down = self.work / "down" / name
        up = f"s3://{BUCKET}/up-{self.prefix}-{name.replace(' ', '-')}/"
        if case == "links":
            up = f"s3://{BUCKET}/links-{self.prefix}-{name.replace(' ', '-')}/"
        if name in self.checkouts:
            ours = [sys.executable, "-m", "tao_data_io.cli", "sync"]
            if case == "links":
                return [*ours, "--exclude", ".complete", str(self.links()), up], self.checkouts[name]
            if case.startswith("upload"):
                return [*ours, str(down), up], self.checkouts[name]
            if case == "shard":
                return [*ours, "--shard", f"0/{self.shards}", remote, str(self.shard_dir(name))], self.checkouts[name]
            return [*ours, remote, str(down)], self.checkouts[name]
        s5 = [s5cmd_binary(), "--endpoint-url", str(self.target.credentials.endpoint_url), "--numworkers", "256"]
        verb = "cp" if case in ("download", "upload") else "sync"
        if case == "links":
            return [*s5, "cp", "--no-follow-symlinks", "--exclude", ".complete", str(self.links()) + "/*", up], None
        if case.startswith("upload"):
            return [*s5, verb, str(down) + "/*", up], None
        return [*s5, verb, remote + "*", str(down) + "/"], None

    def run(self, cases: list[str], contenders: list[str], reps: int) -> list[str]:
        rows = ["| case | contender | wall s (median) | ratio to s5cmd | peak RSS MiB | CPU s (median) |",
                "|---|---|---|---|---|---|"]
        for case in cases:
            in_case = [name for name in contenders if case != "shard" or name in self.checkouts]
            results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in in_case}
            if case in RESYNCS:  # untimed: the state a resync starts from
                for name in in_case:
                    argv, cwd = self.command(name, case)
                    timed(argv, self.env(name), cwd, self.work)
            for rep in range(reps):
                if case == "changed":
                    self.rewrite(rep)
                order = in_case[rep % len(in_case):] + in_case[:rep % len(in_case)]
                for name in order:
                    self.prepare(name, case)
                    argv, cwd = self.command(name, case)
                    results[name].append(timed(argv, self.env(name), cwd, self.work))
                    wall, rss, cpu = results[name][-1]
                    print(f"{case} {name}: {wall:.2f}s {rss:.0f} MiB {cpu:.2f} CPU s", flush=True)
            base = statistics.median(wall for wall, _, _ in results["s5cmd"]) if "s5cmd" in results else None
            for name in in_case:
                wall = statistics.median(w for w, _, _ in results[name])
                rss = max(r for _, r, _ in results[name])
                cpu = statistics.median(c for _, _, c in results[name])
                ratio = f"{wall / base:.2f}×" if base else "–"
                rows.append(f"| {case} | {name} | {wall:.2f} | {ratio} | {rss:.0f} | {cpu:.2f} |")
        return rows

    def shard_dir(self, name: str) -> Path:
        return self.work / "shard" / name

    def set_aside(self, tree: Path) -> None:
        """Move ``tree`` out of the way, to be removed once the run ends (:meth:`remove_set_aside`)."""
        if tree.exists():
            self.removed.mkdir(parents=True, exist_ok=True)
            tree.rename(self.removed / str(len(os.listdir(self.removed))))

    def remove_set_aside(self) -> None:
        shutil.rmtree(self.removed, ignore_errors=True)

    def prepare(self, name: str, case: str) -> None:
        """A fresh download starts from an empty directory; a fresh upload to an empty prefix."""
        if case in ("download", "shard"):
            self.set_aside(self.work / "down" / name if case == "download" else self.shard_dir(name))
            shutil.rmtree(self.work / "cache" / name, ignore_errors=True)
        elif case in ("upload", "links"):
            prefix = f"{'up' if case == 'upload' else 'links'}-{self.prefix}-{name.replace(' ', '-')}/"
            subprocess.run([s5cmd_binary(), "--endpoint-url", str(self.server.endpoint_url), "rm",
                            f"s3://{BUCKET}/{prefix}*"], env=self.target.env(), stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, check=False)
            shutil.rmtree(self.work / "cache" / name, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=10_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--changed", type=int, default=1000)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--shards", type=int, default=4, help="the shard case takes shard 0 of this many")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--data", type=Path, default=Path("/tmp/tao-data-io-scale"),
                        help="the server's data directory, kept between runs (seeded once)")
    parser.add_argument("--before", type=Path, help="another checkout's command as a contender")
    parser.add_argument("--latency", type=int, default=0,
                        help="ms added to each request the contenders make (bench/latency_proxy.py; 0 = direct)")
    args = parser.parse_args()
    cases = [case for case in args.cases.split(",") if case]
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        parser.error(f"unknown cases {unknown}: choose from {', '.join(CASES)}")
    checkouts = {"tao-data-io": Path(__file__).resolve().parents[1]}
    if args.before is not None:
        checkouts["before"] = args.before.resolve()
    contenders = [*checkouts, "s5cmd"]
    work = args.data / "work"
    work.mkdir(parents=True, exist_ok=True)
    with EmbeddedS3(args.data / "server") as server:
        proxy, target = start_proxy(server, args.latency) if args.latency else (None, None)
        bench = Bench(server, work, args.objects, args.size, min(args.changed, args.objects), checkouts, args.shards,
                      target)
        bench.make_bucket()
        if set(cases) - {"links"}:  # the links case reads a local tree only
            bench.seed()
        bench.remove_set_aside()  # a run killed before its end left these
        try:
            rows = bench.run(cases, contenders, args.reps)
        finally:
            bench.remove_set_aside()
            if proxy is not None:
                proxy.terminate()
                proxy.wait()
    print(f"\n{args.objects} objects × {args.size} B, {args.reps} rep(s), "
          f"{f'+{args.latency} ms a request' if args.latency else 'direct'}\n")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
