"""A minimal Chrome DevTools Protocol client for headless-Chromium tests of the dashboard.

Starts ``chromium --headless`` with a debugging port, opens one page and lets a
test navigate, evaluate JavaScript and take screenshots, so it can watch a page
update live (no reload) while the server changes underneath it.
"""

from __future__ import annotations

import base64
import itertools
import json
import shutil
import subprocess
import time
from contextlib import ExitStack
from pathlib import Path

import httpx

from tests.server.harness import free_port

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_browser() -> str | None:
    return next((p for p in map(shutil.which, BROWSERS) if p), None)


class Browser:
    def __init__(self, binary: str, profile_dir: Path) -> None:
        from websockets.sync.client import connect

        self.port = free_port()
        self.proc = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-dev-shm-usage", "--no-first-run", "--window-size=1400,1000",
             f"--remote-debugging-port={self.port}", f"--user-data-dir={profile_dir}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # 120 s: at load 20 (CI beside other jobs) chromium once took over 30 s to open its page
        deadline = time.monotonic() + 120
        targets: list[dict] = []
        while time.monotonic() < deadline:
            try:
                targets = [t for t in httpx.get(f"http://127.0.0.1:{self.port}/json/list", timeout=2).json()
                           if t.get("type") == "page"]
                if targets:
                    break
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.2)
        if not targets:
            self.close()
            raise RuntimeError("headless chromium did not open a page")
        self._stack = ExitStack()
        self.ws = self._stack.enter_context(connect(targets[0]["webSocketDebuggerUrl"], max_size=64 * 1024 * 1024))
        self._ids = itertools.count(1)
        self.events: list[dict] = []

    def call(self, method: str, **params) -> dict:
        mid = next(self._ids)
        self.ws.send(json.dumps({"id": mid, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=30))
            if msg.get("id") == mid:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    def evaluate(self, expression: str):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"page error: {r['exceptionDetails']}")
        return r["result"].get("value")

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            self._stack.close()
        except Exception:  # noqa: BLE001
            pass
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
