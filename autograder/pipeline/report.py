"""Write what grading found: grades.csv, Gradescope results, executed notebooks, a summary.

* ``OUT/grades.csv``: one row per student and notebook (columns :data:`CSV_COLUMNS`);
* ``OUT/<student>/<assignment>/<notebook>.results.json``: Gradescope's autograder
  format (``score``, ``tests[]`` with ``name``, ``score``, ``max_score``, ``status``,
  ``output``, ``visibility``);
* ``OUT/<student>/<assignment>/<notebook>.ipynb``: the notebook as executed (the layout
  of nbgrader's ``autograded/`` folder, so ``nbgrader generate_feedback`` can read it).

The executed notebooks and the JSON results of hidden tests are for instructors: OUT
is never inside a learner's working directory.
"""
from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path
from typing import Iterable, List, Sequence

import nbformat

from autograder.pipeline.result import STATUSES, SubmissionResult
from autograder.pipeline.judge import FAILED, NOT_RUN, PARTIAL, PASSED, SKIPPED
from autograder.pipeline.speed import ranked_speedup

CSV_COLUMNS = ("student_id", "assignment", "notebook", "score", "max_score", "status",
               "message", "tests_passed", "tests_failed", "tests_skipped", "skipped_points",
               "seconds", "device")


FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def cell_text(value: str) -> str:
    """A CSV cell no spreadsheet evaluates: text that starts like a formula gets a leading
    apostrophe (OWASP's advice against CSV injection), e.g. a student folder named ``=1+1``."""
    return "'" + value if value.startswith(FORMULA_STARTS) else value


def csv_row(result: SubmissionResult) -> dict:
    sub = result.submission
    return {
        "student_id": cell_text(sub.student_id), "assignment": cell_text(sub.assignment),
        "notebook": cell_text(sub.notebook),
        "score": f"{result.score:g}", "max_score": f"{result.max_score:g}",
        "status": result.status, "message": cell_text(" ".join(result.message.split())),
        "tests_passed": result.count(PASSED),
        "tests_failed": result.count(FAILED, PARTIAL, NOT_RUN),
        "tests_skipped": result.count(SKIPPED),
        "skipped_points": f"{sum(t.max_score for t in result.tests if t.outcome == SKIPPED):g}",
        "seconds": f"{result.seconds:.2f}", "device": result.device,
    }


def _key(row: dict) -> tuple:
    return row.get("student_id", ""), row.get("assignment", ""), row.get("notebook", "")


def write_grades_csv(results: Iterable[SubmissionResult], path: Path) -> Path:
    """Write ``grades.csv`` (sorted by student, assignment, notebook).

    Rows already in the file for other notebooks stay, as they do in the gradebook: one
    OUT folder can hold every assignment of a course, graded one run at a time. A row for
    a notebook graded again is replaced.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = {_key(row): row for row in (csv_row(r) for r in results)}
    if path.is_file():
        with path.open(newline="") as handle:
            earlier = [row for row in csv.DictReader(handle) if _key(row) not in rows]
        rows.update((_key(row), {c: row.get(c, "") for c in CSV_COLUMNS}) for row in earlier)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        writer.writerows(row for _, row in sorted(rows.items()))
    return path


def gradescope(result: SubmissionResult) -> dict:
    """The result in Gradescope's ``results.json`` format."""
    tests = []
    for number, test in enumerate(result.tests, start=1):
        entry = {"name": test.grade_id, "number": str(number), "score": test.score,
                 "max_score": test.max_score if test.counts else 0.0,
                 "output": test.output, "visibility": test.visibility,
                 "extra_data": {"outcome": test.outcome, "points": test.max_score}}
        if test.counts:
            entry["status"] = "passed" if test.score >= test.max_score else "failed"
        if test.speed is not None:
            entry["extra_data"]["speed"] = test.speed
        tests.append(entry)
    sub = result.submission
    board = leaderboard(result)
    return {**({"leaderboard": board} if board else {}),
        "score": result.score,
        "execution_time": max(1, round(result.seconds)),
        "output": f"{result.status}: {result.message}",
        "tests": tests,
        "extra_data": {"student_id": sub.student_id, "assignment": sub.assignment,
                       "notebook": sub.notebook, "status": result.status,
                       "max_score": result.max_score, "device": result.device,
                       "seconds": result.seconds,
                       "seconds_by_phase": result.phases,
                       "peak_memory_mib": round(result.peak_memory / 2**20),
                       "peak_processes": result.peak_processes},
    }


def leaderboard(result: SubmissionResult) -> List[dict]:
    """Gradescope's leaderboard entries: each speed test's measured speedup (higher is
    better), on the device it ran on; none for a speedup the machine could not verify."""
    return [{"name": f"{test.grade_id} speedup ({test.speed['device']})",
             "value": round(ranked_speedup(test.speed), 3), "order": "desc"}
            for test in result.tests if ranked_speedup(test.speed) is not None]


def submission_dir(out: Path, result: SubmissionResult) -> Path:
    sub = result.submission
    return Path(out) / sub.student_id / sub.assignment


def write_submission(result: SubmissionResult, out: Path) -> List[Path]:
    """Write the submission's ``.results.json`` and, if it ran, its executed notebook."""
    folder = submission_dir(out, result)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    results_json = folder / f"{result.submission.notebook}.results.json"
    results_json.write_text(json.dumps(gradescope(result), indent=2) + "\n")
    written.append(results_json)
    if result.executed is not None:
        executed = folder / f"{result.submission.notebook}.ipynb"
        nbformat.write(result.executed, str(executed))
        written.append(executed)
    return written


def status_counts(results: Iterable[SubmissionResult]) -> Counter:
    counts = Counter({status: 0 for status in STATUSES})
    counts.update(r.status for r in results)
    return counts


def _table(header: Sequence[str], rows: List[Sequence[str]]) -> str:
    widths = [max(len(str(x)) for x in column) for column in zip(header, *rows)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()
    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def summary(results: Sequence[SubmissionResult], seconds: float, jobs: int,
            max_rows: int = 60) -> str:
    """The table printed at the end: every submission (or the ones that need a look)."""
    counts = status_counts(results)
    shown = list(results)
    title = "Grades"
    if len(shown) > max_rows:
        shown = [r for r in results if r.status != "graded"][:max_rows]
        title = f"Submissions that need a look ({len(shown)} shown)"
    rows = [(r.submission.student_id, r.submission.notebook, f"{r.score:g}/{r.max_score:g}",
             r.status, f"{r.seconds:.1f}", (r.message[:70] + "...") if len(r.message) > 73
             else r.message) for r in shown]
    parts = []
    if rows:
        parts += [title, _table(("student", "notebook", "score", "status", "sec", "message"),
                                rows), ""]
    rate = len(results) / seconds if seconds > 0 else 0.0
    parts.append(f"{len(results)} submission(s) in {seconds:.1f} s ({rate:.2f}/s, {jobs} job(s)): "
                 + ", ".join(f"{counts[s]} {s}" for s in STATUSES))
    return "\n".join(parts)
