"""autograder.pipeline.report: grades.csv, Gradescope's results.json, executed notebooks, summary."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import nbformat

from autograder.pipeline.result import SubmissionResult
from autograder.pipeline.judge import FAILED, MANUAL, PARTIAL, PASSED, SKIPPED, TestResult
from autograder.layout import Submission
from autograder.pipeline.report import (CSV_COLUMNS, gradescope, summary, write_grades_csv,
                               write_submission)

REQUIRED = ["student_id", "assignment", "notebook", "score", "max_score", "status", "message"]


def result(student="ann", status="graded", executed=True):
    tests = [TestResult("t_visible", 2.0, 2.0, PASSED, "ok"),
             TestResult("t_hidden", 3.0, 0.0, FAILED, "AssertionError: wrong", hidden=True),
             TestResult("t_partial", 2.0, 0.5, PARTIAL, "Partial credit"),
             TestResult("t_gpu", 1.0, 0.0, SKIPPED, "Skipped"),
             TestResult("essay", 4.0, 0.0, MANUAL, "Graded by a person.")]
    sub = Submission(student, "a1", "nb", Path("/nowhere") / student / "a1" / "nb.ipynb")
    nb = nbformat.v4.new_notebook() if executed else None
    return SubmissionResult(sub, status, "2.5/7 points, with a comma, and\nnewline", tests,
                            seconds=1.234, executed=nb)


def test_scores_leave_out_skipped_and_manual():
    r = result()
    assert (r.score, r.max_score) == (2.5, 7.0)


def test_grades_csv_has_one_row_per_submission(tmp_path):
    path = write_grades_csv([result("zed"), result("ann", status="timeout")], tmp_path / "g.csv")
    with path.open() as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == list(CSV_COLUMNS)
    assert all(column in CSV_COLUMNS for column in REQUIRED)
    assert [r["student_id"] for r in rows] == ["ann", "zed"]
    assert rows[0]["status"] == "timeout"
    assert (rows[1]["score"], rows[1]["max_score"]) == ("2.5", "7")
    assert "\n" not in rows[1]["message"] and rows[1]["skipped_points"] == "1"
    assert (rows[1]["tests_passed"], rows[1]["tests_failed"], rows[1]["tests_skipped"]) == (
        "1", "2", "1")


def test_grades_csv_keeps_the_rows_of_other_notebooks(tmp_path):
    path = tmp_path / "grades.csv"
    write_grades_csv([result("ann"), result("zed")], path)
    again = result("zed", status="timeout")  # graded again: its row is replaced
    other = result("ann")
    other.submission = Submission("ann", "a2", "nb", Path("/nowhere/ann/a2/nb.ipynb"))
    write_grades_csv([again, other], path)
    with path.open() as handle:
        rows = [(r["student_id"], r["assignment"], r["status"]) for r in csv.DictReader(handle)]
    assert rows == [("ann", "a1", "graded"), ("ann", "a2", "graded"), ("zed", "a1", "timeout")]


def test_csv_cells_never_start_like_a_formula():
    from autograder.pipeline.report import cell_text
    for text in ("=1+1", "+1", "-1", "@SUM(A1)", "\tx", "\rx"):
        assert cell_text(text) == "'" + text
    assert cell_text("ann") == "ann" and cell_text("") == ""


def test_gradescope_format():
    data = gradescope(result())
    assert data["score"] == 2.5
    tests = {t["name"]: t for t in data["tests"]}
    for test in data["tests"]:
        assert {"name", "score", "max_score", "output", "visibility"} <= set(test)
    assert tests["t_visible"]["status"] == "passed"
    assert tests["t_visible"]["visibility"] == "visible"
    assert tests["t_hidden"]["status"] == "failed"
    assert tests["t_hidden"]["visibility"] == "after_published"
    assert tests["t_partial"]["status"] == "failed" and tests["t_partial"]["score"] == 0.5
    assert tests["t_gpu"]["max_score"] == 0.0 and "status" not in tests["t_gpu"]
    assert tests["t_gpu"]["extra_data"]["outcome"] == "skipped"
    assert sum(t["max_score"] for t in data["tests"]) == data["extra_data"]["max_score"] == 7.0
    json.dumps(data)


def test_results_and_executed_notebook_go_where_nbgrader_puts_them(tmp_path):
    written = write_submission(result(), tmp_path)
    folder = tmp_path / "ann" / "a1"
    assert written == [folder / "nb.results.json", folder / "nb.ipynb"]
    nbformat.read(str(written[1]), as_version=4)
    only_json = write_submission(result("bob", "invalid", executed=False), tmp_path)
    assert only_json == [tmp_path / "bob" / "a1" / "nb.results.json"]


def test_summary_table_and_totals():
    text = summary([result("ann"), result("bob", "error")], seconds=4.0, jobs=2)
    assert "ann" in text and "bob" in text and "2.5/7" in text
    assert text.splitlines()[-1].startswith("2 submission(s) in 4.0 s (0.50/s, 2 job(s)): "
                                            "1 graded, 0 timeout, 1 error, 0 invalid")
    many = summary([result(f"s{i}") for i in range(70)] + [result("late", "timeout")], 10.0, 2)
    assert "late" in many and "s5 " not in many
