"""``python -m autograder check NOTEBOOK``: a learner runs the visible tests on their work.

The same pipeline as grading (rebuild, execute, judge) on one notebook, in a fresh
kernel whose working directory is the notebook's folder, with the quick profile by
default, so that it answers in seconds. The tests come from the released notebook when
``--source`` names it, else from the notebook itself; in that case a test cell the
learner edited is still run as edited, but flagged: nbgrader's checksum in its metadata
no longer matches, and grading will use the original. Hidden tests are not in a learner's
notebook at all, so a passing check is necessary, not sufficient.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

from .execute import Limits, execute
from .judge import HIDDEN_ONLY, MANUAL, PARTIAL, PASSED, SKIPPED, TestResult, judge
from .layout import read_submission
from .rebuild import grade_id_of, is_test, rebuild


@dataclass
class CheckReport:
    notebook: Path
    tests: List[TestResult]
    seconds: float
    device: str
    problem: str = ""                                   # why it could not run, if it could not
    edited: List[str] = field(default_factory=list)     # test cells changed by the learner

    @property
    def graded(self) -> List[TestResult]:
        return [t for t in self.tests if t.counts]

    @property
    def score(self) -> float:
        return sum(t.score for t in self.graded)

    @property
    def max_score(self) -> float:
        return sum(t.max_score for t in self.graded)

    @property
    def all_passed(self) -> bool:
        return not self.problem and all(t.outcome == PASSED for t in self.graded)


def has_code(source: str) -> bool:
    """Whether a cell holds any statement (not only comments and blank lines)."""
    try:
        return bool(ast.parse(source).body)
    except SyntaxError:
        return True  # IPython syntax or a typo: something is there to run


def edited_tests(nb) -> List[str]:
    """Test cells whose source no longer matches the checksum nbgrader released them with."""
    from nbgrader.utils import compute_checksum
    edited = []
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if is_test(cell) and meta.get("checksum") and compute_checksum(cell) != meta["checksum"]:
            edited.append(grade_id_of(cell))
    return edited


def check(notebook: Path, source: Optional[Path] = None, device: str = "cpu",
          profile: str = "quick", limits: Limits = Limits(cell=300, notebook=900)) -> CheckReport:
    notebook = Path(notebook).resolve()
    learner = read_submission(notebook)
    reference = read_submission(Path(source)) if source else learner
    edited = [] if source else edited_tests(learner)
    rebuilt = rebuild(reference, learner, device=device, profile=profile)
    env = {"DLPERF_PROFILE": profile}
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    execution = execute(rebuilt.notebook, notebook.parent,
                        parameters={"autograder_device": device, "autograder_profile": profile},
                        limits=limits, env=env)
    tests = judge(execution.notebook, rebuilt.tests, rebuilt.manual, stopped=execution.message)
    # A released test cell with no code left held only hidden tests: nothing to check here.
    sources = {cell.get("id"): cell.source for cell in rebuilt.notebook.cells}
    empty = {t.grade_id for t in rebuilt.tests if not has_code(sources.get(t.cell_id, ""))}
    tests = [TestResult(t.grade_id, t.max_score, 0.0, HIDDEN_ONLY,
                        "Hidden tests only: they run when your work is graded.")
             if t.grade_id in empty else t for t in tests]
    return CheckReport(notebook=notebook, tests=tests, seconds=execution.seconds, device=device,
                       problem="" if execution.completed else execution.message, edited=edited)


MARKS = {PASSED: "PASS", PARTIAL: "PART", SKIPPED: "SKIP", MANUAL: "TODO", HIDDEN_ONLY: "HIDE"}


def render(report: CheckReport) -> str:
    """What the learner sees: one line per test, then the points."""
    lines = [f"Visible tests of {report.notebook.name} (on {report.device}):"]
    width = max([len(t.grade_id) for t in report.tests] + [4])
    for test in report.tests:
        mark = MARKS.get(test.outcome, "FAIL")
        points = (f"{test.score:g}/{test.max_score:g}" if test.counts
                  else f"-/{test.max_score:g}")
        first = test.output.splitlines()[0] if test.output else ""
        lines.append(f"  {mark}  {test.grade_id.ljust(width)}  {points:>7}  {first}".rstrip())
    for gid in report.edited:
        lines.append(f"  note: you edited test cell {gid!r}; grading runs the original test")
    if report.problem:
        lines.append(f"  stopped: {report.problem}")
    lines.append(f"{report.score:g} of {report.max_score:g} points from the visible tests, "
                 f"in {report.seconds:.1f} s. Hidden tests run when your work is graded.")
    return "\n".join(lines)
