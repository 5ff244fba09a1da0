"""Submitted files are data, never paths to follow (submissions come from tar files, shared
exchange folders and LMS downloads, where links and odd files survive).

A symbolic link to the instructor's notebook, a named pipe, a folder where a notebook should
be, and a student folder that links outside the submissions each get an ``invalid`` row that
says why, and one learner's odd file never holds up the others. A student id that a
spreadsheet would evaluate as a formula is written so that it is not.
"""
from __future__ import annotations

import csv
import os
import subprocess
import sys

import nbformat
import pytest

from tests.assignments import ASSIGNMENTS, ROOT, SOLUTIONS, submission

pytestmark = pytest.mark.integration
ASSIGNMENT = "data_parallel"
NOTEBOOK = ASSIGNMENTS[ASSIGNMENT]


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    base = tmp_path_factory.mktemp("files")
    submitted = base / "submitted"
    solved = submission(ASSIGNMENT, {})

    def folder(student):
        path = submitted / student / ASSIGNMENT
        path.mkdir(parents=True)
        return path / f"{NOTEBOOK}.ipynb"

    nbformat.write(solved, str(folder("solved")))
    nbformat.write(solved, str(folder("=1+1")))
    folder("linked").symlink_to(SOLUTIONS / ASSIGNMENT / f"{NOTEBOOK}.ipynb")
    os.mkfifo(folder("pipe"))
    folder("folder").mkdir()
    elsewhere = base / "elsewhere" / ASSIGNMENT
    elsewhere.mkdir(parents=True)
    nbformat.write(solved, str(elsewhere / f"{NOTEBOOK}.ipynb"))
    (submitted / "outside").symlink_to(base / "elsewhere")
    done = subprocess.run(
        [sys.executable, "-m", "autograder", "grade", str(submitted), "--assignment", ASSIGNMENT,
         "--out", str(base / "graded"), "--device", "cpu", "--no-progress"],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
        timeout=600)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    with (base / "graded" / "grades.csv").open() as handle:
        return {row["student_id"]: row for row in csv.DictReader(handle)}


@pytest.mark.parametrize("student, says", [
    ("linked", "the notebook is a symbolic link, not a file"),
    ("pipe", "the notebook is a named pipe, not a file"),
    ("folder", "the notebook is a folder, not a file"),
    ("outside", "a link to somewhere outside the submissions"),
])
def test_odd_files_get_an_invalid_row_that_says_why(rows, student, says):
    row = rows[student]
    assert (row["status"], row["score"]) == ("invalid", "0"), row
    assert says in row["message"], row["message"]


def test_the_others_are_graded_as_usual(rows):
    assert rows["solved"]["status"] == "graded"
    assert rows["solved"]["score"] == rows["solved"]["max_score"] != "0"


def test_no_spreadsheet_evaluates_a_student_id(rows):
    assert "=1+1" not in rows
    row = rows["'=1+1"]  # the apostrophe makes a spreadsheet show the text as it is
    assert row["score"] == rows["solved"]["score"]
