"""Grading throughput: this course's autograder against ``nbgrader autograde``, in one run.

Both grade the same submissions of one assignment in a scratch copy of the course: the
instructor's solution, the unedited release and every plausible wrong submission of
``tests/wrong_submissions/<assignment>/`` (as ``tests/test_assignments.py`` builds them),
repeated under new student ids until there are ``--submissions`` of them. Each grader
runs as its command-line tool, from its start to its last gradebook write, and both
store the scores in a gradebook:

    nbgrader autograde ASSIGNMENT
    python -m autograder grade submitted --assignment ASSIGNMENT --out ... --gradebook ...

The script prints both wall times, the throughputs and their ratio, and checks that the
two agree on every score (GPU-only test cells aside: nbgrader runs them on the CPU too,
where the course's GPU tests print SKIPPED and pass; the autograder skips them).

It also grades the same submissions on a Dask cluster started on this machine for the
purpose (a scheduler and ``--dask-workers`` one-thread workers on loopback, as many as the
local run's jobs), with ``--scheduler``, checks that grades.csv is the same as the local
run's, and prints the scheduler's overhead per submission: the extra wall time over the
local run with the same parallelism, per submission, and the median time a no-op task
takes from submission to start on a worker.

    .venv/bin/python benchmarks/grading_throughput.py --assignment benchmark --submissions 24
"""
from __future__ import annotations

import argparse
import copy
import csv
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, List, Optional

ROOT = Path(__file__).resolve().parent.parent
SOLUTION_MARKERS = re.compile(r"^[ \t]*### (BEGIN|END) SOLUTION[ \t]*\n?", re.MULTILINE)


def tool_env() -> dict:
    # nbgrader runs `alembic` from PATH; a virtualenv need not be activated to run this.
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def run(command: list, cwd: Path, what: str) -> float:
    """Run a command to completion and return its wall time; stop on failure."""
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=tool_env(), capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{what} failed (exit {done.returncode}):\n{done.stdout[-3000:]}\n"
                 f"{done.stderr[-3000:]}")
    return seconds


def add_keep_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--keep", type=Path, default=None,
                        help="build the scratch course here and keep it (default: a temp dir)")


@contextmanager
def scratch_folder(keep: Optional[Path], prefix: str) -> Iterator[Path]:
    """The benchmark's folder: ``keep`` (left in place), or a temporary one removed after."""
    base = keep or Path(tempfile.mkdtemp(prefix=prefix))
    base.mkdir(parents=True, exist_ok=True)
    try:
        yield base
    finally:
        if keep is None:
            shutil.rmtree(base, ignore_errors=True)


def report_problems(problems: List[str], heading: str) -> int:
    """Print what went wrong (the first 50) under ``heading``; the exit status."""
    if not problems:
        return 0
    print(f"\n{len(problems)} {heading}:", file=sys.stderr)
    print("\n".join(f"  {line}" for line in problems[:50]), file=sys.stderr)
    return 1


def answer_cells(nb) -> dict:
    return {c.metadata["nbgrader"]["grade_id"]: c for c in nb.cells
            if c.get("metadata", {}).get("nbgrader", {}).get("solution")}


def variants(course: Path, assignment: str, notebook: str) -> dict:
    """name -> submitted notebook: the solution, the unedited release, the wrong ones."""
    import nbformat
    solution = nbformat.read(course / "solutions" / assignment / f"{notebook}.ipynb", as_version=4)
    release = nbformat.read(course / "exercises" / assignment / f"{notebook}.ipynb", as_version=4)
    found = {"solution": solution, "unedited": release}
    solved = answer_cells(solution)
    for path in sorted((ROOT / "tests" / "wrong_submissions" / assignment).glob("*.toml")):
        answers = tomllib.loads(path.read_text())["answers"]
        nb = copy.deepcopy(release)
        for grade_id, cell in answer_cells(nb).items():
            code = answers.get(grade_id)
            if code is None:
                code = SOLUTION_MARKERS.sub("", solved[grade_id].source)
            cell.source = code.strip("\n")
        found[f"wrong_{path.stem}"] = nb
    return found


def make_course(base: Path, assignment: str, count: int) -> tuple:
    """A scratch course with the assignment generated and ``count`` submissions."""
    import nbformat
    course = base / "course"
    (course / "solutions").mkdir(parents=True)
    shutil.copy(ROOT / "nbgrader_config.py", course / "nbgrader_config.py")
    shutil.copytree(ROOT / "solutions" / assignment, course / "solutions" / assignment)
    notebooks = sorted((course / "solutions" / assignment).glob("*.ipynb"))
    if len(notebooks) != 1:
        sys.exit(f"{assignment}: expected one notebook, found {[p.name for p in notebooks]}")
    notebook = notebooks[0].stem
    run([sys.executable, "-m", "nbgrader", "generate_assignment", assignment, "--force"],
        course, "nbgrader generate_assignment")
    kinds = variants(course, assignment, notebook)
    names = list(kinds)
    students = {}
    for i in range(count):
        kind = names[i % len(names)]
        student = f"s{i + 1:03d}_{kind}"
        folder = course / "submitted" / student / assignment
        folder.mkdir(parents=True)
        nbformat.write(kinds[kind], folder / f"{notebook}.ipynb")
        students[student] = kind
    return course, notebook, students


def nbgrader_scores(course: Path, assignment: str, notebook: str) -> dict:
    """student -> {grade_id: score} from nbgrader's gradebook."""
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        return {student.id: {g.name: g.score for g in gradebook.find_submission_notebook(
                    notebook, assignment, student.id).grades}
                for student in gradebook.students}


def autograder_scores(out: Path, assignment: str, notebook: str) -> dict:
    """student -> {grade_id: score} (skipped tests left out) from the results.json files."""
    scores = {}
    for path in out.glob(f"*/{assignment}/{notebook}.results.json"):
        tests = json.loads(path.read_text())["tests"]
        scores[path.parent.parent.name] = {t["name"]: t["score"] for t in tests
                                           if t["extra_data"]["outcome"] != "skipped"}
    return scores


def disagreements(ours: dict, theirs: dict) -> list:
    found = []
    for student, tests in sorted(ours.items()):
        for grade_id, score in tests.items():
            if grade_id.endswith("_gpu"):
                continue
            other = theirs.get(student, {}).get(grade_id)
            if other is None or abs(other - score) > 1e-9:
                found.append(f"{student} {grade_id}: autograder {score:g}, nbgrader {other}")
    return found


def start_dask(base: Path, workers: int) -> tuple:
    """A scheduler and ``workers`` one-thread worker processes on loopback."""
    file = base / "scheduler.json"
    logs = base / "dask-logs"
    logs.mkdir(exist_ok=True)

    def launch(name: str, module: str, *args) -> subprocess.Popen:
        with (logs / f"{name}.log").open("w") as log:
            return subprocess.Popen([sys.executable, "-m", module, *map(str, args)], cwd=ROOT,
                                    env=tool_env(), stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)

    processes = [launch("scheduler", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                        "--port", "0", "--no-dashboard", "--scheduler-file", file)]
    deadline = time.monotonic() + 60
    while not (file.exists() and file.read_text().strip()):
        if time.monotonic() > deadline:
            stop_dask(processes)
            sys.exit(f"the Dask scheduler did not start; see {logs}")
        time.sleep(0.2)
    address = json.loads(file.read_text())["address"]
    for n in range(workers):
        processes.append(launch(f"worker{n + 1}", "distributed.cli.dask_worker", address,
                                "--nthreads", "1", "--host", "127.0.0.1", "--no-dashboard"))
    from distributed import Client
    with Client(address, set_as_default=False) as client:
        client.wait_for_workers(workers, timeout=120)
    return address, processes


def stop_dask(processes: list) -> None:
    for process in reversed(processes):
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=15)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def task_latency(address: str, count: int = 50) -> tuple:
    """Medians, in seconds, of a no-op task's submission-to-start time and round trip."""
    from distributed import Client
    with Client(address, set_as_default=False) as client:
        client.submit(time.time, pure=False).result()  # connections made, function known
        to_start, round_trip = [], []
        for _ in range(count):
            sent = time.time()
            started = client.submit(time.time, pure=False).result()
            round_trip.append(time.time() - sent)
            to_start.append(started - sent)
    return statistics.median(to_start), statistics.median(round_trip)


def checks_cost(course: Path, assignment: str, notebook: str, repeats: int = 20) -> tuple:
    """Median seconds of one submission's trusted checks (the instructor's solution, every
    split test) run in the grader's own process and in a forked process of their own."""
    from autograder.pipeline.checks import evidence_of, run_checks
    from autograder.pipeline.checks_process import run_checks_isolated
    from autograder.pipeline.execute import execute
    from autograder.layout import Course
    from autograder.pipeline.rebuild import rebuild
    from autograder.runners.local import LocalRunner
    source = Course.discover(course).source_notebooks(assignment)[notebook]
    submitted = course / "submitted" / next(
        p.name for p in sorted((course / "submitted").iterdir()) if p.name.endswith("_solution"))
    import nbformat
    nb = nbformat.read(submitted / assignment / f"{notebook}.ipynb", as_version=4)
    rebuilt = rebuild(source.graded_view, nb, seed=12345)
    with LocalRunner(1, "fork", [source.path]) as runner, \
            tempfile.TemporaryDirectory() as folder:
        server = runner.spawner  # the run's spawner, as grade opens it
        executed = execute(rebuilt.notebook, Path(folder), spawner=server,
                           parameters={"autograder_device": "cpu", "autograder_profile": "quick"})
        cells = {c.get("id"): c for c in executed.notebook.cells}
        work = [(t.grade_id, t.checks, evidence_of(cells[t.cell_id])[0][0])
                for t in rebuilt.tests if t.checks is not None and not t.skipped]
        in_process, isolated = [], []
        for _ in range(repeats):
            start = time.perf_counter()
            run_checks(rebuilt.setup_code, rebuilt.seed, work)
            in_process.append(time.perf_counter() - start)
            start = time.perf_counter()
            run_checks_isolated(rebuilt.setup_code, rebuilt.seed, work, timeout=60,
                                folder=folder, spawner=server)
            isolated.append(time.perf_counter() - start)
    return len(work), statistics.median(in_process), statistics.median(isolated)


def grades(path: Path) -> list:
    """grades.csv without what is measured rather than graded (seconds, memory)."""
    with path.open() as handle:
        return [{k: v for k, v in row.items() if not k.startswith(("seconds", "peak_memory"))}
                for row in csv.DictReader(handle)]


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--assignment", default="benchmark")
    parser.add_argument("--submissions", type=int, default=24, help="at least 20 (default 24)")
    parser.add_argument("--jobs", type=int, default=None,
                        help="the autograder's --jobs (default: its own default, the cores)")
    parser.add_argument("--also-fresh", action="store_true",
                        help="also time the autograder with --kernel fresh (no fork server)")
    parser.add_argument("--dask-workers", type=int, default=None, metavar="N",
                        help="also grade on a loopback Dask cluster of N one-thread workers "
                             "(default: as many as the local run's jobs; 0: not at all)")
    add_keep_option(parser)
    args = parser.parse_args(argv)
    if args.submissions < 20:
        parser.error("use at least 20 submissions")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    with scratch_folder(args.keep, "grading-throughput-") as base:
        course, notebook, students = make_course(base, args.assignment, args.submissions)
        print(f"{len(students)} submissions of {args.assignment!r} ({len(set(students.values()))} "
              f"different ones); {cores} cores ({cpu_name()}), Python {platform.python_version()}")
        # Warm the file cache for both: the first to import torch would otherwise pay for it.
        run([sys.executable, "-c", "import torch, torchvision, matplotlib, nbformat"], course,
            "warm-up")

        timings = {}
        timings["nbgrader autograde"] = run(
            [sys.executable, "-m", "nbgrader", "autograde", args.assignment, "--force"], course,
            "nbgrader autograde")
        print(f"nbgrader autograde: {timings['nbgrader autograde']:.1f} s", flush=True)
        jobs = ["--jobs", str(args.jobs)] if args.jobs else []
        label = f"python -m autograder ({args.jobs or cores} jobs)"
        kernels = ["fork"] + (["fresh"] if args.also_fresh else [])
        for kernel in kernels:
            name = label if kernel == "fork" else f"{label}, fresh kernels"
            out = course / f"graded-{kernel}"
            timings[name] = run(
                [sys.executable, "-m", "autograder", "grade", "submitted",
                 "--assignment", args.assignment, "--out", str(out), "--kernel", kernel,
                 "--gradebook", f"sqlite:///{course / f'gradebook-{kernel}.db'}",
                 "--no-progress", *jobs], course, f"autograder ({kernel} kernels)")
            print(f"{name}: {timings[name]:.1f} s", flush=True)

        dask_workers = (args.jobs or cores) if args.dask_workers is None else args.dask_workers
        dask_label, latency = f"python -m autograder --scheduler ({dask_workers} workers)", None
        if dask_workers > 0:
            address, processes = start_dask(base, dask_workers)
            try:
                timings[dask_label] = run(
                    [sys.executable, "-m", "autograder", "grade", "submitted",
                     "--assignment", args.assignment, "--out", str(course / "graded-dask"),
                     "--gradebook", f"sqlite:///{course / 'gradebook-dask.db'}",
                     "--no-progress", "--scheduler", address], course, "autograder on Dask")
                print(f"{dask_label}: {timings[dask_label]:.1f} s", flush=True)
                latency = task_latency(address)
            finally:
                stop_dask(processes)

        theirs = nbgrader_scores(course, args.assignment, notebook)
        ours = autograder_scores(course / "graded-fork", args.assignment, notebook)
        with (course / "graded-fork" / "grades.csv").open() as handle:
            rows = list(csv.DictReader(handle))
        problems = disagreements(ours, theirs)
        if len(rows) != len(students):
            problems.append(f"grades.csv has {len(rows)} rows for {len(students)} submissions")
        if dask_label in timings and (grades(course / "graded-dask" / "grades.csv")
                                      != grades(course / "graded-fork" / "grades.csv")):
            problems.append("grades.csv from the Dask cluster differs from the local run's")

        n = len(students)
        base_time = timings["nbgrader autograde"]
        print(f"\n{'grader':<48} {'wall s':>8} {'subm./s':>8} {'vs nbgrader':>12}")
        for name, seconds in timings.items():
            print(f"{name:<48} {seconds:8.1f} {n / seconds:8.2f} {base_time / seconds:11.1f}x")
        ratio = base_time / timings[label]
        print(f"\nThroughput ratio (autograder / nbgrader): {ratio:.1f}x")
        if dask_label in timings:
            extra = (timings[dask_label] - timings[label]) / n
            print(f"Dask scheduler overhead: {extra:+.2f} s per submission over the local run "
                  f"({timings[dask_label] / timings[label]:.2f}x its wall time); a no-op task "
                  f"takes {latency[0] * 1e3:.1f} ms from submission to start on a worker, "
                  f"{latency[1] * 1e3:.1f} ms there and back (medians of 50)")
        tests, shared, own = checks_cost(course, args.assignment, notebook)
        print(f"Trusted checks of one submission ({tests} test cells): {shared * 1e3:.1f} ms in "
              f"the grader's process, {own * 1e3:.1f} ms in a process of their own forked from "
              f"the fork server ({(own - shared) * 1e3:+.1f} ms; medians of 20)")
        if problems:
            print(f"\nScores differ on {len(problems)} test cell(s):")
            print("\n".join(f"  {p}" for p in problems))
            return 1
        print(f"Both graders gave the same score to every test cell of all {n} submissions "
              "(GPU-only cells aside)" + ("; the Dask run wrote the same grades.csv as the "
                                          "local one." if dask_label in timings else "."))
        return 0


if __name__ == "__main__":
    sys.exit(main())
