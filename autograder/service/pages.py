"""The submission service's pages: Tornado handlers, and the HTML they render.

The JSON API (what ``python -m autograder submit`` asks) is :mod:`.api`: handlers of their
own, over the same functions of the service, at the ``.json`` addresses and, for a POST of
``/submit``, ``/leaderboard`` or ``/instructor/regrade``, wherever the request asks for
JSON (:class:`JsonRequests`). An error answers as the request asks, from either kind
(:meth:`Base.refuse`).

The pages are Tornado templates in ``templates/`` (one base layout with the shared
``<head>``, the style and the title; one file per page), autoescaped: every value put in a
page is escaped, so a learner's file name, notebook output or message can never become
markup. Plain server-rendered HTML that works without JavaScript (a page waiting for a grade
reloads itself with ``<meta http-equiv="refresh">``). Every handler's ``prepare`` asks the
sign-in who is asking before anything is read; forms carry an XSRF token (Tornado's, or
JupyterHub's on a hub), and requests signed with ``Authorization: Bearer`` (the ``submit``
command) need none. Every answer, error pages and downloads included, carries the headers
of :data:`SECURITY_HEADERS` and a :func:`content_security_policy` that allows no script,
no framing and forms to this service only; none is kept in a cache. Every address is
under the sign-in's prefix: ``/`` standalone, ``/services/NAME/`` on a JupyterHub;
:meth:`Base.url` writes them.
"""
from __future__ import annotations

import base64
import hashlib
import re
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import NamedTuple, Optional

import tornado.routing
import tornado.template
import tornado.web
from tornado import httputil
from tornado.escape import url_escape
from tornado.ioloop import IOLoop

from autograder.layout import MAX_NOTEBOOK_BYTES, too_big
from autograder.options import SERVICE_FORM_OVERHEAD, SERVICE_REFRESH
from autograder.service.auth import Refused, bearer, bearer_of
from autograder.service.board import NAME_MAX, NameRefused, change_name
from autograder.service import similarity
from autograder.service.db import DONE, GRADING, QUEUED, Row, when
from autograder.feedback import mark as test_mark, test_points

STYLE = ("body{font-family:system-ui,sans-serif;max-width:70rem;margin:1rem auto;padding:0 1rem}"
         "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2rem .5rem;"
         "text-align:left;vertical-align:top}.PASS{color:#060}.FAIL{color:#a00;font-weight:bold}"
         ".SKIPPED,.MANUAL{color:#666}th{background:#f4f4f4}"
         "pre{white-space:pre-wrap;margin:0}form.inline{display:inline}")

# The pages' only style is STYLE, in their <style> element: the policy allows that text by
# its hash, and nothing else (no script at all, no inline style attributes, no framing).
STYLE_HASH = "sha256-" + base64.b64encode(hashlib.sha256(STYLE.encode()).digest()).decode()
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",  # a download is never run as a page
    "X-Frame-Options": "DENY",           # (frame-ancestors, for browsers without CSP 2)
    "Referrer-Policy": "no-referrer",    # no address of the service leaves with a link
    "Cache-Control": "no-store",         # grades, feedback and sign-in pages are personal
}


# The pages' templates, loaded once (and kept compiled); {{ value }} escapes value.
TEMPLATES = tornado.template.Loader(str(Path(__file__).with_name("templates")),
                                    autoescape="xhtml_escape")


def content_security_policy(form_action: str = "") -> str:
    """The pages' policy; ``form_action``: more places a form may lead (the hub's logout,
    where the sign-out sends a browser on a hub of another origin)."""
    return ("default-src 'none'; "
            f"style-src '{STYLE_HASH}'; "
            f"form-action 'self'{' ' + form_action if form_action else ''}; "
            "frame-ancestors 'none'; base-uri 'none'")


def points(value) -> str:
    return "" if value is None else f"{value:g}"


def sentence(message: str) -> str:
    """``message`` as a sentence on a page: its first word capitalised when it is an ordinary
    word (a message may begin with the learner's file name, which stays as it is)."""
    return message[:1].upper() + message[1:] if re.match(r"[a-z]+ ", message) else message


def wants_json(request: httputil.HTTPServerRequest) -> bool:
    """Whether a request is a program's (``submit``: a Bearer token, or an Accept header
    that names JSON) rather than a browser's."""
    return bearer_of(request) is not None or \
        "application/json" in request.headers.get("Accept", "")


class JsonRequests(tornado.routing.PathMatches):
    """A route's requests at ``path`` that :func:`wants_json` (the API's, at an address
    the pages share)."""

    def match(self, request: httputil.HTTPServerRequest) -> Optional[dict]:
        return super().match(request) if wants_json(request) else None


class Base(tornado.web.RequestHandler):
    """Who is asking, first: every route refuses anyone the sign-in does not know."""
    instructors_only = False
    person = None

    def create_template_loader(self, template_path: str) -> tornado.template.Loader:
        return TEMPLATES

    def get_template_namespace(self) -> dict:
        """What every template may use besides Tornado's (``handler``, ``xsrf_form_html``,
        ``url_escape``...): the style, the person asking, and the pages' helpers."""
        namespace = super().get_template_namespace()
        namespace.update(style=STYLE, refresh=None, person=self.person, url=self.url,
                         points=points, when=when, sentence=sentence, mark=test_mark,
                         test_points=test_points, QUEUED=QUEUED, GRADING=GRADING, DONE=DONE)
        return namespace

    def page(self, template: str, **values) -> None:
        """Answers with the page of ``template`` (a file of templates/) filled with ``values``."""
        self.finish(self.render_string(template, **values))

    @property
    def service(self):
        return self.settings["service"]

    def set_default_headers(self) -> None:
        # also on errors and redirects: send_error and redirect keep these (clear() sets them)
        for name, value in SECURITY_HEADERS.items():
            self.set_header(name, value)
        self.set_header("Content-Security-Policy",
                        content_security_policy(self.service.form_targets))

    def check_xsrf_cookie(self) -> None:
        if bearer(self) is None:  # a browser's form: it must carry the XSRF token
            super().check_xsrf_cookie()

    def url(self, path: str = "") -> str:
        """The address of one of the service's pages (``path`` without its leading /)."""
        return self.service.signin.prefix + path

    async def prepare(self) -> None:
        try:
            self.person = await self.service.signin.person(self)
        except Refused as why:
            self.person = None
            return self.refuse(403, str(why))
        if self.person is None:
            self.not_signed_in()
        elif self.instructors_only and not self.person.instructor:
            self.refuse(403, "This page is for instructors.")

    def not_signed_in(self) -> None:
        """A browser's page view goes to the sign-in's login (the hub's); the rest is 401."""
        signin = self.service.signin
        if self.request.method == "GET" and not self.wants_json():
            login = signin.login_url(self)
            if login:
                return self.redirect(login)
        self.refuse(401, signin.how_to_sign_in)

    def wants_json(self) -> bool:
        return wants_json(self.request)

    def refuse(self, code: int, message: str) -> None:
        self.set_status(code)
        if self.wants_json():
            self.finish({"error": message})
        else:
            self.page("refused.html", message=message)

    def write_error(self, status_code: int, **kwargs) -> None:
        reason = self._reason or "error"
        error = kwargs.get("exc_info", (None, None))[1]
        why = str(getattr(error, "log_message", "")).lower()
        if status_code == 403 and ("xsrf" in why or "origin" in why):
            return self.refuse(403, "This form is out of date or came from another site: "
                                    "open the service's page again and send it from there.")
        if self.wants_json():
            self.finish({"error": reason})
        else:
            self.page("error.html", status_code=status_code, reason=reason)

    def known_assignment(self, assignment: str) -> bool:
        """Whether the course has ``assignment`` (else the request is refused, 404)."""
        if assignment in self.service.sources:
            return True
        self.refuse(404, "No such assignment.")
        return False

    def upload(self, submission_id: str):
        """The upload with this id, if the person may see it (else the request is refused)."""
        row = self.service.store.by_key(submission_id)
        if row is None or (row.student != self.person.id and not self.person.instructor):
            self.refuse(404, "No such submission of yours.")
            return None
        return row


class SignIn(Base):
    """``/signin``. With a sign-in that :attr:`confirms` (the standalone tokens): a GET of
    the link signs no one in, it asks "Sign in as ID?"; the POST of that page's form (its
    XSRF token, the token in its body) signs in. On a hub, the OAuth has signed in already."""

    async def prepare(self) -> None:  # the one route that signs in rather than asks
        try:
            self.person = await self.service.signin.sign_in(self)
        except Refused as why:
            self.person = None
            return self.refuse(403, str(why))
        if self.person is None:
            if self.service.signin.login_url(self) is not None:
                return self.not_signed_in()
            self.refuse(403, "This sign-in link is not valid: ask your instructor for yours.")

    async def get(self) -> None:
        if not self.service.signin.confirms:
            return self.signed_in()
        try:
            now = await self.service.signin.person(self)
        except Refused:
            now = None
        self.page("signin.html", now=now, token=self.get_query_argument("token"))

    def post(self) -> None:
        self.signed_in(status=303)

    def signed_in(self, status: int = 302) -> None:
        self.redirect(self.url("instructor") if self.person.instructor else self.url(),
                      status=status)


class SignOut(Base):
    def post(self) -> None:
        then = self.service.signin.sign_out(self)
        if then:  # on a hub: sign out of the hub too
            return self.redirect(then, status=303)
        self.page("signed_out.html")


class Home(Base):
    def get(self) -> None:
        service = self.service
        rows = service.store.rows("WHERE student = ? ORDER BY id DESC", (self.person.id,))
        mine = service.extensions(self.person.id)  # this learner's only: no one else's
        rules = [(name, mine.get((self.person.id, name)), service.config.rules[name])
                 for name in service.assignments]
        self.page("home.html", assignments=service.assignments,
                  rules=[(name, course.extended(extension), extension, course)
                         for name, extension, course in rules],
                  attempts=list(zip(range(len(rows), 0, -1), rows)),
                  boards=[name for name in service.assignments if service.speed_tests.get(name)])


class Leaderboard(Base):
    """``/leaderboard/ASSIGNMENT``: the assignment's speed leaderboard, the same for
    everyone: only those who opted in, under their display names (its ``.json`` is
    :class:`.api.Leaderboard`). The page holds the form to join it, change one's name, or
    leave it. ``_json`` is always None, as it was here."""

    def get(self, assignment: str, _json: Optional[str] = None) -> None:
        if self.known_assignment(assignment):
            self.board_page(self.service.leaderboard(assignment, self.person))

    def board_page(self, data: dict, message: str = "", typed: Optional[str] = None) -> None:
        self.page("leaderboard.html", data=data, message=message,
                  typed=data["display_name"] if typed is None else typed,
                  name_max=NAME_MAX)


class BoardName(Base):
    """``POST /leaderboard``: join the leaderboard as ``display_name``, change it, or leave
    (``action=leave``). A browser's form carries its XSRF token (checked before this runs).
    Back to the assignment's board (303); a name refused: the board again, saying why.
    (A program's POST is :class:`.api.BoardName`'s.)"""

    def post(self) -> None:
        service = self.service
        assignment = self.get_body_argument("assignment", "")
        typed = self.get_body_argument("display_name", "")
        try:
            change_name(service.store, self.person.id,
                        self.get_body_argument("action", "join"), typed)
        except NameRefused as why:
            self.set_status(400)
            if assignment not in service.sources:
                return self.refuse(400, str(why))
            return self.board_page(service.leaderboard(assignment, self.person),
                                   message=sentence(str(why)), typed=typed)
        except ValueError as why:
            return self.refuse(400, str(why))
        self.redirect(self.url(f"leaderboard/{url_escape(assignment, plus=False)}"
                               if assignment in service.sources else ""), status=303)

    board_page = Leaderboard.board_page


UPLOAD_BODY = MAX_NOTEBOOK_BYTES + SERVICE_FORM_OVERHEAD  # the largest upload body read
DRAIN = 2 ** 40  # bytes of an over-size upload read and dropped, so its sender sees why


def read_form(spool, content_type: str):
    """The fields and files of a multipart body spooled to ``spool`` (off the event loop)."""
    spool.seek(0)
    body = spool.read()
    arguments: dict = {}
    files: dict = {}
    httputil.parse_body_arguments(content_type, body, arguments, files)
    return arguments, files


@tornado.web.stream_request_body
class Submit(Base):
    """``POST /submit`` from a browser's form: to the upload's page (303); a program's is
    :class:`.api.Submit`, the same but for its answer (:meth:`accepted`). The body is read
    only from someone signed in (``prepare`` asks first, and Tornado has checked the XSRF
    token of a browser's form), up to the upload limit, into a file of its own; a body
    declared larger is refused at once (before it is sent, for a client that asks
    ``Expect: 100-continue``, as ``submit`` does; other clients send it and it is dropped,
    so they still read why). The form is parsed and the notebook checked in the service's
    upload threads, never on the event loop."""

    spool = None
    refusal = None
    received = 0

    async def prepare(self) -> None:
        try:
            await super().prepare()
        except sqlite3.Error as error:  # who is asking cannot be known just now
            return self.refuse(503, _unavailable(error))
        if self._finished:
            return
        try:
            declared = int(self.request.headers.get("Content-Length") or 0)
        except ValueError:
            declared = 0  # (Tornado has refused it already)
        if declared > UPLOAD_BODY:
            self.refusal = (413, too_big(declared))
        assignment = self.get_query_argument("assignment", "")
        if self.refusal is None and assignment in self.service.sources:
            try:  # `submit` names it in the address too: the hour's limit before the body
                self.service.check_hour(self.person, assignment, time.time())
            except ValueError as error:
                message, code = error.args
                self.refusal = (code, message)
        if self.refusal is not None and \
                self.request.headers.get("Expect", "").lower() == "100-continue":
            return self.refuse(*self.refusal)  # it waits for this before sending
        self.request.connection.set_max_body_size(DRAIN)
        if self.refusal is None:
            incoming = self.service.files / "incoming"
            try:
                incoming.mkdir(parents=True, exist_ok=True)
                self.spool = tempfile.TemporaryFile(dir=incoming)
            except OSError as error:
                self.refusal = (507, _no_room(error))

    def data_received(self, chunk: bytes) -> None:
        self.received += len(chunk)
        if self.refusal is None and self.received > UPLOAD_BODY:
            self.refusal = (413, too_big(self.received))
            self._drop()
        if self.refusal is not None:
            return  # dropped: read only so that the sender reads the refusal
        try:
            self.spool.write(chunk)
        except OSError as error:
            self.refusal = (507, _no_room(error))
            self._drop()

    def _drop(self) -> None:
        if self.spool is not None:
            spool, self.spool = self.spool, None
            spool.close()

    def on_finish(self) -> None:
        self._drop()

    def on_connection_close(self) -> None:
        self._drop()
        super().on_connection_close()

    async def post(self) -> None:
        if self.refusal is not None:
            return self.refuse(*self.refusal)
        pool = self.service.upload_pool
        try:
            fields, files = await IOLoop.current().run_in_executor(
                pool, read_form, self.spool, self.request.headers.get("Content-Type", ""))
        except (httputil.HTTPInputError, ValueError, OSError):
            return self.refuse(400, "The upload is not a form with a notebook file: send it "
                                    "from the service's page or with `python -m autograder "
                                    "submit`.")
        finally:
            self._drop()
        notebooks = files.get("notebook") or []
        if len(notebooks) != 1:
            return self.refuse(400, "Choose one notebook file to hand in.")
        upload = notebooks[0]
        assignment = (fields.get("assignment") or [b""])[0].decode("utf-8", "replace").strip()
        try:
            row = await IOLoop.current().run_in_executor(
                pool, self.service.accept, self.person, assignment, upload.filename,
                upload.body)
        except ValueError as error:
            message, code = error.args if len(error.args) == 2 else (str(error), 400)
            return self.refuse(code, message)
        except (sqlite3.Error, OSError) as error:  # nothing was acknowledged
            return self.refuse(503, _unavailable(error))
        self.accepted(row)

    def accepted(self, row: Row) -> None:
        """The answer once ``row`` is stored and queued."""
        self.redirect(self.url(f"submissions/{row.key}"), status=303)


def _unavailable(error: Exception) -> str:
    return (f"the service cannot take uploads just now ({type(error).__name__}: {error}); "
            "try again in a minute")


def _no_room(error: OSError) -> str:
    return (f"the service could not store the upload ({error.strerror or error}); try again "
            "later")


class Health(tornado.web.RequestHandler):
    """``GET /health``: whether the graders run and the queue moves, for a monitor. Open to
    anyone: it names no one and no upload."""

    def get(self) -> None:
        code, data = self.settings["service"].health()
        self.set_status(code)
        self.set_header("Cache-Control", "no-store")
        self.finish(data)


class Feedback(Base):
    """``/submissions/ID``: the upload's place in the queue, then its feedback (its
    ``.json`` is :class:`.api.Feedback`; ``_json`` is always None, as it was here)."""

    def get(self, submission_id: str, _json: Optional[str] = None) -> None:
        row = self.upload(submission_id)
        if row is None:
            return
        self.page("feedback.html", row=row, data=self.service.feedback(row),
                  refresh=SERVICE_REFRESH if row.state != DONE else None)


class Notebook(Base):
    def get(self, submission_id: str) -> None:
        row = self.upload(submission_id)
        if row is None:
            return
        if row.state != DONE or not row.executed or not Path(row.executed).is_file():
            return self.refuse(404, "This upload has no executed notebook (yet).")
        self.set_header("Content-Type", "application/x-ipynb+json")
        self.set_header("Content-Disposition", f'attachment; filename="{row.notebook}.'
                        f'attempt{row.attempt}.ipynb"')
        self.finish(Path(row.executed).read_bytes())


class Cell(NamedTuple):
    """One learner's uploads of one notebook, on the instructor's page."""
    row: Optional[Row]  # the attempt that counts (None: none graded yet)
    attempts: int
    pending: int  # not graded yet


class Instructor(Base):
    instructors_only = True

    def get(self) -> None:
        service = self.service
        rows = service.store.rows("ORDER BY id")
        counted = service.counted_rows()
        columns = [(a, n) for a in service.assignments for n in sorted(service.sources[a])]
        matrix = []
        for learner in service.learners():
            cells = []
            for assignment, notebook in columns:
                mine = [r for r in rows if (r.student, r.assignment, r.notebook)
                        == (learner, assignment, notebook)]
                cells.append(Cell(counted.get((learner, assignment, notebook)), len(mine),
                                  sum(r.state != DONE for r in mine)) if mine else None)
            matrix.append((learner, cells))
        by_id = {r.id: r for r in rows}
        queue = [(str(i + 1), by_id[n]) for i, n in enumerate(service.store.queue())]
        queue += [("grading", r) for r in rows if r.state == GRADING]
        self.page("instructor.html", assignments=service.assignments,
                  columns=[a if len(service.sources[a]) == 1 else f"{a}/{n}"
                           for a, n in columns],
                  matrix=matrix, queue=queue, every=list(reversed(rows)),
                  lms=service.store.scores_outbox()[:100] if service.lti is not None else None,
                  extensions=sorted(service.extensions().items()),
                  learners=service.learners(), rules=service.config.rules,
                  refresh=SERVICE_REFRESH if queue else None)


class Extensions(Base):
    """``POST /instructor/extensions``: grant a learner an extension of one assignment (a
    later deadline and/or more uploads an hour), replacing the one they had, or withdraw
    the one granted here (``action=withdraw``). Back to the instructor page (303)."""
    instructors_only = True

    def post(self) -> None:
        learner = self.get_body_argument("learner", "").strip()
        assignment = self.get_body_argument("assignment", "")
        action = self.get_body_argument("action", "grant")
        if action == "withdraw":
            self.service.store.withdraw_extension(learner, assignment)
        elif action == "grant":
            try:
                self.service.grant_extension(
                    self.person, learner, assignment, self.get_body_argument("deadline", ""),
                    self.get_body_argument("attempts_per_hour", ""))
            except ValueError as error:  # UploadRefused: (message, HTTP code)
                message, code = error.args
                return self.refuse(code, sentence(message))
        else:
            return self.refuse(400, f"no such action {action!r}: grant or withdraw")
        self.redirect(self.url("instructor"), status=303)


class GradesCsv(Base):
    instructors_only = True

    def get(self) -> None:
        self.set_header("Content-Type", "text/csv; charset=utf-8")
        self.set_header("Content-Disposition", 'attachment; filename="grades.csv"')
        self.finish(self.service.grades_csv())


class Regrade(Base):
    instructors_only = True

    def post(self) -> None:
        self.service.regrade_all()
        self.redirect(self.url("instructor"), status=303)


class Similarity(Base):
    """``/instructor/similarity/ASSIGNMENT``: the pairs of learners whose latest uploads are
    most alike, with their matching lines (:mod:`.similarity`, as the ``similarity``
    command). Compared off the event loop: seconds for a large course."""
    instructors_only = True

    async def get(self, assignment: str) -> None:
        if not self.known_assignment(assignment):
            return
        report = await IOLoop.current().run_in_executor(
            None, similarity.of_uploads, self.service, assignment)
        self.page("similarity.html", report=report, percent=similarity.percent,
                  source="each learner's latest upload")


def similarity_file(report: similarity.Report, source: str) -> str:
    """The similarity page as a file of its own (``similarity --html``): the same template,
    no one signed in, so no sign-in bar and no links into the service."""
    return TEMPLATES.load("similarity.html").generate(
        style=STYLE, refresh=None, person=None, report=report, percent=similarity.percent,
        source=source).decode()


class NotFound(Base):
    def get(self, *args) -> None:
        self.refuse(404, "No such page.")

    post = get


def routes(prefix: str = "/"):
    """The JSON API's routes (first: they share some addresses with pages), then the
    pages', under ``prefix`` (``/``, or a hub service's ``/services/NAME/``)."""
    from autograder.service import api
    at = re.escape(prefix)
    return api.routes(at) + [
            (at, Home), (at + r"signin", SignIn), (at + r"signout", SignOut),
            (at + r"submit", Submit), (at + r"submissions/([\w-]+)", Feedback),
            (at + r"submissions/([\w-]+)/notebook", Notebook),
            (at + r"instructor", Instructor), (at + r"instructor/grades\.csv", GradesCsv),
            (at + r"instructor/regrade", Regrade), (at + r"leaderboard", BoardName),
            (at + r"instructor/extensions", Extensions),
            (at + r"instructor/similarity/([^/]+)", Similarity),
            (at + r"leaderboard/([^/]+)", Leaderboard)]


