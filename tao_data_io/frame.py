"""The compute frame's own paths and the rule of where each remote source is staged: where the
config and the verify probe are mounted, which directories the frame needs for itself, what makes
a path usable as a place the job sees, and the one sub-path of each source (two sources never
share one).

Why a module of its own, below the request: the request's validator refuses, at load time, a
target over the frame's own directories and two sources that would be staged at one place;
staging places each source and the config by the same rules; the backends mount the probe at its
directory. Each reads the rules here, so they exist once and the request never reaches up into
staging for them.

Placement rules:

* Each distinct remote source is staged once, at ``<staging root>/<sub_path>``, where the
  sub-path is :func:`tao_data_io.uris.staging_location` of the *parsed* URI.
* Archives and selective inputs get ``archive/`` and ``selective/`` sub-paths, so their trees
  never nest inside a plain copy of the same prefix (``s3://b/p/`` as a folder and
  ``s3://b/p/a.tar`` extracted would otherwise collide).
* ``s3://b/p`` and ``s3://b/p/`` are one source. Two different sources that would share a
  sub-path are refused: the renderer mounts one sub-path per source.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from .errors import UsageError
from .uris import RemoteURI, is_s3_url, parse_uri, staging_location

#: Where the materialized config is mounted read-only inside the compute frame.
CONFIG_MOUNT_DIR = "/tao-action-config"
#: Where the verify probe's script and checklist are mounted read-only inside the frame.
PROBE_DIR = "/tao-data-io-verify"
#: Where a backend that runs the frame's own agents beside the command keeps them (the Docker
#: backend's frame script, its control and report directories, the credentials file).
AGENT_ROOT = "/tao-data-io"
#: The frame's own directories: an input or results directory there would hide the system the
#: command runs on (or our own mounts), so a target inside any of them is refused.
SHADOWED_DIRS = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/sbin", "/sys",
                 "/usr", CONFIG_MOUNT_DIR, PROBE_DIR, AGENT_ROOT)


def check_frame_target(value: str, *, what: str) -> str:
    """A path the frame sees an input or results at: usable, and not over the frame's own."""
    check_container_path(value, what=what)
    shadowed = next((d for d in SHADOWED_DIRS if value == d or value.startswith(d + "/")), None)
    if shadowed is not None:
        raise ValueError(f"{what} {value!r} shadows {shadowed}, which the frame needs for itself; put it under a "
                         "directory of its own such as /data")
    return value


def check_container_path(value: str, *, what: str) -> str:
    """An absolute, normalised POSIX path that is not ``/`` (mount targets, results dirs)."""
    problem = None
    if not value.startswith("/"):
        problem = "it is not absolute"
    elif value == "/":
        problem = "it is the root directory"
    elif posixpath.normpath(value) != value or "//" in value:
        problem = "it is not normalised (no '..', '.', '//' or trailing '/')"
    elif any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value):
        problem = "it contains a control character"
    if problem:
        raise ValueError(f"{what} {value!r} is not usable: {problem}; write an absolute path such as /data/coco")
    return value


#: Input kinds staged in a sub-tree of their own (``archive/…``, ``selective/…``).
OWN_SUBTREE = ("archive", "selective")


class NamedSource(Protocol):
    """A remote source where a request names it (:meth:`tao_data_io.request.JobRequest.remote_sources`)."""

    @property
    def source(self) -> str: ...

    @property
    def kind(self) -> str: ...

    @property
    def field(self) -> str: ...


Named = TypeVar("Named", bound=NamedSource)


@dataclass(frozen=True)
class Place(Generic[Named]):
    """Where one distinct remote source is staged: its URI parsed (once, here) and its sub-path
    below the staging root."""

    #: Where the request names the source first.
    named: Named
    uri: RemoteURI
    sub_path: str


def place_sources(sources: Iterable[Named]) -> dict[str, Place[Named]]:
    """Every spelling of every remote source in ``sources`` (in the request's order) → its place;
    two spellings of one prefix map to the same object. A source that would be staged where
    another already is raises :class:`UsageError` naming both (see the module docstring)."""
    places: dict[str, Place[Named]] = {}
    owners: dict[str, str] = {}
    for named in sources:
        source = named.source
        if source in places:
            continue
        uri = parse_uri(source, field=named.field)
        alias = source[:-1] if source.endswith("/") else source + "/"
        if alias in places and is_s3_url(source):
            places[source] = places[alias]  # the same prefix written two ways
            continue
        sub_path = (f"{named.kind}/" if named.kind in OWN_SUBTREE else "") + staging_location(uri)
        if sub_path in owners:
            raise UsageError(f"{named.field}: {source!r} would be staged at the same place as {owners[sub_path]!r} "
                             f"({sub_path}); declare only one of them")
        owners[sub_path] = source
        places[source] = Place(named, uri, sub_path)
    return places
