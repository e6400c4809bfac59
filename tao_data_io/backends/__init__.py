"""The backends, one package each, and the registry that finds them: a backend name (as a job
record keeps it) and its settings → the backend.

A backend is a package here listed in :data:`BUILTIN` (or, from another distribution, an entry
point of the group :data:`~tao_data_io.launch.declaration.ENTRY_POINTS`), whose ``DECLARATION`` is its
:class:`~tao_data_io.launch.declaration.Declaration`. Nothing else in the project names a backend: the
CLI's flags, the target blocks and the flows' target parameter are made from the declarations found
here, and an unknown backend is refused naming those there are — never a fallback.

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
from ..launch.declaration import ENTRY_POINTS, Declaration
from ..reporting import said_list

#: The backends this distribution brings, by the package that declares each (``DECLARATION``).
BUILTIN = ("tao_data_io.backends.local", "tao_data_io.backends.kubernetes", "tao_data_io.backends.docker",
           "tao_data_io.backends.slurm")

log = logging.getLogger(__name__)
_added: dict[str, Declaration] = {}


def register(declared: Declaration) -> Declaration:
    """Add a backend at run time (an embedding program, a test): as if its distribution listed
    it. A name already taken is refused: two backends answering to one name would each read the
    other's records."""
    if declared.name in declarations():
        raise UsageError(f"a backend called {declared.name!r} is already registered: name the new one otherwise")
    _added[declared.name] = declared
    declarations.cache_clear()
    return declared


@cache
def declarations() -> Mapping[str, Declaration]:
    """Every backend there is, by name: the built-in ones, then those other distributions list,
    then those :func:`register` added. A listed backend that cannot be loaded is said in the log
    and left out (one broken plugin must not stop every job), and so is a second one of a name."""
    found: dict[str, Declaration] = {}
    for module in BUILTIN:
        _add(found, importlib.import_module(module).DECLARATION, module)
    for point in entry_points(group=ENTRY_POINTS):
        try:
            declared = point.load()
        except Exception as exc:  # noqa: BLE001 - a plugin's own import error: said, and the rest still work
            log.warning("backend entry point %s (%s) could not be loaded, left out: %s", point.name, point.value, exc)
            continue
        _add(found, declared, f"entry point {point.name} ({point.value})")
    for declared in _added.values():
        _add(found, declared, "register()")
    return found


def _add(found: dict[str, Declaration], declared: Any, where: str) -> None:
    refusal = _refusal(found, declared)
    if refusal:
        log.warning("%s is left out: %s", where, refusal)
    else:
        found[declared.name] = declared


#: A backend's name: what records keep, ``--backend`` takes and the target block's slug holds
#: (``tao-<name>-target``, which Prefect's slugs allow).
NAME = re.compile(r"[a-z](?:[a-z0-9-]{0,30}[a-z0-9])?")
#: A title: words of letters and digits (its block is ``TAO <title> Target``, whose class is the
#: title without its spaces and ``Target``).
TITLE = re.compile(r"[A-Za-z][A-Za-z0-9]*(?: [A-Za-z0-9]+)*")


def _refusal(found: Mapping[str, Declaration], declared: Any) -> str | None:
    """Why ``declared`` cannot join the backends in ``found`` (None: it can). Checked where it is
    found, so a plugin its author got wrong is left out naming why, and never breaks the parsers,
    the blocks or the records of every other backend."""
    if not isinstance(declared, Declaration):
        return f"it is not a tao_data_io Declaration but a {type(declared).__name__}"
    settings = declared.settings
    if not (isinstance(settings, type) and issubclass(settings, BackendSettings)):
        return f"its settings {settings!r} are not a BackendSettings model"
    name = getattr(settings, "name", None)
    if not isinstance(name, str):
        return f"its settings {settings.__name__} declare no backend name (name: ClassVar[str] = \"name\")"
    if not NAME.fullmatch(name):
        return (f"{name[:80]!r} is not a backend name: a lowercase letter, then at most 31 lowercase letters, "
                "digits and inner dashes")
    if name in found:
        return f"it declares backend {name!r}, which is already a backend"
    if not TITLE.fullmatch(declared.label):
        return f"its title {declared.label[:80]!r} is not words of letters and digits"
    for other in found.values():
        if other.block_class.lower() == declared.block_class.lower():
            return f"its title {declared.label!r} is the title of {other.name!r} (each target block needs its own)"
    return None


def declaration_of(name: str) -> Declaration:
    """The backend called ``name``; a name no backend has is refused, naming those there are."""
    known = declarations()
    if name not in known:
        raise UsageError(f"backend {name!r} is not known here: use {said_list([repr(name) for name in known])} "
                         "(a backend another distribution provides is found once that distribution is installed "
                         "here)")
    return known[name]


def settings_model(name: str) -> type[BackendSettings]:
    """The settings model of backend ``name``."""
    return declaration_of(name).settings


def settings_from(name: str, config: Mapping[str, Any] | None = None) -> BackendSettings:
    """Declaration ``name``'s settings from ``config`` (a record's ``backend_config``, the CLI's
    flags, a target file); a refusal is a :class:`UsageError` naming the field, the value and the fix."""
    return declaration_of(name).settings.from_mapping(dict(config or {}))


def backend_for(name: str, config: Mapping[str, Any] | None = None) -> Backend:
    """The backend ``name`` built from ``config``: how a later verb rebuilds a
    recorded job's backend (``backend_config``), and how the CLI builds one."""
    return backend_from(settings_from(name, config))


def backend_from(settings: BackendSettings) -> Backend:
    """The backend these settings are for, built from them (how a target block builds its own).
    Its module is imported only now: a backend that needs an extra (the Kubernetes client) is
    told to install it, naming what, on a host without it; one that cannot be loaded, or does
    not keep the protocol, is refused naming what is wrong — before a record is written."""
    declared = declaration_of(settings.name)
    module, _, name = declared.implementation.partition(":")
    try:
        backend_class = getattr(importlib.import_module(module), name)
    except ImportError as exc:
        if (exc.name or "").startswith("tao_data_io"):
            raise
        if declared.install is not None and exc.name != module:
            raise UsageError(f"the {declared.name} backend needs {exc.name!r}, which this host lacks: install "
                             f"{declared.install}") from exc
        raise _unloadable(declared, exc) from exc
    except AttributeError as exc:
        raise _unloadable(declared, exc) from exc
    backend: Backend = backend_class(settings)
    if not isinstance(backend, Backend):
        members = set(Backend.__annotations__) | {member for member, value in vars(Backend).items()
                                                  if callable(value) and not member.startswith("_")}
        lacking = ", ".join(sorted(member for member in members if not hasattr(backend, member)))
        raise UsageError(f"the {declared.name} backend ({declared.implementation}) lacks {lacking} of the "
                         "Backend protocol of this tao-data-io: install a version of its distribution made for it")
    return backend


def _unloadable(declared: Declaration, exc: Exception) -> UsageError:
    return UsageError(f"the {declared.name} backend is declared as {declared.implementation}, which cannot be loaded "
                      f"({exc}): reinstall the distribution that provides it")
