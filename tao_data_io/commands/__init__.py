"""CLI verb modules. Each exposes ``register(verbs)`` adding its subcommands; a subcommand sets
``run(args, console) -> exit code``. Raising :class:`~tao_data_io.errors.UsageError` exits 2.

Why a map of verbs: a command line names one verb, and its parser needs that verb's module
alone. Registering all ten cost a resync 94 ms (``bench/README.md``, the start-up paths), most
of it the backends' flags, made from their settings models; those now wait until their verb is
used (:func:`~tao_data_io.commands.target.when_used`), and the map saves a resync's parse ~10 ms
(80 against 90 ms, medians of 15 fresh processes) — under the bar a start-up path must clear,
so it is due to be measured again and, failing it, removed. The whole set is built
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
