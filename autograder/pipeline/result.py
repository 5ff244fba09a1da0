"""What grading one notebook gives: a :class:`SubmissionResult`, and how it reads.

The statuses and the timed phases of :func:`autograder.pipeline.grade.grade_submission`,
the result object every runner returns (reports and the gradebook are written from it), the
one-line summary a result carries and the executed notebook as instructors and feedback see
it (:func:`for_the_record`: no hidden test, no probe's report).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Optional

import nbformat

from autograder.layout import Submission, plural
from autograder.options import CPU
from autograder.pipeline.judge import MANUAL, NOT_RUN, PARTIAL, PASSED, SKIPPED, TestResult
from autograder.protocol import EVIDENCE_MIME, TIMEOUT_ENAME

if TYPE_CHECKING:  # types only: a result is read without the execution stack
    from autograder.pipeline.execute import Execution
    from autograder.pipeline.rebuild import TestCell

GRADED, TIMEOUT, ERROR, INVALID = "graded", "timeout", "error", "invalid"
STATUSES = (GRADED, TIMEOUT, ERROR, INVALID)


# The steps of grade_submission whose seconds a result keeps (``SubmissionResult.phases``),
# in order; together they are all of its ``seconds`` but for a few milliseconds between.
READ, PREPARE, KERNEL_START, CELLS, CHECKS, JUDGE = (
    "read and rebuild", "working directory", "kernel start", "cells", "trusted checks", "judge")
PHASES = (READ, PREPARE, KERNEL_START, CELLS, CHECKS, JUDGE)


@dataclass
class SubmissionResult:
    """Everything known about one graded (or ungradable) submission."""
    submission: Submission
    status: str                      # graded, timeout, error or invalid
    message: str                     # one line: why, and what happened
    tests: List[TestResult] = field(default_factory=list)
    seconds: float = 0.0
    device: str = CPU
    executed: Optional[nbformat.NotebookNode] = None
    answered: Dict[str, bool] = field(default_factory=dict)
    peak_memory: int = 0             # bytes, the kernel's largest resident memory
    peak_processes: int = 0          # its most processes and threads at once (0: unknown)
    phases: Dict[str, float] = field(default_factory=dict)  # seconds of each PHASES step run

    @property
    def score(self) -> float:
        return round(sum(t.score for t in self.tests if t.counts), 6)

    @property
    def max_score(self) -> float:
        """Points at stake in this run (skipped GPU tests and manual cells excluded)."""
        return round(sum(t.max_score for t in self.tests if t.counts), 6)

    def count(self, *outcomes: str) -> int:
        return sum(t.outcome in outcomes for t in self.tests)


def for_the_record(executed: nbformat.NotebookNode, tests: List[TestCell],
                   results: List[TestResult]) -> nbformat.NotebookNode:
    """The executed notebook as instructors and feedback see it: test cells show what
    learners were shown of them, never hidden tests or the probes' reports."""
    verdicts = {r.grade_id: r for r in results}
    by_id = {t.cell_id: t for t in tests}
    for cell in executed.cells:
        test = by_id.get(cell.get("id"))
        if test is None:
            continue
        cell.source = test.visible_source.rstrip() + (
            "\n# (hidden tests, not shown: their results are in the feedback)"
            if test.hidden else "")
        cell.outputs = [o for o in cell.get("outputs", [])
                        if EVIDENCE_MIME not in o.get("data", {})]
        if test.hidden:  # a traceback would quote the hidden lines: keep only the error
            for output in cell.outputs:
                if output.get("output_type") == "error":
                    output["traceback"] = [f"{output.get('ename')}: {output.get('evalue')}"]
        verdict = verdicts.get(test.grade_id)
        if verdict is not None and test.checks is not None and verdict.output \
                and not any(o.get("output_type") == "error" for o in cell.outputs):
            cell.outputs.append(nbformat.v4.new_output(
                "stream", name="stdout", text=f"[{verdict.outcome}] {verdict.output}\n"))
    return executed


def timed_out_cells(nb: nbformat.NotebookNode) -> int:
    return sum(any(o.get("output_type") == "error" and o.get("ename") == TIMEOUT_ENAME
                   for o in cell.get("outputs", []))
               for cell in nb.cells if cell.get("cell_type") == "code")


def _points(value: float) -> str:
    return f"{value:g} point" + ("" if value == 1 else "s")


def summary(result: SubmissionResult, execution: Optional[Execution], notes: List[str]) -> str:
    parts = []
    if execution is not None and not execution.completed:
        parts.append(execution.message)
    elif execution is not None and timed_out_cells(execution.notebook):
        late = timed_out_cells(execution.notebook)
        parts.append(f"{plural(late, 'cell')} ran past the per-cell time limit and "
                     + ("was" if late == 1 else "were") + " interrupted"
                     + (f"; no points depended on {'it' if late == 1 else 'them'}"
                        if result.status == GRADED else ""))
    autograded = [t for t in result.tests if t.counts]
    passed = result.count(PASSED)
    parts.append(f"{result.score:g}/{result.max_score:g} points, {passed} of {len(autograded)} "
                 "tests passed")
    if result.count(PARTIAL):
        parts.append(f"{result.count(PARTIAL)} with partial credit")
    if result.count(NOT_RUN):
        parts.append(f"{result.count(NOT_RUN)} not run")
    skipped = [t for t in result.tests if t.outcome == SKIPPED]
    if skipped:
        parts.append(f"{plural(len(skipped), 'GPU-only test')} worth "
                     f"{_points(sum(t.max_score for t in skipped))} skipped on the CPU")
    manual = [t for t in result.tests if t.outcome == MANUAL]
    if manual:
        parts.append(f"{_points(sum(t.max_score for t in manual))} left to grade by hand")
    parts.extend(notes)
    return "; ".join(parts)

