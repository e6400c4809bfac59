"""NGC's model registry as a :class:`~.registry.Registry`, over its REST API. ``NGC_KEY`` is
exchanged for a short-lived bearer token at ``$NGC_AUTH_URL/token`` (default
https://authn.nvidia.com); the API is ``$NGC_API_URL/v2/...`` (default https://api.ngc.nvidia.com).
Both overrides exist for mirrors and tests."""

from __future__ import annotations

import base64
import http.client
import json
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ...credentials import require_env
from ...redaction import mask_userinfo
from ...errors import CredentialError, TransferError, UsageError
from ...uris import NGCModelURI
from .registry import HEX, SHA256, Digest, Listing, RemoteFile

DEFAULT_NGC_API_URL = "https://api.ngc.nvidia.com"
DEFAULT_NGC_AUTH_URL = "https://authn.nvidia.com"
_CHUNK = 1 << 20
# Throttling, server errors and dropped connections are retried with backoff.
_NGC_ATTEMPTS = 4
_NGC_FIRST_BACKOFF_S = 0.5
_NGC_RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_NGC_TIMEOUT_S = 60
_NGC_PAGE_SIZE = 1000

T = TypeVar("T")


class NGCRegistry:
    """NGC's model registry REST API, as NGC's own tools call it:

    * ``GET $NGC_AUTH_URL/token?service=ngc&scope=group/ngc:{org}[&scope=group/ngc:{org}/{team}]``
      with HTTP Basic ``$oauthtoken:<NGC_KEY>`` → ``{"token": ...}``, then ``Authorization: Bearer``;
    * ``GET $NGC_API_URL/v2/org/{org}[/team/{team}]/models/{model}/versions/{version}/files
      ?page-size=N&page-number=P`` → ``{"modelFiles": [{"path", "sizeInBytes", "sha256"}, ...],
      "paginationInfo": {"totalPages": ...}}``;
    * ``GET .../versions/{version}/files/{path}`` → the bytes, usually via a redirect to signed
      storage. The bearer token is never sent past a redirect.
    """

    def __init__(self, uri: NGCModelURI, environ: Mapping[str, str]) -> None:
        self.uri = uri
        self.key = require_env("NGC_KEY", f"pull {uri} from NGC", environ)
        self.api = (environ.get("NGC_API_URL") or DEFAULT_NGC_API_URL).rstrip("/")
        self.authn = (environ.get("NGC_AUTH_URL") or DEFAULT_NGC_AUTH_URL).rstrip("/")
        #: How messages name the two services: never with a password from the URL's userinfo.
        self.api_shown, self.authn_shown = mask_userinfo(self.api), mask_userinfo(self.authn)
        self._token: str | None = None
        quote = urllib.parse.quote
        team = f"/team/{quote(uri.team)}" if uri.team else ""
        self._version_url = (f"{self.api}/v2/org/{quote(uri.org)}{team}/models/{quote(uri.model)}"
                             f"/versions/{quote(uri.version)}")
        self._no_such_version = (f"NGC has no model version {uri} (HTTP 404) at {self.api_shown}: "
                                 "check the org, team, model and version")

    def listing(self) -> Listing:
        files: list[RemoteFile] = []
        page, pages = 0, 1
        while page < pages:
            body = self._get_json(f"{self._version_url}/files?page-size={_NGC_PAGE_SIZE}&page-number={page}",
                                  f"listing the files of {self.uri} at {self.api_shown} (NGC_API_URL)",
                                  self._no_such_version)
            files.extend(self._remote_file(entry) for entry in body.get("modelFiles") or ())
            pages = int((body.get("paginationInfo") or {}).get("totalPages") or 1)
            page += 1
        return Listing(self.uri.version, tuple(files))

    def fetch(self, files: Sequence[RemoteFile], revision: str, staging: Path,
              on_file: Callable[[RemoteFile], None]) -> None:
        for remote in files:
            target = staging / remote.path
            target.parent.mkdir(parents=True, exist_ok=True)
            url = f"{self._version_url}/files/{urllib.parse.quote(remote.path)}"

            def download(headers: dict[str, str], url: str = url, target: Path = target) -> None:
                with _ngc_open(url, headers) as response, open(target, "wb") as handle:
                    shutil.copyfileobj(response, handle, _CHUNK)

            self._call(f"downloading {remote.path!r} of {self.uri}", self._no_such_version, download)
            on_file(remote)

    def _remote_file(self, entry: Any) -> RemoteFile:
        path = entry.get("path") if isinstance(entry, dict) else None
        size = entry.get("sizeInBytes") if isinstance(entry, dict) else None
        if not isinstance(path, str) or not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise TransferError(f"NGC listed a file of {self.uri} without a usable 'path' and 'sizeInBytes' "
                                f"({entry!r}), so completeness cannot be verified")
        sha256 = entry.get("sha256")
        sha256 = sha256.lower() if isinstance(sha256, str) else None
        return RemoteFile(path, size, Digest(SHA256, sha256) if sha256 and HEX[SHA256].fullmatch(sha256) else None)

    def _bearer(self) -> dict[str, str]:
        if self._token is None:
            scopes = [("scope", f"group/ngc:{self.uri.org}")]
            if self.uri.team:
                scopes.append(("scope", f"group/ngc:{self.uri.org}/{self.uri.team}"))
            query = urllib.parse.urlencode([("service", "ngc"), *scopes])
            basic = base64.b64encode(f"$oauthtoken:{self.key}".encode()).decode("ascii")
            body = self._get_json(f"{self.authn}/token?{query}",
                                  f"exchanging NGC_KEY for a token at {self.authn_shown} (NGC_AUTH_URL)",
                                  f"NGC's token service {self.authn_shown}/token does not exist (HTTP 404); "
                                  "check NGC_AUTH_URL",
                                  basic=basic)
            token = body.get("token")
            if not isinstance(token, str) or not token:
                raise TransferError(f"NGC's token service at {self.authn_shown} answered without a token")
            self._token = token
        return {"Authorization": f"Bearer {self._token}"}

    def _get_json(self, url: str, what: str, missing: str, *, basic: str | None = None) -> dict[str, Any]:
        def get(headers: dict[str, str]) -> Any:
            with _ngc_open(url, {**headers, "Accept": "application/json"}) as response:
                return json.load(response)

        if basic is None:
            body = self._call(what, missing, get)
        else:
            body = self._call(what, missing, lambda _: get({"Authorization": f"Basic {basic}"}), bearer=False)
        if not isinstance(body, dict):
            raise TransferError(f"{what}: NGC answered with JSON that is not an object")
        return body

    def _call(self, what: str, missing: str, send: Callable[[dict[str, str]], T], *, bearer: bool = True) -> T:
        """One HTTP exchange: retry throttling, 5xx and dropped connections with backoff; get a
        fresh token once on 401/403 (tokens are short-lived); map the rest to our errors."""
        delay, refreshed, failure = _NGC_FIRST_BACKOFF_S, False, ""
        for attempt in range(1, _NGC_ATTEMPTS + 1):
            try:
                return send(self._bearer() if bearer else {})
            except urllib.error.HTTPError as exc:
                exc.close()
                if exc.code in (401, 403) and bearer and not refreshed:
                    self._token, refreshed = None, True
                    continue
                if exc.code in (401, 403):
                    raise self._refused(exc.code) from None
                if exc.code == 404:
                    raise UsageError(missing) from None
                failure = f"HTTP {exc.code} {exc.reason}"
                if exc.code not in _NGC_RETRY_STATUS:
                    break
            except (OSError, http.client.HTTPException, json.JSONDecodeError) as exc:
                failure = f"{type(exc).__name__}: {exc}"
            if attempt < _NGC_ATTEMPTS:
                time.sleep(delay)
                delay *= 2
        raise TransferError(f"{what} failed: {failure}; rerun to retry")

    def _refused(self, status: int) -> CredentialError:
        scope = f"org {self.uri.org!r}" + (f" team {self.uri.team!r}" if self.uri.team else "")
        return CredentialError(f"NGC refused NGC_KEY for {self.uri} (HTTP {status}): the key is invalid or expired, "
                               f"or has no access to {scope}; export a valid NGC_KEY")


def _ngc_open(url: str, headers: Mapping[str, str]) -> http.client.HTTPResponse:
    """GET ``url``; headers are "unredirected" so credentials never follow a redirect elsewhere."""
    request = urllib.request.Request(url)
    for name, value in headers.items():
        request.add_unredirected_header(name, value)
    response: http.client.HTTPResponse = urllib.request.urlopen(request, timeout=_NGC_TIMEOUT_S)
    return response
