"""A headless Chromium (Debian's `chromium` package) driven over its DevTools protocol: a small
synchronous client on `websockets` (pinned in the dev extras), no browser download.

    with running_chromium(tmp_path) as page:
        page.navigate("http://127.0.0.1:8000/runs/ID?token=...")
        page.wait_for("document.querySelectorAll('#steps tbody tr').length > 0")
        page.screenshot(tmp_path / "viewer.png")
"""

from __future__ import annotations

import base64
import itertools
import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.sync.client import ClientConnection, connect

from tests.support.procs import end
from toolloop.embedded import free_port

INSTALL = "apt-get install -y chromium (.ci/run does it when it is missing)"


class Page:
    """One browser tab: `call` sends a DevTools command and returns its result."""

    def __init__(self, socket: ClientConnection) -> None:
        self.socket = socket
        self.ids = itertools.count(1)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        call_id = next(self.ids)
        self.socket.send(
            json.dumps({"id": call_id, "method": method, "params": params})
        )
        while True:  # events arrive in between: skip them
            reply = json.loads(self.socket.recv(timeout=60))
            if reply.get("id") == call_id:
                if "error" in reply:
                    raise AssertionError(f"{method} failed: {reply['error']}")
                result: dict[str, Any] = reply.get("result", {})
                return result

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited)."""
        result = self.call(
            "Runtime.evaluate",
            expression=expression,
            returnByValue=True,
            awaitPromise=True,
        )
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    def navigate(self, url: str) -> None:
        self.call("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete'")

    def wait_for(self, expression: str, timeout: float = 30.0) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"not true in the page within {timeout:g} s: {expression}"
                )
            time.sleep(0.1)

    def screenshot(self, path: Path) -> Path:
        shot = self.call(
            "Page.captureScreenshot", format="png", captureBeyondViewport=True
        )
        path.write_bytes(base64.b64decode(shot["data"]))
        return path


@contextmanager
def running_chromium(
    directory: Path, width: int = 1100, height: int = 1400
) -> Iterator[Page]:
    """A headless Chromium with a fresh profile under `directory`; yields its first tab."""
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        pytest.fail(f"No chromium on PATH: the run viewer test needs it.\n  {INSTALL}")
    port = free_port()
    args = [
        binary,
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--no-proxy-server",
        f"--remote-debugging-port={port}",
        f"--user-data-dir={directory / 'profile'}",
        f"--window-size={width},{height}",
        "about:blank",
    ]
    log = (directory / "chromium.log").open("wb")
    process = subprocess.Popen(
        args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                tabs = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=1).json()
                page = next(t for t in tabs if t.get("type") == "page")
                break
            except (httpx.HTTPError, StopIteration, ValueError):
                if process.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(
                        f"Chromium did not start:\n{(directory / 'chromium.log').read_text()[-2000:]}"
                    )
                time.sleep(0.2)
        with connect(
            page["webSocketDebuggerUrl"], max_size=None, open_timeout=30
        ) as socket:
            tab = Page(socket)
            tab.call("Page.enable")
            tab.call("Runtime.enable")
            tab.call(
                "Emulation.setDeviceMetricsOverride",
                width=width,
                height=height,
                deviceScaleFactor=1,
                mobile=False,
            )
            yield tab
    finally:  # its own process group: the renderer and GPU helpers end with it
        end(process, 10, group=True)
        log.close()
