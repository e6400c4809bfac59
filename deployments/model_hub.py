"""A model hub stand-in for the demo: serves directories as Hugging Face Hub repositories on
127.0.0.1, so ``hf://org/repo`` inputs are pulled by ``huggingface_hub`` itself (``HF_ENDPOINT``
points here) and checked against the digests the hub reports — without the internet.

    python -m deployments.model_hub --repo nvidia/tao-demo-detector=DIR [--port 0] [--port-file F]

Each repository has one revision, ``main``, whose commit is a digest of its files; every file is
served as a plain git blob (its ETag the git blob id, which the core verifies). Only what the
Hub client calls is answered: the model info with file metadata, and HEAD/GET of a file.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import signal
import sys
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

BRANCH = "main"


class Repo:
    def __init__(self, repo_id: str, root: Path) -> None:
        self.repo_id = repo_id
        self.files = {path.relative_to(root).as_posix(): path.read_bytes()
                      for path in sorted(root.rglob("*")) if path.is_file()}
        self.commit = hashlib.sha1(json.dumps(
            {name: hashlib.sha256(data).hexdigest() for name, data in self.files.items()}).encode()).hexdigest()

    def resolves(self, revision: str) -> bool:
        return revision in (BRANCH, self.commit)

    def info(self) -> dict[str, Any]:
        siblings = [{"rfilename": name, "size": len(data), "blobId": blob_id(data)} for name, data in self.files.items()]
        return {"_id": self.commit[:24], "id": self.repo_id, "modelId": self.repo_id, "sha": self.commit,
                "private": False, "siblings": siblings}


def blob_id(data: bytes) -> str:
    """git's id of a blob: what the Hub reports for a file kept in git."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class ModelHub(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, repos: Mapping[str, Path], port: int = 0) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.repos = {repo_id: Repo(repo_id, root) for repo_id, root in repos.items()}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ModelHub

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._answer(head=False)

    def do_HEAD(self) -> None:  # noqa: N802
        self._answer(head=True)

    def _answer(self, *, head: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        if path.startswith("/api/models/"):
            repo_id, _, revision = path[len("/api/models/"):].partition("/revision/")
            repo = self._repo(repo_id, revision or BRANCH)
            if repo is not None:
                self._send(200, json.dumps(repo.info()).encode(), {"Content-Type": "application/json"}, head)
            return
        parts = path.lstrip("/").split("/")
        if len(parts) < 5 or parts[2] != "resolve":
            self._send(404, b"not served by the demo hub", {"X-Error-Code": "EntryNotFound"}, head)
            return
        repo = self._repo("/".join(parts[:2]), parts[3])
        if repo is None:
            return
        data = repo.files.get("/".join(parts[4:]))
        if data is None:
            self._send(404, b"", {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": repo.commit}, head)
            return
        self._send(200, data, {"X-Repo-Commit": repo.commit, "ETag": f'"{blob_id(data)}"'}, head)

    def _repo(self, repo_id: str, revision: str) -> Repo | None:
        repo = self.server.repos.get(repo_id)
        if repo is None:
            self._send(404, b'{"error": "Repository not found"}', {"X-Error-Code": "RepoNotFound"}, False)
        elif not repo.resolves(revision):
            self._send(404, b'{"error": "Invalid rev id"}', {"X-Error-Code": "RevisionNotFound"}, False)
        else:
            return repo
        return None

    def _send(self, status: int, data: bytes, headers: Mapping[str, str], head: bool) -> None:
        self.send_response(status)
        for header, value in headers.items():
            self.send_header(header, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if not head and self.command != "HEAD":
            self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
        pass


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
