"""Names a package exports but loads only when asked for (PEP 562).

Why: a command is a fresh process, and a package's ``__init__`` importing every module it
exports makes each verb pay for all of them — the record's models alone are ~120 ms of pydantic
— before its first request. The package keeps its public names; each costs what its module
costs the first time it is used, and nothing before.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, homes: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``, exporting each name of ``homes`` from
    the module of ``package`` it maps to. A name loaded once is set on the package, so later
    lookups are plain attribute reads."""

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{home}", package), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(homes)

    return __getattr__, __dir__
