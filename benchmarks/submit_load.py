"""Load on the submission service: N learners hand in one assignment within a minute.

The script builds a scratch copy of the course (the instructor's notebooks of one assignment,
``roster.toml`` with ``--learners`` learners and one instructor), issues everyone's token with
``python -m autograder serve --issue-tokens``, starts the real service on loopback
(``python -m autograder serve --port 0 --jobs J``) and hands in from one thread per learner, with
the functions ``python -m autograder submit`` uses (``upload`` and ``wait``, autograder/commands/submit.py),
the uploads spread at random over ``--spread`` seconds. The mix is that of a class: most hand in
the reference answers (each signed with its student id, as benchmarks/assignment_throughput.py
does, so each draws its own ``TEST_SEED``), some a wrong answer of tests/wrong_submissions, some
a broken file (text that is not JSON, or a notebook cut in half, as a save cut
short leaves it; an empty file is refused at the upload, so it has no place in the mix).

Every upload must get its feedback before ``--deadline`` seconds, and the right kind: full marks
for the reference answers, fewer for the wrong ones, a refusal at the upload for the broken ones
(``grade`` gives them ``invalid``); otherwise
the exit code is 1 and the offenders are listed. The same files, laid out as
``submitted/<student>/<assignment>/``, are then graded by ``python -m autograder grade`` with the
same ``--jobs`` in the same run, for comparison. Before the load, one learner alone in the queue
hands in the reference answers ``--alone`` times, one after another, on the idle service.

It prints: the learners, the service's wall time (first upload to last feedback), the median
and 95th percentile of the seconds from one upload to its feedback, the throughput (submissions
per second), ``grade``'s wall time and throughput, their ratio, and the lone learner's median.

    .venv/bin/python benchmarks/submit_load.py                          # 200 learners, 60 s
    .venv/bin/python benchmarks/submit_load.py --learners 4 --spread 2  # a quick look
"""
from __future__ import annotations

import argparse
import copy
import csv
import math
import os
import platform
import random
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # the sibling benchmarks and the tests' helpers

from assignment_throughput import make_course, reference_submission, student  # noqa: E402
from grading_throughput import (add_keep_option, answer_cells, cpu_name,  # noqa: E402
                                 report_problems, run, scratch_folder)
from coursebook.cases import ASSIGNMENTS, wrong_submissions  # noqa: E402
from coursebook.service_process import ServiceProcess, issue_tokens  # noqa: E402

from autograder.commands.submit import SubmitError, upload, wait  # noqa: E402

FASTEST = "ring_allreduce"  # the fastest to grade in guide/grader.md's table of 1,000 copies
INSTRUCTOR = "prof"
ALONE = "alone"             # the learner alone in the queue
CORRECT, WRONG, BROKEN_KIND = "correct", "wrong", "broken"
REFUSED = "refused"  # an upload the service turned away at once, with its reason


def kind_of(n: int) -> str:
    """The mix of a class: of every ten learners, seven correct, two wrong, one broken."""
    return {0: BROKEN_KIND, 3: WRONG, 7: WRONG}.get(n % 10, CORRECT)


def signed(nb, who: str):
    nb = copy.deepcopy(nb)
    first = next(iter(answer_cells(nb).values()))
    first.source = f"{first.source}\n# handed in by {who}"  # its own bytes: its own seed
    return nb


def hand_in(course: Path, assignment: str, notebook: str, learners: list) -> dict:
    """Write each learner's file as submitted/<student>/<assignment>/<notebook>.ipynb;
    return student -> (kind, path)."""
    import nbformat
    reference = reference_submission(assignment)
    wrong = list(wrong_submissions(assignment).values()) or [None]
    files = {}
    for n, who in enumerate(learners):
        kind = kind_of(n)
        if kind == WRONG and wrong[0] is None:
            kind = CORRECT  # an assignment without wrong cases: none in the mix
        path = course / "submitted" / who / assignment / f"{notebook}.ipynb"
        path.parent.mkdir(parents=True)
        if kind == BROKEN_KIND and (n // 10) % 2 == 0:
            path.write_text(f"my answers, {who}: see the attached notebook\n")
        elif kind == BROKEN_KIND:
            whole = nbformat.writes(signed(reference, who)).encode()
            path.write_bytes(whole[:len(whole) // 2])
        else:
            nb = reference if kind == CORRECT else wrong[(n // 10) % len(wrong)]
            nbformat.write(signed(nb, who), path)
        files[who] = (kind, path)
    return files


def expected(kind: str, status: str, score: float, max_score: float) -> bool:
    if kind == CORRECT:
        return status == "graded" and score == max_score > 0
    if kind == WRONG:
        return status == "graded" and score < max_score
    return status in ("invalid", REFUSED)  # grade: invalid; the service refuses the upload


@dataclass
class Outcome:
    who: str
    kind: str
    latency: float | None = None  # seconds from the upload to its feedback
    status: str = ""
    score: float = 0.0
    max_score: float = 0.0
    error: str = ""
    finished: float = 0.0         # monotonic clock, when the feedback came

    @property
    def right(self) -> bool:
        return not self.error and expected(self.kind, self.status, self.score, self.max_score)


def hand_in_once(url: str, token: str, path: Path, assignment: str, outcome: Outcome,
                 deadline: float) -> Outcome:
    """One upload through ``submit``'s functions, and its feedback, timed."""
    start = time.monotonic()
    try:
        sent = upload(path, url, token, assignment)
    except SubmitError as refusal:  # the service refuses a broken file at once: its feedback
        outcome.finished = time.monotonic()
        outcome.latency, outcome.status = outcome.finished - start, REFUSED
        outcome.error = "" if outcome.kind == BROKEN_KIND else f"SubmitError: {refusal}"
        return outcome
    except (OSError, ValueError, KeyError) as error:
        outcome.error = f"{type(error).__name__}: {error}"
        return outcome
    try:
        data = wait(url, token, sent["id"], max(1.0, deadline - time.monotonic()))
    except (SubmitError, OSError, ValueError, KeyError) as error:
        outcome.error = f"{type(error).__name__}: {error}"
        return outcome
    outcome.finished = time.monotonic()
    outcome.latency = outcome.finished - start
    outcome.status, outcome.score = data["status"], float(data["score"])
    outcome.max_score = float(data["max_score"])
    return outcome


def load(url: str, people: dict, files: dict, assignment: str, spread: float,
         deadline: float, seed: int = 28) -> tuple:
    """Every learner uploads at a random moment within ``spread`` s; (wall s, outcomes)."""
    chance = random.Random(seed)
    offsets = {who: chance.uniform(0, spread) for who in files}
    outcomes = {who: Outcome(who, kind) for who, (kind, _) in files.items()}
    start = time.monotonic()
    first = start + min(offsets.values(), default=0.0)
    stop = start + deadline

    def learner(who: str) -> None:
        time.sleep(max(0.0, start + offsets[who] - time.monotonic()))
        hand_in_once(url, people[who], files[who][1], assignment, outcomes[who], stop)

    threads = [threading.Thread(target=learner, args=(who,), daemon=True) for who in files]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, stop - time.monotonic()) + 5)
    for outcome in outcomes.values():
        if outcome.latency is None and not outcome.error:
            outcome.error = f"no feedback within the deadline of {deadline:g} s"
    last = max((o.finished for o in outcomes.values() if o.finished), default=first)
    return last - first, list(outcomes.values())


def alone(url: str, token: str, path: Path, assignment: str, times: int) -> list:
    """Seconds from upload to feedback of one learner on an idle service, ``times`` times."""
    seconds = []
    for _ in range(times):
        outcome = hand_in_once(url, token, path, assignment, Outcome(ALONE, CORRECT),
                               time.monotonic() + 300)
        if not outcome.right:
            sys.exit(f"the lone learner's upload went wrong: {outcome}")
        seconds.append(outcome.latency)
    return seconds


def grade_verdicts(path: Path, files: dict) -> list:
    """Problems with ``grade``'s grades.csv: a missing row or the wrong kind of result."""
    with path.open() as handle:
        rows = {row["student_id"]: row for row in csv.DictReader(handle)}
    problems = []
    for who, (kind, _) in files.items():
        row = rows.get(who)
        if row is None:
            problems.append(f"grade: {who} ({kind}): no row")
        elif not expected(kind, row["status"], float(row["score"] or 0),
                          float(row["max_score"] or 0)):
            problems.append(f"grade: {who} ({kind}): {row['score']}/{row['max_score']} "
                            f"({row['status']}): {row['message'][:200]}")
    return problems


def percentile(values: list, fraction: float) -> float:
    """The nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


@dataclass
class Measured:
    learners: int
    wall: float
    median: float
    p95: float
    grade_wall: float
    alone: float

    @property
    def throughput(self) -> float:
        return self.learners / self.wall

    @property
    def grade_throughput(self) -> float:
        return self.learners / self.grade_wall


def table(m: Measured) -> str:
    header = (f"{'learners':>8} {'wall s':>8} {'median s':>9} {'p95 s':>7} {'subm./s':>8} "
              f"{'grade wall s':>13} {'grade subm./s':>14} {'ratio':>6} {'alone s':>8}")
    return "\n".join([header, "-" * len(header),
                      f"{m.learners:>8} {m.wall:>8.1f} {m.median:>9.2f} {m.p95:>7.2f} "
                      f"{m.throughput:>8.2f} {m.grade_wall:>13.1f} {m.grade_throughput:>14.2f} "
                      f"{m.throughput / m.grade_throughput:>6.2f} {m.alone:>8.2f}"])


def main(argv=None) -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--learners", type=int, default=200, help="learners (default 200)")
    parser.add_argument("--spread", type=float, default=60.0,
                        help="seconds over which the uploads arrive (default 60)")
    parser.add_argument("--assignment", choices=sorted(ASSIGNMENTS), default=FASTEST,
                        help=f"the assignment handed in (default {FASTEST}, the fastest)")
    parser.add_argument("--jobs", type=int, default=cores,
                        help=f"--jobs of serve and of grade (default: the cores, {cores} here)")
    parser.add_argument("--deadline", type=float, default=900.0,
                        help="seconds within which every upload must have feedback (900)")
    parser.add_argument("--alone", type=int, default=5,
                        help="uploads of the learner alone in the queue (default 5)")
    add_keep_option(parser)
    args = parser.parse_args(argv)
    if args.learners < 1 or args.jobs < 1 or args.alone < 1 or args.spread < 0:
        parser.error("--learners, --jobs and --alone must be at least 1, --spread at least 0")
    assignment, notebook = args.assignment, ASSIGNMENTS[args.assignment]
    with scratch_folder(args.keep, "submit-load-") as base:
        course = make_course(base, {assignment: notebook})
        learners = [student(n + 1) for n in range(args.learners)]
        (course / "roster.toml").write_text(
            f'instructors = ["{INSTRUCTOR}"]\n'
            f"learners = [{', '.join(repr(who) for who in [*learners, ALONE])}]\n")
        files = hand_in(course, assignment, notebook, learners)
        lone = course / "alone" / f"{notebook}.ipynb"
        lone.parent.mkdir()
        import nbformat
        nbformat.write(signed(reference_submission(assignment), ALONE), lone)
        kinds = [kind for kind, _ in files.values()]
        print(f"{args.learners} learners hand in {assignment} within {args.spread:g} s "
              f"({kinds.count(CORRECT)} correct, {kinds.count(WRONG)} wrong, "
              f"{kinds.count(BROKEN_KIND)} broken); {args.jobs} job(s) on {cores} cores "
              f"({cpu_name()}), Python {platform.python_version()}", flush=True)
        try:
            people = issue_tokens(course)
            server = ServiceProcess(course, jobs=args.jobs, cwd=course)
        except RuntimeError as error:
            sys.exit(str(error))
        try:
            # warm-up: the fork server's first kernel; not counted
            alone(server.url, people[ALONE], lone, assignment, 1)
            lone_seconds = alone(server.url, people[ALONE], lone, assignment, args.alone)
            print(f"alone in the queue: {', '.join(f'{s:.2f}' for s in lone_seconds)} s",
                  flush=True)
            wall, outcomes = load(server.url, people, files, assignment, args.spread,
                                  args.deadline)
        finally:
            server.stop()
        problems = [f"service: {o.who} ({o.kind}): "
                    + (o.error or f"{o.score:g}/{o.max_score:g} ({o.status})")
                    for o in outcomes if not o.right]
        latencies = [o.latency for o in outcomes if o.latency is not None]
        print(f"service: {wall:.1f} s, {len(latencies)}/{args.learners} with feedback",
              flush=True)
        out = course / "graded"
        grade_wall = run([sys.executable, "-m", "autograder", "grade", "submitted",
                          "--assignment", assignment, "--out", str(out), "--jobs",
                          str(args.jobs), "--no-progress"], course, "grading")
        problems += grade_verdicts(out / "grades.csv", files)
        print(f"grade: {grade_wall:.1f} s", flush=True)
        print()
        if latencies:
            print(table(Measured(args.learners, wall, statistics.median(latencies),
                                 percentile(latencies, 0.95), grade_wall,
                                 statistics.median(lone_seconds))))
        return report_problems(problems, "uploads without feedback or with the wrong kind of "
                                         "result")


if __name__ == "__main__":
    sys.exit(main())
