"""The engine a staging run leases: the caller's, or one built on first use and closed at the end.

Why a lease: a run stages many inputs, one task each when an orchestrator runs them, and every
S3 input should share one engine (one connection pool, one executor), built only if some input
needs S3 and closed when the run ends — while an engine the caller passed in stays the caller's
to close.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

from ..credentials import s3_credentials_from_env
from ..transfer.engine import TransferEngine

#: What a staging function accepts as its engine: one the caller owns, a factory, or None (build one).
EngineSource = TransferEngine | Callable[[], TransferEngine] | None


@contextmanager
def lease(engine: EngineSource,
          environ: Mapping[str, str] | None) -> Iterator[Callable[[], TransferEngine]]:
    """A lazy engine: the caller's (never closed here), or one built on first use from
    ``environ`` and closed on the way out."""
    if isinstance(engine, TransferEngine):
        given = engine
        yield lambda: given
        return
    if engine is not None:
        yield engine
        return
    built: list[TransferEngine] = []

    def get() -> TransferEngine:
        if not built:
            built.append(TransferEngine(s3_credentials_from_env(environ)))
        return built[0]

    try:
        yield get
    finally:
        for item in built:
            item.close()
