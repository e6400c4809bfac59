"""Walking a nested spec: every string leaf with its field path, the remote URIs among them, and a
rewritten copy. Pure, and below the request (whose validator walks the spec) and staging (which
rewrites it); where each URI goes is :mod:`tao_data_io.staging.layout`'s business, serialising is
:mod:`tao_data_io.staging.config`'s.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from .uris import is_remote_uri


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


def remote_uris(spec: Any) -> list[tuple[str, str]]:
    """(field path where first seen, URI) for every distinct remote URI in ``spec``, in order."""
    seen: dict[str, str] = {}
    for path, text in iter_strings(spec):
        if is_remote_uri(text):
            seen.setdefault(text, path)
    return [(path, uri) for uri, path in seen.items()]


def rewrite(value: Any, mapping: Mapping[str, str]) -> Any:
    """A copy of ``value`` with every string leaf found in ``mapping`` replaced."""
    if isinstance(value, str):
        return mapping.get(value, value)
    if isinstance(value, Mapping):
        return {key: rewrite(item, mapping) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [rewrite(item, mapping) for item in value]
    return value
