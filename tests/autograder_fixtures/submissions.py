"""Submissions of the fixture assignment ``demo`` (in ``course/``) for the autograder's tests.

``course/solutions/demo/demo.ipynb`` is an instructor notebook with nbgrader metadata;
``course/exercises/demo/demo.ipynb`` is what ``nbgrader generate_assignment demo`` made of it.
Every submission here is that release with answers typed in, as a learner would, and the
score it must get on a CPU run (8 points are at stake there: the GPU-only test is skipped and
the written answer is graded by a person).
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Dict, Optional

import nbformat

COURSE = Path(__file__).resolve().parent / "course"
SOURCE = COURSE / "solutions" / "demo" / "demo.ipynb"
RELEASE = COURSE / "exercises" / "demo" / "demo.ipynb"
CPU_MAX_SCORE = 8.0

GOOD_SQUARES = "def squares(n):\n    return [k * k for k in range(n)]"
GOOD_MEAN = ("def mean(values):\n    values = list(values)\n    if not values:\n"
             "        raise ValueError('no values')\n    return math.fsum(values) / len(values)")


def grade_id(cell) -> Optional[str]:
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def released() -> nbformat.NotebookNode:
    return nbformat.read(str(RELEASE), as_version=4)


def answered(squares: str = GOOD_SQUARES, mean: str = GOOD_MEAN,
             base: Optional[nbformat.NotebookNode] = None) -> nbformat.NotebookNode:
    """The release with the two answer cells filled in."""
    nb = copy.deepcopy(base) if base is not None else released()
    for cell in nb.cells:
        if grade_id(cell) == "squares":
            cell.source = squares
        elif grade_id(cell) == "mean":
            cell.source = mean
    return nb


def tampered() -> nbformat.NotebookNode:
    """A wrong squares() plus every trick on the tests: edit one, tag one, delete one."""
    nb = answered(squares="def squares(n):\n    return []")
    for cell in nb.cells:
        if grade_id(cell) == "test_squares":
            cell.source = "pass  # nothing to see here"
        elif grade_id(cell) == "test_mean":
            cell.metadata["tags"] = ["skip-execution", "raises-exception"]
    nb.cells = [c for c in nb.cells if grade_id(c) != "test_mean_hidden"]
    return nb


# Wrong squares() whose failing plain test reports no error output: the kernel's reply
# still says the cell raised, and the test must fail on that (judge.py).
SILENCED = ("def squares(n):\n    return []\n\n"
            "# the learner's own handler swallows every exception a cell raises\n"
            "get_ipython().set_custom_exc((Exception,), lambda *args, **kwargs: None)")
UNSENDABLE = ("class Squares(list):\n"
              "    def __repr__(self):  # a lone surrogate: the error's message cannot be sent\n"
              "        return '\\ud800'\n\n"
              "def squares(n):\n    return Squares()")


# name -> (notebook, score on a CPU run)
def graded_cases() -> Dict[str, tuple]:
    return {
        "instructor": (nbformat.read(str(SOURCE), as_version=4), 8.0),
        "released": (released(), 0.0),
        "correct": (answered(), 8.0),
        # squares off by one: test_squares fails (2) and half of test_partial (1)
        "off_by_one": (answered(squares="def squares(n):\n"
                                        "    return [k * k for k in range(1, n + 1)]"), 5.0),
        # mean([]) raises ZeroDivisionError, not ValueError: only the hidden test fails (2)
        "no_empty_check": (answered(mean="def mean(values):\n    values = list(values)\n"
                                         "    return sum(values) / len(values)"), 6.0),
        # the tricks change nothing: it scores what its wrong squares() deserves
        "tampered": (tampered(), 5.0),
        # test_squares fails (2) and half of test_partial (1), though no error is shown
        "silenced_errors": (answered(squares=SILENCED), 5.0),
        "unsendable_error": (answered(squares=UNSENDABLE), 5.0),
    }


def write(submitted: Path, student: str, nb, assignment: str = "demo",
          notebook: str = "demo") -> Path:
    """Put one notebook (or raw text) where nbgrader's layout expects it."""
    folder = Path(submitted) / student / assignment
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{notebook}.ipynb"
    if isinstance(nb, str):
        path.write_text(nb)
    else:
        nbformat.write(nb, str(path))
    return path
