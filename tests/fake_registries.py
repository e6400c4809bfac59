"""A fake Hugging Face Hub and NGC model registry on 127.0.0.1, for the pull-model tests.

Why: the real clients — ``huggingface_hub`` itself and our NGC client — must run unmodified
against something that answers the endpoints they call, with the headers and error codes they
read. This threaded server answers exactly those, counts file downloads (so a test can prove a
rerun moved nothing), and misbehaves on request: wrong bytes, 503s, refused credentials, hostile
file names.

Hub endpoints: ``GET /api/models/{org}/{repo}[/revision/{rev}]?blobs=true`` (siblings with size,
blobId and lfs), ``HEAD|GET /{org}/{repo}/resolve/{rev}/{path}`` (X-Repo-Commit, ETag,
X-Linked-Etag/X-Linked-Size for LFS), errors as ``X-Error-Code`` RepoNotFound / RevisionNotFound /
EntryNotFound. NGC endpoints: ``GET /token`` (Basic ``$oauthtoken:<key>`` → bearer token),
``GET /v2/org/{org}[/team/{team}]/models/{model}/versions/{version}/files`` (paginated, at most
:attr:`FakeRegistries.ngc_page_cap` per page) and ``.../files/{path}`` (302 to ``/_blobs/{id}``,
which, like signed storage URLs, refuses requests that carry ``Authorization``).
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import secrets
import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class HubRepo:
    refs: dict[str, str]                 # branch or tag → commit sha
    commits: dict[str, dict[str, bytes]]  # commit sha → path → bytes
    lfs: frozenset[str]
    token: str | None
    default_branch: str = "main"


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
        self.hub: dict[str, HubRepo] = {}
        self.ngc: dict[str, NGCVersion] = {}         # "org/team/model:version" (team may be absent)
        self.ngc_keys: set[str] = set()
        self.ngc_page_cap = 2
        self.downloads: Counter[str] = Counter()      # "hf:{repo}/{path}" or "ngc:{model}:{version}/{path}"
        self.unexpected: list[str] = []
        self.token_scopes: list[list[str]] = []
        self._ngc_tokens: set[str] = set()
        self._blobs: dict[str, tuple[str, str]] = {}  # blob id → (ngc model key, path)
        self._blob_ids = itertools.count()
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.registries = self  # type: ignore[attr-defined]
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
        """Add a repo with named revisions (branch or tag → files); return name → commit sha."""
        refs, commits = {}, {}
        for name, files in revisions.items():
            sha = hashlib.sha1(repr((repo_id, sorted(files.items()))).encode()).hexdigest()
            refs[name], commits[sha] = sha, dict(files)
        self.hub[repo_id] = HubRepo(refs, commits, frozenset(lfs), token)
        return refs

    def add_ngc_version(self, model: str, version: str, files: Mapping[str, bytes], *, key: str) -> NGCVersion:
        """Add ``org/[team/]model:version`` readable with the NGC API key ``key``."""
        entry = NGCVersion(dict(files))
        self.ngc[f"{model}:{version}"] = entry
        self.ngc_keys.add(key)
        return entry

    def count(self, kind: str) -> int:
        """Downloads of all files served by ``kind`` (``hf`` or ``ngc``)."""
        return sum(n for name, n in self.downloads.items() if name.startswith(kind + ":"))

    # --- Hub ---------------------------------------------------------------------------------

    def hub_request(self, handler: _Handler, path: str, head: bool) -> None:
        if path.startswith("/api/models/"):
            rest = path[len("/api/models/"):]
            repo_part, _, revision = rest.partition("/revision/")
            repo_id = unquote(repo_part)
            repo = self._hub_repo(handler, repo_id)
            if repo is None:
                return
            sha = self._hub_commit(handler, repo, unquote(revision) if revision else repo.default_branch)
            if sha is None:
                return
            siblings = [self._sibling(path, data, path in repo.lfs) for path, data in sorted(repo.commits[sha].items())]
            handler.send_json(200, {"_id": "fake", "id": repo_id, "modelId": repo_id, "sha": sha,
                                    "private": repo.token is not None, "siblings": siblings})
            return
        parts = path.lstrip("/").split("/")
        if len(parts) < 5 or parts[2] != "resolve":
            self.unexpected.append(f"{handler.command} {path}")
            handler.send_json(404, {"error": "not served by the fake"})
            return
        org, repo_name, _, revision, *file_parts = parts
        repo = self._hub_repo(handler, f"{unquote(org)}/{unquote(repo_name)}")
        if repo is None:
            return
        sha = self._hub_commit(handler, repo, unquote(revision))
        if sha is None:
            return
        file_path = unquote("/".join(file_parts))
        data = repo.commits[sha].get(file_path)
        if data is None:
            handler.send_bytes(404, b"", {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": sha}, head)
            return
        headers = {"X-Repo-Commit": sha, "ETag": f'"{git_blob_sha1(data)}"'}
        if file_path in repo.lfs:
            headers.update({"X-Linked-Etag": f'"{hashlib.sha256(data).hexdigest()}"', "X-Linked-Size": str(len(data))})
        if not head:
            with self._lock:
                self.downloads[f"hf:{org}/{repo_name}/{file_path}"] += 1
        handler.send_bytes(200, data, headers, head)

    @staticmethod
    def _sibling(path: str, data: bytes, lfs: bool) -> dict[str, Any]:
        if not lfs:
            return {"rfilename": path, "size": len(data), "blobId": git_blob_sha1(data)}
        sha256 = hashlib.sha256(data).hexdigest()
        pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {len(data)}\n"
        return {"rfilename": path, "size": len(data), "blobId": git_blob_sha1(pointer.encode()),
                "lfs": {"size": len(data), "sha256": sha256, "pointerSize": len(pointer)}}

    def _hub_repo(self, handler: _Handler, repo_id: str) -> HubRepo | None:
        repo = self.hub.get(repo_id)
        if repo is None:
            handler.send_json(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
            return None
        sent = handler.headers.get("Authorization")
        if repo.token is not None and sent != f"Bearer {repo.token}":
            # What the Hub answers: anonymous → RepoNotFound (it hides private repos); a wrong
            # token → "Invalid credentials".
            headers = ({"X-Error-Message": "Invalid credentials in Authorization header"} if sent
                       else {"X-Error-Code": "RepoNotFound"})
            handler.send_json(401, {"error": "Unauthorized"}, headers)
            return None
        return repo

    @staticmethod
    def _hub_commit(handler: _Handler, repo: HubRepo, revision: str) -> str | None:
        sha = repo.refs.get(revision) or (revision if revision in repo.commits else None)
        if sha is None:
            handler.send_json(404, {"error": f"Invalid rev id: {revision}"},
                              {"X-Error-Code": "RevisionNotFound", "X-Error-Message": f"Invalid rev id: {revision}"})
        return sha

    # --- NGC ---------------------------------------------------------------------------------

    def ngc_token(self, handler: _Handler, query: dict[str, list[str]]) -> None:
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

    def ngc_api(self, handler: _Handler, path: str, query: dict[str, list[str]], head: bool) -> None:
        if handler.headers.get("Authorization", "")[len("Bearer "):] not in self._ngc_tokens:
            handler.send_json(401, {"requestStatus": {"statusCode": "UNAUTHORIZED"}})
            return
        parts = path.split("/")  # '', 'v2', 'org', org, ['team', team,] 'models', model, 'versions', version, 'files', ...
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
            entries = [{"path": name, "sizeInBytes": len(version.files[name]), "lastModified": "2025-01-01T00:00:00.000Z",
                        **({"sha256": hashlib.sha256(version.files[name]).hexdigest()} if version.report_sha256 else {})}
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

    def ngc_blob(self, handler: _Handler, blob: str, head: bool) -> None:
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


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ThreadingHTTPServer

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._route(head=False)

    def do_HEAD(self) -> None:  # noqa: N802
        self._route(head=True)

    def _route(self, *, head: bool) -> None:
        fake: FakeRegistries = self.server.registries  # type: ignore[attr-defined]
        parts = urlsplit(self.path)
        query = parse_qs(parts.query)
        if parts.path == "/token":
            fake.ngc_token(self, query)
        elif parts.path.startswith("/v2/org/"):
            fake.ngc_api(self, parts.path, query, head)
        elif parts.path.startswith("/_blobs/"):
            fake.ngc_blob(self, parts.path[len("/_blobs/"):], head)
        elif parts.path.startswith("/api/models/") or "/resolve/" in parts.path:
            fake.hub_request(self, parts.path, head)
        else:
            fake.unexpected.append(f"{self.command} {self.path}")
            self.send_json(404, {"error": "not served by the fake"})

    def send_json(self, status: int, body: Any, headers: Mapping[str, str] | None = None) -> None:
        self.send_bytes(status, json.dumps(body).encode(), {"Content-Type": "application/json", **(headers or {})},
                        self.command == "HEAD")

    def send_bytes(self, status: int, data: bytes, headers: Mapping[str, str], head: bool) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if not head:
            self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - keep test output quiet
        pass

