"""``python -m autograder check NOTEBOOK``: a learner runs the visible tests on their work.

The one grading pipeline (:func:`autograder.pipeline.grade.grade_submission`: rebuild, a sandboxed
kernel of its own, the trusted checks in a process of their own, judge) on one notebook,
with the quick profile by default, so that it answers in seconds and every visible test
counts exactly as it will when the work is graded. The tests come from the released
notebook when ``--source`` names it, else from the notebook itself; in that case a test
cell the learner edited is still run as edited, but flagged: nbgrader's checksum in its
metadata no longer matches, and grading will use the original. Hidden tests are not in a
learner's notebook at all, so a passing check is necessary, not sufficient.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

from autograder.pipeline.checks import parse
from autograder.pipeline.grade import grade_submission
from autograder.pipeline.result import GRADED
from autograder.runners.local import LocalRunner
from autograder.pipeline.judge import HIDDEN_ONLY, MANUAL, PARTIAL, PASSED, SKIPPED, TestResult
from autograder.layout import SourceNotebook, Submission, read_submission
from autograder.options import CHECK_PROFILE, GradeOptions
from autograder.pipeline.rebuild import grade_id_of, is_test


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
        return bool(parse(source).body)
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


def check(notebook: Path, source: Optional[Path] = None,
          options: GradeOptions = GradeOptions(profile=CHECK_PROFILE),
          runner: Optional[LocalRunner] = None) -> CheckReport:
    """Run the visible tests of ``notebook`` through the grading pipeline.

    ``ValueError`` when the file is not a notebook. ``runner`` (a
    :class:`~autograder.pipeline.grade.LocalRunner`; without one, one of its own of
    ``options.kernel``'s kind) resolves ``auto`` in ``options`` as ``grade``'s runners do,
    and its spawner runs the notebook.
    """
    notebook = Path(notebook).resolve()
    if runner is None:
        with LocalRunner(1, options.kernel, [Path(source) if source else notebook]) as own:
            return check(notebook, source, options, own)
    learner = read_submission(notebook)
    reference = SourceNotebook.read_released(Path(source) if source else notebook)
    edited = [] if source else edited_tests(learner)
    submission = Submission(student_id="you", assignment=notebook.parent.name,
                            notebook=notebook.stem, path=notebook)
    options = runner.resolve(options)
    result = grade_submission(submission, reference, options, runner.spawner)
    # A released test cell with no code left held only hidden tests: nothing to check here.
    visible = {grade_id_of(cell): cell.source
               for cell in reference.notebook.cells if is_test(cell)}
    tests = [TestResult(t.grade_id, t.max_score, 0.0, HIDDEN_ONLY,
                        "Hidden tests only: they run when your work is graded.")
             if t.outcome != MANUAL and t.grade_id in visible
             and not has_code(visible[t.grade_id]) else t
             for t in result.tests]
    return CheckReport(notebook=notebook, tests=tests, seconds=result.seconds,
                       device=options.device,
                       problem="" if result.status == GRADED else result.message,
                       edited=edited)


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
