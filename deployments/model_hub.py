"""A Hugging Face Hub stand-in on 127.0.0.1 — the one the demo and the tests both use — so
``hf://org/repo`` inputs are pulled by ``huggingface_hub`` itself (``HF_ENDPOINT`` points here) and
checked against the digests the hub reports, without the internet.

    python -m deployments.model_hub --repo nvidia/tao-demo-detector=DIR [--port 0] [--port-file F]

The demo serves directories, each as a repository with one revision, ``main``. The tests add
repositories with named revisions, LFS files and tokens, and count downloads
(``tests/fake_registries.py`` serves NGC beside it). Only what the Hub client calls is answered:
``GET /api/models/{org}/{repo}[/revision/{rev}]`` (siblings with size, blobId and lfs) and
``HEAD|GET /{org}/{repo}/resolve/{rev}/{path}`` (X-Repo-Commit, ETag — the git blob id the core
verifies — and X-Linked-Etag/X-Linked-Size for LFS), errors as ``X-Error-Code`` RepoNotFound /
RevisionNotFound / EntryNotFound, as the Hub sends them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import signal
import sys
import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult, unquote, urlsplit


def git_blob_sha1(data: bytes) -> str:
    """git's id of a blob: what the Hub reports for a file kept in git."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class HubRepo:
    refs: dict[str, str]                 # branch or tag → commit sha
    commits: dict[str, dict[str, bytes]]  # commit sha → path → bytes
    lfs: frozenset[str]
    token: str | None
    default_branch: str = "main"


class Hub:
    """The Hub's repositories and its answers; an HTTP server hands it the requests for Hub paths
    (:meth:`answer`). ``downloads`` counts each file served (``hf:{repo}/{path}``), so a test can
    prove a rerun moved nothing; ``unexpected`` collects requests the stand-in does not serve."""

    def __init__(self, downloads: Counter[str] | None = None, unexpected: list[str] | None = None) -> None:
        self.repos: dict[str, HubRepo] = {}
        self.downloads: Counter[str] = Counter() if downloads is None else downloads
        self.unexpected: list[str] = [] if unexpected is None else unexpected
        self._lock = threading.Lock()

    def add_repo(self, repo_id: str, revisions: Mapping[str, Mapping[str, bytes]], *, lfs: Iterable[str] = (),
                 token: str | None = None) -> dict[str, str]:
        """Add a repo with named revisions (branch or tag → files); return name → commit sha."""
        refs, commits = {}, {}
        for name, files in revisions.items():
            sha = hashlib.sha1(repr((repo_id, sorted(files.items()))).encode()).hexdigest()
            refs[name], commits[sha] = sha, dict(files)
        self.repos[repo_id] = HubRepo(refs, commits, frozenset(lfs), token)
        return refs

    def add_directory(self, repo_id: str, root: Path) -> str:
        """Serve the files below ``root`` as ``repo_id`` at revision ``main``; return its commit."""
        files = {path.relative_to(root).as_posix(): path.read_bytes() for path in sorted(root.rglob("*"))
                 if path.is_file()}
        return self.add_repo(repo_id, {"main": files})["main"]

    @staticmethod
    def serves(path: str) -> bool:
        return path.startswith("/api/models/") or "/resolve/" in path

    def answer(self, handler: Handler, path: str, head: bool) -> None:
        if path.startswith("/api/models/"):
            repo_part, _, revision = path[len("/api/models/"):].partition("/revision/")
            repo_id = unquote(repo_part)
            repo = self._repo(handler, repo_id)
            if repo is None:
                return
            sha = self._commit(handler, repo, unquote(revision) if revision else repo.default_branch)
            if sha is None:
                return
            siblings = [self._sibling(path, data, path in repo.lfs) for path, data in sorted(repo.commits[sha].items())]
            handler.send_json(200, {"_id": sha[:24], "id": repo_id, "modelId": repo_id, "sha": sha,
                                    "private": repo.token is not None, "siblings": siblings})
            return
        parts = path.lstrip("/").split("/")
        if len(parts) < 5 or parts[2] != "resolve":
            self.unexpected.append(f"{handler.command} {path}")
            handler.send_json(404, {"error": "not served by the stand-in"})
            return
        org, repo_name, _, revision, *file_parts = parts
        repo = self._repo(handler, f"{unquote(org)}/{unquote(repo_name)}")
        if repo is None:
            return
        sha = self._commit(handler, repo, unquote(revision))
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

    def _repo(self, handler: Handler, repo_id: str) -> HubRepo | None:
        repo = self.repos.get(repo_id)
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
    def _commit(handler: Handler, repo: HubRepo, revision: str) -> str | None:
        sha = repo.refs.get(revision) or (revision if revision in repo.commits else None)
        if sha is None:
            handler.send_json(404, {"error": f"Invalid rev id: {revision}"},
                              {"X-Error-Code": "RevisionNotFound", "X-Error-Message": f"Invalid rev id: {revision}"})
        return sha


class Handler(BaseHTTPRequestHandler):
    """Hands each request to its server's ``route(handler, url, head)``."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # http.server's naming
        self.server.route(self, urlsplit(self.path), head=False)  # type: ignore[attr-defined]

    def do_HEAD(self) -> None:
        self.server.route(self, urlsplit(self.path), head=True)  # type: ignore[attr-defined]

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

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's parameter; quiet
        pass


class ModelHub(ThreadingHTTPServer):
    """The Hub stand-in as a server: ``ModelHub({"org/repo": DIR})``, then ``serve_forever``."""

    daemon_threads = True

    def __init__(self, repos: Mapping[str, Path] | None = None, port: int = 0) -> None:
        super().__init__(("127.0.0.1", port), Handler)
        self.hub = Hub()
        for repo_id, root in (repos or {}).items():
            self.hub.add_directory(repo_id, root)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def route(self, handler: Handler, url: SplitResult, head: bool) -> None:
        if self.hub.serves(url.path):
            self.hub.answer(handler, url.path, head)
        else:
            self.hub.unexpected.append(f"{handler.command} {handler.path}")
            handler.send_json(404, {"error": "not served by the stand-in"})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deployments.model_hub", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", action="append", required=True, metavar="ORG/NAME=DIR",
                        help="serve DIR as the repository ORG/NAME (repeatable)")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file", type=Path, help="write the chosen port here once serving")
    args = parser.parse_args(argv)
    repos = {spec.split("=", 1)[0]: Path(spec.split("=", 1)[1]) for spec in args.repo}
    hub = ModelHub(repos, args.port)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    threading.Thread(target=hub.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
    if args.port_file:
        args.port_file.write_text(str(hub.server_address[1]))
    print(f"model hub stand-in on {hub.url}: {', '.join(repos)}", flush=True)
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    hub.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
