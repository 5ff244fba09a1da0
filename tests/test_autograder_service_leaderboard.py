"""The submission service's speed leaderboard: learners opt in under a display name they
choose, and each assignment's board ranks their best verified speedup per speed test.

The unit tests read the display-name rules, which speed results count and how they rank
(:mod:`autograder.service.board`), the store's opt-in table and a schema 5 database brought
to schema 6 with its speeds. The page renders a hostile display name in-process as text.
The integration test starts the real service over the speed fixture course and drives it
as learners do: two join in their browsers, three hand in (one never joins), the board
ranks the two, a forged form is refused, and leaving takes a learner's row away.
"""
from __future__ import annotations

import hashlib
import html
import http.cookiejar
import json
import re
import shutil
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest

from autograder.service import pages
from autograder.service.board import (NAME_MAX, NameRefused, display_name, measured_speeds,
                                      ranked)
from autograder.service.config import Person
from autograder.service.db import DONE, SCHEMA_VERSION, Store, when
from coursebook.service_process import issue_tokens, sign_in, tool_env
from tests.test_autograder_service import Server, graded, request, upload
from tests.test_autograder_service_pages import ESCAPED, EVIL, HOSTILE, rendered

FIXTURES = Path(__file__).resolve().parent / "autograder_fixtures"
SPEED_COURSE = FIXTURES / "speed_course"


def speed(speedup=None, verified=True, **more) -> dict:
    """A speed test's ``extra_data.speed`` as the grader writes it (timing.measure)."""
    found = {"device": "cpu", "verified": verified, "seconds": 5.1, **more}
    if speedup is not None:
        found.update(speedup=speedup, low=speedup * 0.95, high=speedup * 1.05, rounds=9)
    return found


def results(*tests) -> dict:
    """A results.json with these (name, speed or None) tests."""
    return {"score": 1.0, "tests": [
        {"name": name, "score": 1.0, "max_score": 4.0, "output": "",
         "extra_data": {"outcome": "passed", **({"speed": s} if s is not None else {})}}
        for name, s in tests]}


# ------------------------------------------------------------------------ unit tests

def test_a_display_name_is_short_printable_plain_text():
    assert display_name("  Ada   the\tFast ") == "Ada the Fast"  # spaces made one
    assert display_name('Tom & "Jerry" <3') == 'Tom & "Jerry" <3'  # text, shown escaped
    assert display_name("Ålan 速い") == "Ålan 速い"
    assert len(display_name("x" * NAME_MAX)) == NAME_MAX
    for bad, says in [("", "choose a display name"), ("   ", "choose a display name"),
                      ("x" * (NAME_MAX + 1), f"at most {NAME_MAX}"),
                      ("evil\u202eeman", "printable"), ("bell\x07", "printable"),
                      ("zero\u200bwidth", "printable"),
                      ("<b>bold</b>", "not HTML"), ("a</x", "not HTML"),
                      ("<!-- hi", "not HTML"), ("< script>", "not HTML")]:
        with pytest.raises(NameRefused, match=re.escape(says)):
            display_name(bad)


def test_only_measured_speedups_count_and_a_learner_ranks_by_their_best_verified_one():
    measured = measured_speeds(results(
        ("speed", speed(4.0)), ("plain", None), ("slow", speed(problem="outputs differ")),
        ("broken", speed(setup="the cell failed")), ("cut", speed()),  # not measured
        ("unwatched", speed(3.0, verified=False))))
    assert [(m["test"], m["speedup"], m["verified"]) for m in measured] == [
        ("speed", 4.0, True), ("unwatched", 3.0, False)]
    assert measured_speeds({"score": 0, "output": "error", "tests": []}) == []
    uploads = [  # (student, notebook, graded, speeds)
        ("ann", "nb", 10.0, measured_speeds(results(("speed", speed(2.0))))),
        ("ann", "nb", 20.0, measured_speeds(results(("speed", speed(5.0))))),  # her best
        ("ann", "nb", 30.0, measured_speeds(results(("speed", speed(3.0))))),  # the last
        ("bob", "nb", 15.0, measured_speeds(results(("speed", speed(4.0)),
                                                    ("other", speed(1.5))))),
        ("bob", "nb", 25.0, measured_speeds(results(("speed", speed(9.0, verified=False))))),
        ("cid", "nb", 12.0, measured_speeds(results(("speed", speed(8.0))))),  # not opted in
        ("dee", "nb", 11.0, measured_speeds(results(("speed", speed(4.0))))),  # ties bob
    ]
    names = {"ann": "Ann", "bob": "Bob", "dee": "Dee"}
    boards = ranked(uploads, names, viewer="bob")
    assert [(b["notebook"], b["test"]) for b in boards] == [("nb", "other"), ("nb", "speed")]
    rows = boards[1]["rows"]
    assert [(r["rank"], r["name"], r["speedup"], r["graded"], r["you"]) for r in rows] == [
        (1, "Ann", 5.0, 20.0, False), (2, "Dee", 4.0, 11.0, False),  # equal: earlier first
        (3, "Bob", 4.0, 15.0, True)]
    assert all(r["device"] == "cpu" for r in rows)
    assert "cid" not in json.dumps(boards) and "ann" not in json.dumps(boards)
    assert ranked(uploads, {}) == []


def test_the_store_keeps_one_name_per_person_unique_in_the_course(tmp_path):
    store = Store(tmp_path / "service.db")
    assert store.board_names() == {}
    store.join_board("ann", "Speedy")
    store.join_board("ann", "Speedy Ann")  # changed
    assert store.board_names() == {"ann": "Speedy Ann"}
    with pytest.raises(NameRefused, match="someone else's"):
        store.join_board("bob", "SPEEDY ann")  # the same name to a reader
    store.join_board("bob", "Speedy")  # ann's old name is free again
    with pytest.raises(NameRefused):
        store.join_board("ann", "speedy")  # a change into another's name is refused too
    assert store.board_names() == {"ann": "Speedy Ann", "bob": "Speedy"}
    assert store.leave_board("bob") and not store.leave_board("bob")
    assert store.board_names() == {"ann": "Speedy Ann"}
    # speeds are kept per graded upload; the board reads them from the rows
    first = store.add("ann", "speedy", "speedy", 1, tmp_path / "1", time.time(), 0)
    store.add("ann", "speedy", "speedy", 2, tmp_path / "2", time.time(), 0)  # queued
    claimed = store.claim_next()
    assert claimed.id == first
    speeds = measured_speeds(results(("speed", speed(4.5))))
    assert store.finish(first, status="graded", speeds=json.dumps(speeds))
    found = store.speed_uploads("speedy")
    assert found == [("ann", "speedy", store.get(first).finished, speeds)]
    assert store.get(first).measured_speeds == speeds and store.speed_uploads("demo") == []


def test_a_schema_5_database_gets_the_board_and_its_graded_speeds(tmp_path):
    """Schema 6 keeps each graded upload's measured speeds in its row: uploads graded
    before then get them from their results.json once, at the migration (a file gone: no
    speeds, the row still opens); the board's names start empty."""
    path = tmp_path / "service.db"
    (tmp_path / "a.results.json").write_text(json.dumps(results(("speed", speed(3.5)))))
    with sqlite3.connect(path) as db:
        db.executescript((FIXTURES / "service_db_schema5.sql").read_text())
        for n, (student, results_file, state) in enumerate([
                ("alan", tmp_path / "a.results.json", DONE),
                ("grace", tmp_path / "gone.results.json", DONE), ("linus", None, "queued")]):
            db.execute("INSERT INTO submissions (student, assignment, notebook, attempt, path, "
                       "created, state, gradings, finished, results, key, tests) VALUES "
                       "(?, 'speedy', 'speedy', 1, ?, 1.0, ?, ?, 2.0, ?, ?, '[]')",
                       (student, f"/u/{student}", state, int(state == DONE),
                        results_file and str(results_file), f"key-{n}"))
        db.execute("INSERT INTO tokens VALUES ('alan', ?, 1.0)",
                   (hashlib.sha256(b"alans-token").hexdigest(),))
    assert SCHEMA_VERSION >= 6  # 6 brought the board (later versions add tables of their own)
    store = Store(path)
    rows = {r.student: r for r in store.rows()}
    assert [s["speedup"] for s in rows["alan"].measured_speeds] == [3.5]
    assert rows["grace"].speeds is None and rows["linus"].speeds is None
    assert [r.key for r in store.rows("ORDER BY id")] == ["key-0", "key-1", "key-2"]
    assert store.person_of("alans-token") == "alan" and store.board_names() == {}
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    with sqlite3.connect(tmp_path / "service.db.schema5") as db:  # the file as it was
        assert db.execute("PRAGMA user_version").fetchone()[0] == 5
    store.join_board("alan", "Alan")
    assert ranked(store.speed_uploads("speedy"), store.board_names())[0]["rows"][0][
        "speedup"] == 3.5
    assert Store(path).board_names() == {"alan": "Alan"}  # opened again: nothing changes


def test_the_board_page_shows_display_names_as_text():
    data = {"assignment": "speedy" + EVIL, "joined": True, "display_name": EVIL,
            "best_of": "", "tests": [{"notebook": "speedy", "test": "speed" + EVIL,
                                      "title": "speed" + EVIL, "rows": [
                {"rank": 1, "name": EVIL, "speedup": 4.0, "low": 3.9, "high": 4.1,
                 "device": "cpu" + EVIL, "graded": "2026-01-01", "you": True}]}]}
    service = SimpleNamespace(signin=SimpleNamespace(prefix="/"), form_targets="",
                              sources={"speedy" + EVIL: {}},
                              leaderboard=lambda assignment, person: data)
    page = rendered(pages.Leaderboard, Person("alan", "learner"), service, "speedy" + EVIL,
                    None)
    # the title (twice), the name (as you, in the form, in the table), the test, the device
    for raw in HOSTILE[:2]:
        assert raw not in page
    assert "<script" not in page and "<img" not in page
    assert page.count(ESCAPED[0]) >= 6, page
    assert "<td>4.00×</td><td>3.90–4.10</td>" in page and 'name="_xsrf"' in page


# --------------------------------------------------------------- the real service, driven

ROSTER = 'instructors = ["ada"]\nlearners = ["annie", "bobby", "carol"]\n'
FAST = "def row_softmax(x):\n    return torch.softmax(x, dim=1)"
CHUNKED = ("def row_softmax(x):\n"
           "    e = torch.exp(x - x.max(dim=1, keepdim=True).values)\n"
           "    out = torch.empty_like(x)\n"
           "    for i in range(0, x.shape[0], 16):\n"
           "        out[i:i + 16] = e[i:i + 16] / e[i:i + 16].sum(dim=1, keepdim=True)\n"
           "    return out")


def answer(course: Path, source: str) -> nbformat.NotebookNode:
    nb = nbformat.read(course / "exercises" / "speedy" / "speedy.ipynb", as_version=4)
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == "answer":
            cell.source = source
    return nb


def browser_of(server, token: str):
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(
        http.cookiejar.CookieJar()))
    sign_in(browser, server.url, token)
    return browser


def page(browser, url: str) -> str:
    with browser.open(url, timeout=60) as answer_:
        return answer_.read().decode()


def send(browser, url: str, fields: dict):
    """(status, address, text) of a form's POST from ``browser``."""
    body = urllib.parse.urlencode(fields).encode()
    try:
        with browser.open(urllib.request.Request(url, data=body), timeout=60) as answer_:
            return answer_.status, answer_.url, answer_.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, url, error.read().decode()


def board_form(text: str, action: str) -> dict:
    """The fields of the board page's form for ``action`` (join or leave)."""
    for form in re.findall(r'<form method=post action="[^"]*/leaderboard">(.*?)</form>', text,
                           re.S):
        fields = {name: quoted or bare for name, quoted, bare in re.findall(
            r'<input type="?hidden"? name="?(\w+)"? value=(?:"([^"]*)"|([^\s>"]+))', form)}
        if fields.get("action") == action:
            return {k: html.unescape(v) for k, v in fields.items()}
    raise AssertionError(f"no {action} form on the page:\n{text}")


def table_rows(text: str) -> list:
    """(rank, name as in the page, speedup, device, graded) of the board's rows."""
    return re.findall(r"<tr><td>(\d+)</td><td>(.*?)</td><td>([\d.]+)×</td><td>[^<]*</td>"
                      r"<td>([^<]*)</td><td>([^<]*)</td></tr>", text)


@pytest.fixture(scope="module")
def speed_service(tmp_path_factory):
    course = tmp_path_factory.mktemp("leaderboard") / "course"
    shutil.copytree(SPEED_COURSE, course)
    done = subprocess.run([sys.executable, "-m", "nbgrader", "generate_assignment", "speedy",
                           "--force"], cwd=course, env=tool_env(), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (course / "roster.toml").write_text(ROSTER)
    people = issue_tokens(course)
    server = Server(course)
    yield server, people
    server.stop()


@pytest.mark.integration
def test_learners_who_opt_in_are_ranked_by_their_best_speedup(speed_service):
    server, people = speed_service
    board = f"{server.url}/leaderboard/speedy"
    annie, bobby, carol = (browser_of(server, people[p]) for p in ("annie", "bobby", "carol"))
    home = page(annie, f"{server.url}/")
    assert '<a href="/leaderboard/speedy">speedy</a>' in home
    first = page(annie, board)
    assert "You are not on the leaderboard" in first and "No speedups on this board yet" in first
    # annie joins; bobby's first name is markup and is refused, his second is shown as text
    status, where, text = send(annie, f"{server.url}/leaderboard",
                               {**board_form(first, "join"), "display_name": "Annie Fast"})
    assert (status, where) == (200, board) and "You are on the board as <b>Annie Fast</b>" in text
    form = board_form(page(bobby, board), "join")
    status, _, text = send(bobby, f"{server.url}/leaderboard",
                           {**form, "display_name": "<b>Bobby</b>"})
    assert status == 400 and "plain text, not HTML" in text
    assert "<b>Bobby</b>" not in text and 'value="&lt;b&gt;Bobby&lt;/b&gt;"' in text
    status, _, text = send(bobby, f"{server.url}/leaderboard",
                           {**form, "display_name": "annie FAST"})
    assert status == 400 and "someone else's already" in html.unescape(text)
    bob_name = 'Bob & "Co" <3'
    status, _, text = send(bobby, f"{server.url}/leaderboard",
                           {**form, "display_name": bob_name})
    assert status == 200 and "as <b>Bob &amp; &quot;Co&quot; &lt;3</b>" in text
    # A forged form (no XSRF token, as another site's page would send it) changes nothing
    forged = {k: v for k, v in form.items() if k != "_xsrf"}
    status, _, text = send(bobby, f"{server.url}/leaderboard",
                           {**forged, "action": "leave"})
    assert status == 403 and "came from another site" in text
    for token in (None, "wrong"):  # no one, or a wrong token: refused, nothing shown
        status, body = request(f"{board}.json", token)
        assert status in (401, 403) and b"Annie" not in body
    assert request(f"{server.url}/leaderboard", data=urllib.parse.urlencode(
        {"action": "join", "display_name": "Nobody"}).encode())[0] in (401, 403)
    # Three hand in: annie the library's softmax, bobby a chunked loop, carol (not on the
    # board) the fastest answer too
    ids = {}
    for who, source in (("annie", FAST), ("bobby", CHUNKED), ("carol", FAST)):
        status, body = upload(server, people[who], answer(server.course, source), "speedy")
        assert status == 201, body
        ids[who] = json.loads(body)["id"]
    for who, key in ids.items():
        done = graded(server, people[who], key, timeout=300)
        assert done["status"] == "graded", done
    with sqlite3.connect(server.course / "service.db") as db:
        stored = {student: (json.loads(speeds), finished) for student, speeds, finished in
                  db.execute("SELECT student, speeds, finished FROM submissions")}
    for who in ids:  # each measured, verified, on the CPU
        (measured,), _ = stored[who]
        assert measured["test"] == "speed" and measured["verified"] and \
            measured["device"] == "cpu", measured
    expected = sorted([("Annie Fast", "annie"), (bob_name, "bobby")],
                      key=lambda n: -stored[n[1]][0][0]["speedup"])
    text = page(annie, board)
    rows = table_rows(text)
    assert [(r[0], html.unescape(re.sub(r"</?b>| \(you\)", "", r[1]))) for r in rows] == \
        [(str(n), name) for n, (name, _) in enumerate(expected, start=1)], rows
    for (_, _, speedup, device, when_), (_, who) in zip(rows, expected):
        assert speedup == f"{stored[who][0][0]['speedup']:.2f}" and device == "cpu"
        assert when_ == when(stored[who][1])
    assert "<b>Annie Fast</b> (you)" in text and "Bob &amp; &quot;Co&quot; &lt;3" in text
    assert bob_name not in text and "carol" not in text and "bobby" not in text
    assert "best speedup over all of their graded uploads" in text
    # carol, not on the board, sees it without herself and how to join; the JSON is the same
    text = page(carol, board)
    assert "You are not on the leaderboard" in text and 'name=action value=join' in text
    assert len(table_rows(text)) == 2 and "annie" not in text.replace("Annie Fast", "")
    status, body = request(f"{board}.json", people["carol"])
    data = json.loads(body)
    assert status == 200 and data["joined"] is False and data["display_name"] is None
    (test,) = data["tests"]
    assert test["test"] == "speed" and [r["name"] for r in test["rows"]] == \
        [name for name, _ in expected]
    assert not any(who in body.decode() for who in ("annie", "bobby", "carol"))
    # bobby leaves: his row goes from everyone's board
    leave = board_form(page(bobby, board), "leave")
    status, _, text = send(bobby, f"{server.url}/leaderboard", leave)
    assert status == 200 and "You are not on the leaderboard" in text
    rows = table_rows(page(annie, board))
    assert [html.unescape(re.sub(r"</?b>| \(you\)", "", r[1])) for r in rows] == ["Annie Fast"]
    assert [r["name"] for r in json.loads(request(f"{board}.json", people["carol"])[1])[
        "tests"][0]["rows"]] == ["Annie Fast"]
    # `submit`'s token may join too (no form, no XSRF token: a Bearer request), in JSON
    joined = {"Authorization": f"Bearer {people['carol']}", "Accept": "application/json"}
    status, body = request(f"{server.url}/leaderboard", data=urllib.parse.urlencode(
        {"display_name": "carol\u202e"}).encode(), headers=joined)  # (Tornado drops C0 controls)
    assert status == 400 and "printable" in json.loads(body)["error"]
    status, body = request(f"{server.url}/leaderboard", data=urllib.parse.urlencode(
        {"display_name": "Carol C"}).encode(), headers=joined)
    assert (status, json.loads(body)) == (200, {"joined": True, "display_name": "Carol C"})
    data = json.loads(request(f"{board}.json", people["carol"])[1])
    assert data["joined"] and [r["name"] for r in data["tests"][0]["rows"]] == \
        sorted(["Annie Fast", "Carol C"], key=lambda n: -stored[
            {"Annie Fast": "annie", "Carol C": "carol"}[n]][0][0]["speedup"])
