"""CLI verb modules. Each exposes ``register(verbs)`` adding its subcommands; a subcommand sets
``run(args, console) -> exit code``. Raising :class:`~tao_data_io.errors.UsageError` exits 2.

The parser registers every verb (:func:`tao_data_io.cli.build_parser`); what costs, the
backends' flags, waits until its verb is used (:func:`.target.when_used`).
"""

from __future__ import annotations

from importlib import import_module
from types import ModuleType

#: The verb modules, in the order the top-level ``--help`` lists their verbs.
MODULES = ("pipeline", "plan", "transfer", "staging", "selective", "archive", "ptm", "record", "outputs", "kubernetes")


def module(name: str) -> ModuleType:
    """The verb module ``name`` (one of :data:`MODULES`), imported on first use."""
    return import_module(f"{__name__}.{name}")
