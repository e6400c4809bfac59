"""Digest cache at scale: one JSON file rewritten whole, an append-only log, or SQLite.

The engine remembers, per file, what its content is known to be (``tao_data_io.transfer.digests``),
so a rerun needs no hash. At ImageNet's 1.28 M files the cache is hundreds of megabytes; what
matters is what a run costs that changes few entries, and the memory a run holds. Each store
runs in its own process (so its peak RSS is its own) through three phases on N entries:

* ``fill``    — N entries recorded and persisted (a fresh download);
* ``resync``  — open, look every entry up (a no-change resync);
* ``change``  — open, look every entry up, rewrite ``--changed`` of them and persist.

Stores:

* ``json``    — the schema-2 store before this change: a dict in memory, the file rewritten whole;
* ``log``     — an append-only log of JSON lines, replayed into a dict on open (the last line of a
  name wins), compacted when it holds twice the live entries: a change appends its lines only,
  but every open replays the log, and the index is a dict of every entry;
* ``sqlite``  — the store as built (:class:`tao_data_io.transfer.digests.DigestStore`): a table
  keyed by relative path in WAL mode, read a plan chunk's names at a time (``prefetch``), written
  256 records to a transaction.

    .venv/bin/python bench/digests.py --entries 100000,1280000
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STORES = ("json", "log", "sqlite")


def entry(index: int, salt: str = "") -> tuple[str, dict[str, object]]:
    relative = f"n{index // 1280:05d}/img_{index:08d}.JPEG"
    return relative, {"identity": [1024, 1_700_000_000_000_000_000 + index, 1_700_000_000_000_000_000 + index,
                                   10_000_000 + index],
                      "recorded_ns": 1_800_000_000_000_000_000, "md5": None,
                      "etag": f"{salt}{index:032x}"[-32:], "multipart": {}}


def run_json(path: Path, phase: str, entries: int, changed: int) -> None:
    if phase == "fill":
        data = dict(entry(i) for i in range(entries))
    else:
        data = json.loads(path.read_text())["entries"]
        assert all(data.get(entry(i)[0]) is not None for i in range(entries))
        if phase == "resync":
            return
        for i in range(changed):
            name, value = entry(i * (entries // changed), "x")
            data[name] = value
    path.write_text(json.dumps({"schema_version": 2, "entries": data}, separators=(",", ":")))


def run_log(path: Path, phase: str, entries: int, changed: int) -> None:
    index: dict[str, dict[str, object]] = {}
    lines = 0
    if phase != "fill":
        with open(path, encoding="utf-8") as log:
            for line in log:
                name, value = json.loads(line)
                index[name] = value
                lines += 1
        assert all(index.get(entry(i)[0]) is not None for i in range(entries))
        if phase == "resync":
            return
    with open(path, "a", encoding="utf-8") as log:
        written = (entry(i) for i in range(entries)) if phase == "fill" else (
            entry(i * (entries // changed), "x") for i in range(changed))
        for name, value in written:
            index[name] = value
            log.write(json.dumps([name, value], separators=(",", ":")) + "\n")
            lines += 1
        log.flush()
        os.fsync(log.fileno())
    if lines > 2 * len(index):  # compaction: the live entries only
        compacted = path.with_suffix(".compact")
        with open(compacted, "w", encoding="utf-8") as out:
            for name, value in index.items():
                out.write(json.dumps([name, value], separators=(",", ":")) + "\n")
        os.replace(compacted, path)


def run_sqlite(path: Path, phase: str, entries: int, changed: int) -> None:
    from tao_data_io.transfer.digests import DigestStore
    from tao_data_io.transfer.local_walk import LocalFile

    def local(index: int) -> LocalFile:
        name, value = entry(index)
        size, mtime, ctime, ino = value["identity"]  # type: ignore[misc]
        return LocalFile(name, Path(), name, size, mtime, ctime, ino)

    store = DigestStore(path)
    try:
        if phase == "fill":
            for i in range(entries):
                store.record(local(i), etag=entry(i)[1]["etag"])  # type: ignore[arg-type]
            store.save()
            return
        for start in range(0, entries, 5000):  # as the engine asks: a plan chunk's names at once, then each
            store.prefetch([local(i).relative for i in range(start, min(start + 5000, entries))])
            assert all(store.same_stat(local(i)) is not None for i in range(start, min(start + 5000, entries)))
        if phase == "resync":
            return
        for i in range(changed):
            store.record(local(i * (entries // changed)), etag=entry(i, "x")[1]["etag"])  # type: ignore[arg-type]
        store.save()
    finally:
        store.close()


RUNNERS = {"json": run_json, "log": run_log, "sqlite": run_sqlite}


def _wchar() -> int:
    """Bytes this process has written through write(2) and friends (``/proc/self/io``)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    return 0


def child(store: str, path: str, phase: str, entries: int, changed: int) -> None:
    started, wrote = time.perf_counter(), _wchar()
    RUNNERS[store](Path(path), phase, entries, changed)
    wall, wrote = time.perf_counter() - started, _wchar() - wrote
    print(json.dumps({"wall": wall, "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "written": wrote}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", default="10000,100000")
    parser.add_argument("--changed", type=int, default=20)
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        store, path, phase, entries, changed = args.child
        child(store, path, phase, int(entries), int(changed))
        return
    rows = ["| entries | store | fill s | resync s | change s | bytes written by change | file MB | peak RSS MiB |",
            "|---|---|---|---|---|---|---|---|"]
    for entries in (int(n) for n in args.entries.split(",")):
        for store in STORES:
            with tempfile.TemporaryDirectory() as work:
                path = Path(work) / f"digests.{store}"
                measured = {}
                for phase in ("fill", "resync", "change"):
                    out = subprocess.run([sys.executable, __file__, "--child", store, str(path), phase, str(entries),
                                          str(args.changed)], check=True, capture_output=True, text=True)
                    measured[phase] = json.loads(out.stdout)
                written = measured["change"]["written"]
                rss = max(m["rss"] for m in measured.values())
                rows.append(f"| {entries:,} | {store} | {measured['fill']['wall']:.2f}"
                            f" | {measured['resync']['wall']:.2f} | {measured['change']['wall']:.2f} | {written:,}"
                            f" | {_size(path) / 1e6:.1f} | {rss:.0f} |")
                print(rows[-1], flush=True)
    print("\n".join(rows))


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*")) if path.parent.exists() else 0


if __name__ == "__main__":
    main()
