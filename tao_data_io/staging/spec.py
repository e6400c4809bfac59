"""Walk a nested spec, find the remote URIs it references, rewrite them to the paths the compute
frame will see, and materialize the config file.

Why the container path is a pure function of the URI: ``materialize-config`` and ``stage`` must
agree on where each input lives without talking to each other, and a rerun must produce the
same config byte for byte (its name is its SHA-256). ``s3://bucket/key`` lives at
``<inputs root>/s3/bucket/key``, ``hf://org/repo@rev/sub`` at ``…/hf/org/repo/<rev>/sub``,
``ngc://org/team/model:version`` at ``…/ngc/org/team/model/version``. An explicit ``target`` on
a request input overrides the derived path. The derived relative path goes through the one
confinement check, so a URI with ``..`` cannot place data outside the staging root.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w
import yaml

from ..errors import UsageError
from ..request import JobRequest, is_remote_uri
from ..fs import UnsafePathError, atomic_write, check_relative

#: Where inputs appear inside the compute frame unless a request input names a target.
DEFAULT_INPUTS_ROOT = "/tao-inputs"
#: Where the materialized config is mounted read-only inside the compute frame.
CONFIG_MOUNT_DIR = "/tao-action-config"
_EXTENSIONS = {"json": "json", "yaml": "yaml", "toml": "toml"}


def iter_strings(value: Any, path: str = "spec") -> Iterator[tuple[str, str]]:
    """Yield (field path, string) for every string leaf at any depth (dicts, lists, lists of lists)."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from iter_strings(item, f"{path}.{key}")
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from iter_strings(item, f"{path}[{index}]")


def remote_uris(spec: Any) -> list[str]:
    """Every distinct remote URI in ``spec``, in first-seen order."""
    return list(dict.fromkeys(text for _, text in iter_strings(spec) if is_remote_uri(text)))


def rewrite(value: Any, mapping: Mapping[str, str]) -> Any:
    """A copy of ``value`` with every string leaf found in ``mapping`` replaced."""
    if isinstance(value, str):
        return mapping.get(value, value)
    if isinstance(value, Mapping):
        return {key: rewrite(item, mapping) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [rewrite(item, mapping) for item in value]
    return value


def relative_location(uri: str) -> str:
    """The staging-root-relative path for a remote URI (see the module docstring)."""
    if uri.startswith("s3://"):
        relative = "s3/" + uri[len("s3://"):].rstrip("/")
    elif uri.startswith("hf://"):
        body = uri[len("hf://"):].strip("/")
        parts = body.split("/")
        if len(parts) < 2:
            raise UsageError(f"{uri!r} is not hf://ORG/REPO[@REVISION][/SUBPATH]")
        repo, _, revision = parts[1].partition("@")
        relative = "/".join(["hf", parts[0], repo, revision or "main", *parts[2:]])
    elif uri.startswith("ngc://"):
        body = uri[len("ngc://"):].strip("/")
        name, _, version = body.rpartition(":")
        if not name or not version:
            raise UsageError(f"{uri!r} is not ngc://ORG/[TEAM/]MODEL:VERSION")
        relative = f"ngc/{name}/{version}"
    else:
        raise UsageError(f"{uri!r} is not a remote URI (s3://, hf://, ngc://)")
    try:
        return check_relative(relative, what="input URI path")
    except UnsafePathError as exc:
        raise UsageError(f"input {uri!r} cannot be staged: {exc}") from exc


@dataclass(frozen=True)
class Placement:
    """Where one distinct source lives: relative to the staging root and inside the compute frame."""

    source: str
    sub_path: str
    container_path: str


def placements(request: JobRequest, inputs_root: str = DEFAULT_INPUTS_ROOT) -> dict[str, Placement]:
    """Every distinct remote source of the request (declared inputs first, then spec URIs).

    Archives and selective inputs are placed under ``archive/`` and ``selective/`` so their
    trees never nest inside a plain copy of the same prefix (``s3://b/p/`` as a folder and
    ``s3://b/p/a.tar`` extracted would otherwise collide). ``s3://b/p`` and ``s3://b/p/`` are
    one source. Two different sources that would still share a sub-path are refused: the
    renderer mounts one sub-path per source.
    """
    result: dict[str, Placement] = {}
    owners: dict[str, str] = {}

    def add(source: str, sub_path: str, target: str | None) -> None:
        alias = source[:-1] if source.endswith("/") else source + "/"
        if source in result:
            return
        if alias in result and source.startswith("s3://"):
            result[source] = result[alias]  # the same prefix written two ways
            return
        if sub_path in owners:
            raise UsageError(f"inputs {owners[sub_path]!r} and {source!r} would be staged at the same place "
                             f"({sub_path}); declare only one of them")
        owners[sub_path] = source
        result[source] = Placement(source, sub_path, target or f"{inputs_root}/{sub_path}")

    for item in request.inputs:
        if is_remote_uri(item.source):
            prefix = f"{item.kind}/" if item.kind in ("archive", "selective") else ""
            add(item.source, prefix + relative_location(item.source), item.target)
    for uri in remote_uris(request.spec or {}):
        add(uri, relative_location(uri), None)
    return result


def serialise(spec: Mapping[str, Any], config_format: str) -> bytes:
    """Deterministic bytes for a spec: sorted keys, fixed formatting, trailing newline."""
    if config_format == "json":
        return (json.dumps(spec, sort_keys=True, indent=2, ensure_ascii=False) + "\n").encode()
    if config_format == "yaml":
        return yaml.safe_dump(dict(spec), sort_keys=True, default_flow_style=False, allow_unicode=True).encode()
    if config_format == "toml":
        _check_toml(spec, "spec")
        return tomli_w.dumps(_sorted(spec)).encode()
    raise UsageError(f"config_format {config_format!r} is not one of json, yaml, toml")


def _sorted(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _sorted(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [_sorted(item) for item in value]
    return value


def _check_toml(value: Any, path: str) -> None:
    if value is None:
        raise UsageError(f"{path} is null, which TOML cannot represent; remove it or use config_format json/yaml")
    if isinstance(value, Mapping):
        for key, item in value.items():
            _check_toml(item, f"{path}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_toml(item, f"{path}[{index}]")


@dataclass(frozen=True)
class MaterializedConfig:
    path: Path
    sha256: str
    container_path: str
    created: bool


def materialize_config(request: JobRequest, output_dir: Path, inputs_root: str = DEFAULT_INPUTS_ROOT) -> MaterializedConfig:
    """Write the request's spec, remote URIs rewritten, as a content-addressed file.

    The name is ``tao-action-config-<sha256>.<ext>``. The file is written to a temp name,
    fsynced, then hard-linked into place — a link never replaces an existing file, so a
    concurrent writer or an earlier run cannot be overwritten; an existing file with the same
    name must have the same bytes (else it is an error: someone edited it). Mode 0600. The temp
    name is random, so a rerun after a kill (the same PID again, in a container) or two threads
    at once never collide.
    """
    if request.mode != "config" or request.spec is None or request.config_format is None:
        raise UsageError("materialize-config needs a request with mode 'config', a nested 'spec' and 'config_format'")
    mapping = {source: place.container_path for source, place in placements(request, inputs_root).items()}
    data = serialise(rewrite(request.spec, mapping), request.config_format)
    digest = hashlib.sha256(data).hexdigest()
    name = f"tao-action-config-{digest}.{_EXTENSIONS[request.config_format]}"
    output_dir.mkdir(parents=True, exist_ok=True)
    final = output_dir / name
    container_path = f"{CONFIG_MOUNT_DIR}/spec-{digest}.{_EXTENSIONS[request.config_format]}"
    created = atomic_write(final, data, mode=0o600, replace=False)
    if not created:
        _check_same(final, data)
    return MaterializedConfig(final, digest, container_path, created=created)


def _check_same(path: Path, data: bytes) -> None:
    if path.read_bytes() != data:
        raise UsageError(f"{path} exists with different content than the spec it is named after; "
                         "it was modified — remove it and materialize again")
