"""Error types shared by the core, the CLI and (later) the Prefect tasks.

Two families matter to callers, because they need different reactions:

* :class:`UsageError` — the input is wrong (a bad URL, a missing credential, a key that
  would escape the destination). Retrying cannot help; the message names the field, the
  value and the fix. The CLI exits 2.
* :class:`TransferError` — the input was fine but some bytes did not move. Every complete
  file is kept and a rerun converges. The CLI exits 1.
"""

from __future__ import annotations


class TaoDataIOError(Exception):
    """Base class for every error this package raises on purpose."""


class UsageError(TaoDataIOError, ValueError):
    """Bad input: retrying will not help; the message says what to change."""


class CredentialError(UsageError):
    """A credential the operation needs is not in the environment."""


class UnsafePathError(UsageError):
    """A key or member name would land outside its destination, or is not a plain path."""


class TransferError(TaoDataIOError):
    """Some objects failed to move; complete files were kept and a rerun converges."""
