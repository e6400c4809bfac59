"""CLI verb modules. Each exposes ``register(verbs)`` adding its subcommands; a subcommand sets
``run(args, console) -> exit code``. Raising :class:`~tao_data_io.errors.UsageError` exits 2.

Why a map of verbs: a command line names one verb, and its parser needs that verb's module
alone. Importing all ten and registering their parsers is ~45–75 ms in a fresh process, of
which the one a resync needs is ~30: the rest was paid by every run. The whole set is built
only when the line names no verb we know (``--help``, a typo: the error lists every verb).
``tests/test_cli_start.py`` checks this map against what each module registers.
"""

from __future__ import annotations

from importlib import import_module
from types import ModuleType

#: The verb modules, in the order the top-level ``--help`` lists their verbs.
MODULES = ("pipeline", "plan", "transfer", "staging", "selective", "archive", "ptm", "record", "outputs", "kubernetes")

#: Each top-level verb → the module that registers it.
VERBS = {
    "submit": "pipeline", "status": "pipeline", "logs": "pipeline", "cancel": "pipeline", "collect": "pipeline",
    "sync": "transfer", "cp": "transfer",
    "stage": "staging", "materialize-config": "staging",
    "selective-download": "selective",
    "extract": "archive",
    "pull-model": "ptm",
    "record": "record",
    "route-outputs": "outputs", "upload-results": "outputs", "resync": "outputs", "restore-results": "outputs",
    "check-upload": "outputs",
    "plan": "plan", "render-job": "kubernetes",
}


def module(name: str) -> ModuleType:
    """The verb module ``name`` (one of :data:`MODULES`), imported on first use."""
    return import_module(f"{__name__}.{name}")
