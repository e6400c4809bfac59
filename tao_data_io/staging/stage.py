"""Stage a job request's inputs: :func:`plan_inputs` says what, :func:`stage_input` stages one,
:func:`stage_config` materializes the config, :func:`publish_map` writes the staging map, and
:func:`stage` composes them.

Why per input: an orchestrator runs one task per input, so each shows its own progress and a
failed input retries alone; the CLI runs the same functions in a loop. How each kind of input is
staged is :mod:`.inputs`'s business; the engine every input of a run shares is leased by
:mod:`.engines`.

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
from collections.abc import Callable, Mapping
from pathlib import Path

from ..errors import UsageError
from ..reporting import ProgressCallback
from ..request import JobRequest
from ..runner import Runner, direct
from ..transfer.engine import TransferEngine
from ..transfer.shard import Shard
from .config import materialize_config
from .engines import EngineSource, lease
from .inputs import resolved, stage_planned
from .layout import CONFIG_DIR, DEFAULT_INPUTS_ROOT, PlannedInput, plan_inputs
from .stage_map import STAGING_MAP_NAME, StagedSource, StagingMap, write_staging_map
from .sizing import staged_bytes_bound
from .writable import prove_writable

__all__ = ["STAGING_MAP_NAME", "check_air_gap", "plan_inputs", "plan_stage", "publish_map", "stage", "stage_config",
           "stage_input"]


def check_air_gap(request: JobRequest) -> None:
    """Refuse an air-gapped request that references anything remote, listing every such URI."""
    if not request.storage.air_gapped:
        return
    problems = [f"{uri} ({field})" for uri, field in request.remote_references()]
    if problems:
        raise UsageError("storage.air_gapped is true, so nothing may be fetched: pre-position these and reference "
                         "their mount paths instead:\n  " + "\n  ".join(problems))


#: What stages one planned input under a staging root (idempotent): :func:`stage_input`, the
#: tier B cache's :func:`~.cache.stage_cached`, or either run as an orchestrator's task.
Stager = Callable[..., StagedSource]


def stage(request: JobRequest, staging_dir: Path, *, inputs_root: str = DEFAULT_INPUTS_ROOT,
          environ: Mapping[str, str] | None = None, engine: TransferEngine | None = None,
          progress: Callable[[PlannedInput], ProgressCallback | None] | None = None,
          stager: Stager | None = None, run: Runner = direct, shard: Shard | None = None,
          map_path: Path | None = None) -> StagingMap:
    """Stage every input of ``request`` under ``staging_dir`` and write the staging map (default
    ``staging_dir/staging-map.json``): the one loop the CLI, a flow and a tier B stage pod share.
    It first proves it can write both directories (:mod:`.writable`), before a byte moves.

    ``stager`` stages each input (default :func:`stage_input`, or the cache's ``stage_cached`` when
    ``staging_dir`` is a shared stage cache: each entry staged under its lock and skipped when its
    marker shows the source unchanged); ``run`` runs each step (:func:`~tao_data_io.runner.direct`,
    or an orchestrator's task per input — one engine, built lazily here, serves them all).
    ``progress(planned)`` may return a callback for that input's progress. ``shard``: stage only
    this shard's part — the keys of a folder that hash to it, and each other input whose source
    URI does — so N shard runs together stage what one run would.
    """
    check_air_gap(request)
    staging_dir = Path(os.path.abspath(staging_dir))
    prove_writable(staging_dir, what="the staging directory")
    if map_path is not None and map_path.parent != staging_dir:
        prove_writable(Path(os.path.abspath(map_path.parent)), what="the staging map's directory")
    stage_one = stager or stage_input
    plan = plan_inputs(request, inputs_root)  # every source parsed once, here
    with lease(engine, environ) as get_engine:
        sources = [run(stage_one, planned, staging_dir, engine=get_engine, environ=environ,
                       progress=progress(planned) if progress else None, shard=shard)
                   for planned in plan]
    if request.mode == "config":
        sources.append(run(stage_config, request, staging_dir, inputs_root=inputs_root, plan=plan))
    return run(publish_map, request, staging_dir, sources, inputs_root=inputs_root, map_path=map_path)


def plan_stage(request: JobRequest, staging_dir: Path, *, inputs_root: str = DEFAULT_INPUTS_ROOT,
               environ: Mapping[str, str] | None = None, engine: TransferEngine | None = None,
               map_path: Path | None = None, size: bool = False) -> StagingMap:
    """The staging map a stage run *will* produce, without moving a byte, and the materialized
    config — for tiers B and C, where the cluster stages: the renderer needs every source's kind
    and place (the same sub-paths, by :func:`plan_inputs`) and the config's bytes for its
    ConfigMap. Offline, except that an ``auto`` s3:// key without a trailing slash is resolved
    with one request (file or folder decides what the verify probe expects there) — and, with
    ``size`` (tier C, whose pod stages into its own disk), the inputs are sized from their
    listings (:mod:`.sizing`) into the map's ``planned_bytes``."""
    check_air_gap(request)
    staging_dir = Path(os.path.abspath(staging_dir))
    plan = plan_inputs(request, inputs_root)
    sources = []
    bound = None
    with lease(engine, environ) as get_engine:
        plan = [resolved(planned, get_engine) if planned.remote else planned for planned in plan]
        for planned in plan:
            if not planned.remote:
                sources.append(stage_planned(planned, staging_dir, engine=get_engine))
                continue
            assert planned.kind is not None
            note = (f"served from the copy of {planned.inside}" if planned.inside is not None
                    else "planned: staged on the cluster")
            sources.append(StagedSource(source=planned.source, kind=planned.kind, sub_path=planned.sub_path,
                                        container_path=planned.container_path, local_path=None, files=None,
                                        bytes=None, note=note))
        if size:
            bound = staged_bytes_bound(plan, get_engine)
    if request.mode == "config":
        sources.append(stage_config(request, staging_dir, inputs_root=inputs_root, plan=plan))
    return publish_map(request, staging_dir, sources, inputs_root=inputs_root, map_path=map_path, planned_bytes=bound)


def publish_map(request: JobRequest, staging_dir: Path, sources: list[StagedSource], *,
                inputs_root: str = DEFAULT_INPUTS_ROOT, map_path: Path | None = None,
                planned_bytes: int | None = None) -> StagingMap:
    """The staging map of ``sources`` — every input's entry in :func:`plan_inputs` order, then the
    config's — written atomically (default ``staging_dir/staging-map.json``). The last step of
    :func:`stage` and :func:`plan_stage`, and of an orchestrator that staged each input itself."""
    staging_map = StagingMap(job_id=request.job_id, staging_dir=str(Path(os.path.abspath(staging_dir))),
                             inputs_root=inputs_root, sources=sources, planned_bytes=planned_bytes)
    write_staging_map(staging_map, map_path or Path(staging_map.staging_dir) / STAGING_MAP_NAME)
    return staging_map


def stage_config(request: JobRequest, staging_dir: Path, *, inputs_root: str = DEFAULT_INPUTS_ROOT,
                 plan: list[PlannedInput] | None = None) -> StagedSource:
    """Materialize the config under ``staging_dir/config`` and describe it as a staged source.
    ``plan``: the request's :func:`plan_inputs`, when the caller holds it (its URIs are not parsed
    again)."""
    started = time.monotonic()
    config = materialize_config(request, Path(staging_dir) / CONFIG_DIR, inputs_root, plan=plan)
    size = config.path.stat().st_size
    return StagedSource(source=f"config:sha256:{config.sha256}", kind="config", sub_path=config.sub_path,
                        container_path=config.container_path, local_path=str(config.path), files=1, bytes=size,
                        transferred_files=int(config.created), transferred_bytes=size if config.created else 0,
                        unchanged_files=int(not config.created), seconds=time.monotonic() - started)


def stage_input(planned: PlannedInput, staging_dir: Path, *, engine: EngineSource = None,
                environ: Mapping[str, str] | None = None, progress: ProgressCallback | None = None,
                shard: Shard | None = None) -> StagedSource:
    """Stage one planned input under ``staging_dir`` (idempotent) and say what happened (by its kind:
    :mod:`.inputs`).

    ``engine`` is an engine the caller owns, or a factory for one; without it, an engine is
    built from ``environ`` when the input needs S3 and closed before returning. With ``shard``,
    only that shard's part is staged (see :func:`stage`).
    """
    with lease(engine, environ) as get_engine:
        return stage_planned(planned, staging_dir, engine=get_engine, environ=environ, progress=progress, shard=shard)
