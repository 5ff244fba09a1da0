"""Fair grades for honest accidents, and no gain from nbgrader's tampering kinds (coursebook/accidents.py).

Each assignment's cases are handed in together and graded with the guide's command: every
file gets a row; a copied answer cell solved in either copy, and a solved notebook in any
order, get full marks and a message that says what the grader did; no tampering earns more
than the blank release; a broken file gets an ``invalid`` row whose message says in one
sentence what is wrong, never a library's internal error.
"""
from __future__ import annotations

import pytest

from coursebook.accidents import ACCIDENTS
from coursebook.cases import ASSIGNMENTS, SPEED_TESTED

pytestmark = pytest.mark.integration

INTERNAL = ("Traceback", "local variable", "object has no attribute", "KeyError", "Unsupported",
            "codec", "Expecting value", "NBFormatError")


# A learner's habits are the same whatever the assignment; what differs is the notebook they
# act on. So the corpus is graded on three notebooks that between them have what the others
# have: one answer cell (ring_allreduce, which the service's accident test grades too), two
# answer cells and two GPU-only tests (data_parallel), three answer cells among the most cells
# (predict_measure). One with a speed test would time it in every case (seconds each): its
# speed test's own corpus is tests/test_autograder_hostile_speed.py.
HABITUAL = {a: ASSIGNMENTS[a] for a in ("data_parallel", "predict_measure", "ring_allreduce")}
assert not set(HABITUAL) & SPEED_TESTED


@pytest.fixture(scope="module")
def rows(accident_rows):
    return accident_rows.of(HABITUAL)


@pytest.mark.parametrize("assignment", sorted(HABITUAL))
@pytest.mark.parametrize("accident", ACCIDENTS, ids=[a.name for a in ACCIDENTS])
def test_the_grade_is_fair(rows, assignment, accident):
    row = rows[assignment][accident.name]
    solved, blank = rows[assignment]["solved"], rows[assignment]["blank"]
    assert float(solved["score"]) == float(solved["max_score"]) > 0, solved
    assert float(blank["score"]) == 0, blank
    target = solved if accident.expect == "full" else blank
    if accident.expect == "full":
        assert (row["score"], row["max_score"]) == (target["score"], target["max_score"]), row
    else:  # tampering earns no more than the blank release, out of the same maximum
        assert float(row["score"]) <= float(blank["score"]), row
        if accident.status == "graded":
            assert row["max_score"] == blank["max_score"], row
    assert row["status"] == accident.status, row
    says = accident.says.replace("NAME", ASSIGNMENTS[assignment])
    assert says in row["message"], row["message"]
    assert not any(word in row["message"] for word in INTERNAL), row["message"]


def test_every_file_gets_a_row(rows):
    for assignment, found in rows.items():
        assert sorted(found) == sorted(a.name for a in ACCIDENTS), assignment
