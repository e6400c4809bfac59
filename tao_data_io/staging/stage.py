"""Stage a job request's inputs: :func:`plan_inputs` says what, :func:`stage_input` stages one,
:func:`stage_config` materializes the config, :func:`publish_map` writes the staging map, and
:func:`stage` composes them.

Why per input: an orchestrator runs one task per input, so each shows its own progress and a
failed input retries alone; the CLI runs the same functions in a loop. Every input kind calls the
one module that owns it (engine sync or copy, selective download, archive extraction, model
pull), each idempotent, so a rerun moves nothing already staged and a retry is always safe.

Credentials reach a step one way: ``environ`` (default ``os.environ``) — S3 through an engine
built from it (or the ``engine`` passed in, which a caller owns and closes), the Hub and NGC
through their variables. Nothing here stores a value.

Pre-positioned (tier A) inputs are recorded, never touched: on a worker that submits to a
cluster those paths do not exist, and their readability is proved inside the compute frame by
the verify probe. Air-gapped requests never touch the network: every remote URI is refused up
front in one message, and no client is created.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from ..credentials import s3_credentials_from_env
from ..errors import TransferError, UsageError
from ..reporting import ProgressCallback
from ..request import JobRequest
from ..runner import Runner, direct
from ..transfer.engine import TransferEngine, TransferOptions
from ..transfer.filters import PathFilter
from ..transfer.shard import Shard, shard_of
from ..transfer.summary import Failure, TransferSummary
from ..uris import HFModelURI, NGCModelURI, S3Url, is_remote_uri, model_root, parse_s3_url, parse_uri, staging_location
from .archive import extract_archive
from .config import materialize_config
from .layout import CONFIG_DIR, DEFAULT_INPUTS_ROOT, PlannedInput, placements, plan_inputs
from .pretrained import pull_model
from .selective import selective_download
from .stage_map import STAGING_MAP_NAME, Kind, StagedSource, StagingMap, write_staging_map

__all__ = ["STAGING_MAP_NAME", "check_air_gap", "plan_inputs", "plan_stage", "publish_map", "stage", "stage_config",
           "stage_input"]


def check_air_gap(request: JobRequest) -> None:
    """Refuse an air-gapped request that references anything remote, listing every such URI."""
    if not request.storage.air_gapped:
        return
    problems = [f"{uri} ({planned.field})" for uri, planned in placements(request).items()]
    for index, item in enumerate(request.inputs):
        if item.annotation and is_remote_uri(item.annotation):
            problems.append(f"{item.annotation} (inputs[{index}].annotation)")
    if problems:
        raise UsageError("storage.air_gapped is true, so nothing may be fetched: pre-position these and reference "
                         "their mount paths instead:\n  " + "\n  ".join(problems))


#: What stages one planned input under a staging root (idempotent): :func:`stage_input`, the
#: tier B cache's :func:`~.cache.stage_cached`, or either run as an orchestrator's task.
Stager = Callable[..., StagedSource]


def stage(request: JobRequest, workdir: Path, *, inputs_root: str = DEFAULT_INPUTS_ROOT,
          environ: Mapping[str, str] | None = None, engine: TransferEngine | None = None,
          progress: Callable[[PlannedInput], ProgressCallback | None] | None = None,
          stager: Stager | None = None, run: Runner = direct, shard: Shard | None = None,
          map_path: Path | None = None) -> StagingMap:
    """Stage every input of ``request`` under ``workdir`` and write the staging map (default
    ``workdir/staging-map.json``): the one loop the CLI, a flow and a tier B stage pod share.

    ``stager`` stages each input (default :func:`stage_input`, or the cache's ``stage_cached`` when
    ``workdir`` is a shared stage cache: each entry staged under its lock and skipped when its
    marker shows the source unchanged); ``run`` runs each step (:func:`~tao_data_io.runner.direct`,
    or an orchestrator's task per input — one engine, built lazily here, serves them all).
    ``progress(planned)`` may return a callback for that input's progress. ``shard``: stage only
    this shard's part — the keys of a folder that hash to it, and each other input whose source
    URI does — so N shard runs together stage what one run would.
    """
    check_air_gap(request)
    workdir = Path(os.path.abspath(workdir))
    workdir.mkdir(parents=True, exist_ok=True)
    stage_one = stager or stage_input
    with _engines(engine, environ) as get_engine:
        sources = [run(stage_one, planned, workdir, engine=get_engine, environ=environ,
                       progress=progress(planned) if progress else None, shard=shard)
                   for planned in plan_inputs(request, inputs_root)]
    if request.mode == "config":
        sources.append(run(stage_config, request, workdir, inputs_root=inputs_root))
    return run(publish_map, request, workdir, sources, inputs_root=inputs_root, map_path=map_path)


def plan_stage(request: JobRequest, workdir: Path, *, inputs_root: str = DEFAULT_INPUTS_ROOT,
               environ: Mapping[str, str] | None = None, engine: TransferEngine | None = None,
               map_path: Path | None = None) -> StagingMap:
    """The staging map a stage run *will* produce, without moving a byte, and the materialized
    config — for tiers B and C, where the cluster stages: the renderer needs every source's kind
    and place (the same sub-paths, by :func:`plan_inputs`) and the config's bytes for its
    ConfigMap. Offline, except that an ``auto`` s3:// key without a trailing slash is resolved
    with one request (file or folder decides what the verify probe expects there)."""
    check_air_gap(request)
    workdir = Path(os.path.abspath(workdir))
    sources = []
    with _engines(engine, environ) as get_engine:
        for planned in plan_inputs(request, inputs_root):
            if not planned.remote:
                sources.append(stage_input(planned, workdir))
                continue
            parsed = parse_uri(planned.source, field=planned.field)
            kind: Kind = "model" if isinstance(parsed, HFModelURI | NGCModelURI) else resolve_kind(planned, get_engine)
            sources.append(StagedSource(source=planned.source, kind=kind, sub_path=planned.sub_path,
                                        container_path=planned.container_path, local_path=None, files=None,
                                        bytes=None, note="planned: staged on the cluster"))
    if request.mode == "config":
        sources.append(stage_config(request, workdir, inputs_root=inputs_root))
    return publish_map(request, workdir, sources, inputs_root=inputs_root, map_path=map_path)


def publish_map(request: JobRequest, workdir: Path, sources: list[StagedSource], *,
                inputs_root: str = DEFAULT_INPUTS_ROOT, map_path: Path | None = None) -> StagingMap:
    """The staging map of ``sources`` — every input's entry in :func:`plan_inputs` order, then the
    config's — written atomically (default ``workdir/staging-map.json``). The last step of
    :func:`stage` and :func:`plan_stage`, and of an orchestrator that staged each input itself."""
    staging_map = StagingMap(job_id=request.job_id, workdir=str(Path(os.path.abspath(workdir))),
                             inputs_root=inputs_root, sources=sources)
    write_staging_map(staging_map, map_path or Path(staging_map.workdir) / STAGING_MAP_NAME)
    return staging_map


def stage_config(request: JobRequest, workdir: Path, *, inputs_root: str = DEFAULT_INPUTS_ROOT) -> StagedSource:
    """Materialize the config under ``workdir/config`` and describe it as a staged source."""
    started = time.monotonic()
    config = materialize_config(request, Path(workdir) / CONFIG_DIR, inputs_root)
    size = config.path.stat().st_size
    return StagedSource(source=f"config:sha256:{config.sha256}", kind="config", sub_path=config.sub_path,
                        container_path=config.container_path, local_path=str(config.path), files=1, bytes=size,
                        transferred_files=int(config.created), transferred_bytes=size if config.created else 0,
                        unchanged_files=int(not config.created), seconds=time.monotonic() - started)


def stage_input(planned: PlannedInput, workdir: Path, *,
                engine: TransferEngine | Callable[[], TransferEngine] | None = None,
                environ: Mapping[str, str] | None = None, progress: ProgressCallback | None = None,
                shard: Shard | None = None) -> StagedSource:
    """Stage one planned input under ``workdir`` (idempotent) and say what happened.

    ``engine`` is an engine the caller owns, or a factory for one; without it, an engine is
    built from ``environ`` when the input needs S3 and closed before returning. With ``shard``,
    only that shard's part is staged (see :func:`stage`).
    """
    if not planned.remote:
        return StagedSource(source=planned.source, kind="pre-positioned", sub_path=None,
                            container_path=planned.container_path, local_path=None, files=None, bytes=None)
    assert planned.sub_path is not None
    started = time.monotonic()
    local = Path(os.path.abspath(workdir)) / planned.sub_path
    parsed = parse_uri(planned.source, field=planned.field)
    with _engines(engine, environ) as get_engine:
        kind = None if isinstance(parsed, HFModelURI | NGCModelURI) else resolve_kind(planned, get_engine)
        if shard is not None and kind != "folder" and not shard.owns(planned.source):
            return StagedSource(source=planned.source, kind=kind or "model", sub_path=planned.sub_path,
                                container_path=planned.container_path, local_path=str(local), files=None, bytes=None,
                                note=f"staged by shard {shard_of(planned.source, shard.count)}/{shard.count}, not {shard}")
        if isinstance(parsed, HFModelURI | NGCModelURI):
            return _stage_model(planned, parsed, Path(os.path.abspath(workdir)), environ, progress, started)
        assert kind is not None
        return _stage_s3(planned, parsed, kind, local, get_engine(), progress, started, shard)


def resolve_kind(planned: PlannedInput, engine: Callable[[], TransferEngine]) -> Kind:
    """The declared kind of an s3:// input, or — for ``auto`` — what the bucket holds there
    (``s3://b/p/`` is a folder without asking)."""
    declared = planned.declared
    if declared is not None and declared.kind != "auto":
        return declared.kind
    if parse_s3_url(planned.source, field=planned.field).is_prefix:
        return "folder"
    return _resolve_s3_kind(engine(), planned)


def _stage_s3(planned: PlannedInput, url: S3Url, kind: Kind, local: Path, engine: TransferEngine,
              progress: ProgressCallback | None, started: float, shard: Shard | None) -> StagedSource:
    declared = planned.declared

    def staged(summary: TransferSummary, files: int, note: str | None = None) -> StagedSource:
        _raise_failed(summary.failed, planned)
        return StagedSource(source=planned.source, kind=kind, sub_path=planned.sub_path,
                            container_path=planned.container_path, local_path=str(local), files=files,
                            bytes=summary.transferred_bytes + summary.unchanged_bytes,
                            transferred_files=summary.transferred_files, transferred_bytes=summary.transferred_bytes,
                            unchanged_files=summary.unchanged_files, seconds=time.monotonic() - started, note=note)

    if kind == "folder":
        rules = PathFilter.from_patterns(declared.excludes if declared else ())
        summary = engine.download_prefix(url, local, TransferOptions(filter=rules, progress=progress, shard=shard))
        files = summary.transferred_files + summary.unchanged_files
        empty_allowed = shard is not None or (declared is not None and declared.allow_empty)  # a shard may get no key
        if files == 0 and not summary.failed and not empty_allowed:
            excluded = f" ({summary.excluded_files} excluded by its excludes)" if summary.excluded_files else ""
            raise UsageError(f"{planned.field}: {planned.source!r} holds no object{excluded}; check the prefix, or "
                             "declare the input with allow_empty: true if an empty folder is expected")
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
        extracted = extract_archive(planned.source, local, strip_components=declared.strip_components if declared else 0,
                                    engine=engine, progress=progress)
        return StagedSource(source=planned.source, kind=kind, sub_path=planned.sub_path,
                            container_path=planned.container_path, local_path=str(local), files=extracted.files,
                            bytes=extracted.bytes, transferred_files=extracted.files if extracted.extracted else 0,
                            transferred_bytes=extracted.bytes if extracted.extracted else 0,
                            unchanged_files=0 if extracted.extracted else extracted.files,
                            seconds=time.monotonic() - started, note=extracted.reason)
    raise UsageError(f"{planned.field}: kind {kind!r} does not apply to {planned.source!r}")


def _stage_model(planned: PlannedInput, parsed: HFModelURI | NGCModelURI, workdir: Path,
                 environ: Mapping[str, str] | None, progress: ProgressCallback | None, started: float) -> StagedSource:
    """A model is pulled into its repository root; an ``hf://org/repo/sub`` source is the ``sub``
    inside it, so its entry's sub-path and container path point there (one sub-path per source,
    as the renderer requires). Both locations come from the one parser in :mod:`tao_data_io.uris`."""
    assert planned.sub_path is not None
    root = workdir / staging_location(model_root(parsed))
    result = pull_model(planned.source, root, environ=environ, progress=progress)
    return StagedSource(source=planned.source, kind="model", sub_path=planned.sub_path,
                        container_path=planned.container_path, local_path=str(workdir / planned.sub_path),
                        files=len(result.files), bytes=result.bytes, transferred_files=len(result.fetched),
                        transferred_bytes=result.fetched_bytes, unchanged_files=len(result.files) - len(result.fetched),
                        seconds=time.monotonic() - started, note=f"revision {result.revision}")


def _resolve_s3_kind(engine: TransferEngine, planned: PlannedInput) -> Kind:
    """``s3://b/p/`` is a folder; ``s3://b/k`` is a file if that object exists, else a folder
    if anything lives under ``k/``; else the input does not exist."""
    url = parse_s3_url(planned.source, field=planned.field)
    if url.is_prefix:
        return "folder"
    if engine.exists(url):
        return "file"
    if engine.has_prefix(url.as_prefix()):
        return "folder"
    raise UsageError(f"{planned.field}: {planned.source!r} does not exist: no object with that key and nothing "
                     f"under {url.as_prefix()}")


def _raise_failed(failed: list[Failure], planned: PlannedInput) -> None:
    if failed:
        shown = "; ".join(f"{f.name}: {f.reason}" for f in failed[:5])
        raise TransferError(f"staging {planned.source} ({planned.field}) failed for {len(failed)} object(s): {shown}; "
                            "complete files were kept — a rerun retries the rest")


@contextmanager
def _engines(engine: TransferEngine | Callable[[], TransferEngine] | None,
             environ: Mapping[str, str] | None) -> Iterator[Callable[[], TransferEngine]]:
    """A lazy engine: the caller's (never closed here), or one built on first use from
    ``environ`` and closed on the way out."""
    if isinstance(engine, TransferEngine):
        given = engine
        yield lambda: given
        return
    if engine is not None:
        yield engine
        return
    built: list[TransferEngine] = []

    def get() -> TransferEngine:
        if not built:
            built.append(TransferEngine(s3_credentials_from_env(environ)))
        return built[0]

    try:
        yield get
    finally:
        for item in built:
            item.close()
