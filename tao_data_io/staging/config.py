"""The materialized config: the request's spec, remote URIs rewritten to the paths the compute
frame sees, serialised deterministically and published under its own SHA-256.

Why content-addressed: a rerun produces the same bytes and so the same name, a renderer can
refuse a staged file whose bytes differ from its name, and an existing file is never replaced.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w
import yaml

from ..documents import omegaconf_dumper
from ..errors import UsageError
from ..fs.atomic import atomic_write
from ..request import JobRequest
from .layout import DEFAULT_INPUTS_ROOT, PlannedInput, config_location, placements
from ..spec import rewrite

_EXTENSIONS = {"json": "json", "yaml": "yaml", "toml": "toml"}


def serialise(spec: Mapping[str, Any], config_format: str) -> bytes:
    """Deterministic bytes for a spec: sorted keys, fixed formatting, trailing newline. A value the
    format cannot represent faithfully is refused naming its field, never coerced."""
    if config_format not in _EXTENSIONS:
        raise UsageError(f"config_format {config_format!r} is not one of json, yaml, toml")
    _check_representable(spec, config_format)
    if config_format == "json":
        return (json.dumps(spec, sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False) + "\n").encode()
    if config_format == "yaml":
        return yaml.dump(dict(spec), Dumper=omegaconf_dumper(), sort_keys=True, default_flow_style=False,
                         allow_unicode=True).encode()
    return tomli_w.dumps(_sorted(spec)).encode()


def _sorted(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _sorted(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [_sorted(item) for item in value]
    return value


def _check_representable(spec: Mapping[str, Any], fmt: str) -> None:
    """Walk the spec (without recursion) and refuse what ``fmt`` cannot hold: null in TOML, dates
    and binary in JSON and TOML, inf/nan in JSON, and keys that are not strings anywhere (they
    would be turned into strings, or not sort)."""
    fix = "quote it in the request, or choose another config_format"
    stack: list[tuple[str, Any]] = [("spec", spec)]
    while stack:
        path, value = stack.pop()
        problem = None
        if value is None and fmt == "toml":
            problem = "null, which TOML cannot represent"
        elif isinstance(value, datetime.date | datetime.time) and fmt in ("json", "toml"):
            problem = (f"a {type(value).__name__} (YAML reads unquoted dates as dates), "
                       f"which {fmt.upper()} would not keep")
        elif isinstance(value, bytes | bytearray) and fmt in ("json", "toml"):
            problem = f"binary data, which {fmt.upper()} cannot represent"
        elif isinstance(value, float) and not math.isfinite(value) and fmt == "json":
            problem = f"{value}, which JSON cannot represent"
        elif isinstance(value, Mapping):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise UsageError(f"{path} has the key {key!r} ({type(key).__name__}), not a string; {fix}")
                stack.append((f"{path}.{key}", item))
        elif isinstance(value, list | tuple):
            stack.extend((f"{path}[{index}]", item) for index, item in enumerate(value))
        if problem:
            raise UsageError(f"{path} is {problem}; {fix}")


@dataclass(frozen=True)
class MaterializedConfig:
    """Where the config was written, its digest, and where it sits on the staging root and in
    the frame."""

    path: Path
    sha256: str
    sub_path: str
    container_path: str
    created: bool

    def to_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "sha256": self.sha256, "sub_path": self.sub_path,
                "container_path": self.container_path, "created": self.created}

    def describe(self) -> str:
        return f"{self.path} ({'written' if self.created else 'already there'}), mounted at {self.container_path}"


def config_content(request: JobRequest, inputs_root: str = DEFAULT_INPUTS_ROOT, *,
                   plan: list[PlannedInput] | None = None) -> tuple[bytes, str, str, str]:
    """(bytes, sha256, sub-path, path in the frame) of the request's config — pure, so a plan
    can name the config's path without writing it. ``plan``: the request's planned inputs, when
    the caller holds them (a staging run), else planned here."""
    if request.mode != "config" or request.spec is None or request.config_format is None:
        raise UsageError("materialize-config needs a request with mode 'config', a nested 'spec' and 'config_format'")
    mapping = {source: place.frame_value for source, place in placements(request, inputs_root, plan=plan).items()}
    data = serialise(rewrite(request.spec, mapping), request.config_format)
    digest = hashlib.sha256(data).hexdigest()
    sub_path, container_path = config_location(digest, _EXTENSIONS[request.config_format])
    return data, digest, sub_path, container_path


def materialize_config(request: JobRequest, output_dir: Path, inputs_root: str = DEFAULT_INPUTS_ROOT, *,
                       plan: list[PlannedInput] | None = None) -> MaterializedConfig:
    """Write the request's spec, remote URIs rewritten, as a content-addressed file.

    The name is ``tao-action-config-<sha256>.<ext>``. The file is written to a temp name,
    fsynced, then hard-linked into place — a link never replaces an existing file, so a
    concurrent writer or an earlier run cannot be overwritten; an existing file with the same
    name must have the same bytes (else it is an error: someone edited it). Mode 0644: the job
    reads it as its own user, who is not the stager's when the backend runs as root. The temp
    name is random, so a rerun after a kill (the same PID again, in a container) or two threads
    at once never collide.
    """
    data, digest, sub_path, container_path = config_content(request, inputs_root, plan=plan)
    final = output_dir / Path(sub_path).name
    created = atomic_write(final, data, mode=0o644, replace=False)
    if not created:
        _check_same(final, data)
    return MaterializedConfig(final, digest, sub_path, container_path, created=created)


def _check_same(path: Path, data: bytes) -> None:
    if path.read_bytes() != data:
        raise UsageError(f"{path} exists with different content than the spec it is named after; "
                         "it was modified — remove it and materialize again")
