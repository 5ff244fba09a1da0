"""autograder.pipeline.gradebook: scores go into nbgrader's gradebook, and nbgrader reads them back."""
from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autograder.pipeline.result import SubmissionResult
from autograder.pipeline.gradebook import GradebookWriter, db_url
from autograder.pipeline.judge import FAILED, MANUAL, PARTIAL, PASSED, SKIPPED, TestResult
from autograder.layout import Course, Submission
from tests.autograder_fixtures.submissions import COURSE


def demo_result(student: str, status: str = "graded", essay_answered: bool = True):
    tests = [TestResult("test_squares", 2.0, 0.0, FAILED, "AssertionError"),
             TestResult("test_mean", 1.0, 1.0, PASSED, ""),
             TestResult("test_mean_stderr", 1.0, 1.0, PASSED, ""),
             TestResult("test_mean_hidden", 2.0, 2.0, PASSED, ""),
             TestResult("test_partial", 2.0, 1.0, PARTIAL, ""),
             TestResult("test_squares_gpu", 1.0, 0.0, SKIPPED, ""),
             TestResult("explain", 1.0, 0.0, MANUAL, "")]
    sub = Submission(student, "demo", "demo", Path("/nowhere") / student / "demo" / "demo.ipynb")
    return SubmissionResult(sub, status, "", tests, answered={
        "squares": True, "mean": False, "explain": essay_answered})


@pytest.fixture
def gradebook(tmp_path):
    url = f"sqlite:///{tmp_path / 'gradebook.db'}"
    course = Course.discover(COURSE)
    with GradebookWriter(url, course_id=course.course_id) as writer:
        writer.register_assignment("demo", course.source_notebooks("demo"))
        writer.record(demo_result("ann"))
        writer.record(demo_result("bob", essay_answered=False))
        writer.record(demo_result("cat", status="invalid"))
        writer.record(demo_result("ann"))  # grading again updates, never duplicates
    return url


def grades(url, student):
    from nbgrader.api import Gradebook
    with Gradebook(url, "autograder-fixture") as gb:
        nb = gb.find_submission_notebook("demo", "demo", student)
        found = {g.name: (g.auto_score, g.needs_manual_grade) for g in nb.grades}
        comments = {c.name: c.auto_comment for c in nb.comments}
        return found, comments


def test_scores_and_flags_are_stored(gradebook):
    found, comments = grades(gradebook, "ann")
    assert found["test_squares"] == (0.0, False)
    assert found["test_partial"] == (1.0, False)
    assert found["test_mean_hidden"] == (2.0, False)
    assert found["test_squares_gpu"] == (None, True)   # not run: a person (or a GPU) decides
    assert found["explain"] == (None, True)            # a written answer
    assert comments["mean"] == "No response." and comments["squares"] is None


def test_unanswered_essay_and_invalid_submission_get_zero(gradebook):
    assert grades(gradebook, "bob")[0]["explain"] == (0.0, False)
    found, _ = grades(gradebook, "cat")
    assert set(found.values()) == {(0.0, False)}


def test_a_manual_score_is_kept_when_grading_again(gradebook):
    from nbgrader.api import Gradebook
    with Gradebook(gradebook, "autograder-fixture") as gb:
        grade = gb.find_grade("test_squares", "demo", "demo", "ann")
        grade.manual_score = 1.5
        gb.db.commit()
    with GradebookWriter(gradebook, "autograder-fixture") as writer:
        writer.record(demo_result("ann"))
    with Gradebook(gradebook, "autograder-fixture") as gb:
        grade = gb.find_grade("test_squares", "demo", "demo", "ann")
        assert (grade.manual_score, grade.auto_score, grade.score) == (1.5, 0.0, 1.5)
        assert grade.needs_manual_grade


def test_db_url_accepts_paths():
    assert db_url("sqlite:///x.db") == "sqlite:///x.db"
    assert db_url("postgresql://u@h/db") == "postgresql://u@h/db"
    assert db_url("some/gradebook.db").startswith("sqlite:////")


@pytest.mark.integration
def test_nbgrader_export_reads_the_scores(gradebook, tmp_path):
    env = dict(os.environ, PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
    out = tmp_path / "export.csv"
    done = subprocess.run([sys.executable, "-m", "nbgrader", "export", "--db", gradebook,
                           "--to", str(out), "--CourseDirectory.course_id=autograder-fixture"],
                          cwd=COURSE, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    with out.open() as handle:
        rows = {row["student_id"]: row for row in csv.DictReader(handle)}
    assert set(rows) == {"ann", "bob", "cat"}
    assert float(rows["ann"]["raw_score"]) == 5.0      # 0 + 1 + 1 + 2 + 1
    assert float(rows["cat"]["raw_score"]) == 0.0
    assert float(rows["ann"]["max_score"]) == 10.0     # nbgrader's maximum counts every cell
