"""How many bytes a cluster's stage will write, bounded from above before it runs — for tier C,
whose inputs land in the pod's own ``emptyDir``: the bound becomes that volume's ``sizeLimit``
and the stager's ``ephemeral-storage`` request, so the scheduler puts the pod on a node with the
disk for its inputs, instead of the node filling up mid-stage and evicting whatever runs there.

A bound, not an estimate: too small a limit evicts the job, so an input whose staged size cannot
be bounded from what the bucket lists — an archive (its extracted size), a model (the Hub's or
NGC's files), more objects than :data:`MOST_OBJECTS` — leaves the whole request unbounded (None),
and the pod is rendered without a limit, as before. A folder counts everything under its prefix
(excludes only ever shrink it), a selective input its whole prefix and its annotation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..transfer.engine import TransferEngine
from ..uris import S3Url, is_remote_uri, parse_uri
from .layout import PlannedInput

#: Past this many objects under the request's folders, sizing stops (about 200 LIST requests):
#: what it would cost to finish is better spent by the stage itself.
MOST_OBJECTS = 200_000
#: A file takes whole filesystem blocks: each object is counted as one more block than its bytes.
BLOCK_BYTES = 4096


def staged_bytes_bound(inputs: Sequence[PlannedInput], engine: Callable[[], TransferEngine]) -> int | None:
    """An upper bound of the bytes staging ``inputs`` writes (their kinds resolved), or None."""
    total = 0
    for planned in inputs:
        if not planned.remote:
            continue
        url = planned.uri
        if not isinstance(url, S3Url) or planned.kind not in ("folder", "file", "selective"):
            return None
        if planned.kind == "file":
            size = engine().object_size(url)
            found = None if size is None else (size, 1)
        else:
            found = engine().measure_prefix(url, MOST_OBJECTS)
            if found is not None and planned.kind == "selective":
                found = _plus_annotation(found, planned, engine)
        if found is None:
            return None
        total += found[0] + found[1] * BLOCK_BYTES
    return total


def _plus_annotation(found: tuple[int, int], planned: PlannedInput,
                     engine: Callable[[], TransferEngine]) -> tuple[int, int] | None:
    annotation = planned.declared.annotation if planned.declared is not None else None
    if annotation is None or not is_remote_uri(annotation):
        return found
    url = parse_uri(annotation)
    if not isinstance(url, S3Url):
        return None
    size = engine().object_size(url)
    return None if size is None else (found[0] + size, found[1] + 1)
