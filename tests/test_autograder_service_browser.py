"""The submission service in a real browser (issue 28): headless Chromium, driven over the
DevTools Protocol (:mod:`tests.browser`), against ``python -m autograder serve`` started as
users start it, over a copy of the fixture course.

A learner opens their sign-in link, chooses the assignment, picks a notebook in the page's
own file input (``DOM.setFileInputFiles``) and clicks "Hand in"; the queue page reloads
itself until the feedback shows. A form on a page of another origin, posted with the
learner's browser, is refused; a notebook over the size limit gets a refusal page. An
instructor signs in and fetches grades.csv, which must agree, row for row, with
``python -m autograder grade`` run over the same files in a fresh folder. Screenshots of
the feedback pages go to the test's ``tmp_path``.

Chromium is Debian's ``chromium`` package; the test installs it with apt-get when it is
missing, and is skipped (saying why) only where that is impossible.
"""
from __future__ import annotations

import csv
import io
import urllib.request
from pathlib import Path

import nbformat
import pytest

from tests.autograder_fixtures.submissions import answered, write
from tests.browser import Chromium, serve
from tests.test_autograder_service import OFF_BY_ONE, autograder, service_with_rules

pytestmark = pytest.mark.integration

# The feedback page's table as data: one [mark, test, points, message] per test.
FEEDBACK_ROWS = """[...document.querySelectorAll('table tr')].slice(1).map(
  tr => [...tr.querySelectorAll('td')].map(td => td.innerText.trim()))"""


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    yield from service_with_rules(tmp_path_factory, "browser")


def poll(chromium: Chromium, expression: str, timeout: float = 120.0):
    """The first true value of ``expression`` in the page, across navigations and the
    page's own reloads (an evaluation that meets a page being replaced is tried again)."""
    try:
        return chromium.wait_until(expression, timeout)
    except TimeoutError as waited:
        raise AssertionError(f"{waited}; the page says: "
                             + str(chromium.evaluate("document.body && document.body.innerText")))


def sign_in(chromium: Chromium, server, token: str, lands_on: str) -> None:
    """Open the sign-in link; it asks "Sign in as ...?": click the page's button."""
    chromium.open(f"{server.url}/signin?token={token}")
    poll(chromium, "document.readyState === 'complete' && "
                   "document.querySelector('form[action$=\"/signin\"] button') !== null")
    chromium.evaluate("document.querySelector('form[action$=\"/signin\"] button').click()")
    poll(chromium, f"location.pathname === {lands_on!r} && document.readyState === 'complete'")


def hand_in(chromium: Chromium, path: Path, assignment: str = "demo") -> str:
    """On the home page: choose the assignment, put ``path`` in the file input, click
    "Hand in". Returns the text of the page that the form's answer shows."""
    before = chromium.evaluate("location.href")
    chromium.evaluate("(() => { const s = document.querySelector('select[name=assignment]');"
                      f" s.value = {assignment!r}; return s.value; }})()")
    root = chromium.call("DOM.getDocument")["root"]["nodeId"]
    node = chromium.call("DOM.querySelector", nodeId=root,
                         selector='form[action*="/submit?"] input[type=file]')["nodeId"]
    assert node, "no file input on the page"
    chromium.call("DOM.setFileInputFiles", files=[str(path)], nodeId=node)
    assert chromium.evaluate("document.querySelector('input[type=file]').files[0].name") \
        == path.name
    chromium.evaluate("document.querySelector('form[action*=\"/submit?\"] button').click()")
    poll(chromium, f"location.href !== {before!r} && document.readyState === 'complete'")
    return chromium.evaluate("document.body.innerText")


def feedback_page(chromium: Chromium, server, shot: Path) -> dict:
    """Wait on the upload's page until its feedback shows; read it; screenshot it."""
    waiting = chromium.evaluate("document.body.innerText")
    poll(chromium, "document.body.innerText.includes('Download the executed notebook')")
    url = chromium.evaluate("location.href")
    chromium.open(url)  # once more, from the start, to collect the page's problems
    page = {"url": url, "waiting": waiting, "title": chromium.evaluate("document.title"),
            "text": chromium.evaluate("document.body.innerText"),
            "rows": chromium.evaluate(FEEDBACK_ROWS),
            "problems": chromium.problems(server.url)}
    chromium.screenshot(shot, full_page=True)
    return page


def test_learners_hand_in_in_the_browser_and_the_instructor_gets_the_grades(
        browser, service, tmp_path):
    server, people = service
    good, wrong = (write(tmp_path / kind, "alan", nb) for kind, nb in
                   (("good", answered()), ("wrong", answered(squares=OFF_BY_ONE))))

    # alan: sign in with his link, choose demo, hand in a correct notebook.
    sign_in(browser, server, people["alan"], "/")
    home = browser.evaluate("document.body.innerText")
    assert "Signed in as alan (learner)" in home
    assert browser.evaluate("[...document.querySelectorAll('select[name=assignment] option')]"
                            ".map(o => o.value)") == ["closed", "demo", "late"]
    waiting = hand_in(browser, good)
    assert any(words in waiting for words in ("in the queue", "Being graded", "points")), \
        waiting
    first = feedback_page(browser, server, tmp_path / "feedback-correct.png")
    assert first["problems"] == [], first["problems"]
    assert first["title"] == "Feedback: demo, attempt 1"
    assert "Score: 8/8 points (graded)" in first["text"], first["text"]
    marks = {row[1]: row[0] for row in first["rows"]}
    # every test that counts on the CPU passes; the GPU-only one is skipped, and the
    # written answer is left to grade by hand
    assert marks == {"test_squares (hidden test)": "PASS", "test_mean": "PASS",
                     "test_mean_stderr": "PASS", "test_mean_hidden (hidden test)": "PASS",
                     "test_partial": "PASS", "test_squares_gpu": "SKIPPED",
                     "explain": "MANUAL"}, first["rows"]
    tests = {row[1]: row[2] for row in first["rows"]}
    assert tests["test_mean"] == "1/1" and tests["test_squares (hidden test)"] == "2/2"
    assert tests["test_squares_gpu"] == "-/1"  # worth a point, not at stake on the CPU
    assert sum(float(p.split("/")[0]) for p in tests.values() if p[0] != "-") == 8.0

    # Then a wrong one: the failing tests and what they say.
    browser.open(server.url + "/")
    hand_in(browser, wrong)
    second = feedback_page(browser, server, tmp_path / "feedback-wrong.png")
    assert second["title"] == "Feedback: demo, attempt 2"
    assert "Score: 5/8 points (graded)" in second["text"], second["text"]
    failed = {row[1]: (row[2], row[3]) for row in second["rows"] if row[0] == "FAIL"}
    assert set(failed) == {"test_squares (hidden test)", "test_partial"}, second["rows"]
    assert failed["test_squares (hidden test)"][0] == "0/2"
    assert failed["test_partial"][0] == "1/2"
    assert "squares(3) gave [1, 4, 9], expected [0, 1, 4]" in second["text"]
    assert "assert squares(0) == []" not in second["text"]  # hidden tests' code is not shown
    # The home page lists both attempts, each linking to its own page.
    browser.open(server.url + "/")
    links = browser.evaluate("[...document.querySelectorAll('a[href^=\"/submissions/\"]')]"
                             ".map(a => a.href)")
    assert sorted(links) == sorted([first["url"], second["url"]])

    # A page of another origin, opened while alan is signed in, posts a form with his
    # browser to the service: without the service's XSRF token it is refused.
    hostile = tmp_path / "hostile"
    hostile.mkdir()
    (hostile / "index.html").write_text(
        f'<form method=post action="{server.url}/submit" enctype="multipart/form-data">'
        '<input name=assignment value=demo><input type=file name=notebook>'
        "<button>Win a prize</button></form>")
    with serve(hostile) as elsewhere:
        browser.open(elsewhere)
        root = browser.call("DOM.getDocument")["root"]["nodeId"]
        node = browser.call("DOM.querySelector", nodeId=root, selector="input[type=file]")
        browser.call("DOM.setFileInputFiles", files=[str(good)], nodeId=node["nodeId"])
        browser.evaluate("document.querySelector('button').click()")
        poll(browser, f"location.href.startsWith({server.url!r}) && "
                      "document.readyState === 'complete'")
    refused = browser.evaluate("document.body.innerText")
    assert "This form is out of date or came from another site" in refused, refused
    browser.open(server.url + "/")
    assert browser.evaluate("document.querySelectorAll('a[href^=\"/submissions/\"]').length") \
        == 2  # nothing was queued

    # grace: a notebook over the limit is refused with its size; then a correct one.
    big = tmp_path / "big" / "demo.ipynb"
    big.parent.mkdir()
    nb = answered()
    nb.cells[0].source += "\n" + "x" * (20 * 2**20 + 400 * 1024)  # 20.4 MiB, one decimal
    big.write_text(nbformat.writes(nb))
    sign_in(browser, server, people["grace"], "/")
    refused = hand_in(browser, big)
    assert browser.evaluate("document.title") == "Not possible"
    assert "The notebook is 20.4 MiB; the limit is 20 MiB" in refused, refused
    browser.screenshot(tmp_path / "refused.png")
    browser.open(server.url + "/")
    assert "Your attempts" in browser.evaluate("document.body.innerText")
    assert browser.evaluate("document.querySelectorAll('a[href^=\"/submissions/\"]').length") \
        == 0  # nothing was queued
    graces = write(tmp_path / "grace", "grace", answered())
    hand_in(browser, graces)
    assert "8/8 points" in feedback_page(browser, server, tmp_path / "grace.png")["text"]

    # ada, the instructor: grades.csv through the page's own link, with her cookie (the
    # browser's, sent from here: the pages' policy lets no script of theirs fetch anything)
    sign_in(browser, server, people["ada"], "/instructor")
    href = browser.evaluate("document.querySelector('a[href$=\"grades.csv\"]').href")
    cookies = browser.call("Network.getCookies", urls=[href])["cookies"]
    with urllib.request.urlopen(urllib.request.Request(href, headers={"Cookie": "; ".join(
            f"{c['name']}={c['value']}" for c in cookies)}), timeout=60) as answer:
        text = answer.read().decode()
    service_rows = list(csv.DictReader(io.StringIO(text)))

    # python -m autograder grade over the same files (the attempts that count: the last)
    submitted = tmp_path / "fresh" / "submitted"
    for student, path in (("alan", wrong), ("grace", graces)):
        write(submitted, student, nbformat.read(str(path), as_version=4))
    out = tmp_path / "fresh" / "out"
    done = autograder("grade", submitted, "--assignment", "demo", "--out", out, "--course",
                      server.course, "--jobs", 1, "--device", "cpu", "--cell-timeout", 30)
    assert done.returncode == 0, done.stderr[-3000:]
    with (out / "grades.csv").open() as handle:
        graded_rows = list(csv.DictReader(handle))

    def table(rows):
        return sorted((r["student_id"], r["assignment"], float(r["score"]),
                       float(r["max_score"]), r["status"]) for r in rows)
    assert table(service_rows) == table(graded_rows) == [
        ("alan", "demo", 5.0, 8.0, "graded"), ("grace", "demo", 8.0, 8.0, "graded")]
