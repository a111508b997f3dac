"""Headless Chromium driven over the DevTools protocol (the browser tests and benchmarks).

``Browser()`` starts the system's Chromium (Debian's ``chromium`` package) with a
remote-debugging port, connects to its page over a WebSocket (Tornado's client) and offers
``goto(url)``, ``js(expression)`` (awaited, by value), ``wait_for(expression)``, ``type(id, text)``,
``click(id)`` and ``screenshot(path)``.  ``find_chromium()`` is None where it is not installed.
"""
from __future__ import annotations

import asyncio
import base64
import json
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request

import tornado.websocket

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "chrome")


def find_chromium() -> str | None:
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


class Browser:
    def __init__(self, width: int = 1280, height: int = 900, timeout: float = 30.0):
        exe = find_chromium()
        if exe is None:
            raise RuntimeError("Chromium is not installed (apt-get install chromium)")
        self._profile = tempfile.mkdtemp(prefix="pldlib-chromium-")
        self.proc = subprocess.Popen(
            [exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--no-default-browser-check", "--allow-file-access-from-files",
             f"--window-size={width},{height}", "--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1",
             f"--user-data-dir={self._profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        port = None
        deadline = time.time() + timeout
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            m = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line or "")
            if m:
                port = int(m.group(1))
                break
            if not line and self.proc.poll() is not None:
                break
        if port is None:
            self.close()
            raise RuntimeError("Chromium did not open its DevTools port")
        targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=timeout))
        page = next(t for t in targets if t.get("type") == "page")
        self._loop = asyncio.new_event_loop()

        async def connect():
            return await tornado.websocket.websocket_connect(page["webSocketDebuggerUrl"],
                                                             max_message_size=256 * 2**20)

        self._ws = self._loop.run_until_complete(connect())
        self._id = 0
        self.timeout = timeout
        self.console: list = []
        self.call("Runtime.enable")
        self.call("Page.enable")

    # -- protocol ---------------------------------------------------------------------------
    def call(self, method: str, **params):
        self._id += 1
        my = self._id
        async def read():
            await self._ws.write_message(json.dumps({"id": my, "method": method, "params": params}))
            while True:
                msg = await self._ws.read_message()
                if msg is None:
                    raise RuntimeError("Chromium closed the connection")
                d = json.loads(msg)
                if d.get("method") == "Runtime.exceptionThrown":
                    self.console.append(d["params"]["exceptionDetails"].get("text", "exception"))
                if d.get("id") == my:
                    return d

        d = self._loop.run_until_complete(asyncio.wait_for(read(), self.timeout))
        if "error" in d:
            raise RuntimeError(f"{method}: {d['error']}")
        return d.get("result", {})

    def js(self, expression: str):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"page error: {r['exceptionDetails'].get('exception', {}).get('description', r)}")
        return r.get("result", {}).get("value")

    # -- conveniences ---------------------------------------------------------------------------
    def goto(self, url: str) -> None:
        self.call("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete' && !!document.getElementById('compute')")

    def wait_for(self, expression: str, timeout: float | None = None) -> float:
        """Seconds until ``expression`` is truthy in the page (TimeoutError after ``timeout``)."""
        t0 = time.time()
        limit = self.timeout if timeout is None else timeout
        while time.time() - t0 < limit:
            try:
                if self.js(expression):
                    return time.time() - t0
            except RuntimeError:
                pass
            time.sleep(0.02)
        raise TimeoutError(f"waited {limit} s for {expression}")

    def type(self, element_id: str, text: str) -> None:
        self.js(f"(() => {{ const e = document.getElementById({json.dumps(element_id)}); e.focus(); "
                f"e.value = {json.dumps(text)}; e.dispatchEvent(new Event('input', {{bubbles: true}})); }})()")

    def click(self, element_id: str) -> None:
        self.js(f"document.getElementById({json.dumps(element_id)}).click()")

    def screenshot(self, path) -> str:
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
        with open(path, "wb") as fh:
            fh.write(base64.b64decode(data))
        return str(path)

    def close(self) -> None:
        try:
            if getattr(self, "_ws", None) is not None:
                async def close_ws():  # (inside its loop: tornado's close makes a Future of the running
                    self._ws.close()   # loop; outside, it needs a current loop the thread may not have)

                try:
                    self._loop.run_until_complete(close_ws())
                finally:
                    self._loop.close()
        finally:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
            shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
