"""The course's assignments as cases to grade: notebooks, answer cells, wrong submissions.

Shared by tests/test_assignments.py (graded with nbgrader), tests/test_autograder_assignments.py
(graded with the course's autograder), the benchmarks and ``scripts/gpu-run``, so that all
grade exactly the same submissions. The wrong submissions are ``tests/wrong_submissions``.
"""
from __future__ import annotations

import copy
import re
import tomllib
from pathlib import Path

import nbformat

from coursebook.assignments import notebooks

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = ROOT / "solutions"
EXERCISES = ROOT / "exercises"
WRONG_SUBMISSIONS = ROOT / "tests" / "wrong_submissions"
SPEED_ANSWERS = ROOT / "tests" / "speed_answers"

# assignment -> its notebook's name, as the course's manifest lists them (assignments/assignments.toml;
# tests/test_assignments.py checks that solutions/ holds exactly these)
ASSIGNMENTS = notebooks(ROOT)
WRONG = sorted(WRONG_SUBMISSIONS.glob("*/*.toml"))

HIDDEN = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS[ \t]*\n?",
                    re.DOTALL | re.MULTILINE)
SOLUTION = re.compile(r"^[ \t]*### (BEGIN|END) SOLUTION[ \t]*\n?", re.MULTILINE)
SOLUTION_BLOCK = re.compile(r"^[ \t]*### BEGIN SOLUTION.*?### END SOLUTION[ \t]*\n?",
                            re.DOTALL | re.MULTILINE)


def nbgrader_meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def grade_cells(nb) -> dict:
    """grade_id -> cell, for the autograded test cells."""
    return {nbgrader_meta(c)["grade_id"]: c for c in nb.cells
            if nbgrader_meta(c).get("grade") and not nbgrader_meta(c).get("solution")}


def answer_cells(nb) -> dict:
    """grade_id -> cell, for the cells the learner writes code in."""
    return {nbgrader_meta(c)["grade_id"]: c for c in nb.cells if nbgrader_meta(c).get("solution")}


def solution_notebook(assignment: str):
    return nbformat.read(SOLUTIONS / assignment / f"{ASSIGNMENTS[assignment]}.ipynb", as_version=4)


def release_notebook(assignment: str):
    return nbformat.read(EXERCISES / assignment / f"{ASSIGNMENTS[assignment]}.ipynb", as_version=4)


def speed_answers(assignment: str) -> dict:
    """name -> answer code of the honest answers at known speeds (tests/speed_answers)."""
    with open(SPEED_ANSWERS / f"{assignment}.toml", "rb") as f:
        return {name: code.strip("\n") for name, code in tomllib.load(f).items()}


def load_wrong(path: Path) -> dict:
    with open(path, "rb") as f:
        case = tomllib.load(f)
    case["name"] = path.stem
    case["student"] = f"wrong_{path.stem}"
    return case


def expected_losses(case: dict, cuda: bool) -> dict:
    losses = dict(case.get("loses", {}))
    extra = case.get("loses_with_gpu" if cuda else "loses_without_gpu", {})
    for grade_id, points in extra.items():
        losses[grade_id] = losses.get(grade_id, 0) + points
    return losses


def speed_test_ids(assignment: str) -> set:
    """The grade ids of the assignment's speed tests (test cells that declare SPEED_TEST)."""
    return {grade_id for grade_id, cell in grade_cells(solution_notebook(assignment)).items()
            if "SPEED_TEST = {" in cell.source}


def unjudged(case: dict) -> set:
    """The tests whose points a wrong submission's case does not fix: its assignment's speed
    tests that none of its ``loses`` tables names. A wrong answer loses a speed test's points
    for certain only where its outputs are wrong (the case then names it); where they are
    right, the points follow its speed, which depends on the machine and the PyTorch version
    (the fused operator on 3-D inputs, say, runs 2.5 times slower in PyTorch 2.11 than on 4-D
    ones). The solution's full speed points, and the speeds of honest answers, are tested
    by tests/test_autograder_hostile_speed.py and benchmarks/speed_stability.py."""
    named = {grade_id for table in ("loses", "loses_with_gpu", "loses_without_gpu")
             for grade_id in case.get(table, {})}
    return speed_test_ids(case["assignment"]) - named


# Assignments with a speed test: each grading of one times it for seconds, so the tests whose
# subject is not speed (the accident corpus, the reruns at other parallelism) leave them out,
# and the course run hands their reference in fewer times (tests/course_run.py).
SPEED_TESTED = {assignment for assignment in ASSIGNMENTS
                if (SOLUTIONS / assignment / f"{ASSIGNMENTS[assignment]}.ipynb").is_file()
                and speed_test_ids(assignment)}


def counted(result: dict) -> dict:
    """grade_id -> (score, points) for the tests that count in a grader's results.json."""
    return {t["name"]: (t["score"], t["extra_data"]["points"]) for t in result["tests"]
            if t["extra_data"]["outcome"] not in ("skipped", "manual")}


def wrongly_skipped(result: dict, cuda: bool) -> list:
    """Tests the grader skipped or ran against its rule: GPU-only tests (``*_gpu``) run where
    CUDA is and are skipped where it is not; no other test is ever skipped."""
    return [test["name"] for test in result["tests"]
            if (test["extra_data"]["outcome"] == "skipped")
            != (test["name"].endswith("_gpu") and not cuda)]


def submission(assignment: str, answers: dict):
    """The release notebook with the learner's code in its answer cells (the solution's elsewhere)."""
    nb = copy.deepcopy(release_notebook(assignment))
    solved = answer_cells(solution_notebook(assignment))
    for grade_id, cell in answer_cells(nb).items():
        code = answers.get(grade_id)
        if code is None:
            code = SOLUTION.sub("", solved[grade_id].source)
        cell.source = code.strip("\n")
    return nb


def wrong_submissions(assignment: str) -> dict:
    """student -> the release with that wrong case's answers typed in (tests/wrong_submissions)."""
    found = {}
    for path in WRONG:
        case = load_wrong(path)
        if case["assignment"] == assignment:
            found[case["student"]] = submission(assignment, case["answers"])
    return found


def hand_in(submitted: Path, assignment: str, notebooks: dict) -> None:
    """Write SUBMITTED/<student>/<assignment>/<notebook>.ipynb for each student's notebook."""
    for student, nb in notebooks.items():
        folder = submitted / student / assignment
        folder.mkdir(parents=True)
        nbformat.write(nb, str(folder / f"{ASSIGNMENTS[assignment]}.ipynb"))
