"""LTI 1.3 / LTI Advantage: the submission service launched from an LMS.

The LMS is ``tests/lti_platform.py``, a platform built on the ``lti1p3platform`` package
(the tool's side is PyJWT and our own code), on 127.0.0.1; the service is the real
``python -m autograder serve`` over a copy of the fixture course. A learner's browser (no
JavaScript: each redirect and auto-posted form followed by hand) is launched from the
LMS, signed in as the LMS user, hands in through the upload form, and the score arrives in
the LMS's gradebook, late when the LMS was down. Launches that are forged, replayed, meant
for another tool, expired, or finished in another browser are refused with a page that
says why; an assignment closed for syncing sends nothing; an instructor's deep-linking
launch adds an assignment; the roster comes from the LMS.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import html
import json
import re
import shutil
import sqlite3
import subprocess
import textwrap
import time
import urllib.parse
from datetime import datetime
import urllib.request
from pathlib import Path

import nbformat
import pytest

# Where the course's requirements are not all installed (the GPU kit's machine), skip.
jwt = pytest.importorskip("jwt")
pytest.importorskip("lti1p3platform")

from autograder.commands.submit import multipart
from autograder.service.config import ConfigError, read_lti
from autograder.service.db import Store
from autograder.service.lti import STATE_COOKIE, Tool, next_link, person_id
from tests.autograder_fixtures.submissions import COURSE, answered
from tests.lti_platform import DEPLOYMENT, ISSUER, Lms, new_key_pem, public_pem
from tests.test_autograder_service import ROSTER, Server, autograder, until
from tests.test_autograder_service_signin import Browser

USERS = {"u-alan": "learner", "u-grace": "learner", "u-mary": "learner", "u-ada": "instructor"}
PLATFORM = ('[[lti.platforms]]\nissuer = "https://lms.example.edu"\nclient_id = "c"\n'
            'deployment_ids = ["d"]\nauth_login_url = "https://lms.example.edu/auth"\n'
            'auth_token_url = "https://lms.example.edu/token"\n'
            'key_set_url = "https://lms.example.edu/jwks"\n')
HALF = "def squares(n):\n    return [k * k for k in range(1, n + 1)]"  # loses points


def b64(data: bytes) -> bytes:
    return base64.urlsafe_b64encode(data).rstrip(b"=")


def make_key(path: Path) -> None:
    """The tool's key, made with the guide's command (or, without openssl, the same kind)."""
    if shutil.which("openssl"):
        subprocess.run(["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt",
                        "rsa_keygen_bits:2048", "-out", str(path)], check=True,
                       capture_output=True, timeout=60)
    else:
        path.write_text(new_key_pem())


def lti_course(folder: Path, lms: Lms) -> Path:
    """The fixture course with a second assignment, ``frozen``, closed for syncing, and the
    LMS registered in service.toml."""
    course = folder / "course"
    shutil.copytree(COURSE, course)
    shutil.copytree(course / "solutions" / "demo", course / "solutions" / "frozen")
    (course / "roster.toml").write_text(ROSTER)
    make_key(course / "lti-key.pem")
    (course / "service.toml").write_text(
        '[assignments.frozen]\nsync_grades = false\n'
        '[lti]\nprivate_key = "lti-key.pem"\nretry_seconds = 0.3\nretry_max_seconds = 1\n'
        + lms.service_toml())
    return course


@pytest.fixture(scope="module")
def lms_service(tmp_path_factory):
    lms = Lms(USERS, ["demo", "frozen"])
    course = lti_course(tmp_path_factory.mktemp("lti"), lms)
    server = Server(course)
    lms.tool_url = server.url
    yield lms, server
    server.stop()
    lms.stop()


def follow_to_form(browser: Browser, lms: Lms, user: str, message: str):
    """The LMS starts a launch: the tool's login, its redirect to the LMS, the LMS's form.
    Returns the form's fields (id_token, state) and where it posts."""
    login = urllib.parse.urlsplit(lms.login_url(user, message))
    status, headers, page = browser.get(f"{login.path}?{login.query}")
    assert status == 302, (status, page)
    authorize = headers["Location"]
    assert authorize.startswith(lms.url + "/auth?"), authorize
    with urllib.request.urlopen(authorize, timeout=30) as answer:
        form = answer.read().decode()
    action = re.search(r'action="([^"]+)"', form).group(1)
    fields = {name: html.unescape(value) for name, value in
              re.findall(r'name=(\w+) value="([^"]*)"', form)}
    return fields, action


def post_launch(browser: Browser, action: str, fields: dict):
    """The auto-posted form, as the LMS's page sends it: from the LMS's site."""
    return browser.send("POST", urllib.parse.urlsplit(action).path, fields=fields,
                        headers={"Origin": "https://lms.example.edu",
                                 "Sec-Fetch-Site": "cross-site"})


def launch(browser: Browser, lms: Lms, user: str, message: str):
    fields, action = follow_to_form(browser, lms, user, message)
    return post_launch(browser, action, fields) + (fields,)


def hand_in(browser: Browser, nb, assignment: str) -> str:
    """Upload through the home page's form; the feedback page's path."""
    status, _, home = browser.get("/")
    assert status == 200, home
    xsrf = html.unescape(re.search(r'name="_xsrf" value="([^"]+)"', home).group(1))
    action = html.unescape(re.search(r'<form method=post action="([^"]+)" enctype',
                                     home).group(1))
    body, kind = multipart({"_xsrf": xsrf, "assignment": assignment}, "notebook",
                           "demo.ipynb", nbformat.writes(nb).encode())
    status, headers, page = browser.send("POST", action, body=body,
                                         headers={"Content-Type": kind})
    assert status == 303, (status, page)
    return headers["Location"]


def outbox(server) -> list:
    with sqlite3.connect(server.course / "service.db") as db:
        return db.execute("SELECT person, assignment, score, max_score, state, tries "
                          "FROM lti_scores ORDER BY id").fetchall()


@pytest.mark.integration
def test_a_learner_launched_from_the_lms_hands_in_and_the_score_arrives_after_the_lms_is_back(
        lms_service):
    lms, server = lms_service
    lms.down = True  # the score is posted while the LMS is down: retried until it is up
    browser = Browser(server.url)
    status, headers, page, _ = launch(browser, lms, "u-alan", "link:demo")
    assert status == 303 and headers["Location"] == "/", (status, page)
    alan = person_id(ISSUER, DEPLOYMENT, "u-alan")
    assert browser.who() == alan and re.fullmatch(r"lti-[0-9a-f]{16}", alan)
    # the mapping is written down, and a second launch is the same person
    with sqlite3.connect(server.course / "service.db") as db:
        assert db.execute("SELECT issuer, deployment, sub, role FROM lti_people WHERE person "
                          "= ?", (alan,)).fetchall() == [(ISSUER, DEPLOYMENT, "u-alan",
                                                          "learner")]
    status, _, page = browser.get("/instructor")  # an LMS learner is a learner here
    assert status == 403 and "for instructors" in page
    again = Browser(server.url)
    assert launch(again, lms, "u-alan", "link:demo")[0] == 303 and again.who() == alan

    feedback = hand_in(browser, answered(squares=HALF), "demo")
    until(lambda: "Download the executed notebook" in browser.get(feedback)[2], 120,
             "the grade")
    until(lambda: any(row[5] >= 2 for row in outbox(server)), 30, "two failed posts")
    assert lms.scores["demo"] == {} and lms.refused_posts >= 2
    # a post that failed drops its token (it may have been revoked): a fresh one each try
    assert lms.tokens_issued >= lms.refused_posts
    lms.down = False
    score = until(lambda: lms.scores["demo"].get("u-alan"), 30, "the score in the LMS")
    assert (score["scoreGiven"], score["scoreMaximum"]) == (5, 8), score
    assert (score["activityProgress"], score["gradingProgress"]) == ("Completed",
                                                                    "FullyGraded")
    assert abs(time.time() - datetime.fromisoformat(score["timestamp"]).timestamp()) < 300
    time.sleep(1.5)  # longer than the longest wait between tries: nothing is posted again
    assert len(lms.score_posts) == 1 and outbox(server)[-1][4] == "sent"
    # the same learner id in grades.csv (an instructor's view)
    teacher = Browser(server.url)
    status, headers, _, _ = launch(teacher, lms, "u-ada", "link:demo")
    assert status == 303 and headers["Location"] == "/instructor"
    status, _, grades = teacher.get("/instructor/grades.csv")
    assert status == 200 and f"{alan},demo,demo,5,8" in grades, grades
    status, _, page = teacher.get("/instructor")
    assert f"<tr><td>{alan}</td><td>demo</td><td>5/8</td><td>sent</td><td>" in page, page
    # the LMS's last error is shown, as text
    assert "&lt;b&gt;down&lt;/b&gt;" in page and "<b>down" not in page
    assert f"<td>{alan}</td>" in page.split("<h2>Queue")[0]  # a learner of the matrix


@pytest.mark.integration
def test_a_forged_replayed_misaddressed_or_expired_launch_is_refused(lms_service):
    lms, server = lms_service
    attacker = new_key_pem()
    # forged: the LMS's claims and key id, signed with another key
    browser = Browser(server.url)
    fields, action = follow_to_form(browser, lms, "u-mary", "link:demo")
    claims = jwt.decode(fields["id_token"], options={"verify_signature": False})
    kid = jwt.get_unverified_header(fields["id_token"])["kid"]
    forged = dict(fields, id_token=jwt.encode(dict(claims, sub="u-alan"), attacker,
                                              algorithm="RS256", headers={"kid": kid}))
    status, _, page = post_launch(browser, action, forged)
    assert status == 403 and "signature or content is not valid" in page, page
    assert browser.who() == ""
    # unsigned ("alg": "none"), and HS256 keyed with the LMS's public key (which anyone can
    # fetch): the tool takes RS256 only
    public = public_pem(lms.private_key).encode()
    for alg, sign in (("none", lambda data: b""),
                      ("HS256", lambda data: hmac.new(public, data, hashlib.sha256).digest())):
        fields, action = follow_to_form(browser, lms, "u-mary", "link:demo")
        head = b64(json.dumps({"alg": alg, "typ": "JWT", "kid": kid}).encode())
        data = head + b"." + b64(json.dumps(dict(claims, nonce=jwt.decode(
            fields["id_token"], options={"verify_signature": False})["nonce"])).encode())
        token = (data + b"." + b64(sign(data))).decode()
        status, _, page = post_launch(browser, action, dict(fields, id_token=token))
        assert status == 403 and "signature or content is not valid" in page, (alg, page)
        assert browser.who() == ""
    # replayed: the same form again after it signed someone in, and with a fresh login
    status, _, _, used = launch(browser, lms, "u-mary", "link:demo")
    assert status == 303 and browser.who() == person_id(ISSUER, DEPLOYMENT, "u-mary")
    thief = Browser(server.url)
    thief.cookies[STATE_COOKIE] = used["state"]
    status, _, page = post_launch(thief, action, used)
    assert status == 403 and "used already" in page and thief.who() == ""
    fresh, _ = follow_to_form(thief, lms, "u-grace", "link:demo")
    status, _, page = post_launch(thief, action, dict(used, state=fresh["state"]))
    assert status == 403 and "used already (its nonce)" in page and thief.who() == ""
    # a login started in another browser: its state is not this browser's
    victim = Browser(server.url)
    status, _, page = post_launch(victim, action, follow_to_form(thief, lms, "u-grace",
                                                                 "link:demo")[0])
    assert status == 403 and "not started in this browser" in page and victim.who() == ""
    # meant for another tool, expired, naming a page in the assignment: refused, escaped
    for change, says in ((lambda m: dict(m, aud="another-tool"), "meant for another tool"),
                         (None, "has expired"),
                         (lambda m: dict(m, **{"https://purl.imsglobal.org/spec/lti/claim/"
                                               "custom": {"assignment": "<b>x</b>"}}),
                          "names no assignment of the course ('<b>x</b>')")):
        lms.tamper, lms.expires_in = change, (300 if change else -120)
        try:
            stranger = Browser(server.url)
            status, _, page, _ = launch(stranger, lms, "u-grace", "link:demo")
        finally:
            lms.tamper, lms.expires_in = None, 300
        assert status == 403 and says in html.unescape(page) and "<b>x" not in page, page
        assert stranger.who() == ""
    # a login from an LMS that is not registered
    status, _, page = Browser(server.url).get(
        "/lti/login?" + urllib.parse.urlencode({"iss": "https://evil.example",
                                                "login_hint": "u-alan",
                                                "target_link_uri": server.url}))
    assert status == 400 and "not registered" in page


@pytest.mark.integration
def test_an_assignment_closed_for_syncing_sends_no_score(lms_service):
    lms, server = lms_service
    browser = Browser(server.url)
    assert launch(browser, lms, "u-grace", "link:frozen")[0] == 303
    feedback = hand_in(browser, answered(), "frozen")
    until(lambda: "Download the executed notebook" in browser.get(feedback)[2], 120,
             "the grade")
    time.sleep(1.0)  # the outbox's wake-up and a try would have happened by now
    assert lms.scores["frozen"] == {}
    assert not [row for row in outbox(server) if row[1] == "frozen"]


@pytest.mark.integration
def test_an_instructor_adds_an_assignment_by_deep_linking_and_reads_the_roster(lms_service):
    lms, server = lms_service
    teacher = Browser(server.url)
    status, headers, page, _ = launch(teacher, lms, "u-ada", "deep-link")
    assert status == 200 and "Add an assignment to the course" in page, page
    assert f"form-action 'self' {lms.url}" in headers["Content-Security-Policy"]
    forms = dict(re.findall(r'name=JWT value="([^"]+)"><button>Add (\w+)<', page))
    assert set(forms.values()) == {"demo", "frozen"}
    token = next(t for t, a in forms.items() if a == "demo")
    body = urllib.parse.urlencode({"JWT": token}).encode()
    with urllib.request.urlopen(f"{lms.url}/deep_link_return", body, timeout=30) as answer:
        assert answer.status == 200
    item, = lms.deep_links
    assert item["type"] == "ltiResourceLink" and item["custom"] == {"assignment": "demo"}
    assert item["url"] == server.url + "/lti/launch"
    assert item["lineItem"]["resourceId"] == "demo" and item["lineItem"]["scoreMaximum"] > 0
    assert jwt.decode(token, options={"verify_signature": False})[
        "https://purl.imsglobal.org/spec/lti-dl/claim/data"] == "opaque-42"
    # a learner's deep-linking launch is refused
    status, _, page, _ = launch(Browser(server.url), lms, "u-mary", "deep-link")
    assert status == 403 and "only the course's instructors" in html.unescape(page)
    # the roster, from the LMS's NRPS with a client-credentials token (the learners'
    # launches recorded where it is)
    listed = autograder("serve", "--course", server.course, "--lti-roster", timeout=120)
    assert listed.returncode == 0, listed.stderr
    members = {line.split("\t")[1]: dict(zip(("person", "user_id", "role", "status", "name"),
                                             line.split("\t")))
               for line in listed.stdout.splitlines() if not line.startswith("#")}
    assert set(members) == set(USERS)
    assert members["u-alan"]["person"] == person_id(ISSUER, DEPLOYMENT, "u-alan")
    assert members["u-ada"]["role"] == "instructor" and members["u-mary"]["role"] == "learner"


# ------------------------------------------------------------------ unit tests

def test_the_outbox_keeps_one_score_per_change_and_waits_longer_each_try(tmp_path):
    store = Store(tmp_path / "service.db")
    assert store.queue_score("lti-a", "demo", 6.0, 8.0) is not None
    assert store.queue_score("lti-a", "demo", 6.0, 8.0) is None  # no change: not again
    assert store.queue_score("lti-a", "demo", 8.0, 8.0) is not None
    states = [row[4] for row in store.scores_outbox()]
    assert states == ["pending", "superseded"]  # only the newest is sent
    (course := tmp_path / "course").mkdir()
    (course / "k.pem").write_text(new_key_pem())
    (course / "service.toml").write_text(
        '[lti]\nprivate_key = "k.pem"\nretry_seconds = 2\nretry_max_seconds = 10\n'
        + PLATFORM)
    tool = Tool(read_lti(course), store, {})
    assert [tool.wait_after(n) for n in range(1, 6)] == [2, 4, 8, 10, 10]
    assert tool.jwks["keys"][0]["kid"] == tool.key_id and "d" not in tool.jwks["keys"][0]
    assert next_link('<https://l/m?p=2>; rel="next", <https://l/m>; rel="first"') == \
        "https://l/m?p=2"


@pytest.mark.parametrize("text, says", [
    ('[lti]\nprivate_key = "missing.pem"\n', "is missing"),
    ('[lti]\nprivate_key = "k.pem"\n', "no [[lti.platforms]]"),
    ('[lti]\nprivate_key = "k.pem"\n[[lti.platforms]]\nissuer = "x"\n', "missing"),
    ('[lti]\nprivate_key = "k.pem"\nurl = "http://grader.example.edu"\n', "https://"),
    ('[assignments.demo]\nsync_grades = "no"\n', "sync_grades must be true or false"),
])
def test_a_bad_lti_table_is_a_clear_error(tmp_path, text, says):
    from autograder.service.config import read_rules
    (tmp_path / "k.pem").write_text("not read before the table is checked")
    (tmp_path / "service.toml").write_text(text)
    with pytest.raises(ConfigError, match=re.escape(says)):
        read_rules(tmp_path, ["demo"])
        read_lti(tmp_path)


def test_a_schema_6_database_gets_the_lti_tables_keeping_its_rows(tmp_path):
    """Version 7 adds the LTI tables, empty; the file as it was is kept beside it."""
    from autograder.service.db import SCHEMA_VERSION
    path = tmp_path / "service.db"
    store = Store(path)
    store.set_token("alan", "alans-token")
    with sqlite3.connect(path) as db:  # the same file as the version 6 service left it
        for (table,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND "
                                   "name LIKE 'lti_%'").fetchall():
            db.execute(f"DROP TABLE {table}")
        db.execute("PRAGMA user_version = 6")
    store = Store(path)
    assert SCHEMA_VERSION == 7 and store.person_of("alans-token") == "alan"
    assert store.lti_people() == {} and store.scores_outbox() == []
    assert store.lti_person("https://lms", "d", "u1", "learner", "U", person_id) == \
        person_id("https://lms", "d", "u1")
    with sqlite3.connect(tmp_path / "service.db.schema6") as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 6


def test_a_score_queued_before_its_assignment_was_closed_is_never_sent(tmp_path):
    """Closing an assignment (sync_grades = false, then a restart) stops what is queued: the
    outbox marks it closed without asking the LMS (whose address here answers nothing)."""
    from autograder.service.config import Rules
    from autograder.service.lti import Outbox
    (tmp_path / "k.pem").write_text(new_key_pem())
    (tmp_path / "service.toml").write_text('[lti]\nprivate_key = "k.pem"\n' + PLATFORM)
    store = Store(tmp_path / "service.db")
    store.set_lti_link("lti-a", "demo", "https://lms.example.edu", "c", "u1",
                       "https://127.0.0.1:9/lineitems/demo")
    store.queue_score("lti-a", "demo", 6.0, 8.0)
    outbox = Outbox(Tool(read_lti(tmp_path), store, {"demo": Rules(sync_grades=False)}),
                    log=lambda text: None)
    assert outbox.send_due() == 0
    assert [row[4] for row in store.scores_outbox()] == ["closed"]


def test_the_guide_s_service_toml_and_key_command_make_a_tool(tmp_path):
    """guide/lti.md's ``[lti]`` example, with a key from its openssl command, is read as it
    says: the platform's fields, and sync_grades for the assignment."""
    from autograder.service.config import read_rules
    guide = (Path(__file__).resolve().parent.parent / "guide" / "lti.md").read_text()
    example = textwrap.dedent(re.search(r"```toml\n( *\[lti\].*?) *```", guide,
                                        re.S).group(1))
    assert "openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out " \
        "COURSE/lti-key.pem" in guide
    make_key(tmp_path / "lti-key.pem")
    (tmp_path / "service.toml").write_text(example)
    config = read_lti(tmp_path)
    platform, = config.platforms
    assert platform.issuer == "https://canvas.instructure.com"
    assert platform.deployment_ids == ("1:abc123",) and config.retry_seconds == 30
    assert read_rules(tmp_path, ["demo"])[1]["demo"].sync_grades is True
    tool = Tool(config, Store(tmp_path / "service.db"), {})
    assert tool.jwks["keys"][0]["kty"] == "RSA"
