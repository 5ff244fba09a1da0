"""How stable a speed test's grade is, and what it costs: the same file graded many times.

For each answer, ``--gradings`` copies of one notebook (the same bytes, so the same
``TEST_SEED``: the same file graded again) are handed in under new student ids and graded in one
``python -m autograder grade`` run, with ``--jobs 1``, ``--jobs 2``, and ``--jobs 2`` while
``--load`` busy processes keep the machine's cores occupied. The table gives, per run, the
CPUs the timed kernels had to themselves ("no": not pinned), the speed points each copy got,
the spread of the measured speedup (min, median, max, and max/min - 1), the timed rounds
(median, and how many gradings reached the precision asked for within the budget), the
seconds the speed test took (the clean kernel, the warm-up and the timed rounds; not the wait
for another grading's speed test to end) and the
seconds each grading took in all (medians).

    .venv/bin/python benchmarks/speed_stability.py --gradings 10

The assignment is the course's ``fast_attention``: its reference answer (the fused operator)
and a middle one, the first improvement a learner makes (loops over batch and heads kept),
as tests/speed_answers/fast_attention.toml writes them.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import sys
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grading_throughput import (ROOT, add_keep_option, cpu_name, report_problems, run,  # noqa: E402
                                scratch_folder)

ASSIGNMENT = "fast_attention"


def answers() -> dict:
    from coursebook.cases import speed_answers
    return speed_answers(ASSIGNMENT)


def _busy() -> None:
    while True:
        pass


@contextmanager
def load(processes: int):
    """``processes`` busy loops for the duration (a machine shared with other work)."""
    workers = [multiprocessing.Process(target=_busy, daemon=True) for _ in range(processes)]
    for worker in workers:
        worker.start()
    try:
        yield
    finally:
        for worker in workers:
            worker.terminate()
            worker.join()


def hand_in(submitted: Path, answer: str, copies: int, tag: str) -> list:
    """``copies`` of the release with ``answer`` typed in (the same bytes each time, so the
    same TEST_SEED: the same file graded again), under new student ids."""
    from coursebook.cases import hand_in as write, submission
    notebook = submission(ASSIGNMENT, {"attention_answer": answer})
    students = [f"{tag}-{n:02d}" for n in range(copies)]
    write(submitted, ASSIGNMENT, {who: notebook for who in students})
    return students


def speed_of(out: Path, who: str, assignment: str) -> tuple:
    """(points, speed measurement, grading seconds) of one graded copy."""
    result = json.loads((out / who / assignment / f"{assignment}.results.json").read_text())
    test = next(t for t in result["tests"] if "speed" in t["extra_data"])
    return test["score"], test["extra_data"]["speed"], result["extra_data"]["seconds"]


def row(name: str, jobs: int, busy: int, graded: list) -> str:
    points = Counter(p for p, _, _ in graded)
    speedups = sorted(s["speedup"] for _, s, _ in graded if "speedup" in s)
    shown = ", ".join(f"{p:g} x{n}" for p, n in sorted(points.items()))
    spread = (f"{speedups[0]:.2f} / {statistics.median(speedups):.2f} / {speedups[-1]:.2f} "
              f"({(speedups[-1] / speedups[0] - 1) * 100:.0f} %)") if speedups else "-"
    timing = statistics.median(s["seconds"] - s.get("waited", 0) for _, s, _ in graded)
    total = statistics.median(t for _, _, t in graded)
    pinned = Counter(",".join(map(str, s.get("cpus") or [])) or "no" for _, s, _ in graded)
    cpus = ", ".join(f"{c} x{n}" for c, n in sorted(pinned.items()))
    measured = [s for _, s, _ in graded if "rounds" in s]
    rounds = (f"{statistics.median(s['rounds'] for s in measured):g} "
              f"({sum(bool(s['precise']) for s in measured)} precise)") if measured else "-"
    return (f"| {name} | {jobs} | {busy} | {len(graded)} | {cpus} | {shown} | {spread} | "
            f"{rounds} | {timing:.1f} | {total:.1f} |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gradings", type=int, default=10, help="copies per run (default 10)")
    parser.add_argument("--load", type=int, default=os.cpu_count() or 2,
                        help="busy processes for the loaded run (default: one per core)")
    add_keep_option(parser)
    args = parser.parse_args(argv)
    problems = []
    with scratch_folder(args.keep, "speed-stability-") as base:
        print(f"{args.gradings} gradings of the same file per run, on {os.cpu_count()} cores "
              f"({cpu_name()}), Python {platform.python_version()}", flush=True)
        lines = ["| answer | jobs | busy processes | gradings | timed on CPU | "
                 "points (of the cell's) | speedup min / median / max (spread) | "
                 "rounds (median) | speed test s | grading s |",
                 "|---|---|---|---|---|---|---|---|---|---|"]
        for name, answer in answers().items():
            for jobs, busy in ((1, 0), (2, 0), (2, args.load)):
                tag = f"{name}-{jobs}-{busy}"
                students = hand_in(base / f"submitted-{tag}", answer, args.gradings, tag)
                out = base / f"graded-{tag}"
                with load(busy):
                    run([sys.executable, "-m", "autograder", "grade", str(base / f"submitted-{tag}"),
                         "--assignment", ASSIGNMENT, "--out", str(out), "--jobs", str(jobs),
                         "--no-progress"], ROOT, f"grading {tag}")
                graded = [speed_of(out, who, ASSIGNMENT) for who in students]
                problems += [f"{tag} {who}: {s.get('problem') or s.get('setup')}"
                             for who, (_, s, _) in zip(students, graded)
                             if s.get("problem") or s.get("setup")]
                lines.append(row(name, jobs, busy, graded))
                print(lines[-1], flush=True)
        print()
        print("\n".join(lines))
    return report_problems(problems, "gradings without a measurement")


if __name__ == "__main__":
    sys.exit(main())
