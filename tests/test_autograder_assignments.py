"""The autograder on the course's real assignments, end to end.

For each assignment in solutions/: the instructor's solution gets full marks, the unedited
release gets 0, and every plausible wrong submission of tests/wrong_submissions/ (the same
cases tests/test_assignments.py gives nbgrader) loses exactly the points it lists; then
``nbgrader export`` reads the same scores back from the gradebook the grader wrote. The cases
are graded once per test session, by the guide's nbgrader steps (tests/course_run.py).

GPU-only test cells run only with CUDA; elsewhere they are skipped, so they are neither
in the score nor in the maximum.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from coursebook.cases import (ASSIGNMENTS, WRONG, counted, expected_losses, load_wrong, unjudged,
                              wrongly_skipped)

CUDA = torch.cuda.is_available()


def wrong_case(path: Path) -> dict:
    case = load_wrong(path)
    case["losses"] = expected_losses(case, CUDA)
    return case

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def graded(course_run):
    """Every assignment's cases as the guide's ``python -m autograder grade ... --gradebook``
    graded them, once for the whole test session (tests/course_run.py)."""
    if not ASSIGNMENTS:
        pytest.skip("no assignments in solutions/ yet")
    rows = course_run.grades()
    return {assignment: {"results": {student: course_run.results(assignment, student)
                                     for student in students},
                         "rows": {student: rows[(assignment, student)] for student in students}}
            for assignment, students in course_run.students.items()}


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
    left_out = unjudged(case)
    got = {gid: scores for gid, scores in counted(result).items() if gid not in left_out}
    expected = {gid: (points - case["losses"].get(gid, 0), points)
                for gid, (_, points) in got.items()}
    assert got == expected, f"{case['student']}: {case['mistake'].strip()}\n{result['output']}"
    gpu_handling_is_right(result)


@pytest.mark.parametrize("assignment", sorted(ASSIGNMENTS))
def test_nbgrader_export_reads_the_same_scores(course_run, assignment):
    """``nbgrader export`` of the gradebook the grader wrote gives every student the score of
    the grader's own grades.csv."""
    exported, ours = course_run.exported(), course_run.grades()
    students = course_run.students[assignment]
    assert {s: exported[(assignment, s)] for s in students} == {
        s: float(ours[(assignment, s)]["score"]) for s in students}


def test_a_speed_test_with_a_cuda_schedule_only_is_at_stake_only_on_cuda(graded):
    """fused_layernorm's speed test has a schedule for CUDA only: with CUDA the reference is
    timed and earns both points; without, the test is skipped, its 2 points neither scored nor
    in the maximum (grades.csv's skipped_points says so)."""
    result = graded["fused_layernorm"]["results"]["solution"]
    speed = next(t for t in result["tests"] if t["name"] == "layernorm_speed_gpu")
    row = graded["fused_layernorm"]["rows"]["solution"]
    if CUDA:
        assert speed["extra_data"]["outcome"] != "skipped", speed
        assert "speed" in speed["extra_data"], speed
        assert speed["score"] == speed["extra_data"]["points"] == 2, speed
        assert float(row["max_score"]) == 10 and float(row["skipped_points"]) == 0, row
    else:
        assert speed["extra_data"]["outcome"] == "skipped", speed
        assert float(row["max_score"]) == 8 and float(row["skipped_points"]) == 2, row


@pytest.mark.gpu
def test_the_layer_norm_kernel_is_timed_against_pytorch_on_a_gpu(graded):
    """On a GPU the reference Triton kernel is compiled, checked and timed against
    torch.nn.functional.layer_norm; the speedup is what sets the schedule (solutions/GRADING.md)."""
    result = graded["fused_layernorm"]["results"]["solution"]
    speed = next(t for t in result["tests"] if t["name"] == "layernorm_speed_gpu")
    measured = speed["extra_data"]["speed"]
    assert measured.get("device") == "cuda", measured
    print(f"fused_layernorm on {torch.cuda.get_device_name()}: {json.dumps(measured)[:2000]}")
