"""``python -m autograder serve``: hand in a notebook on the web and get its feedback.

A Tornado application (server-rendered HTML, no JavaScript) over the service's database
(:mod:`.service_db`), its graders (:mod:`.service_queue`, the one grading pipeline) and
its sign-in (:mod:`.service_auth`). Every handler learns who is asking before it reads
anything; learners see their own uploads only, instructors everything.

Routes (under ``/``, or on a JupyterHub under the service's prefix ``/services/NAME/``,
with the OAuth callback ``oauth_callback`` there too):
``/`` (a learner's assignments, upload form and attempts), ``/signin``,
``/signout``, ``POST /submit`` (multipart: ``assignment``, ``notebook``), ``/submissions/ID``
(place in the queue, then the feedback; ID is random, never guessable),
``/submissions/ID.json`` (the same for ``python -m autograder submit``; ``?wait=S`` holds it
until the upload changes state, at most ``SERVICE_LONG_POLL`` seconds),
``/submissions/ID/notebook`` (the executed notebook),
``/instructor``, ``/instructor/grades.csv``, ``POST /instructor/regrade``.
"""
from __future__ import annotations

import asyncio
import csv
import io
import json
import logging
import math
import os
import re
import secrets
import signal
import threading
import time
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import Dict, List, Optional

import tornado.log
import tornado.web

from .layout import MAX_NOTEBOOK_BYTES, Course, mebibytes, notebook_from_bytes, plural
from .options import SERVICE_BODY_CEILING, SERVICE_DB, SERVICE_SESSION_DAYS
from .service_auth import HubSignIn, TokenSignIn, hub_address
from .service_config import ConfigError, Person, ServiceConfig  # noqa: F401 (ConfigError: cli)
from .service_db import DONE, QUEUED, Row, Store, when

HOUR = 3600.0
# query parameters that carry a secret: the sign-in link's token, an OAuth callback's code
SECRET_PARAMETER = re.compile(r"(?<=[?&;])(token|code)=[^&;\s]*", re.IGNORECASE)


def redact(text: str) -> str:
    """``text`` (a logged request line) with the values of secret query parameters cut."""
    return SECRET_PARAMETER.sub(r"\1=[redacted]", text)


def log_request(handler) -> None:
    """Tornado's access log line (status, method, address, client, milliseconds), without
    the secrets of the address: a refused or accepted sign-in link logs no token."""
    status = handler.get_status()
    log = (tornado.log.access_log.info if status < 400 else
           tornado.log.access_log.warning if status < 500 else tornado.log.access_log.error)
    request = handler.request
    log("%d %s %s (%s) %.2fms", status, request.method, redact(request.uri),
        request.remote_ip, 1000.0 * request.request_time())


class Redacted(logging.Filter):
    """Cuts secret query parameters out of Tornado's other log lines (an uncaught error
    logs the request's address)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if SECRET_PARAMETER.search(message):
            record.msg, record.args = redact(message), None
        return True


def course_assignments(course: Course) -> List[str]:
    """The assignments of the course's source folder that have notebooks."""
    if not course.source_path.is_dir():
        raise ConfigError(f"{course.source_path} is not a folder of assignments")
    return sorted(p.name for p in course.source_path.iterdir()
                  if p.is_dir() and any(p.glob("*.ipynb")))


def write_durably(path: Path, data: bytes) -> None:
    """``data`` at ``path``, on disk (file and folder entry) when this returns."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    with open(partial, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, path)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


class Service:
    """The course, its configuration, its database and files: what the service serves."""

    def __init__(self, course: Path, db: Optional[Path] = None, gradebook: Optional[str] = "",
                 hub: bool = False, behind_proxy: bool = False,
                 session_days: float = SERVICE_SESSION_DAYS):
        """``hub``: run as a JupyterHub service (its users, its OAuth; no roster).
        ``behind_proxy``: believe the ``X-Forwarded-Proto`` and ``X-Real-IP`` (or
        ``X-Forwarded-For``) headers of a proxy in front (a TLS proxy: cookies are then
        ``Secure``). ``session_days``: how long a browser's sign-in lasts."""
        self.course = Course.discover(course)
        self.assignments = course_assignments(self.course)
        if hub:  # a clear error, before anything else, off a hub or without a service url
            hub_address()
        self.config = ServiceConfig.read(self.course.root, self.assignments, hub=hub,
                                         course_id=self.course.course_id)
        self.db = Path(db).resolve() if db else self.course.root / SERVICE_DB
        self.files = self.db.parent / f"{self.db.stem}-files"
        self.store = Store(self.db)
        self.hub = hub
        self.signin = (HubSignIn(self.config.instructors_group) if hub
                       else TokenSignIn(self.store, self.config.people, session_days))
        self.behind_proxy = behind_proxy
        # where a form may lead besides this service: a hub elsewhere (its logout page)
        self.form_targets = getattr(getattr(self.signin, "auth", None), "hub_host", "") or ""
        self.gradebook = (f"sqlite:///{self.course.root / 'gradebook.db'}" if gradebook == ""
                          else gradebook)
        self.sources = {a: self.course.source_notebooks(a) for a in self.assignments}
        self.graders = None
        self._upload_lock = threading.Lock()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._waiting: Dict[int, List[asyncio.Future]] = {}  # upload id -> requests held

    # changes: a request for feedback waits for its upload's next change (a long poll)

    def changed(self, submission_id: int) -> None:
        """An upload's new state is committed (any thread): answer the requests held for it."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._release, submission_id)

    def _release(self, submission_id: int) -> None:
        for future in self._waiting.pop(submission_id, []):
            if not future.done():
                future.set_result(None)

    async def next_change(self, submission_id: int, timeout: float) -> None:
        """Return once the upload changes state, or after ``timeout`` seconds. Call it in the
        same step of the event loop as the read it follows, so no change slips between."""
        future = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(submission_id, []).append(future)
        try:
            await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:
            pass
        finally:
            held = self._waiting.get(submission_id, [])
            if future in held:
                held.remove(future)
                if not held:
                    del self._waiting[submission_id]

    def notebooks(self) -> List[Path]:
        return [s.path for sources in self.sources.values() for s in sources.values()]

    def hidden(self) -> List[Path]:
        """What kernels must not see: the course, the service's database and files."""
        hidden = [self.course.root, self.db.parent, self.files]
        if self.gradebook and self.gradebook.startswith("sqlite:///"):
            hidden.append(Path(self.gradebook[len("sqlite:///"):]).resolve().parent)
        return hidden

    # uploads

    def accept(self, person: Person, assignment: str, filename: str, body: bytes) -> Row:
        """Store an upload durably and queue it; ``ValueError`` (message, HTTP code) if not.

        ``filename`` (the browser's, the learner's) only says which notebook this is: the
        file is stored under the course's own notebook name, never under ``filename``."""
        if not body:
            raise ValueError("the upload is empty: choose your notebook file", 400)
        if len(body) > MAX_NOTEBOOK_BYTES:
            raise ValueError(f"the notebook is {mebibytes(len(body), MAX_NOTEBOOK_BYTES)} MiB; "
                             "the limit is "
                             f"{MAX_NOTEBOOK_BYTES / 2**20:g} MiB (clear its outputs, save it "
                             "and upload it again)", 413)
        try:
            notebook_from_bytes(body)
        except ValueError as error:
            raise ValueError(f"{filename or 'the upload'}: {error}", 415) from None
        stem = PurePosixPath(str(filename or "").replace("\\", "/").replace("\0", "")).stem
        if not assignment:
            matches = [a for a, s in self.sources.items() if stem in s] or \
                      [a for a in self.assignments if a == stem]
            if len(matches) != 1:
                raise ValueError(f"say which assignment {filename!r} is for (one of "
                                 f"{', '.join(self.assignments)})", 400)
            assignment = matches[0]
        if assignment not in self.sources:
            raise ValueError(f"no assignment {assignment!r} (there are "
                             f"{', '.join(self.assignments)})", 404)
        names = sorted(self.sources[assignment])
        notebook = names[0] if len(names) == 1 else stem
        if notebook not in names:
            raise ValueError(f"assignment {assignment!r} has notebooks {', '.join(names)}: "
                             "upload one of them under its own name", 400)
        rules = self.config.rules[assignment]
        now = time.time()
        days_late = rules.days_late(datetime.fromtimestamp(now, timezone.utc))
        if days_late and rules.late == "refuse":
            raise ValueError(f"the deadline of {assignment!r} was "
                             f"{rules.deadline:%Y-%m-%d %H:%M %Z}: uploads are closed", 403)
        with self._upload_lock:
            recent = self.store.upload_times(person.id, assignment, now - HOUR)
            if len(recent) >= rules.attempts_per_hour:
                # the upload that frees a place: the one that many places back from the end
                frees = recent[-rules.attempts_per_hour] + HOUR
                minutes = max(1, math.ceil((frees - now) / 60))
                raise ValueError(f"{len(recent)} uploads of {assignment!r} in the last hour: "
                                 f"the limit is {rules.attempts_per_hour} an hour; try again "
                                 f"in {plural(minutes, 'minute')}", 429)
            attempt = self.store.next_attempt(person.id, assignment, notebook)
            folder = self.files / "uploads" / person.id / assignment / str(attempt)
            write_durably(folder / "timestamp.txt",
                          datetime.fromtimestamp(now, timezone.utc).isoformat().encode())
            write_durably(folder / f"{notebook}.ipynb", body)
            submission_id = self.store.add(person.id, assignment, notebook, attempt,
                                           folder / f"{notebook}.ipynb", now, days_late)
        if self.graders is not None:
            self.graders.wake()
        return self.store.get(submission_id)

    # what pages show

    def position(self, row: Row) -> Optional[int]:
        """1 for the next upload to be graded; None when not queued."""
        if row.state != QUEUED:
            return None
        order = self.store.queue()
        return order.index(row.id) + 1 if row.id in order else None

    def feedback(self, row: Row) -> dict:
        """What a learner may see of one upload: results.json's tests and message."""
        data = {"id": row.key, "student": row.student, "assignment": row.assignment,
                "notebook": row.notebook, "attempt": row.attempt, "state": row.state,
                "position": self.position(row), "uploaded": when(row.created),
                "days_late": row.days_late, "tests": []}
        if row.state == DONE:
            data.update(status=row.status, score=row.score, max_score=row.max_score,
                        penalty=row.penalty or 0.0, counted_score=row.counted_score,
                        message=row.message, seconds=row.seconds, graded=when(row.finished),
                        has_notebook=bool(row.executed and Path(row.executed).is_file()))
            found = bool(row.results) and Path(row.results).is_file()
            results = json.loads(Path(row.results).read_text()) if found else {"tests": []}
            for test in results["tests"]:
                data["tests"].append({
                    "name": test["name"], "status": test.get("status", "not counted"),
                    "outcome": test.get("extra_data", {}).get("outcome", ""),
                    "score": test["score"], "max_score": test["max_score"],
                    "points": test.get("extra_data", {}).get("points", test["max_score"]),
                    "output": test.get("output", ""),
                    "hidden": test.get("visibility") != "visible"})
        return data

    def learners(self) -> List[str]:
        """The learners of the instructor's page: the roster's; on a hub (which has no roster
        here), everyone who has handed in."""
        if self.hub:
            return sorted({row.student for row in self.store.rows()})
        return sorted(p.id for p in self.config.people.values() if not p.instructor)

    def counted_rows(self) -> Dict[tuple, Row]:
        """The attempt that counts, per (student, assignment, notebook)."""
        keys = {(r.student, r.assignment, r.notebook) for r in self.store.rows()}
        counted = {}
        for key in keys:
            row = self.store.counted(*key, self.config.rules[key[1]].counts)
            if row is not None:
                counted[key] = row
        return counted

    def grades_csv(self) -> str:
        from .report import CSV_COLUMNS
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for _, row in sorted(self.counted_rows().items()):
            writer.writerow(json.loads(row.csv_row))
        return out.getvalue()

    def regrade_all(self) -> int:
        count = self.store.requeue([row.id for row in self.counted_rows().values()])
        if self.graders is not None:
            self.graders.wake()
        return count

    # running

    def application(self) -> tornado.web.Application:
        from . import service_pages as pages
        signin = self.signin
        routes = [(pattern, signin.page(handler))
                  for pattern, handler in pages.routes(signin.prefix)] + signin.own_routes()
        # the cookie secret signs the hub sign-in's cookies (a new one at each start: the
        # hub's OAuth signs a browser in again without a word)
        for name in ("tornado.application", "tornado.general"):
            logger = logging.getLogger(name)
            if not any(isinstance(f, Redacted) for f in logger.filters):
                logger.addFilter(Redacted())
        # a form's POST needs its XSRF token and, from a browser that says where it came
        # from (Sec-Fetch-Site, Origin), to come from the service's own pages
        return tornado.web.Application(routes, service=self, xsrf_cookies=True,
                                       cross_origin_protection=True,
                                       cookie_secret=secrets.token_bytes(32),
                                       default_handler_class=signin.page(pages.NotFound),
                                       log_function=log_request)

    def address(self, host: str, port: int):
        """Where to listen: ``host``, ``port``; on a hub, the service's own ``url``."""
        return hub_address() if self.hub else (host, port)

    def run(self, runner, options, host: str, port: int) -> int:
        from .service_queue import Graders
        self.graders = Graders(self.store, runner, self.course, self.sources, options,
                               self.config.rules, self.files, gradebook=self.gradebook,
                               on_change=self.changed)
        return asyncio.run(self._serve(*self.address(host, port)))

    async def _serve(self, host: str, port: int) -> int:
        from tornado.httpserver import HTTPServer
        from tornado.netutil import bind_sockets
        sockets = bind_sockets(port, host)
        server = HTTPServer(self.application(), xheaders=self.behind_proxy,
                            max_body_size=MAX_NOTEBOOK_BYTES * SERVICE_BODY_CEILING)
        server.add_sockets(sockets)
        self._loop = asyncio.get_running_loop()
        self.graders.start()
        address = sockets[0].getsockname()
        how = (f"Open it through the hub, at {self.signin.prefix}; members of the hub group "
               f"{self.config.instructors_group!r} are its instructors." if self.hub else
               "Open it with the sign-in link that `python -m autograder serve --issue-tokens` "
               "printed for you.")
        print(f"Serving {self.course.root} at http://{address[0]}:{address[1]}"
              f"{self.signin.prefix} (database {self.db}; {self.graders.jobs} grader(s) on "
              f"{self.graders.runner.describe()}). {how}",
              flush=True)
        stopped = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stopped.set)
        await stopped.wait()
        server.stop()
        await loop.run_in_executor(None, self.graders.stop)
        print("Stopped; anything not graded yet is graded at the next start.", flush=True)
        return 0


__all__ = ["Service", "ConfigError"]
