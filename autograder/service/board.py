"""The service's speed leaderboard: learners who opt in, under a display name they choose,
ranked per speed test by the best speedup any of their graded uploads measured.

What counts (:func:`measured_speeds`, kept in each upload's row when it is graded): a speed
test's ``extra_data.speed`` in the result's ``results.json`` that has a ``speedup`` (it was
timed to the end), no ``problem`` or ``setup`` message, and ``verified`` true (a grader
that could not watch the learner's kernel cannot vouch for the number). A learner's row is
their best such speedup over every graded upload of the assignment, whichever attempt
counts for the grade: the board is about how fast they made it, not about the score.

No learner appears unless they opted in (:data:`~.db` table ``board_names``); a display
name stands for them and their id is never shown. Names are plain text (:func:`display_name`)
and every page escapes them anyway.
"""
from __future__ import annotations

import re
import unicodedata
from typing import Dict, Iterable, List, Optional

from autograder.pipeline.speed import ranked_speedup, timed_to_the_end

NAME_MAX = 32  # characters of a display name
# A display name is text: nothing that reads as a tag, a comment or a doctype opening
TAG = re.compile(r"<\s*[/!?A-Za-z]")


class NameRefused(ValueError):
    """A display name the board does not take; the message says why."""


def change_name(store, person: str, action: str, typed: str) -> None:
    """Do what the board's form asks for ``person``: ``join`` the board as ``typed`` (or
    change their name to it), or ``leave`` it. ValueError for another action; NameRefused
    for a name the board does not take."""
    if action == "leave":
        store.leave_board(person)
    elif action == "join":
        store.join_board(person, display_name(typed))
    else:
        raise ValueError(f"no such action {action!r}: join or leave")


def display_name(text: str) -> str:
    """``text`` as a display name (runs of white space made one space, ends trimmed), or
    :class:`NameRefused`: empty, over :data:`NAME_MAX` characters, a character that does not
    print (controls, format characters such as right-to-left overrides, line breaks), or
    markup (``<b>``, ``</x``, ``<!--``)."""
    name = " ".join(str(text or "").split())
    if not name:
        raise NameRefused("choose a display name (it is what the board shows instead of your id)")
    if len(name) > NAME_MAX:
        raise NameRefused(f"a display name is at most {NAME_MAX} characters; this one has "
                          f"{len(name)}")
    if not name.isprintable():  # (Unicode's "Other" and separators but the space)
        raise NameRefused("a display name holds printable characters only")
    if TAG.search(name):
        raise NameRefused("a display name is plain text, not HTML: leave out the tags")
    return name


def folded(name: str) -> str:
    """What two display names that are the same to a reader share (case and Unicode forms
    aside): names are unique in the course by this."""
    return unicodedata.normalize("NFKC", name).casefold()


def measured_speeds(results: dict) -> List[dict]:
    """The speed tests of one result (its Gradescope form, ``results.json``) that were
    measured: ``test`` (the name the results give it), ``speedup`` with its interval
    ``low``-``high``, ``device``, ``rounds`` and ``verified``. A test that was not timed,
    or whose timing ended with a ``problem`` or a ``setup`` failure, gives none."""
    found = []
    for test in results.get("tests", []):
        speed = (test.get("extra_data") or {}).get("speed")
        if not timed_to_the_end(speed):
            continue
        found.append({"test": test["name"], "speedup": float(speed["speedup"]),
                      "low": speed.get("low"), "high": speed.get("high"),
                      "device": str(speed.get("device", "")), "rounds": speed.get("rounds"),
                      "verified": bool(speed.get("verified"))})
    return found


def ranked(uploads: Iterable[tuple], names: Dict[str, str],
           viewer: Optional[str] = None) -> List[dict]:
    """The board of one assignment: per speed test (``notebook``, ``test``), one row per
    learner in ``names`` (person -> display name: those who opted in), their best verified
    speedup over ``uploads`` (``(student, notebook, graded_time, speeds)``, ``speeds`` as
    :func:`measured_speeds` gives them), highest first; equal speedups: the earlier graded
    first. ``you`` marks the row of ``viewer``. No row names a learner's id."""
    best: Dict[tuple, tuple] = {}
    for student, notebook, graded, speeds in uploads:
        if student not in names:
            continue
        for speed in speeds:
            if ranked_speedup(speed) is None:
                continue  # not verified
            key = (notebook, speed["test"], student)
            mine = (speed["speedup"], -(graded or 0.0))
            if key not in best or mine > best[key][0]:
                best[key] = (mine, speed, graded)
    boards: Dict[tuple, list] = {}
    for (notebook, test, student), (_, speed, graded) in best.items():
        boards.setdefault((notebook, test), []).append({
            "name": names[student], "speedup": speed["speedup"], "low": speed.get("low"),
            "high": speed.get("high"), "device": speed["device"], "graded": graded,
            "you": student == viewer})
    shown = []
    for (notebook, test), rows in sorted(boards.items()):
        rows.sort(key=lambda r: (-r["speedup"], r["graded"] or 0.0, folded(r["name"])))
        for rank, row in enumerate(rows, start=1):
            row["rank"] = rank
        shown.append({"notebook": notebook, "test": test, "rows": rows})
    return shown
