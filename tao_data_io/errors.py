"""Error types shared by the core, the CLI and the Prefect tasks, and the one answer to "should
this be retried?".

Callers need different reactions, so the families say which:

* :class:`UsageError` — the input is wrong (a bad URL, a missing credential, a key that would
  escape the destination). Retrying cannot help; the message names the field or parameter, the
  value and the fix. The CLI exits 2.
* :class:`TransferError` — the input was fine but some bytes did not move. Every complete file
  is kept and a rerun converges, so it is retryable — except its subclasses that report a fact a
  rerun will find again (:class:`VerificationError`, missing references).
* :class:`BackendError` — the compute backend (a cluster, the local sandbox) failed; it says
  itself whether a retry can help (an API 503 can, a refused admission cannot).

:func:`is_retryable` is what an orchestrator's retry condition calls: our own errors carry the
answer, and transient failures of the libraries below us (throttling, 5xx, dropped connections,
timeouts) are recognised by type.
"""

from __future__ import annotations


class TaoDataIOError(Exception):
    """Base class for every error this package raises on purpose."""

    #: Whether running the same step again can succeed.
    retryable: bool = False


class UsageError(TaoDataIOError, ValueError):
    """Bad input: retrying will not help; the message says what to change."""


class CredentialError(UsageError):
    """A credential the operation needs is not in the environment, or was refused."""


class UnsafePathError(UsageError):
    """A key or member name would land outside its destination, or is not a plain path."""


class TransferError(TaoDataIOError):
    """Some objects failed to move; complete files were kept and a rerun converges."""

    retryable = True


class VerificationError(TransferError):
    """Bytes arrived but are not what the source says they must be (size, digest); nothing was
    published. A rerun fetches the same bytes again, so it is not retried automatically."""

    retryable = False


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
