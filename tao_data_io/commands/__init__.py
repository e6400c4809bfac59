"""CLI verb modules. Each exposes ``register(verbs)`` adding its subcommands; a subcommand sets
``run(args, console) -> exit code``. Raising :class:`~tao_data_io.errors.UsageError` exits 2."""

from __future__ import annotations

from . import archive, kubernetes, outputs, pipeline, ptm, record, selective, staging, transfer

MODULES = (pipeline, transfer, staging, selective, archive, ptm, record, outputs, kubernetes)
