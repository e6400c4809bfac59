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

from typing import Literal

from pydantic import BaseModel, ConfigDict

from ..frame import CONFIG_MOUNT_DIR, place_sources
from ..request import InputSpec, JobRequest
from ..uris import is_remote_uri

#: Where inputs appear inside the compute frame unless a request input names a target.
DEFAULT_INPUTS_ROOT = "/tao-inputs"
#: Where the materialized config is written, relative to the staging root.
CONFIG_DIR = "config"

Origin = Literal["input", "spec"]


class PlannedInput(BaseModel):
    """One distinct source to stage, where it goes, and the request's options for it.

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

    @property
    def remote(self) -> bool:
        return self.sub_path is not None


def placements(request: JobRequest, inputs_root: str = DEFAULT_INPUTS_ROOT) -> dict[str, PlannedInput]:
    """Every spelling of every remote source in the request → its planned input (declared inputs
    first, then spec URIs). Two spellings of one prefix map to the same object."""
    planned: dict[int, PlannedInput] = {}
    result: dict[str, PlannedInput] = {}
    for spelling, place in place_sources(request.remote_sources()).items():
        if id(place) not in planned:
            declared = place.named.declared
            target = declared.target if declared is not None else None
            planned[id(place)] = PlannedInput(source=place.named.source, sub_path=place.sub_path,
                                              container_path=target or f"{inputs_root}/{place.sub_path}",
                                              declared=declared, field=place.named.field)
        result[spelling] = planned[id(place)]
    return result


def plan_inputs(request: JobRequest, inputs_root: str = DEFAULT_INPUTS_ROOT) -> list[PlannedInput]:
    """Every distinct input to stage, remote ones first (in request order), then pre-positioned ones."""
    planned = list({id(item): item for item in placements(request, inputs_root).values()}.values())
    for index, item in enumerate(request.inputs):
        if not is_remote_uri(item.source):
            planned.append(PlannedInput(source=item.source, sub_path=None, container_path=item.target or item.source,
                                        declared=item, field=f"inputs[{index}].source"))
    return planned


def config_location(digest: str, extension: str) -> tuple[str, str]:
    """(sub-path under the staging root, path inside the frame) of the config with this digest."""
    return (f"{CONFIG_DIR}/tao-action-config-{digest}.{extension}",
            f"{CONFIG_MOUNT_DIR}/spec-{digest}.{extension}")
