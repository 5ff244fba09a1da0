"""How one graded test reads to a learner, the same wherever the service's feedback is shown:
its web page (:mod:`autograder.service.pages`) and ``submit``'s text
(:mod:`autograder.commands.submit`). ``test`` is a test of the service's JSON feedback, made
by :func:`shown_tests` from a result's Gradescope form (``results.json``)."""
from __future__ import annotations

from typing import List

MARKS = {"passed": "PASS", "failed": "FAIL"}


def shown_tests(results: dict) -> List[dict]:
    """The tests of one result as the service keeps and shows them, from its Gradescope
    form (:func:`autograder.pipeline.report.gradescope`, what ``results.json`` holds)."""
    return [{"name": test["name"], "status": test.get("status", "not counted"),
             "outcome": test.get("extra_data", {}).get("outcome", ""),
             "score": test["score"], "max_score": test["max_score"],
             "points": test.get("extra_data", {}).get("points", test["max_score"]),
             "output": test.get("output", ""),
             "hidden": test.get("visibility") != "visible"}
            for test in results.get("tests", [])]


def mark(test: dict) -> str:
    """PASS or FAIL for a test that counts, else what happened to it (SKIPPED, MANUAL)."""
    return MARKS.get(test["status"], test["outcome"].upper() or "----")


def test_points(test: dict) -> str:
    """``1/2`` for a test that counts; ``-/1`` for one worth a point that is not at stake
    in this grading (a GPU-only test on a CPU grader, a cell graded by hand), as
    ``python -m autograder check`` shows it."""
    if test["status"] in MARKS:
        return f"{test['score']:g}/{test['max_score']:g}"
    return f"-/{test.get('points', test['max_score']):g}"
