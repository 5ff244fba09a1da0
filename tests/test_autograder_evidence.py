"""autograder.kernel.evidence: what crosses from a learner's kernel to the trusted checks.

A value of an allowed form (a subclass of a plain type: a named tuple where a tuple is
asked, ``numpy.float64`` where a float is) crosses as its base type's value, and none of
the subclass's own code runs on the way.
"""
from __future__ import annotations

import enum
import json
from collections import OrderedDict, defaultdict
from typing import NamedTuple

import numpy as np
import pytest

from autograder.pipeline.checks import Opaque, decode
from autograder.kernel.evidence import encode
from coursebook.cases import submission


def crossed(value):
    """``value`` as the checks' process sees it: encoded in the kernel, sent as JSON."""
    return decode(json.loads(json.dumps(encode(value))))


class Timing(NamedTuple):
    seconds: float
    bound: str


class Level(enum.IntEnum):
    LOW = 1


def test_allowed_forms_cross_as_their_plain_values():
    got = crossed(Timing(np.float64(0.25), "memory"))
    assert got == (0.25, "memory") and type(got) is tuple
    assert type(got[0]) is float and type(got[1]) is str
    assert type(crossed(np.float64(1.5))) is float and crossed(np.float64(1.5)) == 1.5
    assert crossed(Level.LOW) == 1 and type(crossed(Level.LOW)) is int
    assert crossed(defaultdict(int, a=2)) == {"a": 2}
    assert crossed(OrderedDict(b=[np.float64(3.0)])) == {"b": [3.0]}
    assert crossed(np.float64("nan")) != crossed(np.float64("nan"))  # still a float nan
    assert crossed(np.float64("inf")) == float("inf")


def test_plain_types_keep_what_tells_them_apart():
    assert type(crossed(True)) is bool and crossed(True) is True  # a bool is never an int
    assert type(crossed(3)) is int and type(crossed(3.0)) is float
    assert type(crossed((1, 2))) is tuple and type(crossed([1, 2])) is list
    assert isinstance(crossed(np.int64(3)), Opaque)  # not an int subclass: no value crosses


def test_a_subclass_crosses_by_value_and_none_of_its_code_runs():
    ran = []

    class Liar(float):
        def __float__(self):
            ran.append("__float__")
            return 0.0

        def __eq__(self, other):
            ran.append("__eq__")
            return True

        __hash__ = float.__hash__

    class Rows(tuple):
        def __iter__(self):
            ran.append("__iter__")
            return iter(("forged",))

    class Text(str):
        def __str__(self):
            ran.append("__str__")
            return "forged"

    class Whole(int):
        def __int__(self):
            ran.append("__int__")
            return 0

    class Items(dict):
        def items(self):
            ran.append("items")
            return [("forged", 0)]

    assert crossed(Liar(2.5)) == 2.5 and crossed(Liar(2.5)) != 3.0
    assert crossed(Rows((1, 2))) == (1, 2)
    assert crossed(Text("memory")) == "memory"
    assert crossed(Whole(7)) == 7
    assert crossed(Items(a=1)) == {"a": 1}
    assert ran == []


@pytest.mark.integration
def test_predict_measure_answers_in_the_allowed_forms_get_full_marks(tmp_path):
    """The task text asks for "a Python float" and "a tuple (seconds, bound)": numpy.float64
    is a float and a typing.NamedTuple a tuple, and nbgrader gives them full marks too."""
    from autograder.pipeline.result import GRADED
    from autograder.runners.local import LocalRunner
    from autograder.layout import Course, find_submissions
    from coursebook.cases import (ROOT, SOLUTION, answer_cells, hand_in,
                                   solution_notebook)
    from tests.test_autograder_grade import OPTIONS

    solved = {gid: SOLUTION.sub("", cell.source)
              for gid, cell in answer_cells(solution_notebook("predict_measure")).items()}
    forms = {  # answer cell -> (the solution's line, the same value in an allowed form)
        "bytes_answer": [("return float(sum(held))", "return np.float64(sum(held))")],
        "ring_time_answer": [("return steps * alpha", "return np.float64(steps) * alpha")],
        "roofline_answer": [('return moving, "memory"', 'return Roofline(np.float64(moving), "memory")'),
                            ('return computing, "compute"', 'return Roofline(computing, "compute")')],
    }
    header = ("import numpy as np\nfrom typing import NamedTuple\n\n\n"
              "class Roofline(NamedTuple):\n    seconds: float\n    bound: str\n\n\n")
    answers = {}
    for grade_id, replacements in forms.items():
        code = solved[grade_id]
        for line, allowed in replacements:
            assert line in code, (grade_id, line)
            code = code.replace(line, allowed)
        answers[grade_id] = header + code
    hand_in(tmp_path, "predict_measure", {"forms": submission("predict_measure", answers)})
    sources = Course.discover(ROOT).source_notebooks("predict_measure")
    with LocalRunner(jobs=1) as runner:
        [result] = runner.grade(find_submissions(tmp_path, "predict_measure"),
                                sources, OPTIONS)
    assert (result.status, result.score, result.max_score) == (GRADED, 17, 17), result.message
