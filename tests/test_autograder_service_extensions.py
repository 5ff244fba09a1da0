"""Extensions per learner: a later deadline and/or more uploads an hour for one learner and
one assignment, from service.toml or granted on the instructor page.

The unit tests read service.toml's ``[[assignments.NAME.extensions]]`` (and its mistakes)
and keep a granted extension across a restart of the service. The integration tests start
the real server (as ``test_autograder_service.py`` does) and drive it as its users do: a
learner with an extension hands in after the course's deadline and is on time while another
is refused or penalised; an instructor grants one with the instructor page's form; a
learner sees their own extension and no one else's, and cannot grant one (403, with or
without the form's XSRF token); forged and hostile form values are refused, as text.
"""
from __future__ import annotations

import html
import http.cookiejar
import json
import re
import shutil
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from autograder.service.app import Service
from autograder.service.config import ConfigError, Extension, ServiceConfig, read_rules
from autograder.service.db import Store
from coursebook.service_process import issue_tokens, sign_in
from tests.autograder_fixtures.submissions import COURSE, answered
from tests.test_autograder_service import ROSTER, Server, feedback, graded, request, upload
from tests.test_autograder_service_leaderboard import send as post_form

NOW = datetime.now(timezone.utc).replace(microsecond=0)
PAST, FUTURE = NOW - timedelta(hours=1), NOW + timedelta(days=3)


def stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def course_with(tmp_path: Path, rules: str) -> Path:
    """The fixture course with two more assignments (copies of demo), ``closed`` and
    ``late``, the test roster and ``rules`` as service.toml."""
    course = tmp_path / "course"
    shutil.copytree(COURSE, course)
    for other in ("closed", "late"):
        shutil.copytree(course / "solutions" / "demo", course / "solutions" / other)
    (course / "roster.toml").write_text(ROSTER)
    (course / "service.toml").write_text(rules)
    return course


# closed: its deadline passed, late uploads refused, mary has an extension in service.toml;
# late: its deadline passed, a quarter of the points off per day; one upload an hour
RULES = (f"attempts_per_hour = 1\n"
         f"[assignments.closed]\ndeadline = {stamp(PAST)}\n"
         f'[[assignments.closed.extensions]]\nlearner = "mary"\ndeadline = {stamp(FUTURE)}\n'
         f'[assignments.late]\ndeadline = {stamp(PAST)}\nlate = "penalty"\n'
         f"penalty_per_day = 0.25\n")


# ------------------------------------------------------------- unit tests: service.toml

def test_extensions_in_service_toml_change_only_their_learners_rules(tmp_path):
    course = course_with(tmp_path, RULES + '[[assignments.late.extensions]]\n'
                                           'learner = "alan"\nattempts_per_hour = 4\n')
    _, rules = read_rules(course, ["closed", "demo", "late"])
    closed = rules["closed"]
    assert closed.extension("mary") == Extension("mary", FUTURE, None)
    assert closed.extension("alan") is None and rules["demo"].extensions == ()
    mary = closed.extended(closed.extension("mary"))
    assert (mary.deadline, mary.attempts_per_hour, mary.late) == (FUTURE, 1, "refuse")
    assert mary.days_late(NOW) == 0 and closed.days_late(NOW) == 1
    alan = rules["late"].extended(rules["late"].extension("alan"))
    assert (alan.deadline, alan.attempts_per_hour) == (PAST, 4)
    assert closed.extended(None) == closed


@pytest.mark.parametrize("table, says", [
    ('learner = "mary"\n', "needs a deadline, attempts_per_hour or both"),
    ('learner = "mary"\ndeadline = 2020-01-01T00:00:00Z\n', "is not after the assignment's"),
    ('learner = "mary"\ndeadline = 2099-01-01T00:00:00\n', "with its offset"),
    ('learner = "mary"\nattempts_per_hour = 0\n', "attempts_per_hour must be a whole number"),
    ('learner = "mary"\nattempts_per_hour = true\n', "attempts_per_hour must be a whole number"),
    ('learner = "../mary"\nattempts_per_hour = 2\n', "learner must be a learner's id"),
    ('attempts_per_hour = 2\n', "learner must be a learner's id"),
    ('learner = "mary"\nattempt_per_hour = 2\n', "unknown key(s) ['attempt_per_hour']"),
    ('learner = "mary"\nattempts_per_hour = 2\n[[assignments.closed.extensions]]\n'
     'learner = "mary"\nattempts_per_hour = 3\n', "two extensions for 'mary'"),
])
def test_a_bad_extension_is_a_clear_error(tmp_path, table, says):
    course = course_with(tmp_path, f"[assignments.closed]\ndeadline = {stamp(PAST)}\n"
                                   f"[[assignments.closed.extensions]]\n{table}")
    with pytest.raises(ConfigError, match=re.escape(says)) as error:
        read_rules(course, ["closed", "demo", "late"])
    assert "[[assignments.closed.extensions]]" in str(error.value)


def test_an_extension_needs_a_deadline_to_extend_and_a_learner_of_the_roster(tmp_path):
    course = course_with(tmp_path, '[[assignments.demo.extensions]]\nlearner = "mary"\n'
                                   'deadline = 2099-01-01T00:00:00Z\n')
    with pytest.raises(ConfigError, match="the assignment has no deadline to extend"):
        read_rules(course, ["closed", "demo", "late"])
    (course / "service.toml").write_text('[[assignments.demo.extensions]]\nlearner = "ada"\n'
                                         'attempts_per_hour = 9\n')
    with pytest.raises(ConfigError, match="'ada' is not a learner of roster.toml"):
        ServiceConfig.read(course, ["closed", "demo", "late"])
    (course / "service.toml").write_text("[assignments.demo]\nextensions = 3\n")
    with pytest.raises(ConfigError, match=re.escape("[[assignments.demo.extensions]] tables")):
        read_rules(course, ["demo"])


def test_an_extension_granted_on_the_page_replaces_service_tomls_and_outlives_a_restart(
        tmp_path):
    course = course_with(tmp_path, RULES)
    service = Service(course, gradebook=None)
    ada = service.config.people["ada"]
    granted = service.grant_extension(ada, "mary", "closed", "", "5")
    # the page's replaces the file's whole: mary's deadline is the course's again
    assert (granted.deadline, granted.attempts_per_hour, granted.granted_by) == (None, 5, "ada")
    assert service.rules_for("mary", "closed").deadline == PAST
    again = Service(course, gradebook=None)  # a restart: the database keeps it
    assert again.rules_for("mary", "closed").attempts_per_hour == 5
    assert again.rules_for("grace", "closed").attempts_per_hour == 1
    assert again.store.withdraw_extension("mary", "closed")
    assert again.rules_for("mary", "closed").deadline == FUTURE  # service.toml's again
    assert Store(again.db).extensions() == []


def test_a_database_made_before_extensions_gets_their_table_keeping_its_rows(tmp_path):
    import sqlite3
    path = tmp_path / "service.db"
    Store(path).set_token("alan", "alans-token")
    with sqlite3.connect(path) as db:  # the file as the service before extensions left it
        db.execute("DROP TABLE extensions")
    store = Store(path)
    assert store.person_of("alans-token") == "alan" and store.extensions() == []
    store.grant_extension("alan", "demo", None, 3, "ada")
    assert [row[:5] for row in Store(path).extensions("alan")] == [
        ("alan", "demo", None, 3, "ada")]


# ---------------------------------------------------------------- the real server, driven


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    course = course_with(tmp_path_factory.mktemp("extensions"), RULES)
    people = issue_tokens(course)
    server = Server(course)
    yield server, people
    server.stop()


def browser_of(server, token):
    """A browser signed in with ``token``: (opener, its home page's text)."""
    opener = urllib.request.build_opener(
        urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    return opener, sign_in(opener, server.url, token)[1]


def xsrf_of(page: str) -> str:
    return html.unescape(re.search(r'name="_xsrf" value="([^"]+)"', page).group(1))


def home_of(server, token) -> str:
    status, body = request(f"{server.url}/", token)
    assert status == 200
    return body.decode()


def uploaded(server, token, assignment):
    status, body = upload(server, token, answered(), assignment=assignment)
    return status, json.loads(body)


@pytest.mark.integration
def test_a_learner_with_an_extension_in_service_toml_is_on_time_others_are_refused(served):
    server, people = served
    status, mary = uploaded(server, people["mary"], "closed")
    assert status == 201, mary
    assert feedback(server, people["mary"], mary["id"])["days_late"] == 0
    status, grace = uploaded(server, people["grace"], "closed")
    assert status == 403 and "uploads are closed" in grace["error"], grace
    # mary's page says her own deadline and that it is an extension; no one else's does
    shown = FUTURE.strftime("%Y-%m-%d %H:%M UTC")
    page = home_of(server, people["mary"])
    assert f"{shown} (your extension; the course's: {PAST:%Y-%m-%d %H:%M} UTC)" in page
    for other in ("grace", "alan"):
        page = home_of(server, people[other])
        assert shown not in page and "extension" not in page and "mary" not in page


@pytest.mark.integration
def test_an_instructor_grants_an_extension_on_the_instructor_page(served):
    server, people = served
    ada, _ = browser_of(server, people["ada"])
    with ada.open(f"{server.url}/instructor", timeout=60) as page:
        text = page.read().decode()
    assert "<td>mary</td><td>closed</td>" in text and "service.toml" in text
    action = re.search(r'<form method=post action="([^"]+)">(?:(?!</form>).)*'
                       r'Grant extension', text, re.S).group(1)
    later = (NOW + timedelta(days=2)).strftime("%Y-%m-%dT%H:%M")  # as a browser sends it
    status, where, text = post_form(ada, server.url + html.unescape(action), {
        "_xsrf": xsrf_of(text), "action": "grant", "learner": "grace", "assignment": "late",
        "deadline": later, "attempts_per_hour": "2"})
    assert (status, where) == (200, f"{server.url}/instructor"), text
    assert re.search(r"<td>grace</td><td>late</td><td>[^<]+</td><td>2</td><td>by ada, ", text)
    # grace hands in after the course's deadline: on time, and twice in the hour
    first = []
    for _ in range(2):
        status, body = uploaded(server, people["grace"], "late")
        assert status == 201, body
        first.append(body["id"])
    assert feedback(server, people["grace"], first[0])["days_late"] == 0
    status, body = uploaded(server, people["grace"], "late")
    assert status == 429 and "the limit is 2 an hour" in body["error"], body
    # alan, without one: a day late (and a quarter of the points off), once an hour
    status, alan = uploaded(server, people["alan"], "late")
    assert status == 201, alan
    status, body = uploaded(server, people["alan"], "late")
    assert status == 429 and "the limit is 1 an hour" in body["error"], body
    graced, alans = graded(server, people["grace"], first[0]), graded(
        server, people["alan"], alan["id"])
    assert (graced["days_late"], graced["penalty"], graced["counted_score"]) == (0, 0.0, 8.0)
    assert (alans["days_late"], alans["penalty"], alans["counted_score"]) == (1, 2.0, 6.0)
    page = home_of(server, people["grace"])
    assert f"{later.replace('T', ' ')} UTC (your extension; the course's:" in page
    assert "2 (your extension; the course's: 1)" in page
    assert "extension" not in home_of(server, people["linus"])


@pytest.mark.integration
def test_a_learner_cannot_grant_an_extension(served):
    server, people = served
    url = f"{server.url}/instructor/extensions"
    forged = {"action": "grant", "learner": "linus", "assignment": "closed",
              "deadline": FUTURE.strftime("%Y-%m-%dT%H:%M"), "attempts_per_hour": "50"}
    linus, home = browser_of(server, people["linus"])
    assert post_form(linus, url, {"_xsrf": xsrf_of(home), **forged})[0] == 403
    assert post_form(linus, url, forged)[0] == 403  # nor without the form's token
    status, body = request(url, people["linus"], urllib.parse.urlencode(forged).encode())
    assert status == 403 and "for instructors" in json.loads(body)["error"]
    # nor does a form another site makes an instructor's browser send (no XSRF token)
    ada, _ = browser_of(server, people["ada"])
    assert post_form(ada, url, forged)[0] == 403
    # nor withdrawing one: mary's stays hers
    assert post_form(linus, url, {"_xsrf": xsrf_of(home), "action": "withdraw",
                                  "learner": "mary", "assignment": "closed"})[0] == 403
    status, body = uploaded(server, people["linus"], "closed")
    assert status == 403 and "uploads are closed" in body["error"]
    assert "extension" not in home_of(server, people["linus"])


@pytest.mark.integration
def test_forged_and_hostile_grants_are_refused_as_text(served):
    server, people = served
    ada, _ = browser_of(server, people["ada"])
    with ada.open(f"{server.url}/instructor", timeout=60) as page:
        token = xsrf_of(page.read().decode())
    url = f"{server.url}/instructor/extensions"
    evil = '<script>alert(1)</script>'
    for fields, says in [
            ({"learner": "nobody", "assignment": "late", "attempts_per_hour": "3"},
             "&#x27;nobody&#x27; is not a learner"),
            ({"learner": "ada", "assignment": "late", "attempts_per_hour": "3"},
             "&#x27;ada&#x27; is not a learner"),  # an instructor is no learner
            ({"learner": evil, "assignment": "late", "attempts_per_hour": "3"},
             "&lt;script&gt;alert(1)&lt;/script&gt;"),
            ({"learner": "linus", "assignment": evil, "attempts_per_hour": "3"},
             "No assignment &#x27;&lt;script&gt;"),
            ({"learner": "linus", "assignment": "late", "deadline": "2000-01-01T00:00"},
             "is not after the assignment"),
            ({"learner": "linus", "assignment": "demo", "deadline": "2099-01-01T00:00"},
             "The assignment has no deadline to extend"),
            ({"learner": "linus", "assignment": "late", "deadline": "tomorrow"},
             "a date and time"),
            ({"learner": "linus", "assignment": "late", "attempts_per_hour": "-1"},
             "a whole number of 1 or more"),
            ({"learner": "linus", "assignment": "late"}, "needs a deadline"),
            ({"learner": "linus", "assignment": "late", "action": "extend"},
             "No such action")]:
        status, _, text = post_form(ada, url, {"_xsrf": token, "action": "grant", **fields})
        assert status == 400 and says in text, (fields, status, text)
        assert evil not in text
    assert "extension" not in home_of(server, people["linus"])


@pytest.mark.integration
def test_one_address_answers_a_browsers_form_and_a_program_each_its_way(served):
    """The pages and the JSON API are handlers of their own (service/api.py): a program's
    request (a Bearer token, or Accept: application/json) to an address they share gets
    JSON, a browser's form gets the page's 303, a ``.json`` address JSON, and its page
    HTML even for a program."""
    server, people = served
    linus, home = browser_of(server, people["linus"])
    status, where, text = post_form(linus, f"{server.url}/leaderboard", {
        "_xsrf": xsrf_of(home), "action": "join", "display_name": "Linus L",
        "assignment": "demo"})
    assert (status, where) == (200, f"{server.url}/leaderboard/demo"), text
    assert "<!doctype html>" in text and "Linus L" in text
    status, body = request(f"{server.url}/leaderboard/demo.json", people["linus"])
    assert status == 200 and json.loads(body)["display_name"] == "Linus L"
    status, body = request(f"{server.url}/leaderboard/demo", people["linus"])
    assert status == 200 and body.startswith(b"<!doctype html>")
    status, body = request(f"{server.url}/leaderboard", people["linus"],
                           b"action=leave&assignment=demo")
    assert (status, json.loads(body)) == (200, {"joined": False, "display_name": None})
    status, body = request(f"{server.url}/leaderboard", people["linus"], b"action=dance")
    assert status == 400 and "no such action 'dance'" in json.loads(body)["error"]
    # the instructor's regrade: JSON for a program, the instructor page for her browser
    status, body = request(f"{server.url}/instructor/regrade", people["ada"], b"")
    assert status == 200 and isinstance(json.loads(body)["queued"], int)
    ada, page = browser_of(server, people["ada"])
    status, where, text = post_form(ada, f"{server.url}/instructor/regrade",
                                    {"_xsrf": xsrf_of(page)})
    assert (status, where) == (200, f"{server.url}/instructor") and "Regrade all" in text
    status, body = request(f"{server.url}/instructor/regrade", people["grace"], b"")
    assert status == 403 and "for instructors" in json.loads(body)["error"]
