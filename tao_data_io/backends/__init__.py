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
import re
from collections.abc import Mapping
from functools import cache
from importlib.metadata import entry_points
from typing import Any

from ..errors import UsageError
from ..launch.backend import Backend, BackendSettings
from ..launch.platform import ENTRY_POINTS, Platform
from ..reporting import said_list

#: The backends this distribution brings, by the package that declares each (``PLATFORM``).
BUILTIN = ("tao_data_io.backends.local", "tao_data_io.backends.kubernetes", "tao_data_io.backends.docker",
           "tao_data_io.backends.slurm")

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
        except Exception as exc:  # noqa: BLE001 - a plugin's own import error: said, and the rest still work
            log.warning("backend entry point %s (%s) could not be loaded, left out: %s", point.name, point.value, exc)
            continue
        _add(found, platform, f"entry point {point.name} ({point.value})")
    for platform in _added.values():
        _add(found, platform, "register()")
    return found


def _add(found: dict[str, Platform], platform: Any, where: str) -> None:
    refusal = _refusal(found, platform)
    if refusal:
        log.warning("%s is left out: %s", where, refusal)
    else:
        found[platform.name] = platform


#: A platform's name: what records keep, ``--backend`` takes and the target block's slug holds
#: (``tao-<name>-target``, which Prefect's slugs allow).
NAME = re.compile(r"[a-z](?:[a-z0-9-]{0,30}[a-z0-9])?")
#: A title: words of letters and digits (its block is ``TAO <title> Target``, whose class is the
#: title without its spaces and ``Target``).
TITLE = re.compile(r"[A-Za-z][A-Za-z0-9]*(?: [A-Za-z0-9]+)*")


def _refusal(found: Mapping[str, Platform], platform: Any) -> str | None:
    """Why ``platform`` cannot join the backends in ``found`` (None: it can). Checked where it is
    found, so a plugin its author got wrong is left out naming why, and never breaks the parsers,
    the blocks or the records of every other backend."""
    if not isinstance(platform, Platform):
        return f"it is not a tao_data_io Platform but a {type(platform).__name__}"
    settings = platform.settings
    if not (isinstance(settings, type) and issubclass(settings, BackendSettings)):
        return f"its settings {settings!r} are not a BackendSettings model"
    name = getattr(settings, "platform", None)
    if not isinstance(name, str):
        return f"its settings {settings.__name__} declare no platform name (platform: ClassVar[str] = \"name\")"
    if not NAME.fullmatch(name):
        return (f"{name[:80]!r} is not a platform name: a lowercase letter, then at most 31 lowercase letters, "
                "digits and inner dashes")
    if name in found:
        return f"it declares platform {name!r}, which is already a backend"
    if not TITLE.fullmatch(platform.label):
        return f"its title {platform.label[:80]!r} is not words of letters and digits"
    for other in found.values():
        if other.block_class.lower() == platform.block_class.lower():
            return f"its title {platform.label!r} is the title of {other.name!r} (each target block needs its own)"
    return None


def platform_of(name: str) -> Platform:
    """The backend called ``name``; a name no backend has is refused, naming those there are."""
    known = platforms()
    if name not in known:
        raise UsageError(f"platform {name!r} is not a backend: use {said_list([repr(name) for name in known])} "
                         "(a backend another distribution provides is found once that distribution is installed "
                         "here)")
    return known[name]


def settings_model(name: str) -> type[BackendSettings]:
    """The settings model of platform ``name``."""
    return platform_of(name).settings


def settings_from(name: str, config: Mapping[str, Any] | None = None) -> BackendSettings:
    """Platform ``name``'s settings from ``config`` (a record's ``backend_config``, the CLI's
    flags, a target file); a refusal is a :class:`UsageError` naming the field, the value and the fix."""
    return platform_of(name).settings.from_mapping(dict(config or {}))


def backend_for(name: str, config: Mapping[str, Any] | None = None) -> Backend:
    """The backend of platform ``name`` built from ``config``: how a later verb rebuilds a
    recorded job's backend (``backend_config``), and how the CLI builds one."""
    return backend_from(settings_from(name, config))


def backend_from(settings: BackendSettings) -> Backend:
    """The backend these settings are for, built from them (how a target block builds its own).
    Its module is imported only now: a backend that needs an extra (the Kubernetes client) is
    told to install it, naming what, on a host without it; one that cannot be loaded, or does
    not keep the protocol, is refused naming what is wrong — before a record is written."""
    platform = platform_of(settings.platform)
    module, _, name = platform.backend.partition(":")
    try:
        backend_class = getattr(importlib.import_module(module), name)
    except ImportError as exc:
        if (exc.name or "").startswith("tao_data_io"):
            raise
        if platform.install is not None and exc.name != module:
            raise UsageError(f"the {platform.name} backend needs {exc.name!r}, which this host lacks: install "
                             f"{platform.install}") from exc
        raise _unloadable(platform, exc) from exc
    except AttributeError as exc:
        raise _unloadable(platform, exc) from exc
    backend: Backend = backend_class(settings)
    if not isinstance(backend, Backend):
        members = set(Backend.__annotations__) | {member for member, value in vars(Backend).items()
                                                  if callable(value) and not member.startswith("_")}
        lacking = ", ".join(sorted(member for member in members if not hasattr(backend, member)))
        raise UsageError(f"the {platform.name} backend ({platform.backend}) lacks {lacking} of the Backend protocol "
                         "of this tao-data-io: install a version of its distribution made for it")
    return backend


def _unloadable(platform: Platform, exc: Exception) -> UsageError:
    return UsageError(f"the {platform.name} backend is declared as {platform.backend}, which cannot be loaded "
                      f"({exc}): reinstall the distribution that provides it")
