"""A headless Chromium for the browser test, driven over the Chrome DevTools Protocol.

No WebDriver and no browser download: Debian's ``chromium`` package is started
with ``--headless --no-sandbox --remote-debugging-port=0`` and spoken to over
its websocket with ``websocket-client`` (pinned in requirements.txt).

``python -m tests.browser --install`` installs Chromium with apt-get when it is
missing (``make test`` runs it); :func:`find_chromium` does the same from the
test, so the suite installs what it needs itself.
"""
from __future__ import annotations

import base64
import contextlib
import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def _which() -> Optional[str]:
    override = os.environ.get("CHROMIUM")
    if override:
        return override if shutil.which(override) else None
    return next((path for path in map(shutil.which, CANDIDATES) if path), None)


def install_command() -> Optional[List[str]]:
    """apt-get as root, or through sudo when that needs no password; None when neither works."""
    if not shutil.which("apt-get"):
        return None
    if os.geteuid() == 0:
        return ["apt-get"]
    if shutil.which("sudo") and subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode == 0:
        return ["sudo", "-n", "apt-get"]
    return None


def find_chromium(install: bool = True, echo: Callable[[str], None] = print) -> Tuple[Optional[str], str]:
    """``(path, "")`` of a Chromium binary, installing Debian's package if allowed; else ``(None, why)``."""
    path = _which()
    if path or not install:
        return path, "" if path else "chromium is not installed"
    apt = install_command()
    if apt is None:
        return None, ("chromium is not installed and cannot be installed here (apt-get needs root or "
                      "passwordless sudo); install it with `sudo apt-get install -y chromium`")
    echo("==> Installing Debian's chromium package for the browser test (apt-get install -y chromium)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    result = subprocess.run([*apt, "install", "-y", "--no-install-recommends", "chromium"],
                            capture_output=True, text=True, env=env)
    if result.returncode != 0:  # the package lists may be missing or stale
        subprocess.run([*apt, "update"], capture_output=True, env=env)
        result = subprocess.run([*apt, "install", "-y", "--no-install-recommends", "chromium"],
                                capture_output=True, text=True, env=env)
    path = _which()
    if path:
        return path, ""
    return None, f"apt-get install chromium failed: {(result.stderr or result.stdout)[-500:]}"


@contextlib.contextmanager
def serve(folder: Path) -> Iterator[str]:
    """Serve ``folder`` over HTTP on a free loopback port; yields the base URL."""
    handler = functools.partial(_QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


class Chromium:
    """One headless Chromium and one of its tabs, driven over the DevTools Protocol.

    Every event the tab sends is kept in :attr:`events`; :meth:`problems` picks out
    JavaScript errors, console errors and failed requests to the local site.
    """

    def __init__(self, binary: str, width: int = 1280, height: int = 900):
        import websocket  # websocket-client
        self.profile = tempfile.mkdtemp(prefix="dlperf-chromium-")
        self.process = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--no-default-browser-check", "--hide-scrollbars",
             # the site is local; every other host fails at once instead of timing out offline
             "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
             f"--user-data-dir={self.profile}", f"--window-size={width},{height}",
             "--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        port = self._devtools_port()
        deadline = time.monotonic() + 30
        while True:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as answer:
                pages = [t for t in json.load(answer) if t.get("type") == "page"]
            if pages or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        self.socket = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=60,
                                                  suppress_origin=True)
        self._id = 0
        self.events: List[Dict[str, Any]] = []
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable")
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                  deviceScaleFactor=1, mobile=False)

    def _devtools_port(self) -> int:
        deadline = time.monotonic() + 60
        seen = []
        while time.monotonic() < deadline:
            line = self.process.stderr.readline()
            if not line and self.process.poll() is not None:
                break
            seen.append(line)
            match = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
            if match:
                # keep draining stderr so that Chromium never blocks on a full pipe
                threading.Thread(target=lambda: [None for _ in self.process.stderr], daemon=True).start()
                return int(match[1])
        self.close()
        raise RuntimeError("Chromium did not start:\n" + "".join(seen[-20:]))

    def call(self, method: str, **params) -> Dict[str, Any]:
        """Send one command and return its result; events that arrive meanwhile are kept."""
        self._id += 1
        self.socket.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv())
            if message.get("id") == self._id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            if "method" in message:
                self.events.append(message)

    def wait_for(self, event: str, timeout: float = 60) -> Dict[str, Any]:
        start = len(self.events)
        deadline = time.monotonic() + timeout
        self.socket.settimeout(1)
        try:
            while time.monotonic() < deadline:
                for message in self.events[start:]:
                    if message["method"] == event:
                        return message
                start = len(self.events)
                try:
                    message = json.loads(self.socket.recv())
                except Exception:  # websocket timeout: look again
                    continue
                if "method" in message:
                    self.events.append(message)
        finally:
            self.socket.settimeout(60)
        raise TimeoutError(f"no {event} within {timeout} s")

    def open(self, url: str, timeout: float = 60) -> None:
        """Load ``url`` and wait for its load event."""
        self.events.clear()
        self.call("Page.navigate", url=url)
        self.wait_for("Page.loadEventFired", timeout)

    def evaluate(self, expression: str, timeout: float = 30) -> Any:
        """The value of a JavaScript expression in the page (promises are awaited)."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                           awaitPromise=True, timeout=int(timeout * 1000))
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:80]}...: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_until(self, expression: str, timeout: float = 30) -> Any:
        """The first true value of ``expression``. An evaluation that fails (a redirect or a
        reload replacing the page, an element not there yet) is tried again until ``timeout``."""
        deadline = time.monotonic() + timeout
        last_error = None
        while time.monotonic() < deadline:
            try:
                value = self.evaluate(expression)
            except (RuntimeError, TimeoutError) as error:
                value, last_error = None, error
            if value:
                return value
            time.sleep(0.2)
        raise TimeoutError(f"{expression} stayed false for {timeout} s"
                           + (f"; last error: {last_error}" if last_error else ""))

    def screenshot(self, path: Path, full_page: bool = False) -> Path:
        params = {"format": "png"}
        if full_page:
            params["captureBeyondViewport"] = True
        data = self.call("Page.captureScreenshot", **params)["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def problems(self, site: str) -> List[str]:
        """JavaScript exceptions, console errors and failed loads of ``site``'s own files."""
        found = []
        failed_requests = {}
        for message in self.events:
            method, params = message["method"], message.get("params", {})
            if method == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                text = details.get("exception", {}).get("description") or details.get("text")
                found.append(f"JavaScript error: {text} ({details.get('url', '')}:{details.get('lineNumber')})")
            elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
                text = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
                found.append(f"console.error: {text}")
            elif method == "Network.requestWillBeSent":
                failed_requests[params["requestId"]] = params["request"]["url"]
            elif method == "Network.responseReceived":
                url = params["response"]["url"]
                if url.startswith(site) and params["response"]["status"] >= 400:
                    found.append(f"HTTP {params['response']['status']}: {url}")
            elif method == "Network.loadingFailed":
                url = failed_requests.get(params["requestId"], "")
                if url.startswith(site) and not params.get("canceled"):
                    found.append(f"failed to load {url}: {params.get('errorText')}")
            elif method == "Log.entryAdded":
                entry = params["entry"]
                # failed loads of other hosts are expected offline; they are not the book's fault
                if entry["level"] == "error" and entry.get("source") != "network":
                    found.append(f"console: {entry.get('text')} ({entry.get('url', '')})")
        return found

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.socket.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
        shutil.rmtree(self.profile, ignore_errors=True)


if __name__ == "__main__":
    if "--install" in sys.argv[1:]:
        path, why = find_chromium(install=True)
        print(f"==> Chromium for the browser test: {path}" if path
              else f"==> WARNING: {why}; the browser test will be skipped")
        sys.exit(0)
    print(__doc__)
