"""The submission service (issue 28): ``python -m autograder serve`` and ``submit``.

The unit tests read the queue's fair order, the store, the configuration files and the
command line. The integration tests start the real server as users do, on 127.0.0.1 and
a free port, over a copy of the fixture course, and drive it with ``submit``, with the
HTML form (a real multipart POST) and as an instructor; one kills it with SIGKILL while it
grades and starts it again. The security tests send what the service must refuse before
anything is queued (a file over the size limit, one that is not a notebook, uploads beyond
the hour's limit, a form without its XSRF token), file names that point elsewhere, and
guesses of submission ids. ``test_autograder_service_browser.py`` drives it in Chromium.
"""
from __future__ import annotations

import csv
import hashlib
import html
import http.cookiejar
import io
import json
import re
import shutil
import signal
import sqlite3
import time
import urllib.error
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path

import nbformat
import pytest

from autograder.commands.cli import main, parser
from autograder.service.config import ConfigError, Rules, read_roster, read_rules
from autograder.service.db import DONE, GRADING, QUEUED, Store, fair_order
from autograder.commands.submit import multipart
from tests.autograder_fixtures.submissions import COURSE, GOOD_SQUARES, answered, write
from tests import helpers
from coursebook.service_process import ServiceProcess, issue_tokens, sign_in

ROOT = Path(__file__).resolve().parent.parent
OFF_BY_ONE = "def squares(n):\n    return [k * k for k in range(1, n + 1)]"
HIDDEN_CODE = ("assert squares(0) == []", "squares(10)[-1] == 81", "except ValueError")
ROSTER = 'instructors = ["ada"]\nlearners = ["alan", "grace", "linus", "mary"]\n'


# ---------------------------------------------------------------- unit tests: the queue

def test_fair_order_serves_the_learner_served_least_recently():
    # alan uploads twenty times, then grace and linus once each: they need not wait for
    # all of alan's attempts, and each learner's uploads keep their own order.
    queued = [(i, "alan") for i in range(1, 21)] + [(21, "grace"), (22, "linus")]
    order = fair_order(queued, {})
    assert order[:4] == [1, 21, 22, 2]
    assert [i for i in order if i <= 20] == list(range(1, 21))
    # grace was served just now, alan long ago: alan's oldest goes first.
    assert fair_order([(5, "grace"), (7, "alan"), (6, "alan")], {"alan": 1, "grace": 9}) == \
        [6, 5, 7]
    # someone never served goes before everyone who was.
    assert fair_order([(3, "alan"), (4, "mary")], {"alan": 1})[0] == 4
    assert fair_order([], {"alan": 1}) == []


def test_the_store_claims_in_fair_order_and_commits_a_result_once(tmp_path):
    store = Store(tmp_path / "service.db")
    ids = [store.add(student, "demo", "demo", n, tmp_path / f"{student}{n}", time.time(), 0)
           for student, n in (("alan", 1), ("alan", 2), ("alan", 3), ("grace", 1))]
    assert store.queue() == [ids[0], ids[3], ids[1], ids[2]]
    first = store.claim_next()
    assert (first.id, first.state) == (ids[0], GRADING)
    assert store.claim_next().id == ids[3]  # grace, before alan's second
    assert store.finish(first.id, status="graded", score=1.0, max_score=2.0)
    assert not store.finish(first.id, status="graded", score=1.0)  # not being graded: no
    # A service killed now: what was being graded is queued again at the next start.
    assert store.requeue_interrupted() == 1
    assert store.get(ids[3]).state == QUEUED
    states = {r.id: (r.state, r.gradings) for r in store.rows()}
    assert states[first.id] == (DONE, 1)
    assert store.next_attempt("alan", "demo", "demo") == 4
    assert store.counted("alan", "demo", "demo", "last").id == first.id


def test_tokens_are_stored_only_as_their_hash(tmp_path):
    from autograder.service.auth import TokenSignIn
    people = read_roster(roster_course(tmp_path))
    store = Store(tmp_path / "service.db")
    issued = dict((p.id, t) for p, t in TokenSignIn(store, people).issue())
    assert set(issued) == {"ada", "alan", "grace", "linus", "mary"}
    assert store.person_of(issued["alan"]) == "alan" and store.person_of("wrong") is None
    with sqlite3.connect(store.path) as db:
        dump = "\n".join(db.iterdump())
    assert not any(token in dump for token in issued.values())


# ------------------------------------------------- unit tests: databases of earlier services

FIXTURES = Path(__file__).resolve().parent / "autograder_fixtures"
OLD_COLUMNS = ("student", "assignment", "notebook", "attempt", "path", "created", "days_late",
               "state", "claim_seq", "started", "finished", "gradings", "status", "score",
               "max_score", "penalty", "message", "seconds", "csv_row", "results", "executed")


def old_database(path: Path, schema: int) -> list:
    """A database as the service of ``schema`` left it (its SQL from git history): alan's
    graded first attempt, his queued second, grace's upload cut off mid-grading, a token.
    Returns the rows as stored."""
    import contextlib
    rows = [("alan", "demo", "demo", 1, "/u/alan/1/demo.ipynb", 100.0, 0, DONE, 1, 101.0,
             130.0, 1, "graded", 5.0, 8.0, 0.0, "5/8 points", 29.0, '{"score": "5"}',
             "/g/1/demo.results.json", "/g/1/demo.ipynb"),
            ("alan", "demo", "demo", 2, "/u/alan/2/demo.ipynb", 200.0, 1, QUEUED, None, None,
             None, 0, None, None, None, None, None, None, None, None, None),
            ("grace", "demo", "demo", 1, "/u/grace/1/demo.ipynb", 150.0, 0, GRADING, 2, 151.0,
             None, 0, None, None, None, None, None, None, None, None, None)]
    names = OLD_COLUMNS + (("key",) if schema >= 2 else ())
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.executescript((FIXTURES / f"service_db_schema{schema}.sql").read_text())
        for n, row in enumerate(rows):
            values = row + ((f"old-key-{n}",) if schema >= 2 else ())
            db.execute(f"INSERT INTO submissions ({', '.join(names)}) VALUES "
                       f"({', '.join('?' * len(names))})", values)
        db.execute("INSERT INTO tokens VALUES ('alan', ?, 1.0)",
                   (hashlib.sha256(b"alans-token").hexdigest(),))
        db.commit()
    return rows


@pytest.mark.parametrize("schema", [1, 2])
def test_a_database_of_an_earlier_service_is_migrated_keeping_every_row(tmp_path, schema):
    from autograder.service.db import SCHEMA_VERSION
    path = tmp_path / "service.db"
    rows = old_database(path, schema)
    store = Store(path)
    migrated = store.rows("ORDER BY id")
    assert [tuple(getattr(r, c) for c in OLD_COLUMNS) for r in migrated] == rows
    keys = [r.key for r in migrated]
    if schema == 1:  # fresh random keys, one each
        assert len(set(keys)) == 3 and all(len(k) >= 20 and re.fullmatch(r"[\w-]+", k)
                                           for k in keys), keys
    else:  # the keys learners' links hold stay theirs
        assert keys == ["old-key-0", "old-key-1", "old-key-2"]
    assert all(r.phases is None and r.phase_seconds == {} for r in migrated)
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    # The file as it was, kept beside it
    with sqlite3.connect(tmp_path / f"service.db.schema{schema}") as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 0
        assert db.execute("SELECT COUNT(*) FROM submissions").fetchone()[0] == 3
    # It works as a new one does: tokens, ids in URLs, the queue, new uploads, results
    assert store.person_of("alans-token") == "alan"
    assert store.by_key(keys[0]).student == "alan"
    assert store.requeue_interrupted() == 1 and store.queue() == [2, 3]  # alan served first
    new = store.add("alan", "demo", "demo", store.next_attempt("alan", "demo", "demo"),
                    tmp_path / "x", time.time(), 0)
    assert store.get(new).attempt == 3 and store.get(new).key not in keys
    claimed = store.claim_next()
    assert store.finish(claimed.id, status="graded", phases='{"run cells": 1.5}')
    assert store.get(claimed.id).phase_seconds == {"run cells": 1.5}
    with sqlite3.connect(path) as db, pytest.raises(sqlite3.IntegrityError):
        db.execute("UPDATE submissions SET key = ? WHERE id = ?", (keys[0], new))  # unique
    # Opened again: nothing changes
    assert [r.key for r in Store(path).rows("ORDER BY id")][:3] == keys


def test_feedback_of_results_graded_before_schema_5_is_kept_in_the_row(tmp_path):
    """Schema 5 keeps each result's tests in its row (the pages read them from there):
    a result graded before then gets them from its results.json once, at the migration;
    a row whose file is gone shows no tests and still opens."""
    from autograder.feedback import shown_tests
    path = tmp_path / "service.db"
    old_database(path, 2)
    results = {"score": 1.0, "output": "graded", "tests": [
        {"name": "shapes", "score": 1.0, "max_score": 1.0, "status": "passed",
         "visibility": "visible", "output": "", "extra_data": {"outcome": "passed"}},
        {"name": "speed", "score": 0.0, "max_score": 2.0, "status": "failed",
         "visibility": "after_published", "output": "too slow",
         "extra_data": {"outcome": "failed", "points": 2.0}}]}
    (tmp_path / "demo.results.json").write_text(json.dumps(results))
    with sqlite3.connect(path) as db:
        db.execute("UPDATE submissions SET results = ? WHERE student = 'alan' AND attempt = 1",
                   (str(tmp_path / "demo.results.json"),))
        db.execute("INSERT INTO submissions (student, assignment, notebook, attempt, path, "
                   "created, state, results, key) VALUES ('ada', 'demo', 'demo', 1, '/u/a', "
                   "1.0, 'done', ?, 'k')", (str(tmp_path / "gone.results.json"),))
    rows = {r.student + str(r.attempt): r for r in Store(path).rows("ORDER BY id")}
    assert rows["alan1"].shown_tests == shown_tests(results)
    assert [t["hidden"] for t in rows["alan1"].shown_tests] == [False, True]
    assert rows["ada1"].shown_tests == [] and rows["alan2"].shown_tests == []


def test_a_database_of_a_later_service_is_refused_untouched(tmp_path, capsys):
    from autograder.service.db import SCHEMA_VERSION, DatabaseError
    course = roster_course(tmp_path)
    path = course / "service.db"
    Store(path).add("alan", "demo", "demo", 1, path, 1.0, 0)
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    before = path.read_bytes()
    with pytest.raises(DatabaseError, match="later version of the service"):
        Store(path)
    assert main(["serve", "--course", str(course), "--issue-tokens"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and f"schema {SCHEMA_VERSION + 1}" in err, err
    assert "Traceback" not in err and path.read_bytes() == before


# ------------------------------------------------------- unit tests: the configuration

def roster_course(tmp_path: Path, rules: str = "") -> Path:
    course = tmp_path / "course"
    if not course.exists():
        shutil.copytree(COURSE, course)
    (course / "roster.toml").write_text(ROSTER)
    if rules:
        (course / "service.toml").write_text(rules)
    return course


def test_rules_default_and_per_assignment(tmp_path):
    course = roster_course(tmp_path, 'attempts_per_hour = 4\ncounts = "best"\n'
                           '[assignments.demo]\ndeadline = 2026-01-01T12:00:00+01:00\n'
                           'late = "penalty"\npenalty_per_day = 0.25\n')
    default, rules = read_rules(course, ["demo", "other"])
    assert default == Rules(attempts_per_hour=4, counts="best")
    demo = rules["demo"]
    assert demo.deadline == datetime(2026, 1, 1, 11, tzinfo=timezone.utc)
    assert (demo.attempts_per_hour, demo.counts, demo.late) == (4, "best", "penalty")
    assert demo.days_late(demo.deadline) == 0
    assert demo.days_late(demo.deadline + timedelta(minutes=1)) == 1
    assert demo.days_late(demo.deadline + timedelta(days=1, minutes=1)) == 2
    assert demo.penalty(8.0, 1) == 2.0 and demo.penalty(8.0, 9) == 8.0
    assert rules["other"] == default and default.penalty(8.0, 3) == 0.0


@pytest.mark.parametrize("text, says", [
    ('counts = "first"\n', "counts must be one of"),
    ("attempts_per_hour = 0\n", "attempts_per_hour must be"),
    ("[assignments.demo]\ndeadline = 2026-01-01T12:00:00\n", "with its offset"),
    ("[assignments.nope]\nlate = \"refuse\"\n", "no such assignment"),
    ("[assignments.demo]\npenalty_per_day = 2\n", "penalty_per_day must be"),
    ("[assignments.demo]\nlate = \"penalty\"\n", "needs a deadline"),
    ("deadlin = 2026-01-01T12:00:00Z\n", "unknown key"),
    ("counts = \n", "not valid TOML"),
])
def test_a_bad_rules_file_is_a_clear_error(tmp_path, text, says):
    course = roster_course(tmp_path, text)
    with pytest.raises(ConfigError, match=re.escape(says)):
        read_rules(course, ["demo"])


def test_serve_refuses_to_start_on_bad_configuration(tmp_path, capsys):
    course = roster_course(tmp_path, 'counts = "first"\n')
    assert main(["serve", "--course", str(course), "--port", "0"]) == 2
    assert "service.toml: top level: counts must be one of" in capsys.readouterr().err
    (course / "service.toml").unlink()
    (course / "roster.toml").write_text('learners = ["alan"]\n')
    assert main(["serve", "--course", str(course)]) == 2
    assert "no instructors" in capsys.readouterr().err
    (course / "roster.toml").unlink()
    assert main(["serve", "--course", str(course)]) == 2
    assert "roster.toml is missing" in capsys.readouterr().err


def test_issue_tokens_prints_one_link_each(tmp_path, capsys):
    course = roster_course(tmp_path)
    assert main(["serve", "--course", str(course), "--issue-tokens", "alan",
                 "--url", "http://course.example:9000/"]) == 0
    lines = [line.split("\t") for line in capsys.readouterr().out.splitlines()
             if not line.startswith("#")]
    assert [line[:2] for line in lines] == [["alan", "learner"]]
    assert lines[0][2].startswith("http://course.example:9000/signin?token=")
    assert main(["serve", "--course", str(course), "--issue-tokens", "nobody"]) == 2


def test_serve_and_submit_options():
    args = parser().parse_args(["serve"])
    assert (args.host, args.port, args.db, args.gradebook) == ("127.0.0.1", 8765, None, "")
    assert parser().parse_args(["serve", "--no-gradebook"]).gradebook is None
    args = parser().parse_args(["submit", "nb.ipynb", "--to", "http://h:1", "--token", "t"])
    assert (args.to, args.token, args.assignment) == ("http://h:1", "t", "")


# ------------------------------------------------------------ the real server, driven

def autograder(*args, timeout=300):
    return helpers.autograder(*args, timeout=timeout)


def until(condition, timeout=120.0, what="the condition"):
    """Poll ``condition`` until it returns something true, or fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


class Server(ServiceProcess):
    """The service as these tests start it: one grader, on the CPU, 30 s per cell."""

    def __init__(self, course: Path, *extra):
        super().__init__(course, "--device", "cpu", "--cell-timeout", "30", *extra, jobs=1,
                         start_timeout=120)


tokens = issue_tokens


def request(url, token=None, data=None, headers=None, method=None):
    """(status, body) of one request, signed with ``token`` as a Bearer token if given."""
    req = urllib.request.Request(url, data=data, method=method, headers=dict(headers or {}))
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def upload(server, token, nb, assignment="demo"):
    body, kind = multipart({"assignment": assignment}, "notebook", "demo.ipynb",
                           nbformat.writes(nb).encode())
    return request(f"{server.url}/submit", token, body, {"Content-Type": kind})


def feedback(server, token, submission_id):
    status, body = request(f"{server.url}/submissions/{submission_id}.json", token)
    assert status == 200, body
    return json.loads(body)


def graded(server, token, submission_id, timeout=120.0):
    return until(lambda: (lambda d: d if d["state"] == DONE else None)(
        feedback(server, token, submission_id)), timeout, f"submission {submission_id}")


def queued_rows(server) -> list:
    """Every stored submission (id, student, path), read from the service's database."""
    with sqlite3.connect(server.course / "service.db") as db:
        return db.execute("SELECT id, student, path FROM submissions ORDER BY id").fetchall()


def assert_phases_shown(page: str, db: Path) -> None:
    """The instructor page shows each graded upload's seconds per grading phase: all of
    them, adding up to no more than the seconds it took."""
    from autograder.pipeline.result import PHASES
    with sqlite3.connect(db) as connection:
        graded = connection.execute("SELECT id, seconds FROM submissions WHERE status = "
                                    "'graded' AND state = 'done'").fetchall()
    assert graded
    for submission_id, seconds in graded:
        row = re.search(rf"<tr><td>{submission_id}</td>(.*?)</tr>", page).group(1)
        cells = re.findall(r"<td>(.*?)</td>", row)
        assert float(cells[9]) == seconds  # graded in (s), then its phases
        shown = dict(re.findall(r"([\w ]+): (\d+\.\d\d)", cells[10]))
        assert tuple(shown) == PHASES, cells[10]
        # each phase is shown rounded to 0.01 s, so their sum may exceed the total by
        # up to half a hundredth per phase
        rounding = 0.005 * len(PHASES) + 0.0005
        assert sum(map(float, shown.values())) <= seconds + rounding, (shown, seconds)
        assert all(float(value) >= 0 for value in shown.values())


def with_rules(tmp_path_factory, name: str) -> Path:
    """A copy of the fixture course with two more assignments (copies of demo): ``closed``
    (its deadline passed, late uploads refused) and ``late`` (a penalty per day)."""
    course = tmp_path_factory.mktemp(name) / "course"
    shutil.copytree(COURSE, course)
    for other in ("closed", "late"):
        shutil.copytree(course / "solutions" / "demo", course / "solutions" / other)
    past = (datetime.now(timezone.utc) - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    (course / "roster.toml").write_text(ROSTER)
    (course / "service.toml").write_text(
        "attempts_per_hour = 3\n"
        f"[assignments.closed]\ndeadline = {past}\n"
        f'[assignments.late]\ndeadline = {past}\nlate = "penalty"\npenalty_per_day = 0.25\n')
    return course


def service_with_rules(tmp_path_factory, name: str, *extra):
    """The service over a fresh :func:`with_rules` course in a folder named ``name``, and
    everyone's token; ``extra``: more options of ``serve``; stopped cleanly (SIGTERM) at
    the end. For a module's fixture."""
    course = with_rules(tmp_path_factory, name)
    people = tokens(course)
    server = Server(course, *extra)
    yield server, people
    server.stop()


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    yield from service_with_rules(tmp_path_factory, "service")


@pytest.fixture(scope="module")
def alan_submitted(service, tmp_path_factory):
    """alan hands in with ``python -m autograder submit`` twice: an off-by-one squares(),
    then a correct notebook. Returns both runs and the first upload's id."""
    server, people = service
    runs = []
    for nb in (answered(squares=OFF_BY_ONE), answered()):
        path = write(tmp_path_factory.mktemp("alan"), "alan", nb)
        runs.append(autograder("submit", path, "--to", server.url, "--token", people["alan"],
                               "--assignment", "demo"))
    first = re.search(r"/submissions/([\w-]+)", runs[0].stdout)
    assert first, runs[0].stdout + runs[0].stderr
    return runs, first.group(1)


@pytest.mark.integration
def test_submit_uploads_waits_and_prints_the_feedback(service, alan_submitted):
    server, people = service
    (done, again), _ = alan_submitted
    assert done.returncode == 1, done.stdout + done.stderr  # not every test passed
    out = done.stdout
    lines = [line.split() for line in out.splitlines()]
    assert ["FAIL", "test_squares", "0/2", "(hidden", "test)"] in lines, out
    assert ["PASS", "test_mean", "1/1"] in lines
    assert ["FAIL", "test_partial", "1/2"] in lines
    assert "squares(3) gave [1, 4, 9], expected [0, 1, 4]" in out
    assert "5 of 8 points." in out and "1 GPU-only test worth 1 point skipped on the CPU" in out
    # the GPU-only test: worth a point, not at stake on this CPU grader (as `check` shows it)
    assert ["SKIPPED", "test_squares_gpu", "-/1"] in lines, out
    assert "needs a CUDA GPU and this run used the CPU, so its points are not at stake" in out
    assert not any(code in out for code in HIDDEN_CODE)
    # Stored per learner per attempt, and graded once.
    uploads = server.course / "service-files" / "uploads" / "alan" / "demo" / "1"
    assert (uploads / "demo.ipynb").is_file() and (uploads / "timestamp.txt").is_file()
    # A correct notebook, again from the terminal: a second attempt, full marks, exit 0.
    assert again.returncode == 0, again.stdout + again.stderr
    assert "(attempt 2)" in again.stdout and "8 of 8 points." in again.stdout


@pytest.mark.integration
def test_a_learner_hands_in_through_the_html_form(service):
    server, people = service
    jar = http.cookiejar.CookieJar()
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    where, home = sign_in(browser, server.url, people["grace"])
    assert where == f"{server.url}/"
    assert "Signed in as <b>grace</b>" in home and 'enctype="multipart/form-data"' in home
    xsrf = re.search(r'name="_xsrf" value="([^"]+)"', home).group(1)
    nb = answered(mean="def mean(values):\n    values = list(values)\n"
                       "    return sum(values) / len(values)")
    body, kind = multipart({"_xsrf": xsrf, "assignment": "demo"}, "notebook", "demo.ipynb",
                           nbformat.writes(nb).encode())
    action = re.search(r'<form method=post action="([^"]+)" enctype', home).group(1)
    post = urllib.request.Request(server.url + html.unescape(action), data=body,
                                  headers={"Content-Type": kind})  # as a browser sends it
    with browser.open(post, timeout=60) as page:  # 303 to the upload's own page
        where = page.url
        first = page.read().decode()
    assert re.fullmatch(rf"{server.url}/submissions/[\w-]{{22}}", where), where
    assert "queue" in first or "graded" in first or "Being graded" in first

    def done():
        with browser.open(where, timeout=60) as page:
            text = page.read().decode()
        return text if "Download the executed notebook" in text else None
    text = until(done, what="grace's feedback page")
    assert '<span class="PASS">PASS</span></td><td>test_mean</td><td>1/1' in text
    assert '<span class="FAIL">FAIL</span></td><td>test_mean_hidden (hidden test)</td>' in text
    assert "<b>6/8</b> points" in text
    assert ('<span class="SKIPPED">SKIPPED</span></td><td>test_squares_gpu</td><td>-/1</td>'
            '<td><pre>Skipped: this test needs a CUDA GPU and this run used the CPU, so its '
            'points are not at stake.</pre>') in text
    assert not any(code in text for code in HIDDEN_CODE)
    with browser.open(where + "/notebook", timeout=60) as page:
        executed = nbformat.reads(page.read().decode(), as_version=4)
    assert any("hidden tests, not shown" in cell.source for cell in executed.cells)
    assert not any(code in cell.source for cell in executed.cells for code in HIDDEN_CODE)
    # Without the form's XSRF token a browser's POST is refused.
    body, kind = multipart({"assignment": "demo"}, "notebook", "demo.ipynb",
                           nbformat.writes(nb).encode())
    with pytest.raises(urllib.error.HTTPError) as refused:
        browser.open(urllib.request.Request(f"{server.url}/submit", data=body,
                                            headers={"Content-Type": kind}), timeout=60)
    assert refused.value.code == 403


@pytest.mark.integration
def test_a_wrong_token_is_refused_on_every_route(service, alan_submitted):
    server, people = service
    n = alan_submitted[1]
    routes = [("GET", "/"), ("GET", f"/submissions/{n}"), ("GET", f"/submissions/{n}.json"),
              ("GET", f"/submissions/{n}/notebook"), ("GET", "/instructor"),
              ("GET", "/instructor/grades.csv"), ("GET", "/instructor/similarity/demo"),
              ("GET", "/no/such/page"), ("POST", "/submit"), ("POST", "/instructor/regrade"),
              ("POST", "/signout")]
    for token in ("wrong", "", people["alan"][:-1]):
        for method, path in routes:
            status, body = request(server.url + path, token, method=method,
                                   data=b"" if method == "POST" else None)
            assert status in (401, 403), (token, method, path, status)
            assert b"5/8" not in body and b"alan" not in body
        assert request(f"{server.url}/signin?token={token}")[0] == 403
    for method, path in routes[:4]:  # and with no credentials at all
        assert request(server.url + path, method=method)[0] == 401
    # A learner sees neither the instructor's pages nor another learner's uploads.
    for path in ("/instructor", "/instructor/grades.csv", "/instructor/similarity/demo"):
        assert request(server.url + path, people["grace"])[0] == 403
    assert request(f"{server.url}/submissions/{n}.json", people["grace"])[0] == 404
    assert request(f"{server.url}/submissions/{n}/notebook", people["grace"])[0] == 404
    assert request(f"{server.url}/submissions/{n}.json", people["ada"])[0] == 200


@pytest.mark.integration
def test_attempts_per_hour_and_the_deadline(service):
    server, people = service
    linus = people["linus"]
    ids = []
    for _ in range(3):
        status, body = upload(server, linus, answered())
        assert status == 201, body
        ids.append(json.loads(body)["id"])
    before = queued_rows(server)
    status, body = upload(server, linus, answered())
    error = json.loads(body)["error"]
    assert status == 429 and "the limit is 3 an hour" in error
    assert re.search(r"try again in (59|60) minutes$", error), error  # the first frees a place
    assert queued_rows(server) == before
    status, body = upload(server, linus, answered(), assignment="closed")
    assert status == 403 and "uploads are closed" in json.loads(body)["error"]
    status, body = upload(server, linus, answered(), assignment="late")
    assert status == 201, body
    late = graded(server, linus, json.loads(body)["id"])
    assert (late["score"], late["penalty"], late["counted_score"]) == (8.0, 2.0, 6.0)
    assert late["days_late"] == 1
    assert [graded(server, linus, i)["attempt"] for i in ids] == [1, 2, 3]


@pytest.mark.integration
def test_an_upload_over_the_limit_is_refused_with_its_size_and_not_queued(service):
    server, people = service
    before = queued_rows(server)
    big = b"{" + b" " * (20 * 2**20 + 400 * 1024)  # 20.4 MiB, to one decimal
    body, kind = multipart({"assignment": "demo"}, "notebook", "demo.ipynb", big)
    status, answer = request(f"{server.url}/submit", people["grace"], body,
                             {"Content-Type": kind})
    assert status == 413, answer
    assert "the notebook is 20.4 MiB; the limit is 20 MiB" in json.loads(answer)["error"]
    assert queued_rows(server) == before


@pytest.mark.integration
def test_an_uploaded_file_name_is_never_used_as_a_path(service):
    server, people = service
    nb = nbformat.writes(answered()).encode()
    stored = []
    for name in ("../../etc/x.ipynb", "/tmp/abs/demo.ipynb", "..\\..\\win.ipynb",
                 "a/b\0c.ipynb"):
        body, kind = multipart({"assignment": "demo"}, "notebook", name, nb)
        status, answer = request(f"{server.url}/submit", people["mary"], body,
                                 {"Content-Type": kind})
        if "\0" in name and status == 400:  # Tornado may drop a part whose header has a NUL
            continue
        assert status == 201, (name, answer)
        stored.append(json.loads(answer)["id"])
        if len(stored) == 2:  # mary may upload 3 an hour; one place is left for below
            break
    uploads = server.course / "service-files" / "uploads"
    paths = [Path(p) for _, student, p in queued_rows(server) if student == "mary"]
    assert [p.relative_to(uploads).parts for p in paths] == [
        ("mary", "demo", str(n), "demo.ipynb") for n in range(1, len(paths) + 1)]
    # nothing was written where the names point, around the course or in /tmp/abs
    root = server.course.parent
    assert not list(root.rglob("x.ipynb")) and not list(root.rglob("win.ipynb"))
    assert not Path("/tmp/abs/demo.ipynb").exists()
    for key in stored:
        assert graded(server, people["mary"], key)["score"] == 8.0


@pytest.mark.integration
def test_submission_ids_in_urls_are_random(service, alan_submitted):
    server, people = service
    key = alan_submitted[1]
    assert re.fullmatch(r"[\w-]{22}", key), key  # secrets.token_urlsafe(16)
    with sqlite3.connect(server.course / "service.db") as db:
        number = db.execute("SELECT id FROM submissions WHERE key = ?", (key,)).fetchone()[0]
    for guess in (str(number), "1", "2", key[:-1]):
        assert request(f"{server.url}/submissions/{guess}.json", people["alan"])[0] == 404
        assert request(f"{server.url}/submissions/{guess}.json", people["ada"])[0] == 404
    assert feedback(server, people["alan"], key)["id"] == key


@pytest.mark.integration
def test_an_upload_that_is_not_a_notebook_is_refused_and_not_queued(service):
    server, people = service
    before = queued_rows(server)
    files = sorted((server.course / "service-files").rglob("*"))
    for name, data in (("demo.ipynb", b"{not json"), ("demo.ipynb", b"%PDF-1.4 ..."),
                       ("demo.ipynb", b""), ("demo.pdf", b"\x89PNG\r\n")):
        body, kind = multipart({"assignment": "demo"}, "notebook", name, data)
        status, answer = request(f"{server.url}/submit", people["mary"], body,
                                 {"Content-Type": kind})
        error = json.loads(answer)["error"]
        assert status in (400, 415), (name, data, status, answer)
        assert "is not a Jupyter notebook" in error or "the upload is empty" in error, error
    assert queued_rows(server) == before  # nothing stored, nothing queued
    assert sorted((server.course / "service-files").rglob("*")) == files
    status, answer = request(f"{server.url}/submit", people["mary"], body,
                             {"Content-Type": "multipart/form-data; boundary=x"})
    assert status == 400  # no file in the form


@pytest.mark.integration
def test_the_instructor_page_grades_csv_gradebook_and_regrade(service, alan_submitted):
    server, people = service
    ada = people["ada"]
    # every upload so far graded (the other tests' too)
    until(lambda: b"<h2>Queue (0)</h2>" in request(f"{server.url}/instructor", ada)[1],
          what="an empty queue")
    status, body = request(f"{server.url}/instructor", ada)
    page = body.decode()
    assert status == 200 and "<th>learner</th><th>closed</th><th>demo</th><th>late</th>" in page
    assert re.search(r"<td>alan</td><td></td><td><a href=\"/submissions/[\w-]+\">8/8</a> graded", page)
    assert "grades.csv" in page and 'action="/instructor/regrade"' in page
    assert_phases_shown(page, server.course / "service.db")
    status, body = request(f"{server.url}/instructor/grades.csv", ada)
    rows = list(csv.DictReader(io.StringIO(body.decode())))
    from autograder.pipeline.report import CSV_COLUMNS
    assert tuple(rows[0]) == CSV_COLUMNS
    scores = {(r["student_id"], r["assignment"]): float(r["score"]) for r in rows}
    assert scores[("alan", "demo")] == 8.0  # the last attempt counts
    # nbgrader's gradebook holds the attempt that counts, one submission each
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{server.course / 'gradebook.db'}") as gb:
        assert gb.find_submission("demo", "alan").score == 8.0
    # Regrade all: every counted attempt is graded again, with the same scores.
    counted = len(rows)
    status, body = request(f"{server.url}/instructor/regrade", ada, data=b"", method="POST")
    assert status == 200 and json.loads(body) == {"queued": counted}
    with sqlite3.connect(server.course / "service.db") as db:
        regraded = until(lambda: db.execute(
            "SELECT COUNT(*) FROM submissions WHERE gradings = 2 AND state = 'done'"
        ).fetchone()[0] == counted and db.execute(
            "SELECT COUNT(*) FROM submissions WHERE state != 'done'").fetchone()[0] == 0,
            what="the regrade")
    assert regraded
    status, body = request(f"{server.url}/instructor/grades.csv", ada)
    again = {(r["student_id"], r["assignment"]): float(r["score"])
             for r in csv.DictReader(io.StringIO(body.decode()))}
    assert again == scores


@pytest.mark.integration
def test_killed_while_grading_then_restarted_grades_each_upload_exactly_once(
        tmp_path_factory):
    course = with_rules(tmp_path_factory, "killed")
    people = tokens(course)
    server = Server(course)
    slow = answered(squares="import time\ntime.sleep(3)\n" + GOOD_SQUARES)
    acknowledged = {}
    try:
        for learner in ("alan", "alan", "grace", "mary"):
            status, body = upload(server, people[learner], slow)
            assert status == 201, body
            acknowledged[json.loads(body)["id"]] = learner
        db = sqlite3.connect(course / "service.db")
        until(lambda: db.execute("SELECT COUNT(*) FROM submissions WHERE state = ?",
                                 (GRADING,)).fetchone()[0], what="a row being graded")
    finally:
        server.kill()  # SIGKILL, mid-grading
    states = dict(db.execute("SELECT key, state FROM submissions").fetchall())
    assert set(states) == set(acknowledged) and GRADING in states.values()
    server = Server(course)  # the same course, database and files
    try:
        until(lambda: db.execute("SELECT COUNT(*) FROM submissions WHERE state = 'done'")
              .fetchone()[0] == len(acknowledged), timeout=180, what="every upload graded")
        rows = db.execute("SELECT key, student, gradings, score FROM submissions").fetchall()
        assert {r[0]: r[1] for r in rows} == acknowledged
        assert all(r[2] == 1 for r in rows), rows  # each result committed exactly once
        assert all(r[3] == 8.0 for r in rows), rows
    finally:
        server.kill(signal.SIGTERM)
        db.close()
    with sqlite3.connect(course / "gradebook.db") as gradebook:
        per_learner = gradebook.execute(
            "SELECT student_id, COUNT(*) FROM submitted_assignment GROUP BY student_id"
        ).fetchall()
    assert sorted(per_learner) == [("alan", 1), ("grace", 1), ("mary", 1)]
