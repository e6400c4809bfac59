"""Stage every input of a job request host-side and write the staging map.

The staging map (``schema_version: "1"``) is the contract with the steps that follow — the
renderer mounts each source's ``sub_path`` of the job's volume at its ``container_path``; the
verify probe reads every ``container_path`` from the compute frame — so it lists one entry per
*distinct* source with where it went, how much it holds and how it was staged.

Each input kind calls the one core module that owns it (engine sync/copy, selective download,
archive extraction, model pull); every one of them is idempotent, so a rerun of ``stage``
moves nothing already staged and a Prefect retry is always safe.

Air-gapped requests never touch the network: every remote URI is refused up front in one
message listing everything that must be pre-positioned, and no client is even created.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from .archive import extract_archive
from ..credentials import s3_credentials_from_env
from ..errors import TransferError, UsageError
from ..request import InputSpec, JobRequest, is_remote_uri
from .pretrained import HFModelURI, parse_model_uri, pull_model
from .selective import selective_download
from .spec import DEFAULT_INPUTS_ROOT, Placement, materialize_config, placements, relative_location
from ..transfer.engine import TransferEngine, TransferOptions
from ..transfer.filters import PathFilter
from ..fs import atomic_write
from ..transfer.summary import Failure
from ..uris import parse_s3_url

STAGING_MAP_NAME = "staging-map.json"
CONFIG_DIR = "config"
Kind = Literal["folder", "file", "selective", "archive", "model", "pre-positioned", "config"]


class StagedSource(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str
    kind: Kind
    #: Relative to the staging root (the workdir, or the job's PVC in tier B). None for tier A.
    sub_path: str | None
    container_path: str
    local_path: str
    files: int
    bytes: int
    #: How it was staged, in words (e.g. "s3 sync: 20 transferred, 180 unchanged").
    how: str


class StagingMap(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal["1"] = "1"
    job_id: str | None
    workdir: str
    inputs_root: str
    sources: list[StagedSource]


@dataclass(frozen=True)
class _Input:
    """A distinct source to stage, with the request's options for it (if declared)."""

    placement: Placement
    spec: InputSpec | None


def air_gap_violations(request: JobRequest) -> list[str]:
    """Everything an air-gapped request references that would need the network, or is not
    already readable locally."""
    problems = [f"{uri} (remote: pre-position it and reference its mount path)"
                for uri in placements(request)]
    for item in request.inputs:
        if not is_remote_uri(item.source) and not os.access(item.source, os.R_OK):
            problems.append(f"{item.source} (local input not readable here)")
        if item.annotation and is_remote_uri(item.annotation):
            problems.append(f"{item.annotation} (remote annotation)")
    for mount in request.mounts:
        if not os.access(mount.source, os.R_OK):
            problems.append(f"{mount.source} (mount source not readable here)")
    return problems


def stage(request: JobRequest, workdir: Path, *, inputs_root: str = DEFAULT_INPUTS_ROOT,
          environ: Mapping[str, str] | None = None,
          engine_factory: Callable[[], TransferEngine] | None = None) -> StagingMap:
    """Stage every input of ``request`` under ``workdir`` and write ``workdir/staging-map.json``."""
    env = os.environ if environ is None else environ
    if request.storage.air_gapped:
        problems = air_gap_violations(request)
        if problems:
            raise UsageError("air_gapped is true, so nothing may be fetched and every input must already be "
                             "readable; pre-position these and reference their local/mount paths:\n  "
                             + "\n  ".join(problems))
    workdir = Path(os.path.abspath(workdir))
    workdir.mkdir(parents=True, exist_ok=True)
    declared = {item.source: item for item in request.inputs}
    engine: TransferEngine | None = None

    def get_engine() -> TransferEngine:
        nonlocal engine
        if engine is None:
            engine = engine_factory() if engine_factory else TransferEngine(s3_credentials_from_env(env))
        return engine

    sources: list[StagedSource] = []
    for placement in dict.fromkeys(placements(request, inputs_root).values()):  # aliases stage once
        sources.append(_stage_one(_Input(placement, declared.get(placement.source)), workdir, get_engine, env))
    for item in request.inputs:
        if not is_remote_uri(item.source):
            sources.append(_pre_positioned(item))
    if request.mode == "config":
        config = materialize_config(request, workdir / CONFIG_DIR, inputs_root)
        sub_path = f"{CONFIG_DIR}/{config.path.name}"
        sources.append(StagedSource(source=f"config:sha256:{config.sha256}", kind="config", sub_path=sub_path,
                                    container_path=config.container_path, local_path=str(config.path), files=1,
                                    bytes=config.path.stat().st_size,
                                    how="materialized" if config.created else "already materialized"))
    staging_map = StagingMap(job_id=request.job_id, workdir=str(workdir), inputs_root=inputs_root, sources=sources)
    write_staging_map(staging_map, workdir / STAGING_MAP_NAME)
    return staging_map


def _stage_one(item: _Input, workdir: Path, get_engine: Callable[[], TransferEngine],
               env: Mapping[str, str]) -> StagedSource:
    source, spec = item.placement.source, item.spec
    kind = spec.kind if spec is not None and spec.kind != "auto" else None
    if source.startswith(("hf://", "ngc://")):
        return _stage_model(item, workdir, env)
    engine = get_engine()
    kind = kind or _resolve_s3_kind(engine, source)
    local = workdir / item.placement.sub_path

    def entry(files: int, size: int, how: str) -> StagedSource:
        return StagedSource(source=source, kind=kind, sub_path=item.placement.sub_path,  # type: ignore[arg-type]
                            container_path=item.placement.container_path, local_path=str(local), files=files,
                            bytes=size, how=how)

    if kind == "folder":
        rules = PathFilter.from_patterns(spec.excludes if spec else ())
        summary = engine.sync(source, str(local), TransferOptions(filter=rules))
        _raise_failed(summary.failed, source)
        return entry(summary.transferred_files + summary.unchanged_files,
                     summary.transferred_bytes + summary.unchanged_bytes,
                     f"s3 sync: {summary.transferred_files} transferred, {summary.unchanged_files} unchanged")
    if kind == "file":
        summary = engine.copy(source, str(local))
        _raise_failed(summary.failed, source)
        return entry(1, summary.transferred_bytes + summary.unchanged_bytes,
                     "s3 copy" if summary.transferred_files else "s3 copy: unchanged")
    if kind == "selective":
        assert spec is not None and spec.annotation is not None
        url = parse_s3_url(source, field="inputs[].source")
        result = selective_download(engine, spec.annotation, spec.keys, url.bucket, url.key, local,
                                    fmt=spec.annotation_format, missing=spec.missing)
        _raise_failed(result.summary.failed, source)
        summary = result.summary
        return entry(result.references - len(result.missing), summary.transferred_bytes + summary.unchanged_bytes,
                     f"selective: {result.references} references, {summary.transferred_files} transferred, "
                     f"{summary.unchanged_files} unchanged, {len(result.missing)} missing")
    if kind == "archive":
        extracted = extract_archive(source, local, strip_components=spec.strip_components if spec else 0,
                                    client=engine.client)
        return entry(extracted.files, extracted.bytes, f"archive: {extracted.reason}")
    raise UsageError(f"inputs: kind {kind!r} does not apply to {source!r}")


def _stage_model(item: _Input, workdir: Path, env: Mapping[str, str]) -> StagedSource:
    """A model is pulled into its repository root; an ``hf://org/repo/sub`` source is the ``sub``
    inside it, so its entry's sub-path and container path point there (one sub-path per source,
    as the renderer requires)."""
    parsed = parse_model_uri(item.placement.source)
    root = item.placement.sub_path
    if isinstance(parsed, HFModelURI) and parsed.subpath:
        root = relative_location(f"hf://{parsed.repo_id}@{parsed.revision or 'main'}")
    result = pull_model(item.placement.source, workdir / root, environ=env)
    return StagedSource(source=item.placement.source, kind="model", sub_path=item.placement.sub_path,
                        container_path=item.placement.container_path,
                        local_path=str(workdir / item.placement.sub_path), files=len(result.files), bytes=result.bytes,
                        how=f"model pull at {result.revision}: " + (f"{len(result.fetched)} fetched"
                                                                   if result.downloaded else "already complete"))


def _pre_positioned(item: InputSpec) -> StagedSource:
    """Tier A: the data is already where the job reads it. Nothing moves; we only look."""
    path = Path(item.source)
    if not os.access(path, os.R_OK):
        raise UsageError(f"inputs: local source {item.source!r} is not readable here; pre-position it or fix the path")
    files, size = (1, path.stat().st_size) if path.is_file() else _count(path)
    return StagedSource(source=item.source, kind="pre-positioned", sub_path=None, container_path=item.target or item.source,
                        local_path=item.source, files=files, bytes=size, how="pre-positioned (tier A): no bytes moved")


def _count(root: Path) -> tuple[int, int]:
    files = size = 0
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            try:
                size += os.stat(os.path.join(dirpath, name)).st_size
                files += 1
            except OSError:
                continue
    return files, size


def _resolve_s3_kind(engine: TransferEngine, uri: str) -> Kind:
    """``s3://b/p/`` is a folder; ``s3://b/k`` is a file if that object exists, else a folder
    if anything lives under ``k/``; else the input does not exist."""
    url = parse_s3_url(uri, field="inputs[].source")
    if url.is_prefix:
        return "folder"
    if engine.exists(url):
        return "file"
    if engine.has_prefix(url.as_prefix()):
        return "folder"
    raise UsageError(f"input {uri!r} does not exist: no object with that key and nothing under {url.as_prefix()}")


def _raise_failed(failed: list[Failure], source: str) -> None:
    if failed:
        shown = "; ".join(f"{f.name}: {f.reason}" for f in failed[:5])
        raise TransferError(f"staging {source} failed for {len(failed)} object(s): {shown}; complete files were "
                            "kept — rerun to retry")


def write_staging_map(staging_map: StagingMap, path: Path) -> None:
    """Atomic publish — a reader never sees half a map."""
    atomic_write(path, (json.dumps(staging_map.model_dump(), indent=2) + "\n").encode())


def read_staging_map(path: Path) -> StagingMap:
    return StagingMap.model_validate_json(path.read_text(encoding="utf-8"))
