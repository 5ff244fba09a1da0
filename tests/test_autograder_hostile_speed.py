"""The speed test of ``fast_attention`` against submissions that try to forge its timing
(tests/hostile_speed_submissions.py), graded in one run of the guide's command beside
honest answers, some handed in several times.

Every trick gets the speed points its case says, with a message that says why; the
honest answers get theirs, and each copy of the same file gets the same speed points (the
stability the guide's table measures over ten gradings, here at the course's default
``--jobs``, one per core).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from coursebook.cases import ROOT, hand_in, submission
from tests.hostile_speed_submissions import ANSWER_CELL, ASSIGNMENT, CASES, NOTEBOOK, SPEED_CELL

pytestmark = pytest.mark.integration


def _student(case, copy: int) -> str:
    return f"{case.name.replace(' ', '_')}-{copy}"


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    base = tmp_path_factory.mktemp("hostile-speed")
    notebooks = {_student(case, n): submission(ASSIGNMENT, {ANSWER_CELL: case.answer})
                 for case in CASES for n in range(case.copies)}
    hand_in(base / "submitted", ASSIGNMENT, notebooks)
    done = subprocess.run([sys.executable, "-m", "autograder", "grade", str(base / "submitted"),
                           "--assignment", ASSIGNMENT, "--out", str(base / "out"),
                           "--no-progress"], cwd=ROOT, capture_output=True, text=True,
                          timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = {}
    for student in notebooks:
        path = Path(base / "out" / student / ASSIGNMENT / f"{NOTEBOOK}.results.json")
        result = json.loads(path.read_text())
        results[student] = {**{t["name"]: t for t in result["tests"]},
                            "leaderboard": result.get("leaderboard")}
    return results


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_each_submission_gets_the_speed_points_it_must(graded, case):
    for copy in range(case.copies):
        test = graded[_student(case, copy)][SPEED_CELL]
        shown = f"{case.name} (copy {copy}): {test['output']}\n{test['extra_data']}"
        if case.at_most:
            assert test["score"] <= case.points, shown
        else:
            assert test["score"] == case.points, shown
        assert case.says in test["output"], shown
        speed = test["extra_data"]["speed"]
        assert speed["device"] == "cpu" and speed["verified"] is True, shown
        assert test["visibility"] == "visible"  # the learner sees the measurement at once
        board = graded[_student(case, copy)]["leaderboard"]
        if "speedup" in speed:
            assert speed["low"] <= speed["speedup"] <= speed["high"], shown
            assert speed["clock"] == "cpu", shown  # CPU time of the kernels' cgroups
            assert board == [{"name": f"{SPEED_CELL} speedup (cpu)",
                              "value": round(speed["speedup"], 3), "order": "desc"}], shown
        else:
            assert board is None, shown  # Gradescope's leaderboard: nothing to rank


def test_the_same_file_graded_again_gets_the_same_speed_points(graded):
    assert any(case.copies > 1 and 0 < case.points < 4 for case in CASES)  # a middle answer
    for case in CASES:
        scores = [graded[_student(case, n)][SPEED_CELL]["score"] for n in range(case.copies)]
        assert len(set(scores)) == 1, (case.name, scores)


def test_honest_answers_keep_every_correctness_point(graded):
    """The speed test's timing takes nothing from the other tests: the honest answers, and the
    tricks that behave for the correctness tests, pass them all."""
    for case in CASES:
        for name, test in graded[_student(case, 0)].items():
            if name not in (SPEED_CELL, "leaderboard"):
                assert test["score"] == test["max_score"], (case.name, test["name"],
                                                            test["output"])
