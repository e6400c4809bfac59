"""Screenshot a flow run's page in the Prefect UI with one of its tabs open, in headless Chromium
(Debian's ``chromium``), for docs/prefect.md. A plain ``chromium --screenshot URL`` always shows the
Logs tab (the page picks its tab before the run has loaded), so this drives the page over the
DevTools protocol: load it, click the tab, wait, capture.

    .venv/bin/python docs/screenshot.py http://127.0.0.1:PORT/runs/flow-run/ID docs/images/demo-flow-run.png \
        [--tab Artifacts] [--width 1600] [--height 1500]
    .venv/bin/python docs/screenshot.py http://127.0.0.1:PORT/artifacts/key/launch-JOB docs/images/x.png --tab ''


Against the demo's server: ``KEEP=1 make demo``, then the URL it prints; ``make demo-stop`` after.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import websockets

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars"]
CLICK_TAB = """(() => { const tab = [...document.querySelectorAll('*')]
  .find(e => e.children.length === 0 && e.textContent.trim() === %s); if (tab) { tab.click(); return true }
  return false })()"""


async def capture(ws_url: str, url: str, tab: str, width: int, height: int) -> bytes:
    async with websockets.connect(ws_url, max_size=64 * 1024 * 1024) as page:
        ids = iter(range(1, 1_000_000))

        async def call(method: str, **params: Any) -> dict[str, Any]:
            number = next(ids)
            await page.send(json.dumps({"id": number, "method": method, "params": params}))
            while True:
                message = json.loads(await page.recv())
                if message.get("id") == number:
                    return dict(message.get("result", {}))

        await call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
        await call("Page.navigate", url=url)
        deadline = time.monotonic() + 30
        while tab and time.monotonic() < deadline:
            await asyncio.sleep(1)
            clicked = await call("Runtime.evaluate", expression=CLICK_TAB % json.dumps(tab), returnByValue=True)
            if clicked.get("result", {}).get("value"):
                break
        else:
            if tab:
                raise RuntimeError(f"no {tab!r} tab on {url}")
        await asyncio.sleep(4)  # the page (and the tab) load and render
        shot = await call("Page.captureScreenshot", format="png")
        return base64.b64decode(shot["data"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url")
    parser.add_argument("output", type=Path)
    parser.add_argument("--tab", default="Artifacts", help="the tab to open; '' for none (an artifact's page)")
    parser.add_argument("--width", type=int, default=1600)
    parser.add_argument("--height", type=int, default=1500)
    args = parser.parse_args()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    browser = subprocess.Popen(["chromium", *FLAGS, f"--user-data-dir={profile}", f"--remote-debugging-port={port}",
                                "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                pages = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json", timeout=1))
                break
            except OSError:
                time.sleep(0.1)
        page = next(p for p in pages if p["type"] == "page")
        args.output.write_bytes(asyncio.run(capture(page["webSocketDebuggerUrl"], args.url, args.tab, args.width,
                                                    args.height)))
    finally:
        browser.terminate()
        browser.wait()
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
