"""A real JupyterHub for the submission service's hub test: its proxy, its config, its process.

JupyterHub (pinned in requirements.txt) needs ``configurable-http-proxy``, a Node program
from the npm registry. ``python -m tests.hub --install`` installs it with npm into
``_build/hub-proxy`` (``make test`` runs it, as ``tests.browser --install`` installs
Chromium); :func:`find_proxy` does the same from the test, so the suite installs what it
needs itself and skips, saying why, only where npm is missing or fails.

:class:`Hub` starts ``python -m jupyterhub`` on free loopback ports with a config that
loads the guide's example (``autograder/service/jupyterhub_config.example.py``) and then sets
only what a test machine needs: where the course is, the ports, a dummy password, and a
stand-in for a learner's Jupyter server (:mod:`tests.hub_server`).
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, Optional, Tuple
from tests.helpers import checkout_env

ROOT = Path(__file__).resolve().parent.parent
PROXY_VERSION = "5.3.0"  # configurable-http-proxy, the proxy JupyterHub's docs install
PROXY_PREFIX = ROOT / "_build" / "hub-proxy"
PROXY = PROXY_PREFIX / "node_modules" / ".bin" / "configurable-http-proxy"
EXAMPLE = ROOT / "autograder" / "service" / "jupyterhub_config.example.py"
PASSWORD = "course-password"  # the DummyAuthenticator's one password for every test user


def find_proxy(install: bool = True, echo: Callable[[str], None] = print
               ) -> Tuple[Optional[str], str]:
    """``(path, "")`` of configurable-http-proxy, installing it with npm if allowed;
    else ``(None, why)``."""
    if PROXY.is_file():
        return str(PROXY), ""
    if not install:
        return None, f"configurable-http-proxy is not installed in {PROXY_PREFIX}"
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        return None, ("configurable-http-proxy (JupyterHub's proxy) needs Node.js and npm; "
                      "install them (e.g. apt-get install nodejs npm) and run "
                      "`python -m tests.hub --install`")
    echo(f"==> Installing configurable-http-proxy@{PROXY_VERSION} from the npm registry into "
         f"{PROXY_PREFIX} for the JupyterHub test")
    PROXY_PREFIX.mkdir(parents=True, exist_ok=True)
    result = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--prefix",
                             str(PROXY_PREFIX), f"configurable-http-proxy@{PROXY_VERSION}"],
                            capture_output=True, text=True, timeout=600)
    if PROXY.is_file():
        return str(PROXY), ""
    said = (result.stderr or result.stdout)[-500:]
    return None, f"npm install configurable-http-proxy failed: {said}"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


TEST_CONFIG = """\
# The guide's example (guide/jupyterhub.md), then what only a test machine changes.
c = get_config()  # noqa: F821
load_subconfig({example!r})  # noqa: F821
COURSE = {course!r}
SERVICE = c.JupyterHub.services[0]
SERVICE["cwd"] = COURSE
SERVICE["url"] = "http://127.0.0.1:{service_port}"
SERVICE["command"] = SERVICE["command"] + {extra!r}
c.JupyterHub.bind_url = "http://127.0.0.1:{port}"
c.JupyterHub.hub_bind_url = "http://127.0.0.1:{hub_port}"
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{api_port}"
c.ConfigurableHTTPProxy.command = [{proxy!r}]
c.JupyterHub.authenticator_class = "dummy"
c.DummyAuthenticator.password = {password!r}
c.Authenticator.allow_all = True
c.JupyterHub.load_groups = {{{group!r}: {{"users": {instructors!r}}}}}
c.JupyterHub.db_url = "sqlite:///{folder}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = "{folder}/jupyterhub_cookie_secret"
c.JupyterHub.pid_file = "{folder}/jupyterhub.pid"
# A learner's server is tests/hub_server.py (no Jupyter server is needed): it hands in
# $SUBMIT_NOTEBOOK with `submit` and the server's own $JUPYTERHUB_API_TOKEN
c.JupyterHub.spawner_class = "simple"
c.SimpleLocalProcessSpawner.home_dir_template = "{folder}/home/{{username}}"
c.Spawner.cmd = [{python!r}, "-m", "tests.hub_server"]
c.Spawner.environment = {{"SUBMIT_NOTEBOOK": {notebook!r}, "SUBMIT_OUT": {out!r},
                          "SUBMIT_TO": "http://127.0.0.1:{port}/services/autograder/"}}
"""


class Hub:
    """``python -m jupyterhub`` with the example config, on free ports of 127.0.0.1.

    ``users`` are created (the learners: every hub user is one); ``instructors`` are
    members of ``group``. The service runs in ``course`` with ``extra`` arguments added to
    the example's command."""

    def __init__(self, folder: Path, course: Path, proxy: str, group: str,
                 instructors: list, learners: list, extra: list = ()):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        # what a learner's server hands in, and where it writes what `submit` printed
        self.server_notebook = folder / "server" / "demo.ipynb"
        self.server_out = folder / "server" / "submit.json"
        self.server_notebook.parent.mkdir()
        config = folder / "jupyterhub_config.py"
        config.write_text(TEST_CONFIG.format(
            example=str(EXAMPLE), course=str(course), service_port=free_port(),
            extra=list(extra), port=self.port, hub_port=free_port(), api_port=free_port(),
            proxy=proxy, password=PASSWORD, group=group, instructors=list(instructors),
            folder=folder, python=sys.executable, notebook=str(self.server_notebook),
            out=str(self.server_out)))
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(folder / "jupyterhub.log", "w")
        env = checkout_env()
        env.pop("JUPYTERHUB_API_TOKEN", None)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub", "-f", str(config)], cwd=folder, env=env,
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.users = list(instructors) + list(learners)
        try:
            self.wait_for_service()
        except BaseException:
            self.stop()
            raise

    def wait_for_service(self, timeout: float = 180.0) -> None:
        """Until the hub answers and the service behind its proxy does (a redirect to the
        hub's login is an answer: the service is up and asks who is there)."""
        deadline = time.monotonic() + timeout
        opener = urllib.request.build_opener(NoRedirect)
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"JupyterHub exited ({self.process.returncode}):\n"
                                     + self.errors())
            try:
                with opener.open(f"{self.url}/services/autograder/", timeout=5) as answer:
                    status = answer.status
            except urllib.error.HTTPError as error:
                status = error.code
            except OSError:
                status = None
            if status in (200, 302) and re.search(r"Serving .* at http", self.errors()):
                return
            time.sleep(0.5)
        raise AssertionError("JupyterHub and its autograder service did not start:\n"
                             + self.errors())

    def errors(self) -> str:
        self.log.flush()
        return (self.folder / "jupyterhub.log").read_text()[-6000:]

    def stop(self) -> None:
        """The hub, its proxy and its service (a process group of their own)."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(60)
        self.log.close()


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


if __name__ == "__main__":
    if "--install" in sys.argv[1:]:
        path, why = find_proxy(install=True)
        print(f"==> configurable-http-proxy for the JupyterHub test: {path}" if path
              else f"==> WARNING: {why}; the JupyterHub test will be skipped")
        sys.exit(0)
    print(__doc__)
