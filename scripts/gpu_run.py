#!/usr/bin/env python3
"""``scripts/gpu-run``: the whole course on a lent GPU machine, in one command, within a budget.

Such a machine has Python 3.12 with PyTorch, no network and a few minutes for us. This script
installs the kit that ``make gpu-kit`` made (``pip install --no-index --no-deps --target``),
then runs, each step timed and logged, with what is left of the time budget:

1. every chapter, executed with papermill in the chosen profile (``full`` by default);
2. ``pytest -m gpu``: every GPU-marked test; the tests of a page's GPU run read the notebook
   step 1 executed (``DLPERF_EXECUTED_CHAPTERS``) rather than run the page a second time;
3. every assignment's solution, unedited release and wrong submissions
   (``tests/wrong_submissions``) graded by ``python -m autograder grade`` on the GPU, each score
   compared with the points that case must lose there;
4. the chapters' runs on a GPU added to ``status/gpu-runs.json`` (what the status page shows).

Everything worth keeping lands in one folder (``--out``), at most 8 files: ``gpu-run.log``,
``summary.json`` (every step, its time and outcome), ``pytest-gpu.xml``, ``chapters.zip`` (the
executed notebooks), ``grading.json`` and ``gpu-runs.json``. It imports nothing but the standard
library before the kit is installed, and exits 1 if any step failed. On a machine without a GPU
it runs the same steps on the CPU (the GPU tests skip), which is how CI proves the kit.

    scripts/gpu-run [--out FOLDER] [--profile full|quick] [--budget SECONDS] [--steps tests,...]
                    [--notebooks FOLDER]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
import zipfile
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KIT = ROOT / "_build" / "gpu-kit"
# The machines stop a command after 10 minutes; leave a minute for starting and copying back.
BUDGET = 540.0
# Time kept back for the steps after the chapters, which take minutes where chapters can take all.
GRADING_RESERVE = 150.0
TESTS_RESERVE = 120.0  # the GPU tests, without the pages (seen on an H100: about 2 minutes)
FILE_LIMIT = 16 * 2**20
STEPS = ("chapters", "tests", "grading")  # the status records come with the chapters


class Run:
    """The run's log, its clock and its summary."""

    def __init__(self, out: Path, budget: float):
        self.out, self.budget, self.started = out, budget, time.monotonic()
        self.log = (out / "gpu-run.log").open("w", buffering=1)
        self.steps: list = []

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.started)

    def say(self, text: str) -> None:
        line = f"[{time.monotonic() - self.started:6.1f} s] {text}"
        print(line, flush=True)
        self.log.write(line + "\n")

    def command(self, args, *, timeout: float, env=None, cwd=ROOT):
        """Run a command, its output into the log; (return code or None on timeout, output)."""
        self.say("$ " + " ".join(str(a) for a in args))
        try:
            done = subprocess.run([str(a) for a in args], capture_output=True, text=True,
                                  timeout=max(timeout, 1), env=env, cwd=cwd)
        except subprocess.TimeoutExpired as stopped:
            output = _text(stopped.stdout) + _text(stopped.stderr)
            self.log.write(output[-20000:] + f"\n(stopped after {timeout:.0f} s)\n")
            return None, output
        output = done.stdout + done.stderr
        self.log.write(output[-20000:] + "\n")
        return done.returncode, output

    def step(self, name: str, outcome: str, started: float, **details) -> dict:
        record = {"step": name, "outcome": outcome,
                  "seconds": round(time.monotonic() - started, 1), **details}
        self.steps.append(record)
        self.say(f"{name}: {outcome} in {record['seconds']} s")
        return record


def _text(data) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


def install(run: Run, kit: Path, site: Path) -> dict:
    started = time.monotonic()
    wheels = sorted(kit.glob("*.whl"))
    if not wheels:
        return run.step("install", "failed", started,
                        error=f"no wheels in {kit}: run `make gpu-kit` on a machine with a network "
                              f"first, and carry {kit.relative_to(ROOT)} along")
    code, output = run.command([sys.executable, "-m", "pip", "install", "--quiet", "--no-index",
                                "--no-deps", "--upgrade", "--target", site, *wheels],
                               timeout=min(180, run.left()))
    if code != 0:
        return run.step("install", "failed", started, error=output[-2000:])
    code, output = run.command([sys.executable, "-c", "import papermill, jupytext, ipykernel, "
                                "nbclient, nbformat, d2l, torch; print(torch.__version__)"],
                               timeout=120, env=environment(site))
    return run.step("install", "passed" if code == 0 else "failed", started, wheels=len(wheels),
                    **({} if code == 0 else {"error": output[-2000:]}))


def environment(site: Path, **extra) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]),
           "PATH": os.pathsep.join([str(site / "bin"), os.environ.get("PATH", "")]),
           "DLPERF_DATA": "synthetic",  # no network there: never wait on a download
           "PYTHONUNBUFFERED": "1", **extra}
    env.pop("VIRTUAL_ENV", None)
    return env


def gpu_tests(run: Run, site: Path, executed: Path | None) -> dict:
    """``pytest -m gpu``; with ``executed``, the pages' GPU tests read the chapters from there."""
    started, report = time.monotonic(), run.out / "pytest-gpu.xml"
    extra = {"DLPERF_EXECUTED_CHAPTERS": str(executed)} if executed else {}
    code, output = run.command([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p",
                                "no:cacheprovider", "-W", "ignore", f"--junitxml={report}",
                                "tests"], timeout=min(300, run.left() - GRADING_RESERVE),
                               env=environment(site, **extra))
    counts = junit_counts(report)
    if code is None:
        outcome = "out of time"
    else:  # pytest: 0 all passed, 5 nothing collected (no GPU-marked test ran)
        outcome = "passed" if code in (0, 5) else "failed"
    return run.step("pytest -m gpu", outcome, started, exit_code=code, **counts)


def junit_counts(report: Path) -> dict:
    if not report.exists():
        return {}
    root = ElementTree.parse(report).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    counts = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return counts


def chapters() -> list:
    """The chapters in the book's order (_toc.yml)."""
    return re.findall(r"^\s*- file: (chapters/[\w-]+)\s*$", (ROOT / "_toc.yml").read_text(),
                      re.MULTILINE)


def title(page: str) -> str:
    found = re.search(r"^# (.+)$", (ROOT / f"{page}.md").read_text(), re.MULTILINE)
    return found.group(1).strip() if found else page


def chapter_notebook(run: Run, page: str, source: Path, notebooks: Path | None, env: dict):
    """Write the notebook to execute for ``page`` at ``source``: the published one from
    ``notebooks``, else the page's ``.md`` made a notebook by jupytext. Its exit code."""
    if notebooks is None:
        code, _ = run.command([sys.executable, "-m", "jupytext", "--to", "ipynb", "--output",
                               source, ROOT / f"{page}.md"], timeout=60, env=env)
        return code
    published = notebooks / f"{page.split('/')[-1]}.ipynb"
    if not published.exists():
        run.say(f"{page}: no published notebook {published}")
        return 1
    shutil.copyfile(published, source)
    return 0


def printed(notebook: Path) -> str:
    """What an executed notebook's cells printed (not its JSON, whose escapes a line would
    swallow)."""
    import nbformat
    from coursebook.executed import page_text  # joins a line a kernel sent in two pieces
    return page_text(nbformat.read(notebook, as_version=4))


def run_chapters(run: Run, site: Path, profile: str, hardware: dict,
                 notebooks: Path | None = None, reserve: float = GRADING_RESERVE,
                 jobs: int = 1) -> tuple:
    """Execute every chapter, leaving ``reserve`` seconds for the steps after it; (the step's
    record, the runs for the status page, the folder of executed notebooks ``<name>.ipynb``).

    Each page's ``.md`` is made a notebook with jupytext; with ``notebooks`` (a folder of the
    built book's published notebooks, ``_build/html/_sources/chapters``) those run instead:
    what readers open from the launch buttons, includes and glued values written in.
    ``jobs`` pages run at once: 1 wherever the pages' timings matter (a page sharing the
    machine with another measures both), more only to check that the pages run."""
    from concurrent.futures import ThreadPoolExecutor

    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="gpu-run-chapters-"))
    executed_folder = work / "executed"
    executed_folder.mkdir()
    env = environment(site, DLPERF_PROFILE=profile)

    def one(page: str) -> dict:
        name = page.split("/")[-1]
        left = run.left() - reserve
        if left < 20:
            run.say(f"{page}: not run, out of time")
            return {"page": page, "outcome": "not run: out of time"}
        source, executed = work / f"{name}.ipynb", executed_folder / f"{name}.ipynb"
        code = chapter_notebook(run, page, source, notebooks, env)
        began, ran_at = time.monotonic(), datetime.now(timezone.utc).isoformat(timespec="seconds")
        if code == 0:
            code, _ = run.command([sys.executable, "-m", "papermill", source, executed,
                                   "--cwd", work, "-k", "python3", "--no-progress-bar"],
                                  timeout=left, env=env)
        seconds = round(time.monotonic() - began, 1)
        outcome = {0: "passed", None: "out of time"}.get(code, "failed")
        run.say(f"{page}: {outcome} in {seconds} s")
        return {"page": page, "outcome": outcome, "seconds": seconds, "ran_at": ran_at,
                "executed": executed if executed.exists() else None}

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        results = list(pool.map(one, chapters()))  # in the book's order, whatever ran first
    from coursebook.status import environment as environment_of  # found through ROOT on sys.path
    runs = []
    with zipfile.ZipFile(run.out / "chapters.zip", "w", zipfile.ZIP_DEFLATED) as archive:
        for result in results:
            executed = result.pop("executed", None)
            ran_at = result.pop("ran_at", None)
            if executed is not None:
                archive.write(executed, executed.name)
                runs.append({"page": result["page"], "title": title(result["page"]),
                             "ran_at": ran_at, "seconds": result["seconds"],
                             "succeeded": result["outcome"] == "passed",
                             **environment_of(printed(executed)),
                             **hardware})
    failed = [r["page"] for r in results if r["outcome"] != "passed"]
    record = run.step("chapters", "passed" if not failed else "failed", started, profile=profile,
                      jobs=max(1, jobs), chapters=results)
    return record, runs, executed_folder


def grade_assignments(run: Run, site: Path, device: str) -> dict:
    """Grade each assignment's cases on ``device``; compare with tests/wrong_submissions."""
    import nbformat
    from coursebook.cases import (ASSIGNMENTS, EXERCISES, SOLUTIONS, WRONG, expected_losses,
                                   hand_in, load_wrong, submission, unjudged)

    started, cases_out = time.monotonic(), []
    work = Path(tempfile.mkdtemp(prefix="gpu-run-grading-"))
    cuda = device == "cuda"
    for assignment, notebook in ASSIGNMENTS.items():
        expected = {"solution": {}, "unedited": None}  # None: every point lost
        unfixed = {"solution": set(), "unedited": set()}
        cases = {"solution": nbformat.read(SOLUTIONS / assignment / f"{notebook}.ipynb", 4),
                 "unedited": nbformat.read(EXERCISES / assignment / f"{notebook}.ipynb", 4)}
        for path in WRONG:
            case = load_wrong(path)
            if case["assignment"] == assignment:
                cases[case["student"]] = submission(assignment, case["answers"])
                expected[case["student"]] = expected_losses(case, cuda)
                unfixed[case["student"]] = unjudged(case)
        submitted, out = work / assignment / "submitted", work / assignment / "out"
        hand_in(submitted, assignment, cases)
        if run.left() < 30:
            cases_out.append({"assignment": assignment, "outcome": "not run: out of time"})
            continue
        code, output = run.command([sys.executable, "-m", "autograder", "grade", submitted,
                                    "--assignment", assignment, "--out", out, "--device", device,
                                    "--no-progress"], timeout=run.left() - 10,
                                   env=environment(site))
        for student, losses in expected.items():
            path = out / student / assignment / f"{notebook}.results.json"
            cases_out.append(judge_case(assignment, student, losses, path, code, cuda,
                                        unfixed[student]))
    (run.out / "grading.json").write_text(json.dumps({"device": device, "cases": cases_out},
                                                      indent=2) + "\n")
    failed = [c for c in cases_out if c["outcome"] != "as expected"]
    return run.step("grading", "passed" if not failed else "failed", started, device=device,
                    cases=cases_out)


def judge_case(assignment: str, student: str, losses, results: Path, code, cuda: bool,
               unfixed: set = frozenset()) -> dict:
    """Did this case lose exactly the points it should (``losses``; None: all of them)? The
    tests in ``unfixed`` (coursebook.cases.unjudged) are not compared.

    As the course's grader does: GPU-only tests (``*_gpu``) run where CUDA is, and are skipped,
    neither scored nor in the maximum, where it is not; no other test may be skipped.
    """
    case = {"assignment": assignment, "student": student}
    if not results.exists():
        return {**case, "outcome": "not graded", "grader_exit": code}
    from coursebook.cases import counted, wrongly_skipped

    result = json.loads(results.read_text())
    scores = {name: s for name, s in counted(result).items() if name not in unfixed}
    misskipped = wrongly_skipped(result, cuda)
    lost = {name: points - score for name, (score, points) in scores.items() if score != points}
    wanted = ({name: points for name, (_, points) in scores.items()} if losses is None
              else {name: points for name, points in losses.items() if points and name in scores})
    outcome = "as expected" if lost == wanted and not misskipped else "unexpected"
    # What the next session needs to mend a surprise without a GPU: each lost test's message
    # where the loss was not expected, and every speed test's measurement.
    tests = {test["name"]: test for test in result["tests"]}
    why = {name: tests[name].get("output", "")[:800] for name in lost
           if outcome != "as expected" and name in tests}
    speeds = {name: {key: test["extra_data"]["speed"].get(key) for key in
                     ("device", "clock", "speedup", "low", "high", "candidate_seconds",
                      "baseline_seconds", "rounds", "calls", "baseline_calls")}
              for name, test in tests.items() if "speed" in test.get("extra_data", {})}
    return {**case, "score": result["score"], "lost": lost, "expected_lost": wanted,
            "wrongly_skipped": misskipped, "outcome": outcome,
            **({"why": why} if why else {}), **({"speed": speeds} if speeds else {})}


def hardware_facts() -> dict:
    """What a GPU run's record says beyond the page's own line: driver and CUDA versions."""
    import torch
    facts = {}
    if torch.cuda.is_available():
        facts["cuda"] = torch.version.cuda
        try:
            done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version",
                                   "--format=csv,noheader"], capture_output=True, text=True,
                                  timeout=30)
            if done.returncode == 0 and done.stdout.strip():
                facts["driver"] = done.stdout.strip().splitlines()[0]
        except (OSError, subprocess.TimeoutExpired):
            pass
    return facts


def record_gpu_runs(run: Run, runs: list) -> dict:
    from coursebook.status import GPU_RUNS, gpu_runs, merge_runs

    started = time.monotonic()
    new = gpu_runs(runs)
    recorded = json.loads(GPU_RUNS.read_text())["runs"] if GPU_RUNS.exists() else []
    merged = {"runs": merge_runs(recorded, new)}
    text = json.dumps(merged, indent=2) + "\n"
    (run.out / "gpu-runs.json").write_text(text)
    if new:
        GPU_RUNS.write_text(text)
    return run.step("status page", "passed", started, gpu_runs=len(new),
                    note=("copy gpu-runs.json to status/ and commit it" if new else
                          "no chapter ran on a GPU: status/gpu-runs.json left as it was"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or
                                                         ROOT / "_build" / "gpu-run"),
                        help="where the results go (default: $OUT, else _build/gpu-run)")
    parser.add_argument("--kit", type=Path, default=KIT, help=f"the wheels (default {KIT})")
    parser.add_argument("--site", type=Path, default=Path(tempfile.gettempdir()) / "dlperf-kit",
                        help="where the kit is installed (default: /tmp/dlperf-kit)")
    parser.add_argument("--profile", choices=("full", "quick"), default="full")
    parser.add_argument("--budget", type=float, default=BUDGET,
                        help=f"seconds for all steps together (default {BUDGET:.0f})")
    parser.add_argument("--notebooks", type=Path, default=None, metavar="FOLDER",
                        help="run the chapters from the built book's published notebooks in "
                             "FOLDER (_build/html/_sources/chapters) instead of the .md pages")
    parser.add_argument("--chapter-jobs", type=int, default=1, metavar="N",
                        help="chapters run at once (default 1: on a GPU the pages measure, and "
                             "a page that shares the machine measures its neighbour too)")
    parser.add_argument("--steps", default=",".join(STEPS),
                        help=f"which steps to run after the install (default: all, {','.join(STEPS)})")
    args = parser.parse_args(argv)
    steps_wanted = [step.strip() for step in args.steps.split(",") if step.strip()]
    unknown = sorted(set(steps_wanted) - set(STEPS))
    if unknown:
        parser.error(f"unknown step(s) {unknown}; the steps are {', '.join(STEPS)}")
    if args.chapter_jobs < 1:
        parser.error(f"--chapter-jobs must be at least 1, got {args.chapter_jobs}")
    args.out.mkdir(parents=True, exist_ok=True)
    run = Run(args.out, args.budget)
    run.say(f"scripts/gpu-run: profile {args.profile}, budget {args.budget:.0f} s, "
            f"Python {sys.version.split()[0]}, results in {args.out}")
    steps = [install(run, args.kit, args.site)]
    if steps[0]["outcome"] == "passed":
        sys.path[:0] = [str(args.site), str(ROOT)]
        import torch
        device = "cuda" if torch.cuda.is_available() else "cpu"
        hardware = hardware_facts()
        run.say(f"PyTorch {torch.__version__} on {device}"
                + (f" ({torch.cuda.get_device_name(0)}, driver {hardware.get('driver')})"
                   if device == "cuda" else ""))
        executed = None
        if "chapters" in steps_wanted:
            reserve = GRADING_RESERVE + (TESTS_RESERVE if "tests" in steps_wanted else 0)
            chapter_step, runs, executed = run_chapters(run, args.site, args.profile, hardware,
                                                        args.notebooks, reserve,
                                                        args.chapter_jobs)
            steps.append(chapter_step)
        if "tests" in steps_wanted:
            steps.append(gpu_tests(run, args.site, executed))
        if "grading" in steps_wanted:
            steps.append(grade_assignments(run, args.site, device))
        if "chapters" in steps_wanted:
            steps.append(record_gpu_runs(run, runs))
    ok = all(step["outcome"] == "passed" for step in steps)
    summary = {"ok": ok, "profile": args.profile, "budget_s": args.budget,
               "seconds": round(time.monotonic() - run.started, 1), "python": sys.version.split()[0],
               "steps": steps}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    run.say(f"{'all steps passed' if ok else 'some steps failed'}; "
            f"summary in {args.out / 'summary.json'}")
    run.log.close()
    too_big = [p.name for p in args.out.iterdir() if p.stat().st_size > FILE_LIMIT]
    if too_big:
        print(f"warning: over {FILE_LIMIT // 2**20} MiB, will not come back: {too_big}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
