"""The backends, one package each, and the registry that finds them: a platform name (as a job
record keeps it) and its settings → the backend.

A backend is a package here listed in :data:`BUILTIN` (or, from another distribution, an entry
point of the group :data:`~tao_data_io.launch.platform.ENTRY_POINTS`), whose ``PLATFORM`` is its
:class:`~tao_data_io.launch.platform.Platform`. Nothing else in the project names a backend: the
CLI's flags, the target blocks and the flows' target parameter are made from the platforms found
here, and an unknown platform is refused naming those there are — never a fallback.

Why the registry sits above the backends: :mod:`tao_data_io.launch` defines the protocol every
backend implements and the declaration they make, so it must not import the backends (that was
an import circle); the callers that choose a backend — the CLI, the target blocks, a verb that
rebuilds a recorded job's backend — come here instead.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping
from functools import cache
from importlib.metadata import entry_points
from typing import Any

from ..errors import UsageError
from ..launch.backend import Backend, BackendSettings
from ..launch.platform import ENTRY_POINTS, Platform

#: The backends this distribution brings, by the package that declares each (``PLATFORM``).
BUILTIN = ("tao_data_io.backends.local", "tao_data_io.backends.kubernetes")

log = logging.getLogger(__name__)
_added: dict[str, Platform] = {}


def register(platform: Platform) -> Platform:
    """Add a backend at run time (an embedding program, a test): as if its distribution listed
    it. A name already taken is refused: two backends answering to one name would each read the
    other's records."""
    if platform.name in platforms():
        raise UsageError(f"platform {platform.name!r} is already a backend: name the new one otherwise")
    _added[platform.name] = platform
    platforms.cache_clear()
    return platform


@cache
def platforms() -> Mapping[str, Platform]:
    """Every backend there is, by name: the built-in ones, then those other distributions list,
    then those :func:`register` added. A listed backend that cannot be loaded is said in the log
    and left out (one broken plugin must not stop every job), and so is a second one of a name."""
    found: dict[str, Platform] = {}
    for module in BUILTIN:
        _add(found, importlib.import_module(module).PLATFORM, module)
    for point in entry_points(group=ENTRY_POINTS):
        try:
            platform = point.load()
        except Exception as exc:  # a plugin's own import error: said, and the rest still work
            log.warning("backend entry point %s (%s) could not be loaded, left out: %s", point.name, point.value, exc)
            continue
        _add(found, platform, f"entry point {point.name} ({point.value})")
    for platform in _added.values():
        _add(found, platform, "register()")
    return found


def _add(found: dict[str, Platform], platform: Any, where: str) -> None:
    if not isinstance(platform, Platform):
        log.warning("%s is not a tao_data_io Platform (%r), left out", where, type(platform).__name__)
    elif platform.name in found:
        log.warning("%s declares platform %r, which is already a backend: left out", where, platform.name)
    else:
        found[platform.name] = platform


def platform_of(name: str) -> Platform:
    """The backend called ``name``; a name no backend has is refused, naming those there are."""
    known = platforms()
    if name not in known:
        raise UsageError(f"platform {name!r} is not a backend: use {_either(known)}")
    return known[name]


def _either(names: Mapping[str, Any]) -> str:
    listed = [repr(name) for name in names]
    return ", ".join(listed[:-1]) + f" or {listed[-1]}" if len(listed) > 1 else "".join(listed)


def settings_model(name: str) -> type[BackendSettings]:
    """The settings model of platform ``name``."""
    return platform_of(name).settings


def settings_from(name: str, config: Mapping[str, Any] | None = None) -> BackendSettings:
    """Platform ``name``'s settings from ``config`` (a record's ``backend_config``, the CLI's
    flags, a target file), with renamed keys migrated (a new name given beside an old one wins: it
    is the later word); a refusal is a :class:`UsageError` naming the field, the value and the fix."""
    platform = platform_of(name)
    values = dict(config or {})
    for old, new in platform.renamed.items():
        if old in values:
            values.setdefault(new, values.pop(old))
    return platform.settings.from_mapping(values)


def backend_for(name: str, config: Mapping[str, Any] | None = None) -> Backend:
    """The backend of platform ``name`` built from ``config``: how a later verb rebuilds a
    recorded job's backend (``backend_config``), and how the CLI builds one."""
    return backend_from(settings_from(name, config))


def backend_from(settings: BackendSettings) -> Backend:
    """The backend these settings are for, built from them (how a target block builds its own).
    Its module is imported only now: a backend that needs an extra (the Kubernetes client) is
    told to install it, naming what, on a host without it."""
    platform = platform_of(settings.platform)
    module, _, name = platform.backend.partition(":")
    try:
        backend_class = getattr(importlib.import_module(module), name)
    except ImportError as exc:
        if platform.install is None or (exc.name or "").startswith("tao_data_io"):
            raise
        raise UsageError(f"the {platform.name} backend needs {exc.name!r}, which this host lacks: install "
                         f"{platform.install}") from exc
    backend: Backend = backend_class(settings)
    return backend
