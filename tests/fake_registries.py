"""A fake NGC model registry beside the Hugging Face Hub stand-in (:mod:`deployments.model_hub`,
the one the demo serves too), on one 127.0.0.1 port, for the pull-model tests.

Why: the real clients — ``huggingface_hub`` itself and our NGC client — must run unmodified
against something that answers the endpoints they call, with the headers and error codes they
read. This threaded server answers exactly those, counts file downloads (so a test can prove a
rerun moved nothing), and misbehaves on request: wrong bytes, 503s, refused credentials, hostile
file names.

Hub endpoints: those of :class:`deployments.model_hub.Hub`. NGC endpoints: ``GET /token``
(Basic ``$oauthtoken:<key>`` → bearer token),
``GET /v2/org/{org}[/team/{team}]/models/{model}/versions/{version}/files`` (paginated, at most
:attr:`FakeRegistries.ngc_page_cap` per page) and ``.../files/{path}`` (302 to ``/_blobs/{id}``,
which, like signed storage URLs, refuses requests that carry ``Authorization``).
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import secrets
import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from urllib.parse import SplitResult, parse_qs, unquote

from deployments.model_hub import Handler, Hub


@dataclass
class NGCVersion:
    files: dict[str, bytes]
    #: Bytes served instead of the listed ones (the listing keeps the true size and sha256).
    served: dict[str, bytes] = field(default_factory=dict)
    #: Answer this many 503s for a file before serving it.
    fail_next: Counter[str] = field(default_factory=Counter)
    #: Whether the listing reports each file's sha256 (else only its size).
    report_sha256: bool = True


class FakeRegistries:
    """Start with ``with FakeRegistries() as fake:``; point ``HF_ENDPOINT``, ``NGC_API_URL`` and
    ``NGC_AUTH_URL`` at :attr:`url`."""

    def __init__(self) -> None:
        self.ngc: dict[str, NGCVersion] = {}         # "org/team/model:version" (team may be absent)
        self.ngc_keys: set[str] = set()
        self.ngc_page_cap = 2
        self.downloads: Counter[str] = Counter()      # "hf:{repo}/{path}" or "ngc:{model}:{version}/{path}"
        self.unexpected: list[str] = []
        self.hub = Hub(self.downloads, self.unexpected)
        self.token_scopes: list[list[str]] = []
        self._ngc_tokens: set[str] = set()
        self._blobs: dict[str, tuple[str, str]] = {}  # blob id → (ngc model key, path)
        self._blob_ids = itertools.count()
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._server.route = self.route  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="fake-registries", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeRegistries:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    # --- setup -------------------------------------------------------------------------------

    def add_hub_repo(self, repo_id: str, revisions: Mapping[str, Mapping[str, bytes]], *, lfs: Iterable[str] = (),
                     token: str | None = None) -> dict[str, str]:
        """Add a Hub repo with named revisions (branch or tag → files); return name → commit sha."""
        return self.hub.add_repo(repo_id, revisions, lfs=lfs, token=token)

    def add_ngc_version(self, model: str, version: str, files: Mapping[str, bytes], *, key: str) -> NGCVersion:
        """Add ``org/[team/]model:version`` readable with the NGC API key ``key``."""
        entry = NGCVersion(dict(files))
        self.ngc[f"{model}:{version}"] = entry
        self.ngc_keys.add(key)
        return entry

    def count(self, kind: str) -> int:
        """Downloads of all files served by ``kind`` (``hf`` or ``ngc``)."""
        return sum(n for name, n in self.downloads.items() if name.startswith(kind + ":"))

    # --- NGC ---------------------------------------------------------------------------------

    def ngc_token(self, handler: Handler, query: dict[str, list[str]]) -> None:
        keys = {base64.b64encode(f"$oauthtoken:{key}".encode()).decode() for key in self.ngc_keys}
        auth = handler.headers.get("Authorization", "")
        if query.get("service") != ["ngc"] or not auth.startswith("Basic ") or auth[len("Basic "):] not in keys:
            handler.send_json(401, {"requestStatus": {"statusCode": "UNAUTHORIZED"}})
            return
        token = "ngc-bearer-" + secrets.token_hex(8)
        with self._lock:
            self._ngc_tokens.add(token)
            self.token_scopes.append(query.get("scope", []))
        handler.send_json(200, {"token": token, "expires_in": 300})

    def ngc_api(self, handler: Handler, path: str, query: dict[str, list[str]], head: bool) -> None:
        if handler.headers.get("Authorization", "")[len("Bearer "):] not in self._ngc_tokens:
            handler.send_json(401, {"requestStatus": {"statusCode": "UNAUTHORIZED"}})
            return
        # '', 'v2', 'org', org, ['team', team,] 'models', model, 'versions', version, 'files', ...
        parts = path.split("/")
        team = parts[5] if parts[4] == "team" else None
        rest = parts[6:] if team else parts[4:]
        if len(rest) < 5 or rest[0] != "models" or rest[2] != "versions" or rest[4] != "files":
            self.unexpected.append(f"GET {path}")
            handler.send_json(404, {"requestStatus": {"statusCode": "NOT_FOUND"}})
            return
        model = "/".join(unquote(p) for p in [parts[3], *([team] if team else []), rest[1]])
        key = f"{model}:{unquote(rest[3])}"
        version = self.ngc.get(key)
        if version is None:
            handler.send_json(404, {"requestStatus": {"statusCode": "NOT_FOUND"}})
            return
        if len(rest) == 5:
            size = min(int(query.get("page-size", ["25"])[0]), self.ngc_page_cap)
            page = int(query.get("page-number", ["0"])[0])
            names = sorted(version.files)
            entries = [{"path": name, "sizeInBytes": len(version.files[name]),
                        "lastModified": "2025-01-01T00:00:00.000Z",
                        **({"sha256": hashlib.sha256(version.files[name]).hexdigest()}
                           if version.report_sha256 else {})}
                       for name in names[page * size:(page + 1) * size]]
            handler.send_json(200, {"modelFiles": entries, "paginationInfo": {
                "index": page, "size": size, "totalPages": -(-len(names) // size), "totalResults": len(names)}})
            return
        file_path = unquote("/".join(rest[5:]))
        if file_path not in version.files:
            handler.send_json(404, {"requestStatus": {"statusCode": "NOT_FOUND"}})
            return
        blob = f"b{next(self._blob_ids)}"
        with self._lock:
            self._blobs[blob] = (key, file_path)
        handler.send_bytes(302, b"", {"Location": f"{self.url}/_blobs/{blob}?signature=fake"}, head)

    def ngc_blob(self, handler: Handler, blob: str, head: bool) -> None:
        if "Authorization" in handler.headers:
            handler.send_json(400, {"error": "signed URLs take no Authorization header"})
            return
        key, file_path = self._blobs[blob]
        version = self.ngc[key]
        with self._lock:
            failing = version.fail_next[file_path] > 0
            version.fail_next[file_path] -= failing
        if failing:
            handler.send_json(503, {"error": "try again"})
            return
        if not head:
            with self._lock:
                self.downloads[f"ngc:{key}/{file_path}"] += 1
        handler.send_bytes(200, version.served.get(file_path, version.files[file_path]), {}, head)

    # --- routing -----------------------------------------------------------------------------

    def route(self, handler: Handler, url: SplitResult, head: bool) -> None:
        query = parse_qs(url.query)
        if url.path == "/token":
            self.ngc_token(handler, query)
        elif url.path.startswith("/v2/org/"):
            self.ngc_api(handler, url.path, query, head)
        elif url.path.startswith("/_blobs/"):
            self.ngc_blob(handler, url.path[len("/_blobs/"):], head)
        elif self.hub.serves(url.path):
            self.hub.answer(handler, url.path, head)
        else:
            self.unexpected.append(f"{handler.command} {handler.path}")
            handler.send_json(404, {"error": "not served by the fake"})
