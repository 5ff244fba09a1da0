"""``python -m autograder serve``: hand in a notebook on the web and get its feedback.

A Tornado application (server-rendered HTML, no JavaScript) over the service's database
(:mod:`.db`), its graders (:mod:`.queue`, the one grading pipeline) and
its sign-in (:mod:`.auth`). Every handler learns who is asking before it reads
anything; learners see their own uploads only, instructors everything.

Routes (under ``/``, or on a JupyterHub under the service's prefix ``/services/NAME/``,
with the OAuth callback ``oauth_callback`` there too; the pages are :mod:`.pages`, the
JSON that ``submit`` reads is :mod:`.api`):
``/`` (a learner's assignments, upload form and attempts), ``/signin``,
``/signout``, ``POST /submit`` (multipart: ``assignment``, ``notebook``), ``/submissions/ID``
(place in the queue, then the feedback; ID is random, never guessable),
``/submissions/ID.json`` (the same for ``python -m autograder submit``; ``?wait=S`` holds it
until the upload changes state, at most ``SERVICE_LONG_POLL`` seconds),
``/submissions/ID/notebook`` (the executed notebook),
``/leaderboard/ASSIGNMENT`` and its ``.json`` (the speed leaderboard, :mod:`.board`),
``POST /leaderboard`` (join it under a display name, change it, or leave),
``/instructor``, ``/instructor/grades.csv``, ``POST /instructor/regrade``,
``POST /instructor/extensions`` (grant a learner a later deadline or more uploads an hour),
``/instructor/similarity/ASSIGNMENT`` (the pairs of learners whose latest uploads are most
alike, :mod:`.similarity`), with ``[lti]`` in service.toml the LMS's ``/lti/login``,
``/lti/launch`` and ``/lti/jwks`` (:mod:`.lti_pages`, ``guide/lti.md``), and ``/health``
(for an instructor's monitor, open to anyone and naming no one: graders alive, queue
length, the oldest upload's wait; 503 when the graders are dead or the queue is stuck).

What one client may use is bounded before anything is parsed (:class:`~.options.
ServiceLimits`): connections at once (:class:`BoundedServer`), the time to send headers
and a body, the body of any request (an upload's only once its sender is signed in), the
cells of a notebook, a learner's gradings at once and stored files.
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
import resource
import secrets
import shutil
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import Dict, List, Optional

import tornado.log
import tornado.web
from tornado import httputil
from tornado.httpserver import HTTPServer

from autograder.layout import (MAX_NOTEBOOK_BYTES, Course, SourceNotebook, TooManyCells,
                               mebibytes, notebook_from_bytes, plural, too_big)
from autograder.options import (SERVICE_DB, SERVICE_FD_PER_JOB, SERVICE_FD_RESERVE,
                      SERVICE_FORM_BYTES, SERVICE_SESSION_DAYS, ServiceLimits)
from autograder.service.auth import HubSignIn, TokenSignIn, hub_address
from autograder.service.config import ConfigError, Person, ServiceConfig  # noqa: F401 (ConfigError: cli)
from autograder.service.config import Extension, Rules, check_extension
from autograder.service.db import DONE, GRADING, QUEUED, Row, Store, when

HOUR = 3600.0
# query parameters that carry a secret: the sign-in link's token, an OAuth callback's code,
# and the upload form's XSRF token (in its address, since the body is read after the checks)
SECRET_PARAMETER = re.compile(r"(?<=[?&;])(token|code|_xsrf)=[^&;\s]*", re.IGNORECASE)


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


def speed_tests(sources: Dict[str, SourceNotebook]) -> List[tuple]:
    """(notebook, test cell id) of each speed test the assignment's notebooks declare."""
    from autograder.pipeline.rebuild import speed_tests_of
    from autograder.pipeline.speed import DeclarationError
    found = []
    for name, source in sorted(sources.items()):
        try:
            found += [(name, grade_id) for grade_id in speed_tests_of(source.notebook)]
        except DeclarationError:
            continue  # the grader says what is wrong with it, at each grading
    return found


class UploadRefused(ValueError):
    """An upload the service does not take: ``args`` are the message and the HTTP code."""


def folder_bytes(folder: Path) -> int:
    """The bytes of the files under ``folder`` (0 if there is none)."""
    total = 0
    for path in Path(folder).rglob("*") if Path(folder).is_dir() else ():
        try:
            total += path.lstat().st_size if path.is_file() else 0
        except OSError:
            pass
    return total


def raise_open_files() -> int:
    """Raise this process's soft limit on open files to its hard limit; the new limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft


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
                 session_days: float = SERVICE_SESSION_DAYS,
                 limits: ServiceLimits = ServiceLimits()):
        """``hub``: run as a JupyterHub service (its users, its OAuth; no roster).
        ``behind_proxy``: believe the ``X-Forwarded-Proto`` and ``X-Real-IP`` (or
        ``X-Forwarded-For``) headers of a proxy in front (a TLS proxy: cookies are then
        ``Secure``). ``session_days``: how long a browser's sign-in lasts. ``limits``: what
        one connection, upload and learner may use."""
        self.limits = limits
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
        self.lti = None
        if self.config.lti is not None:  # an LMS launches the service (LTI 1.3)
            from autograder.service.lti import Tool
            self.lti = Tool(self.config.lti, self.store, self.config.rules)
        self.outbox = None
        self.signin = (HubSignIn(self.config.instructors_group) if hub
                       else TokenSignIn(self.store, self.config.people, session_days,
                                        others=self.lti_member))
        self.behind_proxy = behind_proxy
        # where a form may lead besides this service: a hub elsewhere (its logout page)
        self.form_targets = getattr(getattr(self.signin, "auth", None), "hub_host", "") or ""
        self.gradebook = (f"sqlite:///{self.course.root / 'gradebook.db'}" if gradebook == ""
                          else gradebook)
        self.sources = {a: self.course.source_notebooks(a) for a in self.assignments}
        self.speed_tests = {a: speed_tests(self.sources[a]) for a in self.assignments}
        self.graders = None
        self._upload_lock = threading.Lock()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._waiting: Dict[int, List[asyncio.Future]] = {}  # upload id -> requests held
        # uploads are read and checked here, off the event loop (a 20 MiB notebook takes
        # seconds to parse): two at once, so that the graders keep their cores
        self.upload_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="upload")

    # changes: a request for feedback waits for its upload's next change (a long poll)

    def changed(self, submission_id: int) -> None:
        """An upload's new state is committed (any thread): answer the requests held for it,
        and give the LMS the learner's counted score if it changed."""
        if self.lti is not None:
            try:
                self.sync_score(submission_id)
            except Exception as error:  # the database: the grade stays, the LMS's waits
                logging.getLogger("tornado.application").error(
                    "LTI: the score of upload %s was not queued for the LMS: %s",
                    submission_id, error)
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

    # LTI: who an LMS launched, and their scores for the LMS's gradebook

    def lti_member(self, person_id: str) -> Optional[Person]:
        """The person an LMS launched with this id (never one of the roster's)."""
        role = self.store.lti_role(person_id) if self.lti is not None else None
        return Person(person_id, role) if role else None

    def max_points(self, assignment: str) -> float:
        """The points of ``assignment``: its notebooks' graded cells' (the LMS's maximum)."""
        return sum(float(cell.get("metadata", {}).get("nbgrader", {}).get("points", 0) or 0)
                   for source in self.sources[assignment].values()
                   for cell in source.notebook.cells
                   if cell.get("metadata", {}).get("nbgrader", {}).get("grade"))

    def sync_score(self, submission_id: int) -> None:
        """Queue the learner's counted score of the upload's assignment for the LMS (the sum
        over its notebooks of the attempts that count), once per change."""
        row = self.store.get(submission_id)
        if row is None or row.state != DONE:
            return
        rule = self.config.rules[row.assignment].counts
        counted = [self.store.counted(row.student, row.assignment, notebook, rule)
                   for notebook in sorted(self.sources[row.assignment])]
        counted = [r for r in counted if r is not None]
        score = round(sum(r.counted_score or 0.0 for r in counted), 6)
        # the points at stake as grades.csv has them (a GPU-only test skipped on a CPU
        # grader is not), or the assignment's points before every notebook is graded
        most = sum(r.max_score or 0.0 for r in counted) \
            if len(counted) == len(self.sources[row.assignment]) \
            else self.max_points(row.assignment)
        self.lti.score_changed(row.student, row.assignment, score, round(most, 6))
        if self.outbox is not None:
            self.outbox.wake()

    def notebooks(self) -> List[Path]:
        return [s.path for sources in self.sources.values() for s in sources.values()]

    def hidden(self) -> List[Path]:
        """What kernels must not see: the course, the service's database and files."""
        hidden = [self.course.root, self.db.parent, self.files]
        if self.gradebook and self.gradebook.startswith("sqlite:///"):
            hidden.append(Path(self.gradebook[len("sqlite:///"):]).resolve().parent)
        return hidden

    # uploads

    def stored_bytes(self, person_id: str) -> int:
        """What one learner's uploads keep on disk: the uploads and their graded files."""
        total = folder_bytes(self.files / "uploads" / person_id)
        for (row_id,) in self.store.ids_of(person_id):
            total += folder_bytes(self.files / "graded" / str(row_id))
        return total

    def accept(self, person: Person, assignment: str, filename: str, body: bytes) -> Row:
        """Store an upload durably and queue it; :class:`UploadRefused` (message, HTTP code)
        if not. What is cheap is checked first (the limits, the hour's uploads, the learner's
        stored files), the notebook is parsed last; call it off the event loop.

        ``filename`` (the browser's, the learner's) only says which notebook this is: the
        file is stored under the course's own notebook name, never under ``filename``."""
        if not body:
            raise UploadRefused("the upload is empty: choose your notebook file", 400)
        if len(body) > MAX_NOTEBOOK_BYTES:
            raise UploadRefused(too_big(len(body)), 413)
        stem = PurePosixPath(str(filename or "").replace("\\", "/").replace("\0", "")).stem
        if not assignment:
            matches = [a for a, s in self.sources.items() if stem in s] or \
                      [a for a in self.assignments if a == stem]
            if len(matches) != 1:
                raise UploadRefused(f"say which assignment {filename!r} is for (one of "
                                    f"{', '.join(self.assignments)})", 400)
            assignment = matches[0]
        if assignment not in self.sources:
            raise UploadRefused(f"no assignment {assignment!r} (there are "
                                f"{', '.join(self.assignments)})", 404)
        names = sorted(self.sources[assignment])
        notebook = names[0] if len(names) == 1 else stem
        if notebook not in names:
            raise UploadRefused(f"assignment {assignment!r} has notebooks {', '.join(names)}: "
                                "upload one of them under its own name", 400)
        rules = self.rules_for(person.id, assignment)
        now = time.time()
        days_late = rules.days_late(datetime.fromtimestamp(now, timezone.utc))
        if days_late and rules.late == "refuse":
            raise UploadRefused(f"the deadline of {assignment!r} was "
                                f"{rules.deadline:%Y-%m-%d %H:%M %Z}: uploads are closed", 403)
        self.check_hour(person, assignment, now)  # before the parse, and again after it
        stored = self.stored_bytes(person.id)
        if stored + len(body) > self.limits.learner_bytes:
            raise UploadRefused(
                f"your uploads and their graded copies keep {mebibytes(stored)} MiB, and this "
                f"one would take it past the {mebibytes(self.limits.learner_bytes)} MiB each "
                "learner may keep: ask your instructor", 507)
        try:
            notebook_from_bytes(body, max_cells=self.limits.max_cells)
        except TooManyCells as error:
            raise UploadRefused(str(error), 413) from None
        except ValueError as error:
            raise UploadRefused(f"{filename or 'the upload'}: {error}", 415) from None
        with self._upload_lock:
            self.check_hour(person, assignment, now)
            attempt = self.store.next_attempt(person.id, assignment, notebook)
            folder = self.files / "uploads" / person.id / assignment / str(attempt)
            try:
                write_durably(folder / "timestamp.txt",
                              datetime.fromtimestamp(now, timezone.utc).isoformat().encode())
                write_durably(folder / f"{notebook}.ipynb", body)
            except OSError as error:  # the disk is full (or gone): nothing was acknowledged
                shutil.rmtree(folder, ignore_errors=True)
                raise UploadRefused(f"the service could not store the upload "
                                    f"({error.strerror or error}); try again later", 507) \
                    from None
            submission_id = self.store.add(person.id, assignment, notebook, attempt,
                                           folder / f"{notebook}.ipynb", now, days_late)
        if self.graders is not None:
            self.graders.wake()
        return self.store.get(submission_id)

    def check_hour(self, person: Person, assignment: str, now: float) -> None:
        """Refuse (429) an upload beyond the assignment's uploads an hour."""
        allowed = self.rules_for(person.id, assignment).attempts_per_hour
        recent = self.store.upload_times(person.id, assignment, now - HOUR)
        if len(recent) >= allowed:
            # the upload that frees a place: the one that many places back from the end
            frees = recent[-allowed] + HOUR
            minutes = max(1, math.ceil((frees - now) / 60))
            raise UploadRefused(f"{len(recent)} uploads of {assignment!r} in the last hour: "
                                f"the limit is {allowed} an hour; try again in "
                                f"{plural(minutes, 'minute')}", 429)

    # extensions: one learner's own deadline and/or uploads an hour

    def extensions(self, person_id: Optional[str] = None) -> Dict[tuple, Extension]:
        """(learner, assignment) -> the extension that holds (of ``person_id`` only, if
        given): the one granted on the instructor page, else service.toml's."""
        found = {(e.learner, name): e for name, rules in self.config.rules.items()
                 for e in rules.extensions if person_id in (None, e.learner)}
        for learner, assignment, deadline, attempts, by, granted in \
                self.store.extensions(person_id):
            if assignment in self.config.rules:  # (an assignment the course has no more)
                found[learner, assignment] = Extension(
                    learner, None if deadline is None else
                    datetime.fromtimestamp(deadline, timezone.utc), attempts, by, granted)
        return found

    def rules_for(self, person_id: str, assignment: str) -> Rules:
        """The rules of ``assignment`` as they hold for ``person_id`` (with their extension)."""
        return self.config.rules[assignment].extended(
            self.extensions(person_id).get((person_id, assignment)))

    def grant_extension(self, instructor: Person, learner: str, assignment: str,
                        deadline: str, attempts_per_hour: str) -> Extension:
        """Grant ``learner`` an extension of ``assignment`` as the instructor page's form
        says it (``deadline``: ISO 8601, UTC unless it has an offset; either may be empty);
        :class:`UploadRefused` (message, 400) saying what is wrong, and nothing stored."""
        if assignment not in self.config.rules:
            raise UploadRefused(f"no assignment {assignment!r}", 400)
        if not self.hub and learner not in self.learners():  # (a hub lists no one)
            raise UploadRefused(f"{learner!r} is not a learner of the course", 400)
        try:
            when = datetime.fromisoformat(deadline.strip()) if deadline.strip() else None
            if when is not None and when.tzinfo is None:
                when = when.replace(tzinfo=timezone.utc)
            attempts = int(attempts_per_hour) if attempts_per_hour.strip() else None
        except ValueError:
            raise UploadRefused("the deadline is a date and time (2026-12-04T17:00, UTC) and "
                                "the uploads an hour a whole number", 400) from None
        try:
            extension = check_extension(self.config.rules[assignment], learner, when, attempts)
        except ValueError as error:
            raise UploadRefused(str(error), 400) from None
        self.store.grant_extension(
            learner, assignment,
            None if extension.deadline is None else extension.deadline.timestamp(),
            extension.attempts_per_hour, instructor.id)
        return self.extensions(learner)[learner, assignment]

    def health(self) -> tuple:
        """(HTTP code, what ``/health`` says): no one's name, no upload's id."""
        graders = self.graders
        data = {"graders": graders.jobs if graders else 0,
                "graders_alive": bool(graders and graders.alive())}
        try:
            rows = self.store.states()
        except Exception as error:  # the database: unreadable, locked, its disk gone
            data.update(status="database unavailable", error=type(error).__name__)
            return 503, data
        now = time.time()
        queued = [created for state, created in rows if state == QUEUED]
        data.update(queued=len(queued), grading=sum(state == GRADING for state, _ in rows),
                    oldest_queued_seconds=round(now - min(queued), 1) if queued else 0.0)
        if graders is not None:
            data["last_error"] = graders.last_error
            data["seconds_since_last_claim"] = (round(now - graders.last_claim, 1)
                                                if graders.last_claim else None)
        status = "ok"
        if not data["graders_alive"]:
            status = "graders stopped"
        elif queued and now - min(queued) > self.limits.stuck_after and (
                graders.last_claim is None or now - graders.last_claim > self.limits.stuck_after):
            status = "queue stuck"
        data["status"] = status
        return (200 if status == "ok" else 503), data

    # what pages show

    def position(self, row: Row) -> Optional[int]:
        """1 for the next upload to be graded; None when not queued."""
        if row.state != QUEUED:
            return None
        order = self.store.queue()
        return order.index(row.id) + 1 if row.id in order else None

    def feedback(self, row: Row) -> dict:
        """What a learner may see of one upload: its result's tests and message."""
        data = {"id": row.key, "student": row.student, "assignment": row.assignment,
                "notebook": row.notebook, "attempt": row.attempt, "state": row.state,
                "position": self.position(row), "uploaded": when(row.created),
                "days_late": row.days_late, "tests": []}
        if row.state == DONE:
            data.update(status=row.status, score=row.score, max_score=row.max_score,
                        penalty=row.penalty or 0.0, counted_score=row.counted_score,
                        message=row.message, seconds=row.seconds, graded=when(row.finished),
                        has_notebook=bool(row.executed and Path(row.executed).is_file()),
                        tests=row.shown_tests)
        return data

    def leaderboard(self, assignment: str, person: Person) -> dict:
        """The speed leaderboard of ``assignment`` as ``person`` sees it (the page and its
        JSON): per speed test, the best verified speedup of each learner who opted in, under
        their display name; whether ``person`` is on it, and as whom."""
        from autograder.service.board import ranked
        names = self.store.board_names()
        boards = {(b["notebook"], b["test"]): b for b in ranked(
            self.store.speed_uploads(assignment), names, viewer=person.id)}
        for notebook, test in self.speed_tests.get(assignment, []):  # declared, none yet
            boards.setdefault((notebook, test), {"notebook": notebook, "test": test, "rows": []})
        several = len(self.sources.get(assignment, {})) > 1
        tests = []
        for (notebook, test), board in sorted(boards.items()):
            rows = [{**row, "graded": when(row["graded"])} for row in board["rows"]]
            tests.append({"notebook": notebook, "test": test, "rows": rows,
                          "title": f"{notebook}: {test}" if several else test})
        return {"assignment": assignment, "tests": tests,
                "best_of": "each learner's best speedup over all of their graded uploads",
                "joined": person.id in names, "display_name": names.get(person.id)}

    def learners(self) -> List[str]:
        """The learners of the instructor's page: the roster's; on a hub (which has no roster
        here), everyone who has handed in."""
        if self.hub:
            return sorted({row.student for row in self.store.rows()})
        launched = [person for person, (role, _) in self.store.lti_people().items()
                    if role != "instructor"] if self.lti is not None else []
        return sorted({p.id for p in self.config.people.values() if not p.instructor}
                      | set(launched))

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
        from autograder.pipeline.report import CSV_COLUMNS
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for _, row in sorted(self.counted_rows().items()):
            writer.writerow(json.loads(row.csv_row))
        return out.getvalue()

    def regrade_all(self) -> int:
        """Queue every attempt that counts again; until each is graded anew, its earlier
        result still counts (grades.csv shows no other attempt meanwhile)."""
        count = self.store.requeue([row.id for row in self.counted_rows().values()])
        if self.graders is not None:
            self.graders.wake()
        return count

    # running

    def application(self) -> tornado.web.Application:
        from autograder.service import pages as pages
        signin = self.signin
        routes = [(pattern, signin.page(handler))
                  for pattern, handler in pages.routes(signin.prefix)] + signin.own_routes()
        if self.lti is not None:
            from autograder.service import lti_pages
            routes = lti_pages.routes(re.escape(signin.prefix)) + routes
        # the cookie secret signs the hub sign-in's cookies (a new one at each start: the
        # hub's OAuth signs a browser in again without a word)
        for name in ("tornado.application", "tornado.general"):
            logger = logging.getLogger(name)
            if not any(isinstance(f, Redacted) for f in logger.filters):
                logger.addFilter(Redacted())
        # a form's POST needs its XSRF token and, from a browser that says where it came
        # from (Sec-Fetch-Site, Origin), to come from the service's own pages
        routes.insert(0, (re.escape(signin.prefix) + r"health", pages.Health))
        return tornado.web.Application(routes, service=self, xsrf_cookies=True,
                                       cross_origin_protection=True,
                                       cookie_secret=secrets.token_bytes(32),
                                       default_handler_class=signin.page(pages.NotFound),
                                       log_function=log_request)

    def address(self, host: str, port: int):
        """Where to listen: ``host``, ``port``; on a hub, the service's own ``url``."""
        return hub_address() if self.hub else (host, port)

    def run(self, runner, options, host: str, port: int) -> int:
        from autograder.service.queue import Graders
        self.graders = Graders(self.store, runner, self.course, self.sources, options,
                               self.config.rules, self.files, gradebook=self.gradebook,
                               on_change=self.changed, limits=self.limits)
        return asyncio.run(self._serve(*self.address(host, port)))

    async def _serve(self, host: str, port: int) -> int:
        from tornado.netutil import bind_sockets
        sockets = bind_sockets(port, host)
        open_files = raise_open_files()
        # the header timeout is Tornado's idle_connection_timeout: headers not in by then,
        # on a new connection or between requests, and the connection is closed
        server = BoundedServer(self.application(), max_body_size=SERVICE_FORM_BYTES,
                               xheaders=self.behind_proxy,
                               idle_connection_timeout=self.limits.header_timeout,
                               body_timeout=self.limits.body_timeout)
        server.bound(self.limits.max_connections,
                     SERVICE_FD_RESERVE + SERVICE_FD_PER_JOB * self.graders.jobs)
        server.add_sockets(sockets)
        self._loop = asyncio.get_running_loop()
        self.graders.start()
        if self.lti is not None:
            from autograder.service.lti import Outbox
            self.outbox = Outbox(self.lti, log=lambda text: print(text, flush=True))
            self.outbox.start()
        address = sockets[0].getsockname()
        how = (f"Open it through the hub, at {self.signin.prefix}; members of the hub group "
               f"{self.config.instructors_group!r} are its instructors." if self.hub else
               "Open it with the sign-in link that `python -m autograder serve --issue-tokens` "
               "printed for you.")
        print(f"Serving {self.course.root} at http://{address[0]}:{address[1]}"
              f"{self.signin.prefix} (database {self.db}; {self.graders.jobs} grader(s) on "
              f"{self.graders.runner.describe()}; at most {server.cap()} connections, "
              f"{open_files} open files). {how}",
              flush=True)
        stopped = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stopped.set)
        await stopped.wait()
        server.stop()
        await loop.run_in_executor(None, self.graders.stop)
        if self.outbox is not None:
            await loop.run_in_executor(None, self.outbox.stop)
        print("Stopped; anything not graded yet is graded at the next start.", flush=True)
        return 0


class BoundedServer(HTTPServer):
    """Tornado's HTTP server with a cap on connections, so that a client that opens many
    and sends nothing cannot take the open files the database and the graders need.

    The cap is the smaller of ``max_connections`` and the open-files limit less
    ``reserve``. A connection past it closes the oldest connection still waiting for its
    request's headers (a client that never finishes them, or one idle between requests);
    when every connection is busy with a request, the new one gets a bare 503 and is closed
    at once."""

    def bound(self, max_connections: int, reserve: int) -> None:
        self._max_connections, self._reserve = max_connections, reserve
        self._awaiting: Dict[object, float] = {}  # connection -> since when it awaits headers
        self._dropped: set = set()

    def cap(self) -> int:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        room = self._max_connections if soft == resource.RLIM_INFINITY else soft - self._reserve
        return max(1, min(self._max_connections, room))

    def handle_stream(self, stream, address) -> None:
        if len(self._connections) - len(self._dropped) >= self.cap():
            idle = min(self._awaiting, key=self._awaiting.get, default=None)
            if idle is None:
                try:
                    stream.socket.send(b"HTTP/1.1 503 Service Unavailable\r\nConnection: close"
                                       b"\r\nContent-Length: 0\r\n\r\n")
                except OSError:
                    pass
                stream.close()
                return
            del self._awaiting[idle]
            self._dropped.add(idle)
            idle.stream.close()  # its descriptor is free now; on_close forgets it
        super().handle_stream(stream, address)

    def start_request(self, server_conn, request_conn):
        self._awaiting[server_conn] = time.monotonic()
        delegate = super().start_request(server_conn, request_conn)
        return _HeadersSeen(delegate, lambda: self._awaiting.pop(server_conn, None))

    def on_close(self, server_conn) -> None:
        self._awaiting.pop(server_conn, None)
        self._dropped.discard(server_conn)
        super().on_close(server_conn)


class _HeadersSeen(httputil.HTTPMessageDelegate):
    """A request's delegate that says when the request's headers have come."""

    def __init__(self, delegate, seen):
        self.delegate, self.seen = delegate, seen

    def headers_received(self, start_line, headers):
        self.seen()
        return self.delegate.headers_received(start_line, headers)

    def data_received(self, chunk):
        return self.delegate.data_received(chunk)

    def finish(self) -> None:
        self.delegate.finish()

    def on_connection_close(self) -> None:
        self.seen()
        self.delegate.on_connection_close()


__all__ = ["Service", "ConfigError"]
