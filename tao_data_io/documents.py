"""Loading a YAML or JSON document someone else wrote (a job request), within limits.

Why a module of its own: a request is untrusted input, and the standard loaders are generous in
ways that hurt — a 423-byte YAML "billion laughs" expands aliases into an exponential tree that
pins a core, a few thousand nested brackets end in a ``RecursionError``, and a duplicate key
silently keeps the last value. Every limit below is checked *before* anything is built, in one
streaming pass, and each has a safe default, an environment override, and an error that names
both.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from .errors import UsageError

MAX_BYTES_VARIABLE = "TAO_DATA_IO_MAX_REQUEST_BYTES"
MAX_DEPTH_VARIABLE = "TAO_DATA_IO_MAX_REQUEST_DEPTH"
MAX_NODES_VARIABLE = "TAO_DATA_IO_MAX_REQUEST_NODES"
DEFAULT_MAX_BYTES = 1024 * 1024
DEFAULT_MAX_DEPTH = 64
#: Nodes after expanding YAML aliases: generous for any real spec, tiny next to a laugh bomb.
DEFAULT_MAX_NODES = 100_000


def _limit(environ: Mapping[str, str], name: str, default: int) -> int:
    raw = environ.get(name)
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise UsageError(f"{name} {raw!r} must be a positive whole number")
    return value


def read_document(path: Path, *, what: str, environ: Mapping[str, str] | None = None) -> str:
    """The text of a document file, read only if it is a regular file and never past the size
    limit: a path to ``/dev/zero`` or a FIFO must fail at once, not fill memory or hang."""
    env = os.environ if environ is None else environ
    max_bytes = _limit(env, MAX_BYTES_VARIABLE, DEFAULT_MAX_BYTES)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise UsageError(f"{what} cannot be read: {exc.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UsageError(f"{what} is not a regular file (a device, FIFO or directory); give the path of a "
                             "YAML or JSON file")
        data = os.read(fd, max_bytes + 1)
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise UsageError(f"{what} is over the limit of {max_bytes:,} bytes ({MAX_BYTES_VARIABLE} raises it); a job "
                         "request is a small document")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{what} cannot be read: it is not UTF-8 text") from None


def load_document(text: str, fmt: str, *, what: str, environ: Mapping[str, str] | None = None,
                  as_omegaconf: Sequence[str] = ()) -> Any:
    """Parse ``text`` as ``fmt`` (``yaml`` or ``json``) after checking its size, nesting depth
    and (YAML) expanded size; refuse duplicate keys. ``what`` names the document in errors.
    The top-level fields ``as_omegaconf`` (a request's ``spec``) of a YAML document are read as
    OmegaConf reads YAML — TAO's own reader (:func:`_omegaconf_loader`) — the rest as PyYAML
    does (``environment: {LR: 2e-05}`` stays the text written)."""
    env = os.environ if environ is None else environ
    max_bytes = _limit(env, MAX_BYTES_VARIABLE, DEFAULT_MAX_BYTES)
    max_depth = _limit(env, MAX_DEPTH_VARIABLE, DEFAULT_MAX_DEPTH)
    max_nodes = _limit(env, MAX_NODES_VARIABLE, DEFAULT_MAX_NODES)
    size = len(text.encode("utf-8"))
    if size > max_bytes:
        raise UsageError(f"{what} is {size:,} bytes, over the limit of {max_bytes:,} ({MAX_BYTES_VARIABLE} raises "
                         "it); a job request is a small document")
    if fmt == "json":
        _check_json_depth(text, max_depth, what)
        try:
            return json.loads(text, object_pairs_hook=lambda pairs: _unique(pairs, what))
        except ValueError as exc:
            if isinstance(exc, UsageError):
                raise
            raise UsageError(f"{what} is not valid JSON: {exc}") from None
    import yaml  # only when a YAML document is read: the CLI's hot paths never need it

    try:
        _check_yaml_events(text, max_depth, max_nodes, what)
        data = yaml.load(text, Loader=_unique_key_loader())  # noqa: S506 - a SafeLoader subclass
        if isinstance(data, dict) and any(field in data for field in as_omegaconf):
            # Read again with TAO's rules for those fields (the checks above held for the text).
            read = yaml.load(text, Loader=_omegaconf_loader())  # noqa: S506 - a SafeLoader subclass
            data.update({field: read[field] for field in as_omegaconf if field in data})
        return data
    except yaml.YAMLError as exc:
        raise UsageError(f"{what} is not valid YAML: {_yaml_problem(exc)}") from None
    except _DuplicateKey as exc:
        raise UsageError(f"{what}, {exc}") from None


def _yaml_problem(exc: Exception) -> str:
    """PyYAML's problem and where it is, without the snippet of the line it quotes: that line may
    hold a credential value, cut where no redactor can recognise it."""
    problem = getattr(exc, "problem", None)
    mark = getattr(exc, "problem_mark", None)
    if problem is None or mark is None:
        return type(exc).__name__
    context = getattr(exc, "context", None)
    return f"{context + ', ' if context else ''}{problem} at line {mark.line + 1}, column {mark.column + 1}"


def _depth_error(what: str, limit: int) -> UsageError:
    return UsageError(f"{what} is nested deeper than {limit} levels ({MAX_DEPTH_VARIABLE} raises the limit); "
                      "flatten the document")


def _check_json_depth(text: str, limit: int, what: str) -> None:
    """Bracket depth outside strings, without recursion (the parser itself would recurse)."""
    depth = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > limit:
                raise _depth_error(what, limit)
        elif char in "]}":
            depth -= 1


def _check_yaml_events(text: str, max_depth: int, max_nodes: int, what: str) -> None:
    """One pass over the parser's events (no tree is built): depth, and the node count with every
    alias counted as the size of what it expands to."""
    import yaml

    open_sizes: list[list[Any]] = []  # per open collection: [anchor, nodes in it so far]
    anchored: dict[str, int] = {}     # finished anchored node → its expanded size
    total = 0

    def count(nodes: int) -> None:
        nonlocal total
        total += nodes
        if total > max_nodes:
            raise UsageError(f"{what} expands to more than {max_nodes:,} nodes (YAML aliases multiply what they "
                             f"repeat; {MAX_NODES_VARIABLE} raises the limit); write the values out instead of "
                             "aliasing them")

    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.MappingStartEvent | yaml.SequenceStartEvent):
            count(1)
            open_sizes.append([event.anchor, 1])
            if len(open_sizes) > max_depth:
                raise _depth_error(what, max_depth)
            continue
        if isinstance(event, yaml.MappingEndEvent | yaml.SequenceEndEvent):
            anchor, size = open_sizes.pop()
        elif isinstance(event, yaml.ScalarEvent):
            anchor, size = event.anchor, 1
            count(1)
        elif isinstance(event, yaml.AliasEvent):
            anchor, size = None, anchored.get(event.anchor or "", 1)
            count(size)
        else:
            continue
        if anchor:
            anchored[anchor] = size
        if open_sizes:
            open_sizes[-1][1] += size


def _unique(pairs: list[tuple[Any, Any]], what: str) -> dict[Any, Any]:
    result: dict[Any, Any] = {}
    for key, value in pairs:
        if key in result:
            raise UsageError(f"{what} has the duplicate key {key!r}; a key may appear once per mapping (which "
                             "value was meant?)")
        result[key] = value
    return result


class _DuplicateKey(Exception):
    """Raised inside the loader, which does not know the document's name."""


#: OmegaConf's float rule, which TAO's specs are read with: YAML 1.1's floats, and exponents
#: without a dot (``2e-05``, ``1e-4``, ``1E+3``), which YAML 1.1 — and PyYAML — read as text.
_OMEGACONF_FLOAT = re.compile(r"""^(?:
      [-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    | [-+]?[0-9](?:[0-9_]*[0-9])?[eE][-+]?[0-9]+
    | \.[0-9][0-9_]*(?:[eE][-+][0-9]+)?
    | [-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*
    | [-+]?\.(?:inf|Inf|INF)
    | \.(?:nan|NaN|NAN)
    )$""", re.X)
#: The resolver the spec loader reads floats with and the config writer quotes by: one rule.
_OMEGACONF_FLOAT_RESOLVER = ("tag:yaml.org,2002:float", _OMEGACONF_FLOAT, list("-+0123456789."))


@cache
def _unique_key_loader() -> type:
    """``yaml.safe_load`` that refuses a key repeated in one mapping instead of keeping the last
    (a class made on first use, so importing this module does not import yaml). Keys come from
    what is written in the mapping: a merge (``<<: *base``) brings keys in and one written beside
    it overrides them, as YAML and OmegaConf have it.

    Each mapping is checked once, as written, before PyYAML flattens it: flattening rewrites a
    node in place (the merged keys join its own), and a node is flattened when it is merged as
    well as when it is built — so one met again after a merge looked as if it held its override
    twice, depending on the order the loader met them."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def flatten_mapping(self, node: yaml.MappingNode) -> None:
            checked: set[int] = self.__dict__.setdefault("_checked_mappings", set())
            if id(node) not in checked:
                checked.add(id(node))
                self._refuse_written_twice(node)
            super().flatten_mapping(node)

        def _refuse_written_twice(self, node: yaml.MappingNode) -> None:
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # merged keys: flattened in below the written ones, which override them
                key = self.construct_object(key_node)
                try:
                    duplicate = key in seen
                except TypeError:
                    continue  # an unhashable key: the base constructor reports it
                if duplicate:
                    raise _DuplicateKey(f"line {key_node.start_mark.line + 1}: duplicate key {key!r}; a key may "
                                        "appear once per mapping (which value was meant?)")
                seen.add(key)

    return UniqueKeyLoader


@cache
def _omegaconf_loader() -> type:
    """:func:`_unique_key_loader` with OmegaConf's resolvers — TAO reads its specs through
    OmegaConf: :data:`_OMEGACONF_FLOAT` for floats, and no timestamps (dates stay strings)."""
    import yaml

    class OmegaConfRules(_unique_key_loader()):  # type: ignore[misc]  # a base class built at run time (PyYAML loads lazily)
        pass

    OmegaConfRules.yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers
                if tag not in ("tag:yaml.org,2002:float", "tag:yaml.org,2002:timestamp")]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    OmegaConfRules.add_implicit_resolver(*_OMEGACONF_FLOAT_RESOLVER)
    return OmegaConfRules


@cache
def omegaconf_dumper() -> type:
    """``yaml.SafeDumper`` that writes every string OmegaConf would read as something else
    quoted (``'1e-4'``): a materialized config must give TAO back each value with its type."""
    import yaml

    class ForOmegaConf(yaml.SafeDumper):
        pass

    ForOmegaConf.add_implicit_resolver(*_OMEGACONF_FLOAT_RESOLVER)
    return ForOmegaConf
