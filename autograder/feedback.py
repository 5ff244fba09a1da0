"""How one graded test reads to a learner, the same wherever the service's feedback is shown:
its web page (:mod:`autograder.service.pages`) and ``submit``'s text
(:mod:`autograder.commands.submit`). ``test`` is a test of the service's JSON feedback."""
from __future__ import annotations

MARKS = {"passed": "PASS", "failed": "FAIL"}


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
