"""Error types shared by the core, the CLI and the Prefect tasks, and the one answer to "should
this be retried?".

Callers need different reactions, so the families say which:

* :class:`UsageError` — the input is wrong (a bad URL, a missing credential, a key that would
  escape the destination). Retrying cannot help; the message names the field or parameter, the
  value and the fix. The CLI exits 2.
* :class:`TransferError` — the input was fine but some bytes did not move. Every complete file
  is kept and a rerun converges, so it is retryable — except its subclasses that report a fact a
  rerun will find again (:class:`IntegrityError`, missing references).
* :class:`BackendError` — the compute backend (a cluster, the local sandbox) failed; it says
  itself whether a retry can help (an API 503 can, a refused admission cannot).

:func:`is_retryable` is what an orchestrator's retry condition calls: our own errors carry the
answer, and transient failures of the libraries below us (throttling, 5xx, dropped connections,
timeouts) are recognised by type.
"""

from __future__ import annotations

import errno
import os


#: The exit status of a command refused for its input (a :class:`UsageError`, a path it cannot
#: use).
USAGE_EXIT = 2
#: The exit status of a stage whose staging root this identity cannot write (an
#: :class:`UnwritableError`): the volume refuses it the same way on every retry, so the stage
#: Job's pod failure policy ends the Job on this status alone — unlike 2, which also covers a
#: refusal a retry can outlive (an endpoint not reachable yet, an I/O error on a path).
UNWRITABLE_EXIT = 3


class TaoDataIOError(Exception):
    """Base class for every error this package raises on purpose."""

    #: Whether running the same step again can succeed.
    retryable: bool = False


class UsageError(TaoDataIOError, ValueError):
    """Bad input: retrying will not help; the message says what to change."""


class UnwritableError(UsageError):
    """The staging root (or a directory the stage writes) cannot be written by this identity."""


class CredentialError(UsageError):
    """A credential the operation needs is not in the environment, or was refused."""


class UnsafePathError(UsageError):
    """A key or member name would land outside its destination, or is not a plain path."""


class TransferError(TaoDataIOError):
    """Some objects failed to move; complete files were kept and a rerun converges."""

    retryable = True


class IntegrityError(TransferError):
    """Bytes arrived but are not what the source says they must be (size, digest); nothing was
    published. A rerun fetches the same bytes again, so it is not retried automatically."""

    retryable = False


class JobOutcome(TaoDataIOError):
    """A verb did its work and the job's outcome is not a success (it ended ERROR, or has not
    ended): the message is the whole story, so a run that ends on one says it in one line —
    a traceback of ours would point at code that did nothing wrong."""


class BackendError(TaoDataIOError):
    """The compute backend failed; ``retryable`` says whether trying again can help."""

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


#: HTTP statuses that mean "try again later".
TRANSIENT_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
_THROTTLING_CODES = frozenset({"Throttling", "ThrottlingException", "SlowDown", "RequestTimeout",
                               "RequestTimeTooSkewed", "InternalError", "ServiceUnavailable", "RequestLimitExceeded"})


def is_retryable(exc: BaseException) -> bool:
    """Whether a failed step should be retried: transient network, 5xx and throttling → yes; bad
    input, missing references, verification failures → no."""
    if isinstance(exc, TaoDataIOError):
        return exc.retryable
    if isinstance(exc, ConnectionError | TimeoutError):
        return True
    status, code = _http_status(exc)
    if status in TRANSIENT_STATUS or code in _THROTTLING_CODES:
        return True
    try:
        from botocore.exceptions import (ConnectionClosedError, ConnectTimeoutError, EndpointConnectionError,
                                         ReadTimeoutError)
    except ImportError:  # pragma: no cover - botocore is a dependency
        return False
    return isinstance(exc, EndpointConnectionError | ConnectionClosedError | ReadTimeoutError | ConnectTimeoutError)


def _http_status(exc: BaseException) -> tuple[int | None, str | None]:
    """The HTTP status and error code a library exception carries, if any (botocore's
    ``response``, the kubernetes client's ``status``, an urllib ``code``)."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        meta = response.get("ResponseMetadata") or {}
        error = response.get("Error") or {}
        return meta.get("HTTPStatusCode"), error.get("Code")
    for name in ("status", "code", "status_code"):
        value = getattr(exc, name, None)
        if isinstance(value, int):
            return value, None
    return None, None


def os_error_message(exc: OSError) -> str:
    """What the operating system refused, in words: the path it was about and what to do.

    Why: ``PermissionError: [Errno 13]`` tells a user neither which of the paths involved (the
    destination, its state beside it, a parent) nor that the fix is theirs to make. Every such
    refusal is bad input for the command that met it (a path it cannot use), so callers report it
    like any other, naming the path.
    """
    path = exc.filename if exc.filename is not None else exc.filename2
    where = "" if path is None else f"{os.fsdecode(path)!r}: "
    code = exc.errno
    if code in (errno.EACCES, errno.EPERM):
        return f"{where}permission denied: give this user access to it, or choose a path it may write"
    if code == errno.ENOTDIR:
        blocker = _file_in_the_way(path)
        what = f"{blocker!r} is a file" if blocker else "a component is a file"
        return f"{where}not a directory: {what} where a directory is expected; move it away or choose another path"
    if code == errno.EISDIR:
        return f"{where}is a directory where a file is expected; choose another path"
    if code == errno.ENOENT:
        return (f"{where}no such file or directory, and it cannot be created there; check the path (special "
                "filesystems such as /proc and /sys hold no files of ours)")
    if code == errno.EROFS:
        return f"{where}read-only file system; choose a path on a writable one"
    if code in (errno.ENOSPC, errno.EDQUOT):
        return f"{where}no space left (or the quota is used up) on its device; free some, or choose another path"
    if code == errno.ENAMETOOLONG:
        return f"{where}a name is too long for the filesystem; choose a shorter path"
    return f"{where}{exc.strerror or type(exc).__name__}; check the path"


def _file_in_the_way(path: str | bytes | int | None) -> str | None:
    """The deepest existing ancestor of ``path`` when it is not a directory: what blocks it."""
    if not isinstance(path, str | bytes):
        return None
    current = os.fsdecode(path)
    while current not in ("", os.sep):
        if os.path.lexists(current):
            return None if os.path.isdir(current) else current
        current = os.path.dirname(current)
    return None
