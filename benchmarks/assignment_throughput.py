"""Grading throughput per assignment: N copies of each assignment's reference answers, graded.

For every assignment (the manifest's, ``assignments/assignments.toml``) the script hands in ``--copies`` copies of
the release with the reference answers typed in, as a learner who solved it would, in a scratch
course folder (``submitted/<student>/<assignment>/<notebook>.ipynb``), and grades them with the
course's grader as guide/grader.md writes it, ``--jobs`` at a time:

    python -m autograder grade submitted --assignment ASSIGNMENT --out graded --jobs J

It prints one row per assignment: the copies, the grader's wall time (start to exit, its
start-up included), seconds per submission (wall time / copies), the median time one
submission took inside the grader (``seconds`` in grades.csv), how many copies got full marks,
and how many different ``TEST_SEED`` values they were graded with.

The copies are not identical files: each carries its student id in a comment at the end of
its first answer cell. ``TEST_SEED`` is an HMAC of the submitted file, so identical copies
would all be graded on the same random inputs; with the comment each copy draws its own, as a
class of real submissions does, and a full row also says the hidden tests pass on that many
different inputs.

The exit code is 1, with the offending rows listed, when any copy lacks full marks or a row.

    .venv/bin/python benchmarks/assignment_throughput.py                  # 1000 copies each
    .venv/bin/python benchmarks/assignment_throughput.py --copies 50 --assignment data_parallel
"""
from __future__ import annotations

import argparse
import copy
import csv
import os
import platform
import shutil
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # the sibling benchmark and the tests' helpers

from grading_throughput import (ROOT, add_keep_option, answer_cells, cpu_name,  # noqa: E402
                                 report_problems, run, scratch_folder)
from coursebook.cases import ASSIGNMENTS, submission  # noqa: E402


def reference_submission(assignment: str):
    """The release (exercises/) with the reference answers (solutions/) typed into its cells,
    as the tests hand it in (coursebook/cases.py)."""
    return submission(assignment, {})


def student(n: int) -> str:
    return f"s{n:04d}"


def hand_in(course: Path, assignment: str, notebook: str, copies: int) -> list:
    """Write ``copies`` submissions, each signed with its student id; return the ids."""
    import nbformat
    reference = reference_submission(assignment)
    students = [student(n + 1) for n in range(copies)]
    for who in students:
        nb = copy.deepcopy(reference)
        first = next(iter(answer_cells(nb).values()))
        first.source = f"{first.source}\n# handed in by {who}"  # its own bytes: its own seed
        folder = course / "submitted" / who / assignment
        folder.mkdir(parents=True)
        nbformat.write(nb, folder / f"{notebook}.ipynb")
    return students


def make_course(base: Path, names: dict) -> Path:
    """A scratch course folder: the nbgrader config and the instructor's notebooks."""
    course = base / "course"
    (course / "solutions").mkdir(parents=True)
    shutil.copy(ROOT / "nbgrader_config.py", course / "nbgrader_config.py")
    for assignment in names:
        shutil.copytree(ROOT / "solutions" / assignment, course / "solutions" / assignment)
    return course


def seeds(course: Path, assignment: str, notebook: str, students: list) -> int | None:
    """How many different TEST_SEEDs the grader gives these submissions (None: not known)."""
    try:
        from autograder.pipeline.grade import test_seed
        from autograder.layout import Course
        source = Course.discover(course).source_notebooks(assignment)[notebook]
    except (ImportError, AttributeError, KeyError, TypeError):
        return None
    return len({test_seed(source, (course / "submitted" / who / assignment
                                   / f"{notebook}.ipynb").read_bytes()) for who in students})


@dataclass
class Row:
    assignment: str
    copies: int
    wall: float           # seconds, the grade command from start to exit
    inside: float | None  # median seconds per submission in grades.csv
    full: int             # copies with full marks
    seeds: int | None     # different TEST_SEEDs among the copies

    @property
    def per_submission(self) -> float:
        return self.wall / self.copies


def verdicts(path: Path, students: list) -> tuple:
    """(copies with full marks, median seconds, problems) from the grader's grades.csv."""
    with path.open() as handle:
        rows = {row["student_id"]: row for row in csv.DictReader(handle)}
    problems, full, seconds = [], 0, []
    for who in students:
        row = rows.get(who)
        if row is None:
            problems.append(f"{who}: no row in {path.name}")
            continue
        if row.get("seconds"):
            seconds.append(float(row["seconds"]))
        if row["status"] == "graded" and float(row["score"]) == float(row["max_score"]) > 0:
            full += 1
        else:
            problems.append(f"{who}: {row['score']}/{row['max_score']} ({row['status']}): "
                            f"{row['message']}")
    return full, (statistics.median(seconds) if seconds else None), problems


def table(rows: list) -> str:
    """The printed table, one line per assignment."""
    header = (f"{'assignment':<20} {'copies':>7} {'wall s':>9} {'s/subm.':>8} "
              f"{'median s in grader':>19} {'full marks':>12} {'TEST_SEEDs':>11}")
    lines = [header, "-" * len(header)]
    for row in rows:
        inside = "?" if row.inside is None else f"{row.inside:.2f}"
        seeds_ = "?" if row.seeds is None else str(row.seeds)
        lines.append(f"{row.assignment:<20} {row.copies:>7} {row.wall:>9.1f} "
                     f"{row.per_submission:>8.3f} {inside:>19} "
                     f"{f'{row.full}/{row.copies}':>12} {seeds_:>11}")
    return "\n".join(lines)


def main(argv=None) -> int:
    names = dict(ASSIGNMENTS)  # assignment -> its notebook's name
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--copies", type=int, default=1000,
                        help="submissions per assignment (default 1000)")
    parser.add_argument("--jobs", type=int, default=cores,
                        help=f"the grader's --jobs (default: the cores, {cores} here)")
    parser.add_argument("--assignment", action="append", choices=sorted(names), default=None,
                        help="only this assignment (repeat for several; default: all)")
    add_keep_option(parser)
    args = parser.parse_args(argv)
    if args.copies < 1 or args.jobs < 1:
        parser.error("--copies and --jobs must be at least 1")
    chosen = {name: names[name] for name in (args.assignment or names)}
    with scratch_folder(args.keep, "assignment-throughput-") as base:
        course = make_course(base, chosen)
        print(f"{args.copies} copies of each assignment's reference answers, each signed with its "
              f"student id; {args.jobs} job(s) on {cores} cores ({cpu_name()}), "
              f"Python {platform.python_version()}", flush=True)
        # Warm the file cache, so the first assignment does not pay for everyone's imports.
        run([sys.executable, "-c", "import torch, nbformat, papermill"], course, "warm-up")
        rows, problems = [], []
        for assignment, notebook in chosen.items():
            students = hand_in(course, assignment, notebook, args.copies)
            out = course / f"graded-{assignment}"
            wall = run([sys.executable, "-m", "autograder", "grade", "submitted",
                        "--assignment", assignment, "--out", str(out), "--jobs", str(args.jobs),
                        "--no-progress"], course, f"grading {assignment}")
            full, inside, wrong = verdicts(out / "grades.csv", students)
            rows.append(Row(assignment, args.copies, wall, inside, full,
                            seeds(course, assignment, notebook, students)))
            problems += [f"{assignment} {line}" for line in wrong]
            print(f"{assignment}: {wall:.1f} s, {full}/{args.copies} with full marks", flush=True)
        print()
        print(table(rows))
        return report_problems(problems, "copies without full marks (the reference answers "
                                         "should get them every time)")


if __name__ == "__main__":
    sys.exit(main())
