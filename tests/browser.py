"""Headless Chromium over the DevTools protocol: load a local page, collect every console
error, run a script in the page, take a screenshot.

Debian's ``chromium`` is installed by ``make test`` (see the Makefile); `chromium_binary`
installs it here if it is missing and the tests run as root, as on a fresh CI machine.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-port=0",
    "--window-size=1280,2000",
]


def chromium_binary() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(
            ["apt-get", "install", "-y", "--no-install-recommends", "chromium"],
            check=False,
            capture_output=True,
            env=env,
        )
        found = shutil.which("chromium")
    if not found:
        raise RuntimeError(
            "chromium is not installed and could not be installed here: run "
            "`apt-get install -y chromium` (make test does this) and try again"
        )
    return found


class Browser:
    """One headless Chromium with a fresh, empty profile; use as a context manager."""

    def __init__(self) -> None:
        from websockets.sync.client import connect

        self.profile = tempfile.mkdtemp(prefix="tracerl-chromium-")
        self.proc = subprocess.Popen(
            [chromium_binary(), *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        port_file = Path(self.profile) / "DevToolsActivePort"
        deadline = time.time() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            if time.time() > deadline or self.proc.poll() is not None:
                self.close()
                raise RuntimeError("chromium did not start (no DevToolsActivePort)")
            time.sleep(0.1)
        port = port_file.read_text().split()[0]
        targets = _get_json(f"http://127.0.0.1:{port}/json/list")
        page = next(t for t in targets if t.get("type") == "page")
        self.ws = connect(page["webSocketDebuggerUrl"], max_size=64 * 2**20)
        self._id = 0
        self.events: list[dict[str, Any]] = []
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=60))
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    def load(self, path: Path) -> None:
        """Navigate to a local file and wait for its load event."""
        self.events.clear()
        self.call("Page.navigate", url=path.resolve().as_uri())
        deadline = time.time() + 30
        while not any(e.get("method") == "Page.loadEventFired" for e in self.events):
            if time.time() > deadline:
                raise RuntimeError(f"{path}: no load event within 30 s")
            self.events.append(json.loads(self.ws.recv(timeout=30)))

    def evaluate(self, expression: str) -> Any:
        out = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return out.get("result", {}).get("value")

    def console_errors(self) -> list[str]:
        """Console errors, uncaught exceptions and browser-logged errors (a blocked script,
        a failed resource, a content-policy violation) since the last `load`."""
        out = []
        for e in self.events:
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append(" ".join(str(a.get("value", a.get("description"))) for a in p["args"]))
            elif m == "Runtime.exceptionThrown":
                out.append(p["exceptionDetails"].get("text", "exception"))
            elif m == "Log.entryAdded" and p["entry"].get("level") == "error":
                out.append(p["entry"].get("text", ""))
        return out

    def screenshot(self) -> bytes:
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        return base64.b64decode(data["data"])

    def close(self) -> None:
        ws = getattr(self, "ws", None)
        if ws is not None:
            ws.close()
        self.proc.kill()
        self.proc.wait(timeout=30)
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _get_json(url: str) -> Any:
    import urllib.request

    deadline = time.time() + 30
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                return json.loads(r.read())
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.2)
