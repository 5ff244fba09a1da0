"""What the documentation tells learners and instructors to do, done on the real assignments.

* A learner opens the released notebook, types answers into its answer cells, saves it and
  runs ``python -m autograder check``: a correct notebook gets every visible point, and for
  every notebook (correct or one of tests/wrong_submissions) each visible test has the same
  outcome as when the same file is graded.
* An instructor runs nbgrader's steps in the guide's order (guide/nbgrader.md): ``nbgrader
  generate_assignment``, submissions collected into ``submitted/``, ``python -m autograder grade ... --gradebook``,
  ``nbgrader generate_feedback``, ``nbgrader export``: the exported scores equal grades.csv,
  and no feedback page holds a line of a hidden test. These steps run once per test session
  (tests/course_run.py); other tests read the grades they wrote.
"""
from __future__ import annotations

import html
import re

import nbformat
import pytest

from autograder.commands.check import check, has_code
from autograder.runners.local import LocalRunner
from autograder.options import CHECK_PROFILE, GradeOptions
from coursebook.cases import (ASSIGNMENTS, HIDDEN, grade_cells, nbgrader_meta, release_notebook,
                               solution_notebook, submission, wrong_submissions)
from tests.course_run import reference, run

pytestmark = pytest.mark.integration


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
    done = run("autograder", "check", str(path), cwd=tmp_path)
    points = visible_points(assignment)
    assert points > 0
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith(f"{points:g} of {points:g} points from the visible tests"), done.stdout
    assert not re.search(r"^\s*FAIL\b", done.stdout, re.MULTILINE), done.stdout


@pytest.fixture(scope="module")
def checked_and_graded(course_run):
    """Every learner-made case of every assignment (the reference answers typed in, and each of
    tests/wrong_submissions), checked with the learner's command and graded with the
    instructor's (once per session, tests/course_run.py): assignment -> student -> (check
    report, Gradescope results)."""
    found = {}
    for assignment in ASSIGNMENTS:
        students = [reference(0), *wrong_submissions(assignment)]
        paths = {student: course_run.submitted(assignment, student) for student in students}
        # One warm runner for the assignment's checks, as `python -m autograder check` makes
        # for each: the learner's defaults (quick profile), auto device resolved by it.
        with LocalRunner(1, "fork", [paths[reference(0)]]) as runner:
            options = runner.resolve(GradeOptions(profile=CHECK_PROFILE))
            found[assignment] = {
                student: (check(path, options=options, runner=runner),
                          course_run.results(assignment, student))
                for student, path in paths.items()}
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
        if student == reference(0):
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


def test_the_instructor_exports_what_the_grader_wrote(course_run):
    exported, ours = course_run.exported(), course_run.grades()
    for assignment, students in course_run.students.items():
        for student in students:
            assert exported[(assignment, student)] == float(ours[(assignment, student)]["score"]), (
                assignment, student)
        assert float(ours[(assignment, reference(0))]["score"]) > 0
        assert float(ours[(assignment, "unedited")]["score"]) == 0


def test_feedback_holds_no_line_of_a_hidden_test(course_run):
    for assignment, students in course_run.students.items():
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
            page = course_run.feedback(assignment, student)
            assert page.exists(), f"no feedback for {student}/{assignment}"
            text = page.read_text()
            text = html.unescape(re.sub(r"<[^>]+>", "", text))
            # Whole lines: a failure message may well name what was tested ("allreduce([])
            # should raise a ValueError"); the test's code must not be there.
            lines = {line.strip() for line in text.splitlines()}
            leaked = sorted(line for line in hidden if line in lines)
            assert not leaked, f"{student}/{assignment}: hidden test lines in feedback: {leaked[:5]}"
