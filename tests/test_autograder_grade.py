"""autograder.pipeline.grade: one submission in, one result out; many submissions, one process each."""
from __future__ import annotations

import os
import sys
from dataclasses import replace

import pytest

from autograder.protocol import GROUP, USER
from autograder.sandbox.device import machine_layers
from autograder.pipeline.execute import Limits
from autograder.sandbox.device import cuda_available
from autograder.pipeline.grade import GradeOptions, grade_submission
from autograder.pipeline.result import ERROR, GRADED, INVALID
from autograder.runners.local import LocalRunner
from autograder.sandbox.workdir import prepare_workdir
from autograder.sandbox.spawn import FreshInterpreter
from autograder.pipeline.judge import PASSED, SKIPPED
from autograder.layout import Course, find_submissions
from tests.autograder_fixtures.submissions import (COURSE, CPU_MAX_SCORE, answered, graded_cases,
                                                   write)

OPTIONS = GradeOptions(device="cpu", profile="quick", limits=Limits(cell=30, notebook=120))

# An answer that looks for the tests on disk: everything readable under its working directory.
SNOOP = '''
import os
found = []
for folder, _, files in os.walk(os.getcwd()):
    for name in files:
        try:
            text = open(os.path.join(folder, name), errors="ignore").read()
        except OSError:
            continue
        if "HIDDEN TESTS" in text or "squares(10)[-1]" in text or "range(n)]" in text:
            found.append(name)
print("FILES", sorted(os.listdir(".")), "LEAKS", found)

def squares(n):
    return [k * k for k in range(n)]
'''


@pytest.fixture(scope="module")
def sources():
    return Course.discover(COURSE).source_notebooks("demo")


@pytest.mark.integration
def test_grade_submission_is_one_result_object(tmp_path, sources):
    write(tmp_path, "ann", answered(squares=SNOOP))
    (tmp_path / "ann" / "demo" / "notes.txt").write_text("the learner's own file")
    submission = find_submissions(tmp_path, "demo")[0]
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    result = grade_submission(submission, sources["demo"], OPTIONS, FreshInterpreter())
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert (result.status, result.score, result.max_score) == (GRADED, CPU_MAX_SCORE, CPU_MAX_SCORE)
    assert [t.outcome for t in result.tests].count(SKIPPED) == 1
    printed = "".join(o.get("text", "") for c in result.executed.cells
                      for o in c.get("outputs", []) if "FILES" in o.get("text", ""))
    assert "notes.txt" in printed and "LEAKS []" in printed, printed
    assert ".ipynb" not in printed


def test_workdir_has_support_files_but_no_notebooks(tmp_path, sources):
    write(tmp_path, "ann", answered())
    (tmp_path / "ann" / "demo" / "data.csv").write_text("1,2\n")
    os.symlink("/etc/hostname", tmp_path / "ann" / "demo" / "link")
    workdir = prepare_workdir(find_submissions(tmp_path, "demo")[0], sources["demo"])
    try:
        assert sorted(p.name for p in workdir.iterdir()) == ["data.csv"]
    finally:
        import shutil
        shutil.rmtree(workdir)


def test_unreadable_or_missing_notebooks_are_invalid(tmp_path, sources):
    write(tmp_path, "ann", "{not a notebook")
    (tmp_path / "bob" / "demo").mkdir(parents=True)
    write(tmp_path, "cat", answered(), notebook="surprise")
    subs = find_submissions(tmp_path, "demo", notebooks=["demo"])
    results = [grade_submission(s, sources.get(s.notebook), OPTIONS, FreshInterpreter())
               for s in subs]
    assert [(r.submission.student_id, r.status) for r in results] == [
        ("ann", INVALID), ("bob", INVALID), ("cat", INVALID), ("cat", INVALID)]
    assert "is not a Jupyter notebook" in results[0].message
    assert "not submitted" in results[1].message
    assert results[0].max_score == CPU_MAX_SCORE and results[0].score == 0
    assert "no notebook 'surprise'" in results[3].message


@pytest.mark.integration
@pytest.mark.parametrize("kernel", ["fork", "fresh"])
def test_local_runner_gives_each_case_its_score(tmp_path, sources, kernel):
    cases = graded_cases()
    if kernel == "fresh":  # the slower way: two cases are enough to compare
        cases = {k: cases[k] for k in ("off_by_one", "tampered")}
    for student, (nb, _) in cases.items():
        write(tmp_path, student, nb)
    write(tmp_path, "crashes", answered(squares="import os\nos._exit(1)"))
    submissions = find_submissions(tmp_path, "demo", notebooks=["demo"])
    seen = []
    with LocalRunner(jobs=2, kernel=kernel) as runner:
        results = runner.grade(submissions, sources, replace(OPTIONS, kernel=kernel),
                               on_result=seen.append)
    assert len(seen) == len(results) == len(submissions)
    by_student = {r.submission.student_id: r for r in results}
    assert [r.submission for r in results] == submissions
    for student, (_, expected) in cases.items():
        result = by_student[student]
        assert (result.status, result.score, result.max_score) == (
            GRADED, expected, CPU_MAX_SCORE), (student, result.message)
    crashed = by_student["crashes"]
    assert crashed.status == ERROR and "kernel died" in crashed.message
    if kernel == "fork":
        tampered = by_student["tampered"]
        assert {t.grade_id: t.outcome for t in tampered.tests}["test_mean"] == PASSED
        assert "was edited" in tampered.message and "was missing" in tampered.message


def failing_sandboxes(monkeypatch, tmp_path, failures: int) -> list:
    """The first ``failures`` kernels of grade_submission are told to join a resource group
    that cannot be made and to require it (as under a transient failure); the policies
    it made are collected."""
    import autograder.pipeline.grade as grade
    made, real = [], grade.sandbox_policy

    def policy(*args, **kwargs):
        made.append(real(*args, **kwargs))
        if len(made) <= failures:
            return replace(made[-1], cgroups=(str(tmp_path / "no-such-cgroup"),),
                           required=tuple(sorted({*made[-1].required, GROUP})))
        return made[-1]
    monkeypatch.setattr(grade, "sandbox_policy", policy)
    return made


@pytest.mark.integration
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="cgroups are Linux's")
def test_a_kernel_whose_sandbox_fails_is_started_again_once(monkeypatch, tmp_path, sources):
    write(tmp_path / "in", "ann", answered())
    made = failing_sandboxes(monkeypatch, tmp_path, failures=1)
    submission = find_submissions(tmp_path / "in", "demo")[0]
    result = grade_submission(submission, sources["demo"], OPTIONS, FreshInterpreter())
    assert len(made) == 2
    assert (result.status, result.score) == (GRADED, CPU_MAX_SCORE), result.message


@pytest.mark.integration
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="cgroups are Linux's")
def test_a_submission_is_never_run_with_less_isolation_than_required(monkeypatch, tmp_path,
                                                                      sources):
    write(tmp_path / "in", "ann", answered())
    made = failing_sandboxes(monkeypatch, tmp_path, failures=2)
    submission = find_submissions(tmp_path / "in", "demo")[0]
    result = grade_submission(submission, sources["demo"], OPTIONS, FreshInterpreter())
    assert len(made) == 2 and result.status == ERROR and result.score == 0
    assert "no resource group" in result.message and "was not started" in result.message, \
        result.message


def test_the_policy_requires_what_this_machine_gives(tmp_path, sources):
    """Every namespace the probe found, the resource group when there is one, and the
    change of user for a root grader."""
    from autograder.sandbox.cgroups import ResourceGroup
    from autograder.sandbox.workdir import sandbox_policy
    write(tmp_path, "ann", answered())
    submission = find_submissions(tmp_path, "demo")[0]
    group = ResourceGroup.create(2**30, 64)
    try:
        policy = sandbox_policy(submission, sources["demo"], tmp_path, OPTIONS, group)
    finally:
        if group is not None:
            group.close()
    expected = set(machine_layers()) | ({GROUP} if group is not None else set()) | (
        {USER} if os.geteuid() == 0 else set())
    assert policy.required == tuple(sorted(expected))


@pytest.mark.integration
def test_the_measure_part_of_predict_measure_is_not_run_when_grading(tmp_path):
    """Its three read-only measure cells are tagged skip-when-grading: graded, the reference
    answers get full marks and those cells no output; every other code cell ran."""
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    sources = Course.discover(root).source_notebooks("predict_measure")
    folder = tmp_path / "ann" / "predict_measure"
    folder.mkdir(parents=True)
    (folder / "predict_measure.ipynb").write_bytes(
        (root / "solutions" / "predict_measure" / "predict_measure.ipynb").read_bytes())
    submission = find_submissions(tmp_path, "predict_measure")[0]
    result = grade_submission(submission, sources["predict_measure"], OPTIONS,
                              FreshInterpreter())
    assert (result.status, result.score, result.max_score) == (GRADED, 17, 17), result.message
    code = [c for c in result.executed.cells if c.cell_type == "code"]
    measure = {c.metadata["nbgrader"]["grade_id"]: c for c in code
               if c.metadata.get("nbgrader", {}).get("grade_id", "").startswith("measure_")}
    assert sorted(measure) == ["measure_bytes", "measure_ring", "measure_roofline"]
    assert all(c.outputs == [] and c.execution_count is None for c in measure.values())
    assert all(c.execution_count is not None for c in code if c not in measure.values())


def test_resolve_device():
    def device(requested: str) -> str:
        return GradeOptions(device=requested).resolve(cuda_available).device
    assert device("cpu") == "cpu" and device("cuda") == "cuda"
    import torch
    assert device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError):
        device("tpu")
