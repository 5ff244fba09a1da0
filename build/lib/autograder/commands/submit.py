"""``python -m autograder submit NOTEBOOK --to URL --token T``: hand in from a terminal.

``T`` is the learner's sign-in token, or on a JupyterHub a hub API token (by default the
``$JUPYTERHUB_API_TOKEN`` of the learner's own server); either is sent as
``Authorization: Bearer``, and ``URL`` is then the service's address on the hub
(``https://HUB/services/autograder/``).

Uploads the notebook to the submission service (``python -m autograder serve``), waits
for its grade (a long poll of its feedback, with a deadline), and prints the feedback the web page
shows: each test with PASS or FAIL, its points and message, then the score. Standard
library only (urllib), so it runs wherever the learner's notebook does.
"""
from __future__ import annotations

import http.client
import json
import secrets
import select
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Optional, Tuple

from autograder.feedback import MARKS, mark, test_points
from autograder.options import SERVICE_HTTP_TIMEOUT, SERVICE_LONG_POLL, SERVICE_POLL


CONTINUE_WAIT = 3.0  # seconds to wait for "100 Continue" before sending the body anyway


class SubmitError(Exception):
    """The service refused the upload, or could not be reached."""


def _refusal(code: int, reason: str, body: bytes) -> SubmitError:
    try:
        message = json.loads(body).get("error", "")
    except (ValueError, AttributeError):
        message = ""
    return SubmitError(f"{code}: {message or reason}")


def _interim(sock: socket.socket) -> bool:
    """Whether the service's first answer waiting on ``sock`` is ``100 Continue`` (then read
    and dropped); False when it is the final answer (a refusal, left to be read)."""
    head = b""
    while b"\r\n\r\n" not in head and len(head) < 65536:
        peeked = sock.recv(65536, socket.MSG_PEEK)
        if not peeked or len(peeked) == len(head):
            break
        head = peeked
    if not head.split(b" ", 2)[1:2] == [b"100"]:
        return False
    sock.recv(head.index(b"\r\n\r\n") + 4)
    return True


def _post(url: str, token: str, body: bytes, content_type: str) -> dict:
    """POST ``body`` with ``Expect: 100-continue``: a refusal (too big, not signed in)
    comes before the body is sent, and is read whatever the body's size."""
    parts = urllib.parse.urlsplit(url)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else \
        http.client.HTTPConnection
    connection = kind(parts.hostname, parts.port, timeout=SERVICE_HTTP_TIMEOUT)
    try:
        connection.putrequest("POST", parts.path + (f"?{parts.query}" if parts.query else ""))
        for name, value in (("Authorization", f"Bearer {token}"),
                            ("Accept", "application/json"), ("Content-Type", content_type),
                            ("Content-Length", str(len(body))), ("Expect", "100-continue")):
            connection.putheader(name, value)
        connection.endheaders()
        sock = connection.sock
        if not select.select([sock], [], [], CONTINUE_WAIT)[0] or _interim(sock):
            try:
                connection.send(body)
            except OSError:  # refused while sending: its answer may still be there
                pass
        response = connection.getresponse()
        data = response.read()
        if response.status >= 400:
            raise _refusal(response.status, response.reason, data)
        return json.loads(data)
    except (OSError, http.client.HTTPException) as error:
        raise SubmitError(f"cannot reach {url}: {error}") from None
    finally:
        connection.close()


def _request(url: str, token: str, data: Optional[bytes] = None,
             content_type: Optional[str] = None) -> dict:
    request = urllib.request.Request(url, data=data, method="POST" if data else "GET")
    request.add_header("Authorization", f"Bearer {token}")
    request.add_header("Accept", "application/json")
    if content_type:
        request.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(request, timeout=SERVICE_HTTP_TIMEOUT) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as error:
        raise _refusal(error.code, error.reason, error.read()) from None
    except urllib.error.URLError as error:
        raise SubmitError(f"cannot reach {url}: {error.reason}") from None


def multipart(fields: dict, name: str, filename: str, body: bytes) -> Tuple[bytes, str]:
    """A multipart/form-data body with ``fields`` and one file, and its content type."""
    boundary = secrets.token_hex(16)
    parts = []
    for key, value in fields.items():
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{key}"\r\n\r\n'
                     f"{value}\r\n".encode())
    parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; '
                 f'filename="{filename}"\r\nContent-Type: application/x-ipynb+json\r\n\r\n'
                 .encode() + body + b"\r\n")
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"


def upload(notebook: Path, base: str, token: str, assignment: str = "") -> dict:
    body, content_type = multipart({"assignment": assignment}, "notebook",
                                   Path(notebook).name, Path(notebook).read_bytes())
    query = f"?assignment={urllib.parse.quote(assignment)}" if assignment else ""
    return _post(base.rstrip("/") + "/submit" + query, token, body, content_type)


def wait(base: str, token: str, submission_id: str, timeout: float,
         on_wait=None) -> dict:
    """The feedback of an upload once it is graded (polling until ``timeout``)."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        # a long poll: the service answers once the upload changes state (or after ``hold``
        # seconds), so the grade arrives the moment it is committed
        asked = time.monotonic()
        hold = max(0.0, min(SERVICE_LONG_POLL, deadline - asked))
        data = _request(f"{base.rstrip('/')}/submissions/{submission_id}.json?wait={hold:.1f}",
                        token)
        if data["state"] == "done":
            return data
        now = (data["state"], data.get("position"))
        if on_wait is not None and now != last:
            on_wait(data)
        if time.monotonic() > deadline:
            raise SubmitError(f"not graded after {timeout:g} s; see {base}/submissions/"
                              f"{submission_id} later")
        if now == last:  # nothing changed, and quickly: a service that does not hold
            time.sleep(max(0.0, SERVICE_POLL - (time.monotonic() - asked)))
        last = now


def render(data: dict) -> str:
    """The feedback as the web page shows it, as text."""
    lines = [f"{data['assignment']} (attempt {data['attempt']}): {data['status']}"]
    width = max([len(t["name"]) for t in data["tests"]] + [4])
    for test in data["tests"]:
        name = test["name"].ljust(width)
        lines.append(f"  {mark(test)}  {name}  {test_points(test)}"
                     + ("  (hidden test)" if test["hidden"] else ""))
        for line in (test["output"] or "").splitlines():
            lines.append(f"        {line}")
    if data.get("message"):
        lines.append(f"  {data['message']}")
    late = (f" ({data['penalty']:g} off: {data['days_late']} day(s) late)"
            if data.get("penalty") else "")
    lines.append(f"{data['counted_score']:g} of {data['max_score']:g} points{late}.")
    return "\n".join(lines)


def all_passed(data: dict) -> bool:
    return data["status"] == "graded" and all(t["status"] == "passed" for t in data["tests"]
                                              if t["status"] in MARKS)
