"""Judge each test cell of an executed notebook on its own: passed, failed or skipped.

The evidence for a test is what its own cell did, as recorded in the executed notebook
(:mod:`autograder.pipeline.execute` runs every cell even after errors):

* an ``error`` output means the test failed; its exception name and message (the
  failing assertion's text) are the feedback, plus the failing line for tests the
  learner could see anyway -- never a line of a hidden test;
* no error, and the kernel's answer to the cell says it ran to its end (its
  ``execute_reply`` status ``ok``, recorded by :mod:`.execute`), means it passed: a test
  passes on that positive evidence, never because an error could not be reported; output
  on stderr (warnings, progress) is *not* a failure, unlike nbgrader, which fails any
  test cell that wrote to stderr;
* a test split at ``### CHECKS`` (see :mod:`.checks`) passes only if its probe ran
  without error, reported its values exactly once, and the trusted checks passed on
  them; what the kernel printed or displayed otherwise decides nothing;
* a test cell whose value is a number between 0 and its points earns that number
  (nbgrader's partial-credit convention);
* a test cell that never ran (the notebook was stopped first) failed, and says why;
* a GPU-only test on a CPU run is skipped: no points either way, and not in the
  maximum.

:func:`judge` is a pure function of the executed notebook and the test list from
:mod:`autograder.pipeline.rebuild`, so the evidence can come from elsewhere later (say, tests
run in a separate checker process) without changing what a verdict means.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Tuple

import nbformat

from autograder.pipeline.checks import CheckOutcome, evidence_of
from autograder.protocol import TIMEOUT_ENAME, reply_status
from autograder.pipeline.rebuild import ManualCell, TestCell
from autograder.pipeline.speed import points_for

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
ARROW = re.compile(r"^\s*-*>\s*\d+\s(.*)$")  # IPython's "----> 3 assert x == 1"
# A number, bare or as NumPy shows its scalars: 1.5, np.float64(1.5)
NUMBER = re.compile(r"^(?:np\.\w+\(|numpy\.\w+\()?\s*"
                    r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*\)?$")
MAX_OUTPUT = 2000

PASSED, PARTIAL, FAILED, NOT_RUN, SKIPPED, MANUAL, HIDDEN_ONLY = (
    "passed", "partial", "failed", "not-run", "skipped", "manual", "hidden-only")


@dataclass(frozen=True)
class TestResult:
    """The verdict on one test cell (or one manually graded cell)."""
    __test__ = False  # not a pytest test class
    grade_id: str
    max_score: float
    score: float
    outcome: str       # passed, partial, failed, not-run, skipped, manual or hidden-only
    output: str        # feedback for the learner (no hidden test source)
    hidden: bool = False
    speed: Optional[dict] = None  # a speed test's measurement (see .timing), for the record

    @property
    def counts(self) -> bool:
        """Whether this test is part of the score and the maximum of this run."""
        return self.outcome not in (SKIPPED, MANUAL, HIDDEN_ONLY)

    @property
    def visibility(self) -> str:
        """Gradescope's visibility: results of hidden tests appear once grades are out, but
        a speed test's measurement is for the learner to see now (it shows no test code)."""
        return "after_published" if self.hidden and self.speed is None else "visible"


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else (value or "")


def _clip(text: str, limit: int = MAX_OUTPUT) -> str:
    text = ANSI.sub("", text).strip()
    return text if len(text) <= limit else text[: limit - 15].rstrip() + "\n[... clipped]"


def describe_error(error: dict, hidden: bool) -> str:
    """``AssertionError: message``, plus the failing line of a visible test."""
    ename = error.get("ename", "Error")
    evalue = ANSI.sub("", _text(error.get("evalue"))).strip()
    if ename == TIMEOUT_ENAME:
        return f"Timed out: {evalue}" if evalue else "Timed out"
    summary = f"{ename}: {evalue}" if evalue else ename
    if hidden:
        return summary
    # The first arrowed line of the traceback is in the test cell itself.
    for frame in error.get("traceback", []):
        for line in ANSI.sub("", frame).splitlines():
            match = ARROW.match(line)
            if match:
                return f"{summary}\n  in the test line: {match.group(1).strip()}"
    return summary


def partial_credit(outputs: Iterable[dict], max_score: float) -> Optional[float]:
    """The points a test cell's value awards, if it is a number in [0, max_score]."""
    for output in outputs:
        if output.get("output_type") != "execute_result":
            continue
        match = NUMBER.match(_text(output.get("data", {}).get("text/plain")).strip())
        if match:
            value = float(match.group(1))
            if 0 <= value <= max_score:
                return value
    return None


def _stdout(outputs: Iterable[dict]) -> str:
    return "".join(_text(o.get("text")) for o in outputs
                   if o.get("output_type") == "stream" and o.get("name") == "stdout")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


def _calls(timed: dict) -> str:
    """The calls per round, as the feedback says them."""
    mine, theirs = timed["calls"], timed.get("baseline_calls", timed["calls"])
    if mine == theirs:
        return f"{mine} call(s) each"
    return f"{mine} call(s) of yours and {theirs} of the baseline"


def _clock_words(timed: dict) -> str:
    """What the times are, as the feedback says it."""
    what = ("CPU time, each kernel's processes counted together" if timed.get("clock") == "cpu"
            else "wall-clock time")
    cpus = timed.get("cpus")
    if cpus:
        what += f", on CPU {', '.join(map(str, cpus))} kept for the two timed kernels"
    return what


def speed_verdict(test: TestCell, timed: Optional[dict]) -> Tuple[float, str, str]:
    """(points, outcome, feedback) of a speed test whose cell ran, from what was timed."""
    if not timed:
        return 0.0, FAILED, "Failed: the speed test was not timed."
    if timed.get("setup"):
        return 0.0, FAILED, f"Not timed: the grader could not run the speed test ({timed['setup']})."
    if timed.get("problem"):
        return 0.0, FAILED, f"No speed points: {timed['problem']}."
    device = timed["device"]
    low, high = test.speed.points[device]
    speedup = timed["speedup"]
    earned = points_for(speedup, (low, high), test.points, test.speed.step)
    lines = [f"{speedup:.2f} times as fast as the baseline on the {device.upper()} "
             f"(95 % interval {timed['low']:.2f} to {timed['high']:.2f}, "
             f"{timed['rounds']} rounds of {_calls(timed)}): "
             f"{_ms(timed['candidate_seconds'])} per call, the baseline "
             f"{_ms(timed['baseline_seconds'])} (medians of {_clock_words(timed)}).",
             f"Points: none at {low:g} times or less, all {test.points:g} at {high:g} times "
             f"or more; {earned:g} here."]
    if not timed.get("verified"):
        lines.append("This machine could not keep the kernel still between timed calls or "
                     "count its CPU time, so the timing is not a grade here: no points.")
        earned = 0.0
    outcome = PASSED if earned >= test.points else (PARTIAL if earned > 0 else FAILED)
    return earned, outcome, "\n".join(lines)


def judge_test(cell: Optional[dict], test: TestCell, stopped: str = "",
               checked: Optional[CheckOutcome] = None,
               timed: Optional[dict] = None) -> TestResult:
    """The verdict on one test from its executed cell (``None`` if the cell is absent)
    and, for a test split into probe and checks, the outcome of its trusted checks; for a
    speed test, what the grader timed."""
    def result(score: float, outcome: str, output: str) -> TestResult:
        return TestResult(test.grade_id, test.points, round(score, 6), outcome,
                          _clip(output), test.hidden, timed if test.speed else None)

    if test.skipped:
        return result(0.0, SKIPPED,
                      "Skipped: this test needs a CUDA GPU and this run used the CPU, so its "
                      "points are not at stake.")
    if cell is None:
        return result(0.0, NOT_RUN, "Not run: the test cell is missing from the executed notebook.")
    outputs = cell.get("outputs", [])
    error = next((o for o in outputs if o.get("output_type") == "error"), None)
    if error is not None:
        return result(0.0, FAILED, describe_error(error, test.hidden))
    ran = cell.get("execution_count") is not None or not _text(cell.get("source")).strip()
    if not ran:
        why = stopped or "the notebook stopped before this cell"
        return result(0.0, NOT_RUN, f"Not run: {why}.")
    if _text(cell.get("source")).strip() and reply_status(cell) != "ok":
        return result(0.0, FAILED, "Failed: the kernel never confirmed that this test ran to "
                      f"its end (its answer: {reply_status(cell) or 'none'}).")
    shown = "" if test.hidden else _stdout(outputs)
    if test.speed is not None:
        return result(*speed_verdict(test, timed))
    if test.checks is not None:
        reports, problem = evidence_of(cell)
        if problem or not reports:
            return result(0.0, FAILED, f"Failed: {problem or 'the test did not report its results'}.")
        if checked is None:
            return result(0.0, FAILED, "Failed: the test's checks were not run.")
        if not checked.passed:
            return result(0.0, FAILED, describe_error(
                {"ename": checked.message.split(":")[0],
                 "evalue": checked.message.partition(": ")[2]}, hidden=True))
        shown = "" if test.hidden else (shown + checked.printed)
        credit = checked.credit if checked.credit is not None and \
            0 <= checked.credit <= test.points else None
    else:
        credit = partial_credit(outputs, test.points)
    if credit is not None and credit < test.points:
        return result(credit, PARTIAL, f"Partial credit: {credit:g} of {test.points:g} points."
                      + (f"\n{shown}" if shown else ""))
    return result(test.points, PASSED, shown)


def judge(executed: nbformat.NotebookNode, tests: List[TestCell],
          manual: Iterable[ManualCell] = (), stopped: str = "",
          checked: Optional[Dict[str, CheckOutcome]] = None,
          timed: Optional[Dict[str, dict]] = None) -> List[TestResult]:
    """Verdicts for every test of ``tests`` (in order), then one per manually graded cell.

    ``stopped`` says why the run ended early, if it did; it explains tests not run.
    ``checked`` holds the outcomes of the trusted checks, by grade id; ``timed`` what the
    speed tests measured, by cell id.
    """
    by_id: Dict[str, dict] = {cell.get("id"): cell for cell in executed.cells}
    checked, timed = checked or {}, timed or {}
    results = [judge_test(by_id.get(test.cell_id), test, stopped, checked.get(test.grade_id),
                          timed.get(test.cell_id))
               for test in tests]
    for cell in manual:
        note = ("Graded by a person." if cell.answered
                else "Not answered: the cell still holds the given text.")
        results.append(TestResult(cell.grade_id, cell.points, 0.0, MANUAL, note))
    return results
