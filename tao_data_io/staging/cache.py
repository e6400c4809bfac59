"""The stage cache: a shared staging root (a tier B volume's ``cache/``) that many jobs stage into
and mount from, so a second job on the same dataset moves zero bytes.

Layout: each source lives at its usual sub-path below the cache root (``s3/<bucket>/<key>``,
``archive/s3/…``, ``hf/<org>/<repo>/<revision>``, …), so its place is known before anything is
staged and the renderer can mount it read-only by ``subPath``. Beside the entries, under the
reserved ``.tao-data-io/`` (never an entry: :func:`tao_data_io.fs.check_relative` refuses it):

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
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from pathlib import Path

from ..fs import STATE_DIR_NAME, atomic_write, file_lock
from ..reporting import ProgressCallback
from ..transfer.client import head_or_none
from ..transfer.engine import TransferEngine
from ..transfer.filters import PathFilter
from ..transfer.listing import RemoteListing
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
    # What this entry writes, proved before its lock is taken: a cache an earlier stage made as
    # another user (or as root) refuses with the directory and the fix, not a bare EACCES.
    for directory, what in ((lock.parent, "the stage cache's locks"), (marker.parent, "the stage cache's markers"),
                            ((cache_root / planned.sub_path).parent, "the directory of the stage cache's entry")):
        prove_writable(directory, what=what)
    with lease(engine, environ) as get_engine, file_lock(lock):
        planned = resolved(planned, get_engine)  # its kind asked (if at all) once, for identity and staging
        identity, listing = _identity(planned, get_engine)
        previous = _read_marker(marker)
        now = datetime.now(timezone.utc).isoformat()
        if identity is not None and previous is not None and previous.get("identity") == identity:
            _write_marker(marker, {**previous, "last_used": now})
            entry = StagedSource.model_validate(previous["entry"])
            return entry.model_copy(update={"local_path": str(cache_root / planned.sub_path), "transferred_files": 0,
                                            "transferred_bytes": 0, "unchanged_files": entry.files or 0,
                                            "seconds": 0.0, "note": "stage cache hit: source unchanged"})
        staged = stage_planned(planned, cache_root, engine=get_engine, environ=environ, progress=progress, shard=shard,
                               listing=listing)
        _write_marker(marker, {"version": MARKER_VERSION, "source": planned.source, "identity": identity,
                               "staged_at": now, "last_used": now, "entry": staged.to_dict()})
        return staged


def _identity(planned: PlannedInput, engine: Callable[[], TransferEngine]) -> tuple[str | None, RemoteListing | None]:
    """The source's identity, or None when it has no cheap one (selective inputs, models); and a
    folder's listing, which the identity was computed from and the sync then uses (listed once)."""
    url = planned.uri
    if not isinstance(url, S3Url):
        return None, None
    declared = planned.declared
    if planned.kind == "folder":
        rules = PathFilter.from_patterns(declared.excludes if declared else ())
        listing = engine().list_prefix(url)
        lines = sorted(f"{obj.key}\t{obj.etag}" for obj in listing.objects if rules(obj.relative))
        return "folder:sha256:" + hashlib.sha256("\n".join(lines).encode()).hexdigest(), listing
    if planned.kind in ("file", "archive"):
        head = head_or_none(engine().client, url.bucket, url.key)
        if head is None:
            return None, None  # let the stager report the missing object
        strip = declared.strip_components if declared is not None and planned.kind == "archive" else 0
        return (f"{planned.kind}:etag:{head.get('ETag', '').strip(chr(34))}:size:{head.get('ContentLength')}"
                f":strip:{strip}"), None
    return None, None


def _read_marker(path: Path) -> dict[str, object] | None:
    try:
        data = json.loads(path.read_bytes())
    except (FileNotFoundError, ValueError):
        return None  # absent or damaged: stage again (the stager is idempotent)
    return data if isinstance(data, dict) and data.get("version") == MARKER_VERSION else None


def _write_marker(path: Path, data: dict[str, object]) -> None:
    atomic_write(path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode(), durable=True)
