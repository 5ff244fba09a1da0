"""autograder.commands.check: the learner's own test run (fast parts; the CLI tests run it for real)."""
from __future__ import annotations

from pathlib import Path

from autograder.commands.check import CheckReport, edited_tests, has_code, render
from autograder.pipeline.judge import FAILED, HIDDEN_ONLY, PASSED, SKIPPED, TestResult
from tests.autograder_fixtures.submissions import grade_id, released


def test_has_code():
    assert not has_code("")
    assert not has_code("# Hidden tests (2 points): run when graded\n\n")
    assert has_code("assert f(1) == 2  # visible")
    assert has_code("%timeit f(1)")


def test_edited_tests_are_found_by_nbgrader_checksum():
    nb = released()
    assert edited_tests(nb) == []
    for cell in nb.cells:
        if grade_id(cell) == "test_mean":
            cell.source += "\n# harmless?"
    assert edited_tests(nb) == ["test_mean"]


def test_render_lists_each_test_and_the_points():
    report = CheckReport(
        notebook=Path("/work/demo.ipynb"), seconds=1.26, device="cpu",
        tests=[TestResult("test_a", 2.0, 2.0, PASSED, ""),
               TestResult("test_b", 1.0, 0.0, FAILED,
                          "AssertionError: b is wrong\n  in the test line"),
               TestResult("test_c_gpu", 1.0, 0.0, SKIPPED, "Skipped: needs CUDA"),
               TestResult("test_d", 3.0, 0.0, HIDDEN_ONLY, "Hidden tests only")],
        edited=["test_b"])
    text = render(report)
    lines = text.splitlines()
    assert lines[0] == "Visible tests of demo.ipynb (on cpu):"
    assert lines[1].split() == ["PASS", "test_a", "2/2"]
    assert lines[2].split()[:3] == ["FAIL", "test_b", "0/1"] and "b is wrong" in lines[2]
    assert "in the test line" not in text  # one line per test
    assert lines[3].split()[:3] == ["SKIP", "test_c_gpu", "-/1"]
    assert lines[4].split()[:3] == ["HIDE", "test_d", "-/3"]
    assert "you edited test cell 'test_b'" in text
    assert lines[-1].startswith("2 of 3 points from the visible tests, in 1.3 s.")
    assert not report.all_passed
