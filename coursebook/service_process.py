"""``python -m autograder serve`` started as an instructor starts it, for the tests and
``benchmarks/submit_load.py``: a process of its own (and its own process group, so that
stopping it stops its fork server and kernels) on a free port of 127.0.0.1."""
from __future__ import annotations

import html
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Dict, Optional

ROOT = Path(__file__).resolve().parent.parent


def tool_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """This checkout on the path and the venv's tools first (nbgrader runs ``alembic``)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env.update(extra or {})
    return env


class ServiceProcess:
    """The service over ``course``; ``extra`` are more options of ``serve``. Raises
    ``RuntimeError`` (with the server's log) if it does not say its address in time."""

    def __init__(self, course: Path, *extra: str, jobs: int = 1, cwd: Path = ROOT,
                 env: Optional[Dict[str, str]] = None, start_timeout: float = 300.0):
        self.course = Path(course)
        self.log = open(self.course / f"server-{time.monotonic_ns()}.log", "w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "autograder", "serve", "--course", str(self.course),
             "--port", "0", "--jobs", str(jobs), *map(str, extra)], cwd=cwd,
            env=tool_env(env), stdout=subprocess.PIPE, stderr=self.log, text=True,
            start_new_session=True)
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [lines.put(line) for line in self.process.stdout],
                         daemon=True).start()
        deadline = time.monotonic() + start_timeout
        while True:
            try:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                self.kill()
                raise RuntimeError("the service did not start:\n" + self.errors()) from None
            found = re.search(r"at (http://127\.0\.0\.1:\d+)/", line)
            if found:
                self.url, self.banner = found.group(1), line  # banner: what it says it serves
                return

    def errors(self) -> str:
        """The end of what the server wrote to stderr."""
        if not self.log.closed:
            self.log.flush()
        return Path(self.log.name).read_text()[-3000:]

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """``sig`` to the server and everything it started (SIGKILL: as a crash would);
        SIGKILL after a minute if it is still there."""
        try:
            os.killpg(self.process.pid, sig)
            self.process.wait(timeout=60)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=60)
        if not self.log.closed:
            self.log.close()

    def stop(self) -> None:
        """A clean stop (SIGTERM), as Ctrl-C or a service manager stops it."""
        self.kill(signal.SIGTERM)


def issue_tokens(course: Path, *ids: str) -> Dict[str, str]:
    """``serve --issue-tokens``: person id -> their token."""
    done = subprocess.run([sys.executable, "-m", "autograder", "serve", "--course",
                           str(course), "--issue-tokens", *ids], cwd=ROOT, env=tool_env(),
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"serve --issue-tokens failed:\n{done.stderr[-3000:]}")
    return {line.split("\t")[0]: line.split("\t")[2].split("token=")[1]
            for line in done.stdout.splitlines() if line and not line.startswith("#")}


def sign_in(browser: urllib.request.OpenerDirector, url: str, token: str, timeout: float = 60):
    """A person signs in as a browser without JavaScript does: opens their link
    (``url``/signin?token=...), which asks "Sign in as ...?", and sends that page's form.
    ``browser`` keeps cookies (an ``HTTPCookieProcessor``). Returns (address, text) of the
    page the form leads to."""
    with browser.open(f"{url}/signin?token={urllib.parse.quote(token)}",
                      timeout=timeout) as page:
        confirm = page.read().decode()
    form = re.search(r'<form method=post action="([^"]+)">(.*?)</form>', confirm, re.S)
    fields = dict(re.findall(r'<input type="?hidden"? name="?(\w+)"? value="([^"]*)"',
                             form.group(2)))
    body = urllib.parse.urlencode({k: html.unescape(v) for k, v in fields.items()}).encode()
    with browser.open(urllib.request.Request(urllib.parse.urljoin(url, form.group(1)),
                                             data=body), timeout=timeout) as page:
        return page.url, page.read().decode()
