"""The submission service's JSON API: what ``python -m autograder submit`` (and any other
program with a person's token) asks, answered in JSON.

Handlers of their own, beside the pages of :mod:`.pages`, over the same functions of the
service (``feedback``, ``leaderboard``, ``accept``, ``regrade_all``, the board's
``change_name``) and the same checks (:class:`.pages.Base`: who is asking first, the
XSRF token of a browser's form, the security headers). Routes:

- ``GET /submissions/ID.json`` (``?wait=S``: held until the upload changes state, at most
  ``SERVICE_LONG_POLL`` seconds) and ``GET /leaderboard/ASSIGNMENT.json``;
- ``POST /submit`` (201 and the upload's id), ``POST /leaderboard`` (joined, and as whom)
  and ``POST /instructor/regrade`` (how many queued) from a request that asks for JSON (a
  Bearer token or ``Accept: application/json``); a browser's form there gets the page's
  answer (a 303 to a page).
"""
from __future__ import annotations

from autograder.options import SERVICE_LONG_POLL
from autograder.service.board import NameRefused, change_name
from autograder.service.db import DONE, Row
from autograder.service.pages import Base, JsonRequests, Submit as SubmitPage


class Feedback(Base):
    """``GET /submissions/ID.json``: what the feedback page shows, as data."""

    async def get(self, submission_id: str) -> None:
        row = self.upload(submission_id)
        if row is None:
            return
        if row.state != DONE:
            # ?wait=S: answer when the upload changes state (claimed, graded), not before
            # S seconds (a long poll: `submit` learns its grade at once, without polling)
            try:
                hold = min(float(self.get_query_argument("wait", "0")), SERVICE_LONG_POLL)
            except ValueError:
                hold = 0.0
            if hold > 0:
                await self.service.next_change(row.id, hold)
                row = self.service.store.get(row.id)
        self.finish(self.service.feedback(row))


class Leaderboard(Base):
    """``GET /leaderboard/ASSIGNMENT.json``: the board's page as data."""

    def get(self, assignment: str) -> None:
        if self.known_assignment(assignment):
            self.finish(self.service.leaderboard(assignment, self.person))


class BoardName(Base):
    """``POST /leaderboard`` from a program: join, change one's name or leave; whether one
    is on the board now, and as whom."""

    def post(self) -> None:
        try:
            change_name(self.service.store, self.person.id,
                        self.get_body_argument("action", "join"),
                        self.get_body_argument("display_name", ""))
        except (NameRefused, ValueError) as why:
            return self.refuse(400, str(why))
        names = self.service.store.board_names()
        self.finish({"joined": self.person.id in names,
                     "display_name": names.get(self.person.id)})


class Submit(SubmitPage):
    """``POST /submit`` from a program: the upload, read and checked as the form's is; 201
    with its id, attempt and address."""

    def accepted(self, row: Row) -> None:
        self.set_status(201)
        self.finish({"id": row.key, "attempt": row.attempt, "assignment": row.assignment,
                     "url": self.url(f"submissions/{row.key}")})


class Regrade(Base):
    """``POST /instructor/regrade`` from a program: how many attempts were queued again."""
    instructors_only = True

    def post(self) -> None:
        self.finish({"queued": self.service.regrade_all()})


def routes(at: str) -> list:
    """The API's routes under ``at`` (the prefix, as a pattern): before the pages', which
    share some of their addresses."""
    return [(at + r"submissions/([\w-]+)\.json", Feedback),
            (at + r"leaderboard/([^/]+?)\.json", Leaderboard),
            (JsonRequests(at + r"submit"), Submit),
            (JsonRequests(at + r"leaderboard"), BoardName),
            (JsonRequests(at + r"instructor/regrade"), Regrade)]

