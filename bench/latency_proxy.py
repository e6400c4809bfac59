"""Loopback TCP forwarder that adds a fixed latency per HTTP request, and can inject faults: answer
the first N connections with ``503 ServiceUnavailable`` (a transient S3 fault, for the flow tests),
or hand each request to a hook that may act before it is forwarded.

Used by benchmarks to emulate a remote S3 endpoint in front of a local server.
The delay is applied to the first client->server chunk of a connection and to
the first client->server chunk after any server->client data (the start of the
next request on a keep-alive connection); the rest of a request body streams
without extra delay. Response data is never delayed.

Tests use ``on_request`` to make the server change under a client at an exact moment: it sees
the first chunk of every request (its request line and headers) before that request is
forwarded, may block while it acts (overwrite the object being downloaded, so a later ranged
part reads another version), and may return an event: the response is then held after its first
chunk until the event is set (a download stays in flight for as long as the test needs).

Library use (the proxy runs its own event loop in a daemon thread)::

    with LatencyProxy("127.0.0.1", 8333, delay_s=0.02) as proxy:
        url = f"http://127.0.0.1:{proxy.port}"

    with LatencyProxy("127.0.0.1", 8333, delay_s=0, fail_first=2) as proxy:
        ...  # the first two requests (each on a new connection) get a 503; proxy.failed counts them

A fault is answered before anything reaches the server, with ``Connection: close``, so the
client's retry comes on a new connection and meets the next fault or the server.

CLI::

    python bench/latency_proxy.py --target 127.0.0.1:8333 --delay-ms 20 --port 0
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType

_CHUNK = 256 * 1024
#: Sees the start of each request before it is forwarded; may return an event that holds the
#: response after its first chunk until it is set.
RequestHook = Callable[[bytes], "threading.Event | None"]


def _loopback(host: str) -> str:
    """Return host as a loopback IP literal; refuse anything non-loopback."""
    ip = "127.0.0.1" if host == "localhost" else host
    if not ipaddress.ip_address(ip).is_loopback:
        raise ValueError(f"only loopback targets are allowed, got {host!r}")
    return ip


class LatencyProxy:
    """Asyncio TCP forwarder on 127.0.0.1 with per-request latency."""

    def __init__(self, target_host: str, target_port: int, delay_s: float = 0.02, port: int = 0, *,
                 on_request: RequestHook | None = None, fail_first: int = 0) -> None:
        self.target_host = _loopback(target_host)
        self.target_port = target_port
        self.delay_s = delay_s
        self.on_request = on_request
        #: Connections still to answer with a 503 (touched only on the proxy's event loop).
        self.fail_first = fail_first
        self.failed = 0
        self.port = port  # replaced by the bound port once started
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter,
                    state: dict[str, object], upstream: bool) -> None:
        """Copy src -> dst until EOF, then half-close dst."""
        try:
            while chunk := await src.read(_CHUNK):
                if upstream and state["fresh"]:
                    state["fresh"] = False
                    if self.on_request is not None:
                        state["hold"] = await asyncio.to_thread(self.on_request, chunk)
                    await asyncio.sleep(self.delay_s)
                elif not upstream:
                    state["fresh"] = True  # next client bytes start a new request
                dst.write(chunk)
                await dst.drain()
                hold = state.get("hold")
                if not upstream and isinstance(hold, threading.Event):
                    state["hold"] = None
                    await asyncio.to_thread(hold.wait)
            if dst.can_write_eof() and not dst.is_closing():
                dst.write_eof()
        except (ConnectionError, OSError):
            dst.close()  # propagate the failure to the other side

    async def _handle(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(c_writer)
        s_writer: asyncio.StreamWriter | None = None
        try:
            if self.fail_first > 0:
                self.fail_first -= 1
                self.failed += 1
                await self._unavailable(c_reader, c_writer)
                return
            s_reader, s_writer = await asyncio.open_connection(self.target_host, self.target_port)
            self._writers.add(s_writer)
            state: dict[str, object] = {"fresh": True, "hold": None}
            await asyncio.gather(self._pump(c_reader, s_writer, state, True),
                                 self._pump(s_reader, c_writer, state, False))
        except (ConnectionError, OSError, asyncio.CancelledError):
            pass  # swallow cancel: 3.11's stream callback logs cancelled handlers
        finally:
            for w in (c_writer, s_writer):
                if w is not None:
                    w.close()
                    self._writers.discard(w)
            self._tasks.discard(task)

    @staticmethod
    async def _unavailable(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Read the start of the request and answer it as S3 does when it sheds load."""
        await reader.read(_CHUNK)
        body = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>ServiceUnavailable</Code>'
                b"<Message>injected by the test proxy</Message></Error>")
        writer.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/xml\r\n"
                     b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
        await writer.drain()

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()  # don't wait for unflushed buffers
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()
        await asyncio.sleep(0)  # let connection_lost callbacks close the sockets

    def start(self) -> LatencyProxy:
        """Bind the listening socket and serve from a background thread."""
        try:
            self._loop.run_until_complete(self._start())
        except BaseException:
            self._loop.close()
            raise
        self._thread = threading.Thread(target=self._loop.run_forever, name="latency-proxy", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving, drop live connections, join the thread, close the loop."""
        if self._thread is None:
            return
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._thread = None
        self._loop.close()

    def __enter__(self) -> LatencyProxy:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def spawn(target_port: int, delay_ms: int) -> tuple[subprocess.Popen[bytes], str]:
    """Run the proxy as its own process (so it never competes for a contender's GIL) in front of
    127.0.0.1:``target_port``; return the process and the proxied endpoint URL."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    proc = subprocess.Popen([sys.executable, __file__, "--target", f"127.0.0.1:{target_port}",
                             "--delay-ms", str(delay_ms), "--port", str(port)], stdout=subprocess.DEVNULL)
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.05)
    proc.terminate()
    raise RuntimeError(f"latency proxy did not start on port {port}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True, help="HOST:PORT on loopback")
    parser.add_argument("--delay-ms", type=float, default=20.0)
    parser.add_argument("--port", type=int, default=0, help="listen port (0 = any free)")
    args = parser.parse_args()
    host, _, port = args.target.rpartition(":")
    with LatencyProxy(host, int(port), args.delay_ms / 1000, args.port) as proxy:
        print(f"listening on 127.0.0.1:{proxy.port} -> {proxy.target_host}:{proxy.target_port}", flush=True)
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        try:
            while not stop.wait(0.5):
                pass
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
