"""An HTTP proxy in front of the embedded S3 server that fails chosen requests: what a flaky
network or an overloaded S3 does to one page of a long listing, over real HTTP."""

from __future__ import annotations

import http.client
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit


class FaultProxy:
    """Forwards every request to ``upstream``; one for which ``fails(method, path)`` is true gets
    ``status`` instead (``times`` of them, then they pass; None: always). ``seen`` lists them all."""

    def __init__(self, upstream: str, fails: Callable[[str, str], bool], *, status: int = 500,
                 times: int | None = 1) -> None:
        self.seen: list[str] = []
        self.failed: list[str] = []
        target = urlsplit(upstream)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                proxy.seen.append(f"{self.command} {self.path}")
                if fails(self.command, self.path) and (times is None or len(proxy.failed) < times):
                    proxy.failed.append(f"{self.command} {self.path}")
                    payload = b"<Error><Code>InternalError</Code><Message>injected</Message></Error>"
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                connection = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
                connection.request(self.command, self.path, body=body, headers=headers)
                answer = connection.getresponse()
                data = answer.read()
                self.send_response(answer.status)
                for name, value in answer.getheaders():
                    if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                connection.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward  # the standard library's names

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
