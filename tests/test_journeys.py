"""What the README tells learners and instructors to do, done on the real assignments.

* A learner opens the released notebook, types answers into its answer cells, saves it and
  runs ``python -m autograder check``: a correct notebook gets every visible point, and for
  every notebook (correct or one of tests/wrong_submissions) each visible test has the same
  outcome as when the same file is graded.
* An instructor runs nbgrader's steps in the README's order: ``nbgrader generate_assignment``,
  submissions collected into ``submitted/``, ``python -m autograder grade ... --gradebook``,
  ``nbgrader generate_feedback``, ``nbgrader export``: the exported scores equal grades.csv,
  and no feedback page holds a line of a hidden test.
"""
from __future__ import annotations

import csv
import html
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from autograder.check import check, has_code
from autograder.grade import resolve_device
from autograder.kernels import ForkServer, notebook_imports
from autograder.options import GradeOptions
from tests.assignments import (ASSIGNMENTS, HIDDEN, ROOT, SOLUTIONS, grade_cells, hand_in,
                               nbgrader_meta, release_notebook, solution_notebook, submission,
                               wrong_submissions)

pytestmark = pytest.mark.integration


def run(*command: str, cwd: Path = ROOT, timeout: int = 900) -> subprocess.CompletedProcess:
    """A command as the README writes it, with .venv/bin first on PATH (nbgrader needs alembic)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT),
               PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
    done = subprocess.run([sys.executable, "-m", *command], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)
    return done


def ok(done: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert done.returncode == 0, (f"{' '.join(done.args[2:])} failed ({done.returncode}):\n"
                                  f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


def visible_points(assignment: str) -> float:
    """Points of the released test cells that still hold code (the rest is hidden tests)."""
    return sum(float(nbgrader_meta(cell).get("points", 0))
               for cell in grade_cells(release_notebook(assignment)).values()
               if has_code(cell.source))


def cases(assignment: str) -> dict:
    """student -> the released notebook with that student's answers typed in."""
    return {"solved": submission(assignment, {}), **wrong_submissions(assignment)}


# ---------------------------------------------------------------------------------------------
# The learner


@pytest.mark.parametrize("assignment", sorted(ASSIGNMENTS))
def test_a_learner_checks_a_solved_notebook_and_gets_every_visible_point(tmp_path, assignment):
    path = tmp_path / f"{ASSIGNMENTS[assignment]}.ipynb"
    nbformat.write(submission(assignment, {}), str(path))
    done = ok(run("autograder", "check", str(path), cwd=tmp_path))
    points = visible_points(assignment)
    assert points > 0
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith(f"{points:g} of {points:g} points from the visible tests"), done.stdout
    assert not re.search(r"^\s*FAIL\b", done.stdout, re.MULTILINE), done.stdout


@pytest.fixture(scope="module")
def checked_and_graded(tmp_path_factory):
    """Every case of every assignment, checked (the learner's command) and graded (the
    instructor's): assignment -> student -> (check report, Gradescope results)."""
    found = {}
    device = resolve_device("auto")
    for assignment, notebook in ASSIGNMENTS.items():
        base = tmp_path_factory.mktemp(assignment)
        submitted = base / "submitted"
        hand_in(submitted, assignment, cases(assignment))
        ok(run("autograder", "grade", str(submitted), "--assignment", assignment,
               "--out", str(base / "out"), "--device", device, "--no-progress"))
        found[assignment] = {}
        released = submitted / "solved" / assignment / f"{notebook}.ipynb"
        options = GradeOptions(device=device)
        with ForkServer(notebook_imports([released])) as server:
            for student in cases(assignment):
                path = submitted / student / assignment / f"{notebook}.ipynb"
                report = check(path, options=options, fork_server=server)
                results = json.loads((base / "out" / student / assignment
                                      / f"{notebook}.results.json").read_text())
                found[assignment][student] = (report, results)
    return found


@pytest.mark.parametrize("assignment", sorted(ASSIGNMENTS))
def test_check_and_grade_agree_on_every_visible_test(checked_and_graded, assignment):
    for student, (report, results) in checked_and_graded[assignment].items():
        graded = {t["name"]: (t["extra_data"]["outcome"], t["score"]) for t in results["tests"]}
        checked = {t.grade_id: (t.outcome, t.score) for t in report.tests
                   if t.outcome != "hidden-only"}
        assert checked, f"{assignment}/{student}: no visible test was checked"
        assert checked == {name: graded[name] for name in checked}, (
            f"{assignment}/{student}: check {checked} but grade "
            f"{ {name: graded[name] for name in checked} }")
        if student == "solved":
            assert report.all_passed, f"{assignment}: {report.tests}"
        messages = {t["name"]: t["output"] for t in results["tests"]}
        for test in report.tests:
            if test.outcome == "failed":  # the learner reads the message of the check that failed
                assert test.output and without_numbers(test.output) == without_numbers(
                    messages[test.grade_id]), (test.output, messages[test.grade_id])


def without_numbers(message: str) -> str:
    """A failure message without the inputs drawn from TEST_SEED (check and grade draw
    different ones: only the grader knows the key of its seeds)."""
    return re.sub(r"-?\d+(\.\d+)?(e-?\d+)?", "#", message)


# ---------------------------------------------------------------------------------------------
# The instructor


@pytest.fixture(scope="module")
def instructor_run(tmp_path_factory):
    """The README's instructor guide, step by step, in a fresh course directory."""
    course = tmp_path_factory.mktemp("course")
    shutil.copy(ROOT / "nbgrader_config.py", course / "nbgrader_config.py")
    shutil.copytree(SOLUTIONS, course / "solutions")
    ok(run("nbgrader", "generate_assignment", "*", "--force", cwd=course))
    steps = {}
    for assignment, notebook in ASSIGNMENTS.items():
        released = nbformat.read(str(course / "exercises" / assignment / f"{notebook}.ipynb"),
                                 as_version=4)
        students = {"carol": released}  # handed in the release as it came
        students.update(("alice" if name == "solved" else f"bob_{name}", nb)
                        for name, nb in cases(assignment).items())
        hand_in(course / "submitted", assignment, students)
        ok(run("autograder", "grade", "submitted", "--assignment", assignment, "--out", "graded",
               "--gradebook", "--no-progress", cwd=course))
        ok(run("nbgrader", "generate_feedback", assignment,
               "--CourseDirectory.autograded_directory=graded", cwd=course))
        steps[assignment] = sorted(students)
    ok(run("nbgrader", "export", cwd=course))
    return course, steps


def test_the_instructor_exports_what_the_grader_wrote(instructor_run):
    course, steps = instructor_run
    with (course / "grades.csv").open() as handle:
        exported = {(row["assignment"], row["student_id"]): float(row["raw_score"])
                    for row in csv.DictReader(handle)}
    with (course / "graded" / "grades.csv").open() as handle:
        ours = {(row["assignment"], row["student_id"]): float(row["score"])
                for row in csv.DictReader(handle)}
    for assignment, students in steps.items():
        for student in students:
            assert exported[(assignment, student)] == ours[(assignment, student)], (
                assignment, student)
        assert ours[(assignment, "alice")] > 0 and ours[(assignment, "carol")] == 0


def test_feedback_holds_no_line_of_a_hidden_test(instructor_run):
    course, steps = instructor_run
    for assignment, students in steps.items():
        cells = [cell.source for cell in solution_notebook(assignment).cells]
        # What the learners may see anyway: the visible tests, the text, everyone's answers.
        elsewhere = "\n".join([HIDDEN.sub("", source) for source in cells] + [
            cell.source for nb in cases(assignment).values() for cell in nb.cells])
        hidden = {line.strip() for source in cells for block in HIDDEN.findall(source)
                  for line in block.splitlines()
                  if len(line.strip()) > 12 and line.strip() not in elsewhere
                  and "HIDDEN TESTS" not in line and not line.strip().startswith("#")}
        assert len(hidden) > 20, assignment
        for student in students:
            page = course / "feedback" / student / assignment / f"{ASSIGNMENTS[assignment]}.html"
            assert page.exists(), f"no feedback for {student}/{assignment}"
            text = page.read_text()
            text = html.unescape(re.sub(r"<[^>]+>", "", text))
            # Whole lines: a failure message may well name what was tested ("allreduce([])
            # should raise a ValueError"); the test's code must not be there.
            lines = {line.strip() for line in text.splitlines()}
            leaked = sorted(line for line in hidden if line in lines)
            assert not leaked, f"{student}/{assignment}: hidden test lines in feedback: {leaked[:5]}"
