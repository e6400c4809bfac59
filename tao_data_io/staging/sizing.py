"""How much disk a cluster's stage will take, bounded from above before it runs — for tier C,
whose inputs land in the pod's own ``emptyDir``: the bound becomes that volume's ``sizeLimit``
and part of the training container's ``ephemeral-storage`` request, so the scheduler puts the
pod on a node with the disk for its inputs, instead of the node filling up mid-stage and
evicting whatever runs there.

A bound, not an estimate: too small a limit evicts the job (the kubelet walks the volume as
``du`` does: every file's blocks, every directory's), so each object counts its whole blocks and
its directory entry, and each directory the keys imply one block more. An input whose staged
size cannot be bounded from what the bucket lists — an archive (its extracted size), a model
(the Hub's or NGC's files), more objects in all than :data:`MOST_OBJECTS` — leaves the whole
request unbounded (None), and the pod is rendered without a limit. A folder counts everything
under its prefix (excludes only ever shrink it), a glob what it matches, a selective input its
whole prefix and its annotation.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Iterable, Sequence

from ..transfer.engine import TransferEngine
from ..transfer.filters import GlobFilter
from ..uris import S3Url, is_remote_uri, parse_uri
from .layout import PlannedInput

#: Past this many objects under all of the request's inputs, sizing stops (about 200 LIST
#: requests): what it would cost to finish is better spent by the stage itself.
MOST_OBJECTS = 200_000
#: The filesystem block: a file takes whole ones, a directory at least one.
BLOCK_BYTES = 4096
#: A directory entry's own bytes besides its name (ext4's is 8, rounded to 4; kept generous).
DIRENT_BYTES = 16


class _TooMany(Exception):
    """More objects than :data:`MOST_OBJECTS`: not worth bounding before the stage."""


def staged_bytes_bound(inputs: Sequence[PlannedInput], engine: Callable[[], TransferEngine]) -> int | None:
    """An upper bound of the disk staging ``inputs`` takes (their kinds resolved), or None."""
    budget = [MOST_OBJECTS]
    total = 0
    try:
        for planned in inputs:
            if not planned.remote or planned.inside is not None:  # nothing, or counted with its folder
                continue
            url = planned.uri
            if not isinstance(url, S3Url) or planned.kind not in ("folder", "file", "selective", "glob"):
                return None
            if planned.kind == "glob":  # what it matches, as it is staged: below the folder it lists
                base, pattern = url.glob_split()
                matches = GlobFilter(pattern)
                listed = ((key[len(base.key):], size) for key, size in engine().list_sizes(base))
                total += _disk(((name, size) for name, size in listed if matches(name)), budget)
                continue
            if planned.kind == "file":
                size = engine().object_size(url)
                if size is None:
                    return None
                total += _disk([(posixpath.basename(url.key), size)], budget)
                continue
            prefix = url.as_prefix().key
            total += _disk(((key[len(prefix):], size) for key, size in engine().list_sizes(url)), budget)
            if planned.kind == "selective":
                annotation = _annotation_size(planned, engine)
                if annotation is None:
                    return None
                total += _disk([annotation], budget)
    except _TooMany:
        return None
    return total


def _disk(objects: Iterable[tuple[str, int]], budget: list[int]) -> int:
    """The blocks ``objects`` (relative name, size) take once written, with their directories."""
    total = 0
    directories: set[str] = set()
    for name, size in objects:
        budget[0] -= 1
        if budget[0] < 0:
            raise _TooMany
        total += -(-size // BLOCK_BYTES) * BLOCK_BYTES + DIRENT_BYTES + len(name.encode())
        parent = posixpath.dirname(name)
        while parent and parent not in directories:
            directories.add(parent)
            parent = posixpath.dirname(parent)
    return total + (len(directories) + 1) * BLOCK_BYTES  # and the input's own directory


def _annotation_size(planned: PlannedInput, engine: Callable[[], TransferEngine]) -> tuple[str, int] | None:
    annotation = planned.declared.annotation if planned.declared is not None else None
    if annotation is None or not is_remote_uri(annotation):
        return ("", 0)
    url = parse_uri(annotation)
    if not isinstance(url, S3Url):
        return None
    size = engine().object_size(url)
    return None if size is None else (posixpath.basename(url.key), size)
