"""The stage cache: a shared staging root (a tier B volume's ``cache/``) that many jobs stage into
and mount from, so a second job on the same dataset moves zero bytes.

Layout: each source lives at its usual sub-path below the cache root (``s3/<bucket>/<key>``,
``archive/s3/…``, ``hf/<org>/<repo>/<revision>``, …), so its place is known before anything is
staged and the renderer can mount it read-only by ``subPath``. Beside the entries, under the
reserved ``.tao-data-io/`` (never an entry: :func:`tao_data_io.fs.confinement.check_relative` refuses it):

* ``locks/<sha256 of the sub-path>[.<shard>].lock`` — an entry is staged only under its lock, so
  two stage Jobs on one dataset take turns (the second finds it done); shards of one entry lock
  separately and run side by side (their keys are disjoint).
* ``markers/<sub-path>[.<shard>].json`` — the stage marker, published atomically once the entry
  is complete: the source's identity, what the entry holds, when it was staged and last used.

The identity is what says "unchanged" without a transfer: for a folder the SHA-256 of its
listing (every key and ETag, after the input's excludes), for a file or an archive its ETag
(and, for an archive, ``strip_components``). A marker with the same identity is a hit: only its
``last_used`` is rewritten. Selective inputs and models have no cheap identity (the referenced
objects, the Hub's resolved revision), so they always go through their own idempotent stager,
which moves nothing that is already right; their marker records the outcome and last use.

An entry whose source changed is brought up to date in place (per-file atomic renames); stage a
changed dataset when no job is reading it. Eviction is out of scope: ``last_used`` is there for it.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..fs.atomic import atomic_write
from ..fs.confinement import STATE_DIR_NAME
from ..fs.locks import file_lock
from ..reporting import ProgressCallback
from ..transfer.client import head_or_none
from ..transfer.engine import TransferEngine
from ..transfer.filters import PathFilter
from ..transfer.listing import remote_objects
from ..transfer.shard import Shard
from ..uris import S3Url
from .engines import EngineSource, lease
from .inputs import resolved, stage_planned
from .layout import PlannedInput
from .stage_map import StagedSource
from .writable import prove_writable

MARKER_VERSION = 1


def marker_path(cache_root: Path, sub_path: str, shard: Shard | None = None) -> Path:
    return cache_root / STATE_DIR_NAME / "markers" / f"{sub_path}{'.' + shard.label if shard else ''}.json"


def stage_cached(planned: PlannedInput, cache_root: Path, *,
                 engine: EngineSource = None,
                 environ: Mapping[str, str] | None = None, progress: ProgressCallback | None = None,
                 shard: Shard | None = None) -> StagedSource:
    """Stage ``planned`` into the cache at ``cache_root`` (see the module docstring)."""
    if not planned.remote or planned.inside is not None:
        # Nothing to stage: pre-positioned, or held by the copy of the folder it lies inside.
        with lease(engine, environ) as get_engine:
            return stage_planned(planned, cache_root, engine=get_engine)
    assert planned.sub_path is not None
    digest = hashlib.sha256(planned.sub_path.encode()).hexdigest()[:32]
    lock = cache_root / STATE_DIR_NAME / "locks" / f"{digest}{'.' + shard.label if shard else ''}.lock"
    marker = marker_path(cache_root, planned.sub_path, shard)
    entry_path = cache_root / planned.sub_path
    # What this entry writes, proved before its lock is taken: a cache an earlier stage made as
    # another user (or as root) refuses with the directory and the fix, not a bare EACCES.
    for directory, what in ((lock.parent, "the stage cache's locks"), (marker.parent, "the stage cache's markers"),
                            (entry_path.parent, "the directory of the stage cache's entry")):
        prove_writable(directory, what=what)
    with lease(engine, environ) as get_engine, file_lock(lock):
        planned = resolved(planned, get_engine)  # its kind asked (if at all) once, for identity and staging
        spool = lock.with_suffix(".listing")  # the folder's listing as its identity read it, for the sync
        try:
            identity = _identity(planned, get_engine, spool)
            previous = _read_marker(marker)
            now = datetime.now(timezone.utc).isoformat()
            if identity is not None and previous is not None and previous.get("identity") == identity:
                _write_marker(marker, {**previous, "last_used": now})
                entry = StagedSource.model_validate(previous["entry"])
                return entry.model_copy(update={"local_path": str(entry_path),
                                                "transferred_files": 0, "transferred_bytes": 0,
                                                "unchanged_files": entry.files or 0, "seconds": 0.0,
                                                "note": "stage cache hit: source unchanged"})
            staged = stage_planned(planned, cache_root, engine=get_engine, environ=environ, progress=progress,
                                   shard=shard, pages=_spooled(spool) if spool.exists() else None)
        finally:
            spool.unlink(missing_ok=True)  # hit, miss or failure: the listing is ours for this run only
        _write_marker(marker, {"version": MARKER_VERSION, "source": planned.source, "identity": identity,
                               "staged_at": now, "last_used": now, "entry": staged.to_dict()})
        return staged


def _identity(planned: PlannedInput, engine: Callable[[], TransferEngine], spool: Path) -> str | None:
    """The source's identity, or None when it has no cheap one (selective inputs, models). A
    folder's is the hash of its listing's keys and ETags (after the input's excludes), read as the
    pages come, in the listing's order (by key); the pages are written to ``spool`` as they pass,
    so a miss syncs from them — the folder is listed once, and no listing is held in memory."""
    url = planned.uri
    if not isinstance(url, S3Url):
        return None
    declared = planned.declared
    if planned.kind == "folder":
        rules = PathFilter.from_patterns(declared.excludes if declared else ())
        digest = hashlib.sha256()
        separator = b""
        # Written under the entry's lock, never through a symlink put in its place.
        with os.fdopen(os.open(spool, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600),
                       "w", encoding="utf-8") as out:
            for page in engine().pages(url):
                contents = page.get("Contents", ())
                out.write(json.dumps([[item["Key"], item["Size"], item.get("ETag"), item.get("LastModified")]
                                      for item in contents], separators=(",", ":")) + "\n")
                for obj in remote_objects([page], url.as_prefix().key):
                    if rules(obj.relative):
                        digest.update(separator + f"{obj.key}\t{obj.etag}".encode())
                        separator = b"\n"
        return "folder:sha256:" + digest.hexdigest()
    if planned.kind in ("file", "archive"):
        head = head_or_none(engine().client, url.bucket, url.key)
        if head is None:
            return None  # let the stager report the missing object
        strip = declared.strip_components if declared is not None and planned.kind == "archive" else 0
        return (f"{planned.kind}:etag:{head.get('ETag', '').strip(chr(34))}:size:{head.get('ContentLength')}"
                f":strip:{strip}")
    return None


def _spooled(spool: Path) -> Iterator[dict[str, Any]]:
    """The pages :func:`_identity` wrote to ``spool``, one in memory at a time, as a listing has them."""
    with open(spool, encoding="utf-8") as pages:
        for line in pages:
            yield {"Contents": [{"Key": key, "Size": size, "ETag": etag, "LastModified": modified}
                                for key, size, etag, modified in json.loads(line)]}


def _read_marker(path: Path) -> dict[str, object] | None:
    try:
        data = json.loads(path.read_bytes())
    except (FileNotFoundError, ValueError):
        return None  # absent or damaged: stage again (the stager is idempotent)
    return data if isinstance(data, dict) and data.get("version") == MARKER_VERSION else None


def _write_marker(path: Path, data: dict[str, object]) -> None:
    atomic_write(path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode(), durable=True)
