"""The service's pages are autoescaped templates: what a learner controls (a test's name and
output, a result's message, an assignment's name) shows as text, never as markup, and a
template's own syntax in it is never evaluated. The handlers render in-process here, on a
stand-in service (no server, no grading)."""
from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from unittest import mock

import tornado.httputil
import tornado.web

from autograder.service import pages
from autograder.service.config import Person, Rules
from autograder.service.db import DONE, Row

HOSTILE = ['<script>alert(1)</script>', '"><img src=x onerror=1>', '{{ 1+1 }}']
EVIL = "".join(HOSTILE)
ESCAPED = ['&lt;script&gt;alert(1)&lt;/script&gt;', '&quot;&gt;&lt;img src=x onerror=1&gt;',
           '{{ 1+1 }}']


def stored(**values) -> Row:
    row = dict(id=1, student="alan", assignment="demo", notebook="demo", attempt=1, path="p",
               created=1.7e9, days_late=0, state=DONE, claim_seq=None, started=1.7e9 + 1,
               finished=1.7e9 + 5, gradings=1, status="graded", score=1.0, max_score=2.0,
               penalty=0.0, message=None, seconds=4.0, csv_row=None, results=None,
               executed=None, key="k3y", phases=None, tests=None)
    return Row(**{**row, **values})


def rendered(handler_class, person: Person, service, *args) -> str:
    """The page a GET of ``handler_class`` answers, signed in as ``person``."""
    app = tornado.web.Application(service=service)
    handler = handler_class(app, tornado.httputil.HTTPServerRequest(
        start_line=tornado.httputil.RequestStartLine("GET", "/", "HTTP/1.1"),
        headers=tornado.httputil.HTTPHeaders({"Host": "localhost"}), connection=mock.Mock()))
    handler.person = person
    answers = []
    handler.finish = answers.append
    result = handler.get(*args)
    if asyncio.iscoroutine(result):
        asyncio.run(result)
    (page,) = answers
    return page.decode() if isinstance(page, bytes) else page


def assert_shown_as_text(page: str, count: int) -> None:
    for raw in HOSTILE[:2]:
        assert raw not in page
    assert "<script" not in page and "<img" not in page and "onerror=1>" not in page
    for text in ESCAPED:
        assert page.count(text) >= count, (text, page)
    assert "{{" not in page.replace("{{ 1+1 }}", "")  # no template syntax but the learner's


def test_the_feedback_page_shows_a_learners_test_output_and_message_as_text():
    tests = [{"name": "test_" + EVIL, "status": "failed", "outcome": "failed", "score": 0,
              "max_score": 1, "points": 1, "output": "AssertionError: " + EVIL,
              "hidden": False}]
    row = stored(assignment="demo", message="squares.ipynb: " + EVIL, tests=json.dumps(tests))
    service = SimpleNamespace(
        signin=SimpleNamespace(prefix="/"), form_targets="",
        store=SimpleNamespace(by_key=lambda key: row if key == row.key else None),
        feedback=lambda r: {"id": r.key, "state": r.state, "uploaded": "2026-01-01",
                            "days_late": 0, "status": r.status, "counted_score": 1.0,
                            "max_score": 2.0, "penalty": 0.0, "message": r.message,
                            "seconds": r.seconds, "graded": "2026-01-01",
                            "has_notebook": False, "tests": r.shown_tests})
    page = rendered(pages.Feedback, Person("alan", "learner"), service, row.key, None)
    assert_shown_as_text(page, count=3)  # the name, the output, the message
    assert (f"<td>test_{''.join(ESCAPED)}</td>" in page
            and f"<pre>AssertionError: {''.join(ESCAPED)}</pre>" in page
            and f"<p>squares.ipynb: {''.join(ESCAPED)}</p>" in page)
    assert '<span class="FAIL">FAIL</span>' in page and "<b>1/2</b> points" in page
    style = f"<style>{pages.STYLE}</style>"  # byte for byte: the policy allows it by hash
    assert page.startswith("<!doctype html>") and style in page


def test_the_home_page_shows_hostile_names_as_text():
    assignment = "demo" + EVIL
    rows = [stored(assignment=assignment)]
    service = SimpleNamespace(
        signin=SimpleNamespace(prefix="/"), form_targets="", assignments=[assignment],
        config=SimpleNamespace(rules={assignment: Rules(counts="best" + EVIL)}),
        store=SimpleNamespace(rows=lambda *args: rows),
        extensions=lambda person_id=None: {},  # (none: test_autograder_service_extensions)
        speed_tests={assignment: [("demo", "speed")]})
    page = rendered(pages.Home, Person("alan" + EVIL, "learner"), service)
    # the person, the assignment in the form, the rules, the attempts and the link to its
    # speed leaderboard; the rule's counts
    assert_shown_as_text(page, count=6)
    assert f"<option>demo{''.join(ESCAPED)}</option>" in page
    assert f"Signed in as <b>alan{''.join(ESCAPED)}</b> (learner)" in page
    assert '<a href="/submissions/k3y">1</a>' in page and "<td>1/2</td>" in page
    assert 'name="_xsrf"' in page and 'action="/submit?_xsrf=' in page
