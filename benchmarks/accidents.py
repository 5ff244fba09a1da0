"""Honest accidents and tampering (coursebook/accidents.py): this course's grader next to nbgrader's.

For each assignment, every case of ``coursebook.accidents.ACCIDENTS`` is handed in by a student of
its own in a scratch copy of the course, then graded twice, in one run:

    nbgrader autograde ASSIGNMENT --student CASE --force --Execute.timeout=20
        (once per case: a case that makes nbgrader abort takes only itself)
    python -m autograder grade submitted --assignment ASSIGNMENT --out graded --gradebook \
        --cell-timeout 20

It prints, per case and assignment, what each grader gave (score out of the maximum, or how
it failed) and the wall times; a case nbgrader aborted on is marked ``aborted``. A whole
class graded with one ``nbgrader autograde ASSIGNMENT`` stops at the first such case.

    .venv/bin/python benchmarks/accidents.py [--assignment data_parallel ...] [--case colab ...]
"""
from __future__ import annotations

import argparse
import csv
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from coursebook.accidents import ACCIDENTS, CELL_TIMEOUT, write  # noqa: E402
from coursebook.cases import ASSIGNMENTS  # noqa: E402


def env() -> dict:
    found = dict(os.environ)  # nbgrader runs `alembic` from PATH
    found["PATH"] = str(Path(sys.executable).parent) + os.pathsep + found.get("PATH", "")
    found["PYTHONPATH"] = str(ROOT)
    return found


def command(args: list, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=env(),
                          capture_output=True, text=True)


def nbgrader_scores(course: Path, assignment: str) -> dict:
    """student -> (score, max score) from nbgrader's gradebook."""
    from nbgrader.api import Gradebook
    found = {}
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        for submission in gradebook.assignment_submissions(assignment):
            found[submission.student.id] = (submission.score, submission.max_score)
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--assignment", action="append", choices=sorted(ASSIGNMENTS))
    parser.add_argument("--case", action="append", choices=[a.name for a in ACCIDENTS],
                        help="only these cases (and the solved and blank ones)")
    args = parser.parse_args(argv)
    assignments = args.assignment or sorted(ASSIGNMENTS)
    chosen = set(args.case or [a.name for a in ACCIDENTS]) | {"solved", "blank"}
    accidents = [a for a in ACCIDENTS if a.name in chosen]
    base = Path(tempfile.mkdtemp(prefix="accidents-"))
    try:
        course = base / "course"
        course.mkdir()
        shutil.copy(ROOT / "nbgrader_config.py", course)
        shutil.copytree(ROOT / "solutions", course / "solutions")
        done = command(["nbgrader", "generate_assignment", "*", "--force"], course)
        if done.returncode:
            sys.exit(done.stderr[-3000:])
        rows, times = [], {"nbgrader autograde": 0.0, "python -m autograder": 0.0}
        for assignment in assignments:
            notebook = ASSIGNMENTS[assignment]
            for accident in accidents:
                write(accident, assignment,
                      course / "submitted" / accident.name / assignment / f"{notebook}.ipynb")
            aborted = {}
            start = time.perf_counter()
            for accident in accidents:
                done = command(["nbgrader", "autograde", assignment, "--student", accident.name,
                                "--force", f"--Execute.timeout={CELL_TIMEOUT}"], course)
                if done.returncode:
                    last = [line for line in done.stderr.splitlines() if line.strip()]
                    aborted[accident.name] = last[-1][:90] if last else f"exit {done.returncode}"
            times["nbgrader autograde"] += time.perf_counter() - start
            theirs = nbgrader_scores(course, assignment)
            start = time.perf_counter()
            done = command(["autograder", "grade", "submitted", "--assignment", assignment,
                            "--out", "graded", "--device", "cpu", "--no-progress",
                            "--cell-timeout", str(CELL_TIMEOUT),
                            "--gradebook", f"sqlite:///{base / 'autograder.db'}"], course)
            times["python -m autograder"] += time.perf_counter() - start
            if done.returncode:
                sys.exit(done.stderr[-3000:])
            with (course / "graded" / "grades.csv").open() as handle:
                ours = {row["student_id"]: row for row in csv.DictReader(handle)
                        if row["assignment"] == assignment and row["notebook"] == notebook}
            for accident in accidents:
                if accident.name in aborted:
                    nb = "aborted"
                elif accident.name in theirs:
                    nb = "{:g}/{:g}".format(*theirs[accident.name])
                else:
                    nb = "no row"
                row = ours[accident.name]
                rows.append((assignment, accident.name, nb,
                             f"{row['score']}/{row['max_score']} {row['status']}"))
        print(f"{'assignment':<15} {'case':<28} {'nbgrader autograde':<20} python -m autograder")
        for assignment, name, nb, ag in rows:
            print(f"{assignment:<15} {name:<28} {nb:<20} {ag}")
        print()
        for name, seconds in times.items():
            print(f"{name}: {seconds:.1f} s in all")
        print(f"nbgrader aborted on {sum(r[2] == 'aborted' for r in rows)} of {len(rows)} cases "
              f"(one case per run, so each abort took only itself)")
        return 0
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
