"""The autograder on the course's real assignments, end to end.

For each assignment in solutions/: the instructor's solution gets full marks, the unedited
release gets 0, and every plausible wrong submission of tests/wrong_submissions/ (the same
cases tests/test_assignments.py gives nbgrader) loses exactly the points it lists; then
``nbgrader export`` reads the same scores back from the gradebook the grader wrote.

GPU-only test cells run only with CUDA; elsewhere they are skipped, so they are neither
in the score nor in the maximum.
"""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import torch

from tests.assignments import (ASSIGNMENTS, EXERCISES, ROOT, SOLUTIONS, WRONG, counted,
                               expected_losses, hand_in, load_wrong, wrong_submissions,
                               wrongly_skipped)

CUDA = torch.cuda.is_available()


def wrong_case(path: Path) -> dict:
    case = load_wrong(path)
    case["losses"] = expected_losses(case, CUDA)
    return case

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Grade every assignment's cases with ``python -m autograder grade``, one run each."""
    if not ASSIGNMENTS:
        pytest.skip("no assignments in solutions/ yet")
    base = tmp_path_factory.mktemp("assignments")
    found = {}
    for assignment, notebook in ASSIGNMENTS.items():
        submitted = base / assignment / "submitted"
        cases = {"solution": nbformat.read(str(SOLUTIONS / assignment / f"{notebook}.ipynb"),
                                           as_version=4),
                 "unedited": nbformat.read(str(EXERCISES / assignment / f"{notebook}.ipynb"),
                                           as_version=4)}
        cases.update(wrong_submissions(assignment))
        hand_in(submitted, assignment, cases)
        out, db = base / assignment / "out", base / assignment / "gradebook.db"
        done = subprocess.run(
            [sys.executable, "-m", "autograder", "grade", str(submitted),
             "--assignment", assignment, "--out", str(out), "--gradebook", f"sqlite:///{db}",
             "--no-progress"],
            cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
            timeout=1800)
        assert done.returncode == 0, f"{assignment}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        results = {}
        for student in cases:
            path = out / student / assignment / f"{notebook}.results.json"
            results[student] = json.loads(path.read_text())
        with (out / "grades.csv").open() as handle:
            rows = {row["student_id"]: row for row in csv.DictReader(handle)}
        found[assignment] = {"results": results, "rows": rows, "db": db}
    return found


def gpu_handling_is_right(result: dict) -> None:
    assert not wrongly_skipped(result, CUDA), result["tests"]


@pytest.mark.parametrize("assignment", sorted(ASSIGNMENTS))
def test_solution_gets_full_marks(graded, assignment):
    result = graded[assignment]["results"]["solution"]
    lost = {k: v for k, v in counted(result).items() if v[0] != v[1]}
    assert not lost, f"{assignment}: the solution lost points: {lost}"
    row = graded[assignment]["rows"]["solution"]
    assert row["status"] == "graded" and row["score"] == row["max_score"] != "0"
    gpu_handling_is_right(result)


@pytest.mark.parametrize("assignment", sorted(ASSIGNMENTS))
def test_unedited_release_scores_zero(graded, assignment):
    result = graded[assignment]["results"]["unedited"]
    assert result["score"] == 0
    assert all(score == 0 for score, _ in counted(result).values())
    assert float(graded[assignment]["rows"]["unedited"]["max_score"]) > 0


@pytest.mark.parametrize("path", WRONG, ids=[f"{p.parent.name}/{p.stem}" for p in WRONG])
def test_wrong_submission_loses_exactly_its_points(graded, path):
    case = wrong_case(path)
    result = graded[case["assignment"]]["results"][case["student"]]
    got = counted(result)
    expected = {gid: (points - case["losses"].get(gid, 0), points)
                for gid, (_, points) in got.items()}
    assert got == expected, f"{case['student']}: {case['mistake'].strip()}\n{result['output']}"
    gpu_handling_is_right(result)


@pytest.mark.parametrize("assignment", sorted(ASSIGNMENTS))
def test_nbgrader_export_reads_the_same_scores(graded, assignment, tmp_path):
    export = tmp_path / "export.csv"
    env = dict(os.environ, PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
    done = subprocess.run([sys.executable, "-m", "nbgrader", "export", "--db",
                           f"sqlite:///{graded[assignment]['db']}", "--to", str(export)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    with export.open() as handle:
        exported = {row["student_id"]: float(row["raw_score"]) for row in csv.DictReader(handle)
                    if row["assignment"] == assignment}
    ours = {student: float(row["score"]) for student, row in graded[assignment]["rows"].items()}
    assert exported == ours
