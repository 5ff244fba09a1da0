"""The instructor guide's nbgrader steps (guide/nbgrader.md), done once per test session on
every real assignment.

Every test that needs the course's grader's verdict on a real case reads it from this one run
(``python -m autograder grade`` with its defaults, as the guide writes it), so each case is
graded once in this mode: ``tests/test_autograder_assignments.py`` (scores against
tests/wrong_submissions), ``tests/test_journeys.py`` (feedback, export, ``check`` against
``grade``) and ``tests/test_autograder_determinism.py`` (the same grades at other
parallelism). nbgrader's own ``autograde`` grades some of the same cases in
tests/test_assignments.py.

Students of each assignment:

* ``solution``: the instructor's notebook itself, hidden tests and all;
* ``unedited``: the release as ``nbgrader generate_assignment`` wrote it;
* ``reference_00`` ... : the release with the reference answers typed in, as a learner would;
* ``wrong_<case>``: one per file of tests/wrong_submissions.
"""
from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import nbformat

from coursebook.cases import (ASSIGNMENTS, ROOT, SOLUTIONS, SPEED_TESTED, hand_in,
                               solution_notebook, submission, wrong_submissions)
from tests.helpers import checkout_env

REFERENCE_COPIES = 8  # reference answers handed in this many times (grades must not vary)
SPEED_TESTED_COPIES = 2  # fewer where each grading times a speed test for seconds (the
#                          speed test's own stability: tests/test_autograder_hostile_speed.py)


def reference_copies(assignment: str) -> int:
    return SPEED_TESTED_COPIES if assignment in SPEED_TESTED else REFERENCE_COPIES


def reference(n: int) -> str:
    return f"reference_{n:02d}"


def run(*command: str, cwd: Path = ROOT, timeout: int = 1800) -> subprocess.CompletedProcess:
    """``python -m <command>`` as the guide writes it, with .venv/bin first on PATH (nbgrader
    runs alembic from PATH when it creates gradebook.db); fails with the command's output."""
    env = checkout_env()
    done = subprocess.run([sys.executable, "-m", *command], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (f"{' '.join(command)} failed ({done.returncode}):\n"
                                  f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


@dataclass
class CourseRun:
    """A course folder after the instructor's steps, and what each step left there."""
    folder: Path
    students: dict  # assignment -> sorted student ids

    def submitted(self, assignment: str, student: str) -> Path:
        return (self.folder / "submitted" / student / assignment
                / f"{ASSIGNMENTS[assignment]}.ipynb")

    def results(self, assignment: str, student: str) -> dict:
        """The grader's Gradescope-style results.json of one student."""
        path = (self.folder / "graded" / student / assignment
                / f"{ASSIGNMENTS[assignment]}.results.json")
        return json.loads(path.read_text())

    def grades(self) -> dict:
        """(assignment, student) -> the grader's grades.csv row."""
        with (self.folder / "graded" / "grades.csv").open() as handle:
            return {(row["assignment"], row["student_id"]): row for row in csv.DictReader(handle)}

    def exported(self) -> dict:
        """(assignment, student) -> raw score in ``nbgrader export``'s grades.csv."""
        with (self.folder / "grades.csv").open() as handle:
            return {(row["assignment"], row["student_id"]): float(row["raw_score"])
                    for row in csv.DictReader(handle)}

    def feedback(self, assignment: str, student: str) -> Path:
        return (self.folder / "feedback" / student / assignment
                / f"{ASSIGNMENTS[assignment]}.html")


def cases(assignment: str, released: nbformat.NotebookNode,
          copies: Optional[int] = None) -> dict:
    """student -> notebook handed in, for one assignment (see the module's docstring)."""
    copies = reference_copies(assignment) if copies is None else copies
    handed = {"solution": solution_notebook(assignment), "unedited": released}
    handed.update((reference(n), submission(assignment, {})) for n in range(copies))
    handed.update(wrong_submissions(assignment))
    return handed


# guide/nbgrader.md's commands, each as the words after ``python -m`` (tests/test_documentation.py
# reads the page's and compares them with instructor_commands).
RELEASE = ("nbgrader", "generate_assignment", "*", "--force")  # every assignment at once
EXPORT = ("nbgrader", "export")


def grading_commands(assignment: str) -> tuple:
    """Grading one assignment's submissions, then its feedback."""
    return (("autograder", "grade", "submitted", "--assignment", assignment, "--out", "graded",
             "--gradebook"),
            ("nbgrader", "generate_feedback", assignment,
             "--CourseDirectory.autograded_directory=graded"))


def instructor_commands(assignment: str) -> list:
    """The guide's commands for one assignment, in their order."""
    return [RELEASE, *grading_commands(assignment), EXPORT]


def instructor_steps(course: Path) -> CourseRun:
    """guide/nbgrader.md's steps in ``course`` (a new folder), in their order."""
    shutil.copy(ROOT / "nbgrader_config.py", course / "nbgrader_config.py")
    shutil.copytree(SOLUTIONS, course / "solutions")
    run(*RELEASE, cwd=course)
    students = {}
    for assignment, notebook in ASSIGNMENTS.items():
        released = nbformat.read(str(course / "exercises" / assignment / f"{notebook}.ipynb"),
                                 as_version=4)
        handed = cases(assignment, released)
        hand_in(course / "submitted", assignment, handed)
        grade, feedback = grading_commands(assignment)
        run(*grade, "--no-progress", cwd=course)  # no progress bar in a log
        run(*feedback, cwd=course)
        students[assignment] = sorted(handed)
    run(*EXPORT, cwd=course)
    return CourseRun(course, students)
