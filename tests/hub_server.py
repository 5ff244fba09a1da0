"""A learner's server on the test hub, standing in for ``jupyterhub-singleuser``.

The hub starts it as it starts a learner's Jupyter server (``c.Spawner.cmd``), with the
same environment: ``JUPYTERHUB_API_TOKEN`` is the token the hub gives that server, with the
scopes of ``c.Spawner.server_token_scopes``. It does what the learner does in a terminal of
their server, ``python -m autograder submit NOTEBOOK --to SERVICE`` with no ``--token``,
writes what that printed to ``$SUBMIT_OUT`` (JSON), and answers the hub's requests at its
own address until the hub stops it. Only :mod:`tests.test_autograder_service_hub` uses it.
"""
from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import urlparse


class Up(http.server.BaseHTTPRequestHandler):
    """Any request: 200, so the hub sees the server up."""

    def do_GET(self) -> None:
        body = b'{"stand-in": "a learner\'s server"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def hand_in() -> None:
    done = subprocess.run([sys.executable, "-m", "autograder", "submit",
                           os.environ["SUBMIT_NOTEBOOK"], "--to", os.environ["SUBMIT_TO"],
                           "--assignment", "demo"], capture_output=True, text=True,
                          timeout=300)
    out = Path(os.environ["SUBMIT_OUT"])
    partial = out.with_name(out.name + ".partial")
    partial.write_text(json.dumps({"returncode": done.returncode, "stdout": done.stdout,
                                   "stderr": done.stderr}))
    partial.replace(out)


def main() -> None:
    address = urlparse(os.environ["JUPYTERHUB_SERVICE_URL"])
    server = http.server.ThreadingHTTPServer((address.hostname, address.port), Up)
    threading.Thread(target=hand_in, daemon=True).start()
    try:
        server.serve_forever()
    except KeyboardInterrupt:  # the hub stops a server with SIGINT first
        pass


if __name__ == "__main__":
    main()
