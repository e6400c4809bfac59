"""Where every input of a request lives — on the staging root and inside the compute frame — as a
pure function of the request.

Why pure: ``materialize-config``, ``stage``, the launch plan and the renderer must agree on
where each input is without talking to each other, and a rerun must produce the same config byte
for byte (its name is its SHA-256). Each remote source's sub-path comes from the one placement
rule, :func:`tao_data_io.frame.place_sources` (which the request's validator applies at load
time too), over the *parsed* URI, so the config, the staging map and the puller can never
disagree again.

* A remote source appears in the frame at its input's ``target`` or ``<inputs root>/<sub_path>``.
* A local (pre-positioned, tier A) input has no sub-path: nothing moves, and its readability is
  proved inside the compute frame by the verify probe, never here.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from ..errors import UsageError
from ..frame import CONFIG_MOUNT_DIR, place_sources
from ..request import InputSpec, JobRequest
from ..transfer.filters import PathFilter
from ..uris import HFModelURI, NGCModelURI, RemoteURI, S3Url, is_remote_uri
from .stage_map import Kind

#: Where inputs appear inside the compute frame unless a request input names a target.
DEFAULT_INPUTS_ROOT = "/tao-inputs"
#: Where the materialized config is written, relative to the staging root.
CONFIG_DIR = "config"


class PlannedInput(BaseModel):
    """One distinct source to stage, where it goes, and the request's options for it — with its
    URI parsed once, when it was planned, so no later step parses it again.

    JSON-able on purpose: an orchestrator hands one of these to each staging task.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str
    #: Relative to the staging root; None for a pre-positioned (tier A) input.
    sub_path: str | None
    container_path: str
    #: The request's declaration of this input, when it has one (a spec URI may have none).
    declared: InputSpec | None = None
    #: Where the request names it first: ``inputs[N]`` or a spec field path.
    field: str
    #: The parsed source (None for a pre-positioned input: a path, not a URI).
    uri: RemoteURI | None = None
    #: What it is staged as. Known from the plan for every input but an ``auto`` s3:// key without
    #: a trailing slash, which stays None until :func:`~.inputs.resolve_kind` asks the bucket.
    kind: Kind | None = None
    #: Other spellings of this source in the request (``s3://b/p`` beside ``s3://b/p/``).
    aliases: tuple[str, ...] = ()
    #: The staged folder this source lies inside (:func:`nest_inputs`): it is served from that
    #: folder's copy, never staged itself. None for a source staged on its own.
    inside: str | None = None

    @property
    def remote(self) -> bool:
        return self.sub_path is not None

    @property
    def spellings(self) -> tuple[str, ...]:
        return (self.source, *self.aliases)

    @property
    def frame_value(self) -> str:
        """What the config says in place of the source: where it is in the frame — for a glob,
        its pattern over that place, which the job applies itself."""
        if isinstance(self.uri, S3Url) and self.uri.is_glob:
            return f"{self.container_path}/{self.uri.glob_split()[1]}"
        return self.container_path


def planned_kind(uri: RemoteURI, declared: InputSpec | None) -> Kind | None:
    """The kind a remote source is staged as, when the request alone says it: a model URI is a
    model, a declared kind is that kind, ``s3://b/p/`` is a folder; else None (ask the bucket)."""
    if isinstance(uri, HFModelURI | NGCModelURI):
        return "model"
    if isinstance(uri, S3Url) and uri.is_glob:
        if declared is not None and declared.kind != "auto":
            raise UsageError(f"{uri} is a glob pattern, so its kind is what it matches: drop kind "
                             f"{declared.kind!r} from its input")
        return "glob"
    if declared is not None and declared.kind != "auto":
        return declared.kind
    return "folder" if uri.is_prefix else None


def plan_inputs(request: JobRequest, inputs_root: str = DEFAULT_INPUTS_ROOT) -> list[PlannedInput]:
    """Every distinct input to stage, remote ones first (in request order), then pre-positioned
    ones; each remote source parsed once, here."""
    places = place_sources(request.remote_sources())
    spellings: dict[int, list[str]] = {}
    for spelling, place in places.items():
        spellings.setdefault(id(place), []).append(spelling)
    planned = []
    for place in {id(place): place for place in places.values()}.values():
        declared = place.named.declared
        target = declared.target if declared is not None else None
        planned.append(PlannedInput(source=place.named.source, sub_path=place.sub_path,
                                    container_path=target or f"{inputs_root}/{place.sub_path}", declared=declared,
                                    field=place.named.field, uri=place.uri, kind=planned_kind(place.uri, declared),
                                    aliases=tuple(s for s in spellings[id(place)] if s != place.named.source)))
    planned = nest_inputs(planned)
    for index, item in enumerate(request.inputs):
        if not is_remote_uri(item.source):
            planned.append(PlannedInput(source=item.source, sub_path=None, container_path=item.target or item.source,
                                        declared=item, field=f"inputs[{index}].source", kind="pre-positioned"))
    return planned


def nest_inputs(planned: list[PlannedInput]) -> list[PlannedInput]:
    """Each S3 source that lies inside another source staged as a folder — its place below the
    folder's, by the one placement rule (sparse4d's ``data_root`` with ``ann_file`` under it) — is
    served from the folder's copy: not downloaded again, and none of its state (a file's digest
    cache and lock live beside it) written inside a tree the job reads. It appears where the
    folder does, at its relative path, unless it names its own target. A source the folder's
    excludes leave out is refused: the copy would not hold it."""
    folders = [p for p in planned if isinstance(p.uri, S3Url) and p.kind in ("folder", None) and p.sub_path]
    nested = []
    for item in planned:
        outer = max((f for f in folders if f is not item and item.kind in ("folder", "file", None)
                     and item.sub_path and item.sub_path.startswith(f"{f.sub_path}/")),
                    key=lambda f: len(f.sub_path or ""), default=None)
        if outer is None:
            nested.append(item)
            continue
        relative = (item.sub_path or "")[len(outer.sub_path or "") + 1:]
        excludes = outer.declared.excludes if outer.declared is not None else []
        if excludes and item.kind == "folder":  # which of its files the excludes leave out is not known here
            raise UsageError(f"{item.field}: {item.source!r} lies inside {outer.source!r} ({outer.field}), whose "
                             "excludes may leave part of it out, so the staged copy may not hold it whole: drop the "
                             "folder's excludes, or name the file(s) it needs")
        if excludes and not PathFilter.from_patterns(excludes)(relative):
            raise UsageError(f"{item.field}: {item.source!r} lies inside {outer.source!r} ({outer.field}), whose "
                             f"excludes leave it out, so the staged copy would not hold it: drop the exclude that "
                             "matches it, or stage it from elsewhere")
        target = item.declared.target if item.declared is not None else None
        nested.append(item.model_copy(update={"inside": outer.source,
                                              "container_path": target or f"{outer.container_path}/{relative}"}))
    return nested


def placements(request: JobRequest, inputs_root: str = DEFAULT_INPUTS_ROOT, *,
               plan: list[PlannedInput] | None = None) -> dict[str, PlannedInput]:
    """Every spelling of every remote source in the request → its planned input (declared inputs
    first, then spec URIs); two spellings of one prefix map to the same object. From ``plan``, the
    request's :func:`plan_inputs`, when the caller holds it (nothing is parsed again)."""
    plan = plan_inputs(request, inputs_root) if plan is None else plan
    return {spelling: planned for planned in plan if planned.remote for spelling in planned.spellings}


def config_location(digest: str, extension: str) -> tuple[str, str]:
    """(sub-path under the staging root, path inside the frame) of the config with this digest."""
    return (f"{CONFIG_DIR}/tao-action-config-{digest}.{extension}",
            f"{CONFIG_MOUNT_DIR}/spec-{digest}.{extension}")
