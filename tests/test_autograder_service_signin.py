"""The submission service's sign-in and headers, attacked as learners and strangers would.

Each test runs one attack, or one step of a new user's journey, against the real server on
127.0.0.1 (started as ``tests/test_autograder_service.py`` starts it, through its fixtures):
a link to ``/signin?token=<someone else's>`` (login CSRF) and a form posted from another
site; a session that must end when it expires, at sign-out (its cookie replayed) and when
the person is given a new token; the cookie behind a TLS proxy (``--behind-proxy``); the
server's log after a refused and an accepted sign-in; the security headers of every route,
the 404, the error pages and the downloads; a token that begins with ``-``, typed as the
documentation writes it; a refusal that names the learner's file; sizes in MiB; what the
documentation says is made (grades.csv's columns, the session's lifetime, the Gradescope zip's size); a
database from before sessions; the headers of pages on a JupyterHub.
"""
from __future__ import annotations

import base64
import email.utils
import hashlib
import http.client
import html
import json
import re
import secrets
import time
import urllib.parse
from http.cookies import SimpleCookie
from pathlib import Path

import nbformat
import pytest

from autograder.commands.cli import parser
from autograder.service.db import Store
from autograder.commands.submit import multipart
from tests.autograder_fixtures.submissions import answered, write
from tests.documentation import documentation, one_line
from coursebook.service_process import issue_tokens
from tests.test_autograder_service import (Server, autograder, graded, request,
                                           roster_course, service_with_rules, upload)

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parent.parent
COOKIE = "autograder-session"
LIFETIME_DAYS = 0.00004  # 3.5 s: the session of the short-lived server


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    yield from service_with_rules(tmp_path_factory, "signin")


@pytest.fixture(scope="module")
def proxied(tmp_path_factory):
    """The service behind a TLS proxy (``--behind-proxy``), its sessions 3.5 s long."""
    yield from service_with_rules(tmp_path_factory, "proxied", "--behind-proxy",
                                  "--session-days", LIFETIME_DAYS)


def expiry(expires: str) -> float:
    """A cookie's Expires as a time stamp."""
    return email.utils.parsedate_to_datetime(expires).timestamp()


class Browser:
    """A browser without JavaScript, by hand: its cookies, every answer's headers kept, no
    redirect followed (each answer is looked at as it comes)."""

    def __init__(self, url: str, headers: dict = None):
        self.url, self.headers, self.cookies = url, dict(headers or {}), {}

    def send(self, method: str, path: str, fields: dict = None, headers: dict = None,
             body: bytes = None):
        """(status, headers, text) of one request: a form of ``fields``, or ``body`` (its
        Content-Type in ``headers``); cookies set by the answer are kept."""
        address = urllib.parse.urlsplit(self.url)
        connection = http.client.HTTPConnection(address.hostname, address.port, timeout=60)
        sent = dict(self.headers, **(headers or {}))
        if self.cookies:
            sent["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        if fields is not None:
            body = urllib.parse.urlencode(fields).encode()
            sent["Content-Type"] = "application/x-www-form-urlencoded"
        connection.request(method, path, body=body, headers=sent)
        answer = connection.getresponse()
        data = answer.read()
        connection.close()
        for header in answer.headers.get_all("Set-Cookie") or []:
            cookie = SimpleCookie(header)
            for name, morsel in cookie.items():
                if not morsel.value or morsel["max-age"] == "0" or \
                        (morsel["expires"] and expiry(morsel["expires"]) < time.time()):
                    self.cookies.pop(name, None)  # cleared
                else:
                    self.cookies[name] = morsel.value
        return answer.status, answer.headers, data.decode(errors="replace")

    def get(self, path: str, **kwargs):
        return self.send("GET", path, **kwargs)

    def confirm(self, token: str):
        """Open the sign-in link: (the confirmation's page, its form's hidden fields)."""
        status, headers, page = self.get(f"/signin?token={urllib.parse.quote(token)}")
        assert status == 200, (status, page)
        fields = dict(re.findall(r'<input type="?hidden"? name="?(\w+)"? value="([^"]*)"',
                                 page))
        return page, {k: v.replace("&amp;", "&") for k, v in fields.items()}

    def sign_in(self, token: str, headers: dict = None):
        """The link, then its form: the answer to the form's POST."""
        _, fields = self.confirm(token)
        return self.send("POST", "/signin", fields=fields, headers=headers)

    def who(self) -> str:
        """Who the home page says is signed in; "" when it refuses (not signed in)."""
        status, _, page = self.get("/")
        found = re.search(r"Signed in as <b>([^<]+)</b>", page)
        assert (status == 200) == bool(found), (status, page)
        return found.group(1) if found else ""


# ------------------------------------------------------------------------ login CSRF

def test_a_link_from_elsewhere_signs_no_one_in(service):
    server, people = service
    victim = Browser(server.url)
    assert victim.sign_in(people["alan"])[0] == 303 and victim.who() == "alan"
    # An attacker's link, opened by alan's browser: it only asks; alan stays alan.
    page, fields = victim.confirm(people["mary"])
    assert "Sign in as mary?" in page and "signed in as <b>alan</b> now" in page
    assert COOKIE not in Browser(server.url).get(
        f"/signin?token={people['mary']}")[1].get("Set-Cookie", "")
    assert victim.who() == "alan"
    # A stranger's browser that only opens the link is signed in as no one.
    stranger = Browser(server.url)
    stranger.confirm(people["mary"])
    assert COOKIE not in stranger.cookies and stranger.who() == ""
    # A form on another site posting the attacker's token: no XSRF token, refused.
    status, _, page = victim.send("POST", "/signin", fields={"token": people["mary"]},
                                  headers={"Origin": "http://evil.example",
                                           "Sec-Fetch-Site": "cross-site"})
    assert status == 403 and "came from another site" in page
    status, _, page = stranger.send("POST", "/signin", fields={"token": people["mary"]})
    assert status == 403 and COOKIE not in stranger.cookies
    # Even with the form's own XSRF token, a post that says it came from elsewhere.
    assert victim.send("POST", "/signin", fields=fields,
                       headers={"Origin": "http://evil.example",
                                "Sec-Fetch-Site": "cross-site"})[0] == 403
    assert victim.who() == "alan"
    # The confirmation's own form signs in, as that person, and says so first.
    assert victim.send("POST", "/signin", fields=fields)[0] == 303 and victim.who() == "mary"


# ------------------------------------------------------------------------ sessions

def test_sign_out_ends_the_session_on_the_server(service):
    server, people = service
    browser = Browser(server.url)
    status, headers, _ = browser.sign_in(people["grace"])
    assert status == 303 and headers["Location"] == "/"
    session = browser.cookies[COOKIE]
    assert session != people["grace"] and people["grace"] not in headers["Set-Cookie"]
    assert browser.who() == "grace"
    _, _, home = browser.get("/")
    xsrf = re.search(r'name="_xsrf" value="([^"]+)"', home).group(1)
    status, _, page = browser.send("POST", "/signout", fields={"_xsrf": xsrf})
    assert status == 200 and "Signed out" in page and COOKIE not in browser.cookies
    # The old cookie, replayed (a copy kept by anyone), signs in no one any more.
    replayed = Browser(server.url)
    replayed.cookies[COOKIE] = session
    assert replayed.who() == ""
    assert replayed.get(f"/submissions/x.json", headers={"Accept": "application/json"})[0] \
        == 401


def test_new_tokens_end_the_persons_sessions(service):
    server, people = service
    browser = Browser(server.url)
    browser.sign_in(people["grace"])
    assert browser.who() == "grace"
    people.update(issue_tokens(server.course, "grace"))  # the old link is lost, say
    assert browser.who() == ""
    assert Browser(server.url).sign_in(people["grace"])[0] == 303


def test_a_session_lasts_its_stated_time_in_the_cookie_and_on_the_server(proxied):
    server, people = proxied
    browser = Browser(server.url)
    status, headers, _ = browser.sign_in(people["alan"])
    assert status == 303
    cookie = SimpleCookie(headers["Set-Cookie"])[COOKIE]
    assert cookie["httponly"] and cookie["samesite"] == "Lax"
    # a persistent cookie (kept when the browser quits), as long as the session
    assert cookie["expires"] or cookie["max-age"], headers["Set-Cookie"]
    assert abs(expiry(cookie["expires"]) - (time.time() + LIFETIME_DAYS * 86400)) < 3, \
        cookie["expires"]
    assert browser.who() == "alan"
    time.sleep(LIFETIME_DAYS * 86400 + 0.5)
    assert browser.who() == ""  # the cookie sent after its time: the server says no


def test_the_cookie_is_secure_behind_a_tls_proxy_only(proxied, service):
    server, people = proxied
    https = {"X-Forwarded-Proto": "https"}
    status, headers, _ = Browser(server.url, https).sign_in(people["grace"])
    assert status == 303 and SimpleCookie(headers["Set-Cookie"])[COOKIE]["secure"]
    assert headers["Location"] == "/"
    # plain HTTP to the same server: no Secure (the cookie would never come back)
    status, headers, _ = Browser(server.url).sign_in(people["grace"])
    assert status == 303 and not SimpleCookie(headers["Set-Cookie"])[COOKIE]["secure"]
    # a server not told it is behind a proxy believes no client's X-Forwarded-Proto
    plain, others = service
    status, headers, _ = Browser(plain.url, https).sign_in(others["linus"])
    assert status == 303 and not SimpleCookie(headers["Set-Cookie"])[COOKIE]["secure"]


# ------------------------------------------------------------------------ the log

def test_no_token_reaches_the_log(service):
    server, people = service
    wrong = "W" + secrets.token_urlsafe(30)
    assert request(f"{server.url}/signin?token={wrong}")[0] == 403  # logged: a warning
    browser = Browser(server.url)
    assert browser.sign_in(people["ada"])[0] == 303
    assert browser.get(f"/signin?token={wrong}&next=x")[0] == 403
    log = server.errors()
    assert "/signin?token=[redacted]" in log, log  # the requests are there, without secrets
    for secret in (wrong, people["ada"], browser.cookies[COOKIE]):
        assert secret not in log


# ------------------------------------------------------------------------ headers

@pytest.fixture(scope="module")
def dashed(service, tmp_path_factory):
    """linus's token begins with "-"; he hands in with ``submit --token=...`` (as the
    documentation writes it). Returns the run and his token."""
    server, people = service
    token = "-" + secrets.token_urlsafe(32)
    Store(server.course / "service.db").set_token("linus", token)
    people["linus"] = token
    path = write(tmp_path_factory.mktemp("linus"), "linus", answered())
    run = autograder("submit", path, "--to", server.url, f"--token={token}",
                     "--assignment", "demo", timeout=180)
    return run, token


def test_a_token_that_begins_with_a_dash_as_the_documentation_writes_it(service, dashed):
    run, token = dashed
    assert run.returncode == 0, run.stdout + run.stderr
    assert "8 of 8 points." in run.stdout
    commands = []
    for page in ("assignments/handing-in.md", "guide/service.md"):  # the learners', the service's
        found = re.findall(r"(?:python -m autograder )?(submit [^\n`]*?--token[^\n`]*)",
                           documentation(page).replace("\\\n", " "))
        assert found, f"{page} shows no submit command with its token"
        commands += found
    for command in commands:
        words = command.replace("TOKEN", token).split()
        args = parser().parse_args(words)  # argparse error (exit 2) for "--token -..."
        assert args.token == token, command


def test_issued_tokens_never_begin_with_a_dash(tmp_path, monkeypatch):
    from autograder.service.auth import TokenSignIn
    from autograder.service.config import read_roster
    made = iter(["-" + "a" * 42, "b" * 43, "-" + "c" * 42, "_" + "d" * 42])
    monkeypatch.setattr(secrets, "token_urlsafe", lambda n=None: next(made))
    course = roster_course(tmp_path)
    signin = TokenSignIn(Store(tmp_path / "service.db"), read_roster(course))
    issued = [token for _, token in signin.issue(["alan", "grace"])]
    assert issued == ["b" * 43, "_" + "d" * 42]


STYLE = re.compile(r"<style>(.*?)</style>", re.S)


def assert_safe_headers(headers, what: str) -> None:
    policy = headers.get("Content-Security-Policy", "")
    directives = dict(d.strip().split(" ", 1) for d in policy.split(";") if d.strip())
    assert directives.get("default-src") == "'none'", (what, policy)
    assert directives.get("frame-ancestors") == "'none'", (what, policy)
    assert directives.get("form-action") == "'self'", (what, policy)
    assert directives.get("base-uri") == "'none'", (what, policy)
    assert "script-src" not in directives and "unsafe" not in policy, (what, policy)
    assert headers.get("X-Content-Type-Options") == "nosniff", what
    assert headers.get("X-Frame-Options") == "DENY", what
    assert headers.get("Referrer-Policy") == "no-referrer", what
    assert headers.get("Cache-Control") == "no-store", what


def test_every_answer_carries_the_security_headers(service, dashed):
    server, people = service
    key = json.loads(upload(server, people["mary"], answered())[1])["id"]
    graded(server, people["mary"], key)
    mary, ada, nobody = (Browser(server.url), Browser(server.url), Browser(server.url))
    mary.sign_in(people["mary"])
    ada.sign_in(people["ada"])
    json_accept = {"Accept": "application/json"}
    answers = {
        "sign-in link": nobody.get(f"/signin?token={people['mary']}"),
        "refused link": nobody.get("/signin?token=nope"),
        "sign-in form": Browser(server.url).sign_in(people["alan"]),  # a redirect
        "not signed in": nobody.get("/"),
        "not signed in (json)": nobody.get(f"/submissions/{key}.json", headers=json_accept),
        "home": mary.get("/"),
        "feedback": mary.get(f"/submissions/{key}"),
        "feedback (json)": mary.get(f"/submissions/{key}.json"),
        "executed notebook": mary.get(f"/submissions/{key}/notebook"),
        "download, not signed in": Browser(server.url).get(f"/submissions/{key}/notebook"),
        "404": mary.get("/no/such/page"),
        "POST, no XSRF token": mary.send("POST", "/no/such/page", fields={}),
        "upload, no XSRF token": mary.send("POST", "/submit", fields={}),
        "instructor": ada.get("/instructor"),
        "instructor only": mary.get("/instructor"),
        "grades.csv": ada.get("/instructor/grades.csv"),
    }
    for what, (status, headers, body) in answers.items():
        assert_safe_headers(headers, f"{what} ({status})")
        for style in STYLE.findall(body):  # the policy allows the pages' own style
            digest = base64.b64encode(hashlib.sha256(style.encode()).digest()).decode()
            assert f"'sha256-{digest}'" in headers["Content-Security-Policy"], what
        assert " style=" not in body, what  # no inline style attribute: the policy bans it
    statuses = {what: answer[0] for what, answer in answers.items()}
    assert statuses == {"sign-in link": 200, "refused link": 403, "sign-in form": 303,
                        "not signed in": 401, "not signed in (json)": 401, "home": 200,
                        "feedback": 200, "feedback (json)": 200, "executed notebook": 200,
                        "download, not signed in": 401, "404": 404, "POST, no XSRF token": 403,
                        "upload, no XSRF token": 403, "instructor": 200, "instructor only": 403,
                        "grades.csv": 200}
    assert answers["executed notebook"][1]["Content-Type"] == "application/x-ipynb+json"


# ------------------------------------------------------------------------ the journey

def test_a_refusal_names_the_learners_file_as_it_is(service):
    server, people = service
    browser = Browser(server.url)
    browser.sign_in(people["mary"])
    _, _, home = browser.get("/")
    xsrf = re.search(r'name="_xsrf" value="([^"]+)"', home).group(1)
    action = html.unescape(re.search(r'<form method=post action="([^"]+)" enctype', home).group(1))
    for name, data, says in (
            ("demo.ipynb", b"{not json", "demo.ipynb: the file is not a Jupyter notebook"),
            ("myNotes.ipynb", b"{}", "myNotes.ipynb: the file is JSON but not a Jupyter"),
            ("demo.ipynb", b"", "The upload is empty")):
        body, kind = multipart({"_xsrf": xsrf, "assignment": "demo"}, "notebook", name, data)
        status, _, page = browser.send("POST", "/" + action.lstrip("/"), body=body,
                                       headers={"Content-Type": kind})  # the page's own form
        assert status in (400, 415) and says in page, (name, status, page)


def test_the_documentation_says_what_is_made(tmp_path):
    """grades.csv's columns, the session's lifetime, the Gradescope zip's size."""
    import zipfile
    from autograder.pipeline.report import CSV_COLUMNS
    grader = one_line(documentation("guide/grader.md"))
    listed = re.search(r"`graded/grades\.csv` \(`([\w,]+)`", grader)
    assert listed and tuple(listed.group(1).split(",")) == CSV_COLUMNS, listed
    from autograder.options import SERVICE_SESSION_DAYS
    assert (f"stays signed in for {SERVICE_SESSION_DAYS:g} days"
            in one_line(documentation("assignments/handing-in.md")))
    assert (f"`--session-days` ({SERVICE_SESSION_DAYS:g} by default"
            in one_line(documentation("guide/service.md")))
    said = re.search(r"the zip of `ring_allreduce` is (\d+) KiB \((\d+) files, (\d+) KiB "
                     r"unpacked\)", one_line(documentation("guide/gradescope.md")))
    assert said, "the Gradescope page gives the zip's size"
    built = autograder("gradescope", "--assignment", "ring_allreduce", "--out",
                       tmp_path / "ring_allreduce.zip", timeout=120)
    assert built.returncode == 0, built.stderr[-2000:]
    with zipfile.ZipFile(tmp_path / "ring_allreduce.zip") as made:
        files = made.infolist()
        unpacked = sum(f.file_size for f in files) / 1024
    size = (tmp_path / "ring_allreduce.zip").stat().st_size / 1024
    # as it is now, give or take a tenth (the course's own files change a little)
    assert abs(size - int(said.group(1))) <= 0.1 * size, (size, said.group(0))
    assert abs(unpacked - int(said.group(3))) <= 0.1 * unpacked, (unpacked, said.group(0))
    assert abs(len(files) - int(said.group(2))) <= 5, (len(files), said.group(0))


def test_a_database_of_the_service_before_sessions_gains_them(tmp_path):
    """A schema 3 database (no sessions table): opened, it gains one, its tokens still sign
    in, and a copy of the file as it was is kept beside it."""
    import sqlite3
    from autograder.service.db import SCHEMA_VERSION
    path = tmp_path / "service.db"
    Store(path).set_token("alan", "alans-token")
    with sqlite3.connect(path) as db:  # as the service of schema 3 left it
        db.execute("DROP TABLE sessions")
        db.execute("ALTER TABLE submissions DROP COLUMN tests")
        db.execute("ALTER TABLE submissions DROP COLUMN speeds")
        db.execute("DROP TABLE board_names")
        for (table,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND "
                                   "name LIKE 'lti_%'").fetchall():  # schema 7's
            db.execute(f"DROP TABLE {table}")
        db.execute("PRAGMA user_version = 3")
    store = Store(path)
    assert store.person_of("alans-token") == "alan"
    session = store.start_session("alan", 60.0)
    assert store.session_person(session) == "alan" and store.session_person("x") is None
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert session not in "\n".join(db.iterdump())  # only its hash is stored
    with sqlite3.connect(tmp_path / "service.db.schema3") as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 3
    store.set_token("alan", "a-new-token")  # new tokens end the person's sessions
    assert store.session_person(session) is None


def test_pages_on_a_hub_carry_the_same_headers():
    """On a JupyterHub each page also has JupyterHub's ``HubOAuthenticated`` mixin: the
    policy and headers stay ours (the mixin sets none of its own over them)."""
    from types import SimpleNamespace
    from unittest import mock
    import tornado.httputil
    import tornado.web
    from autograder.service import pages
    from tests.test_autograder_service_hub import PREFIX, hub_signin
    signin = hub_signin()
    service = SimpleNamespace(signin=signin, form_targets="https://hub.example.org")
    app = tornado.web.Application(service=service)
    for page in (pages.Home, pages.Notebook, pages.GradesCsv, pages.NotFound):
        handler = signin.page(page)(app, tornado.httputil.HTTPServerRequest(
            start_line=tornado.httputil.RequestStartLine("GET", PREFIX, "HTTP/1.1"),
            headers=tornado.httputil.HTTPHeaders({"Host": "hub.example.org"}),
            connection=mock.Mock()))
        headers = handler._headers
        assert_safe_headers({**headers, "Content-Security-Policy": headers[
            "Content-Security-Policy"].replace(" https://hub.example.org", "")}, page.__name__)
        assert "form-action 'self' https://hub.example.org;" in \
            headers["Content-Security-Policy"]


def test_the_log_cuts_every_secret_of_an_address():
    from autograder.service.app import redact
    assert redact("POST /submit?_xsrf=2|ab|cd|17&assignment=demo") == \
        "POST /submit?_xsrf=[redacted]&assignment=demo"
    assert redact("GET /signin?token=-abc_DEF") == "GET /signin?token=[redacted]"
    assert redact("GET /oauth_callback?code=xyz&state=s") == \
        "GET /oauth_callback?code=[redacted]&state=s"
    assert redact("GET /submissions/abc?wait=5") == "GET /submissions/abc?wait=5"
