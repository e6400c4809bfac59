"""Talking to the API server: the connection (a kubeconfig context or the pod's service account)
and every call, with its failures turned into this package's errors.

Why one module: the official client changed shape between releases (36 has classic models, 37
pydantic ones that validate bodies and replies), while the backend reasons about objects as the
API server and our renderer spell them. So every call sends a plain dict, asks for the raw reply
(``_preload_content=False``) and decodes the JSON itself — the same dicts on every client version,
and pod logs come back as the text they are (the decoded path turns a log line that happens to be
JSON into a Python repr).

One place also decides how a failure reads: a 5xx, a 429 or a dropped connection is a retryable
:class:`~tao_data_io.errors.BackendError`; 401 and 403 say what to fix; a refused object names the
server's reason. Nothing of a kubeconfig — server address, user, token, certificate — is ever
stored, written back (``persist_config=False``) or put into a message: a connection is described
by its context name only.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.config import kube_config
from kubernetes.config.config_exception import ConfigException
from kubernetes.config.incluster_config import (SERVICE_CERT_FILENAME, SERVICE_HOST_ENV_NAME, SERVICE_TOKEN_FILENAME,
                                                InClusterConfigLoader)
from pydantic import ValidationError
from urllib3.exceptions import HTTPError, MaxRetryError, NewConnectionError, ProtocolError, SSLError
from urllib3.exceptions import TimeoutError as RequestTimeout

from ...redaction import Redactor
from ...errors import BackendError, CredentialError, TaoDataIOError, UsageError
from .names import check_dns_label

CONTEXT_VARIABLE = "TAO_K8S_CONTEXT"
NAMESPACE_VARIABLE = "TAO_K8S_NAMESPACE"
DEFAULT_NAMESPACE = "default"
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
#: (connect, read) seconds for one call: a dead API server must not hang a submit.
REQUEST_TIMEOUT = (10.0, 60.0)
#: HTTP statuses a retry can get past.
_RETRYABLE = frozenset({408, 425, 429, 500, 502, 503, 504})


class ApiError(BackendError):
    """The API server answered a call with an error status (``status``, its ``reason``)."""

    def __init__(self, message: str, *, status: int = 0, reason: str = "") -> None:  # bare: rebuilt from a message
        super().__init__(message, retryable=status in _RETRYABLE)
        self.status = status
        self.reason = reason


@dataclass(frozen=True)
class Connection:
    client: client.ApiClient
    namespace: str
    #: How messages name the cluster: ``context 'kind-tao'``, ``the current context``, ``the
    #: pod's service account`` — never its address.
    origin: str


def connect(*, namespace: str | None = None, context: str | None = None, kubeconfig: str | None = None,
            environ: Mapping[str, str] | None = None) -> Connection:
    """A client for the cluster: the kubeconfig (``kubeconfig``, else ``$KUBECONFIG``, else
    ``~/.kube/config``) at ``context`` (else ``$TAO_K8S_CONTEXT``, else its current context), or —
    with no kubeconfig, inside a pod — the service account. The namespace is ``namespace``, else
    ``$TAO_K8S_NAMESPACE``, else the context's, else the service account's, else ``default``."""
    env = os.environ if environ is None else environ
    context = context or env.get(CONTEXT_VARIABLE) or None
    paths = kubeconfig or env.get("KUBECONFIG") or "~/.kube/config"
    present = [p for p in paths.split(os.pathsep) if p and Path(p).expanduser().is_file()]
    wanted = namespace or env.get(NAMESPACE_VARIABLE) or None
    if present:
        config_file = os.pathsep.join(str(Path(p).expanduser()) for p in present)
        origin = f"kubeconfig context {context!r}" if context else "the kubeconfig's current context"
        try:
            contexts, current = kube_config.list_kube_config_contexts(config_file=config_file)
            chosen = next((c for c in contexts if c.get("name") == context), None) if context else current
            if chosen is None:
                names = sorted(str(c.get("name")) for c in contexts)
                raise UsageError(f"context {context!r} is not in the kubeconfig (it has {names}); set "
                                 f"{CONTEXT_VARIABLE} to one of them")
            api = kube_config.new_client_from_config(config_file=config_file, context=context, persist_config=False)
        except ConfigException as exc:
            raise UsageError(f"the kubeconfig cannot be used with {origin}: {_config_problem(exc)}; fix it, or "
                             f"point KUBECONFIG at another") from None
        found = wanted or (chosen.get("context") or {}).get("namespace") or DEFAULT_NAMESPACE
    elif context is None and env.get(SERVICE_HOST_ENV_NAME):
        origin = "the pod's service account"
        configuration = client.Configuration()
        try:
            InClusterConfigLoader(SERVICE_TOKEN_FILENAME, SERVICE_CERT_FILENAME,
                                  environ=dict(env)).load_and_set(configuration)
        except ConfigException as exc:
            raise UsageError(f"{origin} cannot be used: {_config_problem(exc)}") from None
        api = client.ApiClient(configuration)
        found = wanted or _service_account_namespace() or DEFAULT_NAMESPACE
    else:
        why = f"context {context!r} was asked for" if context else "no cluster is configured"
        raise UsageError(f"{why} but there is no kubeconfig at {paths}: set KUBECONFIG to one (or create "
                         "~/.kube/config), or run inside a pod with a service account")
    check_dns_label(found, what="namespace")
    return Connection(api, found, origin)


def _config_problem(exc: ConfigException) -> str:
    """The loader's first line: it names sections and keys, not their values (masked by the
    redactor all the same, should one be a credential of this environment)."""
    return Redactor()(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)


def _service_account_namespace() -> str | None:
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or None
    except OSError:
        return None


class Api:
    """The calls the backend makes, each with a phrase for messages (``what``), returning the
    reply as JSON (or text for logs) and raising :class:`ApiError`, :class:`BackendError` or
    :class:`UsageError` as the module docstring says."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.namespace = connection.namespace
        #: Masks credential values in what the API server says back (it may echo a refused value).
        self.redact = Redactor()
        self.core = client.CoreV1Api(connection.client)
        self.batch = client.BatchV1Api(connection.client)
        self.storage = client.StorageV1Api(connection.client)
        self.authz = client.AuthorizationV1Api(connection.client)
        self.custom = client.CustomObjectsApi(connection.client)  # Kueue's LocalQueues and Workloads
        self.version = client.VersionApi(connection.client)
        #: The server's (major, minor), once read (:func:`.facts.server_version`): the facts, the
        #: gates and the renderer all ask, and one connection talks to one server.
        self.known_version: tuple[int, int] | None = None

    def call(self, what: str, method: Callable[..., Any], *args: Any, text: bool = False, **kwargs: Any) -> Any:
        try:
            reply = method(*args, _preload_content=False, _request_timeout=REQUEST_TIMEOUT, **kwargs)
            data: bytes = reply.data
        except ApiException as exc:
            raise _api_error(what, exc, self.redact) from None
        except ValidationError as exc:  # client 37 checks a body before sending it
            raise UsageError(f"{what}: the kubernetes client refused the request: {exc.errors()[0]['msg']}") from None
        except (HTTPError, OSError) as exc:
            raise self._unreachable(what, exc) from None
        if text:
            return data.decode("utf-8", "replace")
        return json.loads(data) if data else {}

    def get(self, what: str, method: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        """The reply, or None when the API server says the object does not exist (a read of
        something absent, a delete of something already gone)."""
        try:
            found: dict[str, Any] = self.call(what, method, *args, **kwargs)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return found

    def masking(self, values: Mapping[str, str]) -> None:
        """Mask these values too: the credentials a submit read from an environment that may not
        be this process's."""
        self.redact = Redactor(extra=values)

    def delete(self, what: str, method: Callable[..., Any], *args: Any, **kwargs: Any) -> bool:
        """Delete; False when it was already gone, so a retried delete is a no-op."""
        return self.get(what, method, *args, **kwargs) is not None

    def _unreachable(self, what: str, exc: BaseException) -> TaoDataIOError:
        cause = exc.reason if isinstance(exc, MaxRetryError) else exc
        if isinstance(cause, SSLError):
            return CredentialError(f"{what}: the API server of {self.connection.origin} failed the TLS handshake "
                                   "(its certificate is not the one the kubeconfig trusts); fix the kubeconfig's "
                                   "certificate authority")
        how = ("refused the connection" if isinstance(cause, NewConnectionError | ConnectionRefusedError) else
               "timed out" if isinstance(cause, RequestTimeout | TimeoutError) else
               "dropped the connection" if isinstance(cause, ProtocolError | ConnectionError) else
               f"failed ({type(cause).__name__})")
        return BackendError(f"{what}: the API server of {self.connection.origin} {how}; try again", retryable=True)


#: How the API server words an authorization refusal (apiserver pkg/endpoints/handlers/
#: responsewriters/errors.go, forbiddenMessage): ``User "NAME" cannot VERB ...``; other 403s are
#: admission's (Pod Security, ResourceQuota, LimitRanger, webhooks), which RBAC advice would misdirect.
_RBAC_REFUSAL = re.compile(r'User "[^"]*" cannot ')


def _api_error(what: str, exc: ApiException, redact: Redactor) -> ApiError:
    status = int(exc.status or 0)
    reason = str(exc.reason or "")
    said = ""
    try:
        body = json.loads(exc.body or "{}")
        if isinstance(body, dict):
            reason = str(body.get("reason") or reason)
            said = str(body.get("message") or "")
    except ValueError:
        said = ""
    said = redact(said)
    if status == 401:
        message = (f"{what}: the API server did not accept this identity (401 Unauthorized); refresh the "
                   "kubeconfig's credentials (an expired token or certificate)")
    elif status == 403 and _RBAC_REFUSAL.search(said or ""):
        message = (f"{what}: forbidden (403): {said}; ask the cluster's admin for a Role (and a "
                   "RoleBinding to this identity) that allows it")
    elif status == 403:  # admission (Pod Security, quota, a webhook): its own message says what to change
        message = f"{what}: forbidden (403): {said or reason}"
    elif status in _RETRYABLE:
        message = f"{what}: the API server answered {status} {reason}{': ' + said if said else ''}; try again"
    else:
        message = f"{what}: the API server answered {status} {reason}{': ' + said if said else ''}"
    return ApiError(message, status=status, reason=reason)
