"""One planned input staged, by its kind: an s3:// folder synced, a file copied, a selective input
downloaded by its annotation, an archive extracted, a model pulled; and the kind of an ``auto``
s3:// input resolved from what the bucket holds.

Every kind calls the one module that owns it (:mod:`tao_data_io.transfer.engine`,
:mod:`.selective`, :mod:`.archive`, :mod:`.pretrained`), each idempotent, so a rerun moves
nothing already staged and a retry is always safe. :func:`~.stage.stage_input` (the step) and the
stage cache (:func:`~.cache.stage_cached`) both stage through :func:`stage_planned`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from ..errors import TransferError, UsageError
from ..reporting import ProgressCallback
from ..transfer.engine import TransferEngine
from ..transfer.options import TransferOptions
from ..transfer.filters import GlobFilter, PathFilter
from ..transfer.shard import Shard, shard_of
from ..transfer.summary import TransferSummary
from ..uris import HFModelURI, NGCModelURI, S3Url, model_root, staging_location
from .archive import extract_archive
from .layout import PlannedInput
from .pretrained import pull_model
from .selective import selective_download
from .stage_map import Kind, StagedSource


def stage_planned(planned: PlannedInput, staging_dir: Path, *, engine: Callable[[], TransferEngine],
                  environ: Mapping[str, str] | None = None, progress: ProgressCallback | None = None,
                  shard: Shard | None = None, pages: Iterable[dict[str, Any]] | None = None) -> StagedSource:
    """Stage one planned input under ``staging_dir`` (idempotent) and say what happened, with the
    engine ``engine()`` returns (leased by the caller: :func:`~.engines.lease`). With ``shard``,
    only that shard's part is staged (see :func:`~.stage.stage`). ``pages``: a folder's listing
    when the caller has just read it (the stage cache, for the source's identity)."""
    if not planned.remote:
        return StagedSource(source=planned.source, kind="pre-positioned", sub_path=None,
                            container_path=planned.container_path, local_path=None, files=None, bytes=None)
    assert planned.sub_path is not None and planned.uri is not None
    started = time.monotonic()
    staging_dir = Path(os.path.abspath(staging_dir))
    local = staging_dir / planned.sub_path
    planned = resolved(planned, engine)
    assert planned.kind is not None and planned.uri is not None
    if planned.inside is not None:  # its folder's copy holds it (layout.nest_inputs)
        return StagedSource(source=planned.source, kind=planned.kind, sub_path=planned.sub_path,
                            container_path=planned.container_path, local_path=str(local), files=None, bytes=None,
                            note=f"served from the copy of {planned.inside}")
    if shard is not None and planned.kind not in ("folder", "glob") and not shard.owns(planned.source):
        return StagedSource(source=planned.source, kind=planned.kind, sub_path=planned.sub_path,
                            container_path=planned.container_path, local_path=str(local), files=None, bytes=None,
                            note=f"staged by shard {shard_of(planned.source, shard.count)}/{shard.count}, not {shard}")
    if isinstance(planned.uri, HFModelURI | NGCModelURI):
        return _stage_model(planned, planned.uri, staging_dir, environ, progress, started)
    return _stage_s3(planned, planned.uri, planned.kind, local, engine(), progress, started, shard, pages)


def resolved(planned: PlannedInput, engine: Callable[[], TransferEngine]) -> PlannedInput:
    """``planned`` with its kind: the plan's (:func:`~.layout.planned_kind`), or — for an ``auto``
    ``s3://b/k`` — what the bucket holds there, asked once: a file if that object exists, else a
    folder if anything lives under ``k/``; else the input does not exist."""
    if planned.kind is not None:
        return planned
    url = planned.uri
    assert isinstance(url, S3Url)
    if engine().exists(url):
        kind: Kind = "file"
    elif engine().has_prefix(url.as_prefix()):
        kind = "folder"
    else:
        raise UsageError(f"{planned.field}: {planned.source!r} does not exist: no object with that key and nothing "
                         f"under {url.as_prefix()}")
    return planned.model_copy(update={"kind": kind})


def _stage_s3(planned: PlannedInput, url: S3Url, kind: Kind, local: Path, engine: TransferEngine,
              progress: ProgressCallback | None, started: float, shard: Shard | None,
              pages: Iterable[dict[str, Any]] | None) -> StagedSource:
    declared = planned.declared

    def staged(summary: TransferSummary, files: int, note: str | None = None) -> StagedSource:
        _raise_failed(summary, planned)
        return StagedSource(source=planned.source, kind=kind, sub_path=planned.sub_path,
                            container_path=planned.container_path, local_path=str(local), files=files,
                            bytes=summary.transferred_bytes + summary.unchanged_bytes,
                            transferred_files=summary.transferred_files, transferred_bytes=summary.transferred_bytes,
                            unchanged_files=summary.unchanged_files, seconds=time.monotonic() - started, note=note)

    if kind == "folder":
        rules = PathFilter.from_patterns(declared.excludes if declared else ())
        summary = engine.download_prefix(url, local, TransferOptions(filter=rules, progress=progress, shard=shard),
                                         pages=pages)
        files = summary.transferred_files + summary.unchanged_files
        empty_allowed = shard is not None or (declared is not None and declared.allow_empty)  # a shard may get no key
        if files == 0 and summary.ok and not empty_allowed:
            excluded = f" ({summary.excluded_files} excluded by its excludes)" if summary.excluded_files else ""
            raise UsageError(f"{planned.field}: {planned.source!r} holds no object{excluded}; check the prefix, or "
                             "declare the input with allow_empty: true if an empty folder is expected")
        if files == 0 and summary.ok:  # allowed empty: the job mounts its target all the same
            local.mkdir(parents=True, exist_ok=True)
        return staged(summary, files)
    if kind == "glob":
        base, pattern = url.glob_split()
        summary = engine.download_prefix(base, local, TransferOptions(filter=GlobFilter(pattern), progress=progress,
                                                                      shard=shard))
        files = summary.transferred_files + summary.unchanged_files
        if files == 0 and summary.ok and shard is None:
            raise UsageError(f"{planned.field}: {planned.source!r} matches no object (TensorFlow's glob rule: '*' "
                             "and '?' match within one path component); check the pattern")
        return staged(summary, files)
    if kind == "file":
        summary = engine.download_object(url, local, TransferOptions(progress=progress))
        if summary.failed and summary.failed[0].missing:
            raise UsageError(f"{planned.field}: {planned.source!r} does not exist (404); check the bucket and key")
        return staged(summary, 1)
    if kind == "selective":
        assert declared is not None and declared.annotation is not None
        result = selective_download(engine, declared.annotation, declared.keys, url.bucket, url.key, local,
                                    fmt=declared.annotation_format, missing=declared.missing,
                                    options=TransferOptions(progress=progress))
        note = f"{len(result.missing)} referenced objects missing (skipped)" if result.missing else None
        return staged(result.summary, result.references - len(result.missing), note)
    if kind == "archive":
        extracted = extract_archive(url, local, strip_components=declared.strip_components if declared else 0,
                                    engine=engine, progress=progress)
        return StagedSource(source=planned.source, kind=kind, sub_path=planned.sub_path,
                            container_path=planned.container_path, local_path=str(local), files=extracted.files,
                            bytes=extracted.bytes, transferred_files=extracted.files if extracted.extracted else 0,
                            transferred_bytes=extracted.bytes if extracted.extracted else 0,
                            unchanged_files=0 if extracted.extracted else extracted.files,
                            seconds=time.monotonic() - started, note=extracted.reason)
    raise UsageError(f"{planned.field}: kind {kind!r} does not apply to {planned.source!r}")


def _stage_model(planned: PlannedInput, parsed: HFModelURI | NGCModelURI, staging_dir: Path,
                 environ: Mapping[str, str] | None, progress: ProgressCallback | None, started: float) -> StagedSource:
    """A model is pulled into its repository root; an ``hf://org/repo/sub`` source is the ``sub``
    inside it, so its entry's sub-path and container path point there (one sub-path per source,
    as the renderer requires). Both locations come from the one parser in :mod:`tao_data_io.uris`."""
    assert planned.sub_path is not None
    root = staging_dir / staging_location(model_root(parsed))
    result = pull_model(parsed, root, environ=environ, progress=progress)
    return StagedSource(source=planned.source, kind="model", sub_path=planned.sub_path,
                        container_path=planned.container_path, local_path=str(staging_dir / planned.sub_path),
                        files=len(result.files), bytes=result.bytes, transferred_files=len(result.fetched),
                        transferred_bytes=result.fetched_bytes, unchanged_files=len(result.files) - len(result.fetched),
                        seconds=time.monotonic() - started, note=f"revision {result.revision}")


def _raise_failed(summary: TransferSummary, planned: PlannedInput) -> None:
    if not summary.ok:
        shown = "; ".join(f"{f.name}: {f.reason}" for f in summary.failed[:5])
        raise TransferError(f"staging {planned.source} ({planned.field}) failed for {summary.failed_files} object(s): "
                            f"{shown}; complete files were kept — a rerun retries the rest")
