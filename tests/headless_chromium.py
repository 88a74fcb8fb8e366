"""Load a page in headless Chromium and report what a user would see: console errors, uncaught
exceptions, requests that left the machine, values of JavaScript expressions, a screenshot.

Chromium is driven over its DevTools protocol on a pipe (`--remote-debugging-pipe`: JSON
messages separated by NUL bytes, commands on file descriptor 3, answers and events on 4), so
no port and no websocket library are needed. A fresh profile directory per run.

    with Chromium() as browser:
        page = browser.load("file:///tmp/report.html", ["document.title"], "shot.png")
        page.errors, page.values["document.title"], page.external_requests
"""
from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--remote-debugging-pipe"]


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


@dataclass
class LoadedPage:
    errors: list[str] = field(default_factory=list)
    external_requests: list[str] = field(default_factory=list)
    values: dict[str, object] = field(default_factory=dict)


class Chromium:
    """A headless Chromium process with one page target, for `load`."""

    def __init__(self, width: int = 1440, height: int = 1000, timeout: float = 60.0):
        self.width, self.height, self.timeout = width, height, timeout
        self._next_id = 0
        self._buffer = b""
        self._events: list[dict] = []

    def __enter__(self) -> "Chromium":
        binary = find_chromium()
        if binary is None:
            raise RuntimeError("no chromium on PATH")
        self._profile = tempfile.mkdtemp(prefix="gspmdc-chromium-")
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()

        def wire():
            os.dup2(to_child_r, 3)
            os.dup2(from_child_w, 4)
        self._process = subprocess.Popen(
            [binary, *FLAGS, f"--user-data-dir={self._profile}",
             f"--window-size={self.width},{self.height}", "about:blank"],
            preexec_fn=wire, pass_fds=(3, 4), stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True)
        os.close(to_child_r)
        os.close(from_child_w)
        target = self._call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self._session = self._call("Target.attachToTarget",
                                   {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Page", "Network"):
            self._call(f"{domain}.enable", session=True)
        self._call("Emulation.setDeviceMetricsOverride",
                   {"width": self.width, "height": self.height, "deviceScaleFactor": 1,
                    "mobile": False}, session=True)
        return self

    def __exit__(self, *exc) -> None:
        try:
            self._send("Browser.close", {})
            self._process.wait(timeout=10)
        except Exception:  # noqa: BLE001 - the process is killed below anyway
            pass
        if self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        os.close(self._to_child)
        os.close(self._from_child)
        shutil.rmtree(self._profile, ignore_errors=True)

    def load(self, url: str, expressions=(), screenshot: str | None = None,
             settle: float = 1.0) -> LoadedPage:
        """Navigate to `url`, wait for the load event and `settle` seconds more, evaluate
        `expressions`, take a full-page screenshot; what happened on the way."""
        self._events.clear()
        self._call("Page.navigate", {"url": url}, session=True)
        self._wait_event("Page.loadEventFired")
        end = time.monotonic() + settle
        while (left := end - time.monotonic()) > 0:
            self._read(left)
        page = LoadedPage()
        for expression in expressions:
            result = self._call("Runtime.evaluate", {"expression": expression,
                                                     "returnByValue": True}, session=True)
            if "exceptionDetails" in result:
                page.errors.append(f"evaluating {expression}: {result['exceptionDetails']}")
            else:
                page.values[expression] = result["result"].get("value")
        if screenshot is not None:
            metrics = self._call("Page.getLayoutMetrics", session=True)
            size = metrics.get("cssContentSize") or metrics["contentSize"]
            shot = self._call("Page.captureScreenshot",
                              {"format": "png", "captureBeyondViewport": True,
                               "clip": {"x": 0, "y": 0, "width": size["width"],
                                        "height": size["height"], "scale": 1}},
                              session=True)
            with open(screenshot, "wb") as f:
                f.write(base64.b64decode(shot["data"]))
        for event in self._events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                page.errors.append(json.dumps(params["exceptionDetails"])[:500])
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error",
                                                                                 "assert"):
                page.errors.append(json.dumps(params.get("args"))[:500])
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                page.errors.append(params["entry"].get("text", "")[:500])
            elif method == "Network.requestWillBeSent":
                request = params["request"]["url"]
                if not request.startswith(("file:", "data:", "about:")):
                    page.external_requests.append(request)
        return page

    # -- the protocol ---------------------------------------------------------------------

    def _send(self, method: str, params: dict, session: bool = False) -> int:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self._session
        os.write(self._to_child, json.dumps(message).encode() + b"\0")
        return self._next_id

    def _call(self, method: str, params: dict | None = None, session: bool = False) -> dict:
        ident = self._send(method, params or {}, session)
        deadline = time.monotonic() + self.timeout
        while True:
            for message in self._read(deadline - time.monotonic()):
                if message.get("id") == ident:
                    if "error" in message:
                        raise RuntimeError(f"{method}: {message['error']}")
                    return message.get("result", {})

    def _wait_event(self, method: str) -> None:
        deadline = time.monotonic() + self.timeout
        while not any(e.get("method") == method for e in self._events):
            self._read(deadline - time.monotonic())

    def _read(self, timeout: float) -> list[dict]:
        """Messages that arrive within `timeout` seconds (events are also kept)."""
        if timeout <= 0:
            raise TimeoutError("chromium did not answer in time")
        ready, _, _ = select.select([self._from_child], [], [], timeout)
        if not ready:
            if self._process.poll() is not None:
                raise RuntimeError("chromium exited")
            return []
        chunk = os.read(self._from_child, 1 << 20)
        if not chunk:
            raise RuntimeError("chromium closed the pipe")
        self._buffer += chunk
        messages = []
        while b"\0" in self._buffer:
            raw, self._buffer = self._buffer.split(b"\0", 1)
            message = json.loads(raw)
            if "method" in message:
                self._events.append(message)
            messages.append(message)
        return messages
