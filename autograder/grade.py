"""Grade submissions: one submission in, one :class:`SubmissionResult` out.

:func:`grade_submission` is the one pipeline for one notebook -- read it, rebuild it on
the reference (:mod:`.rebuild`), run it in a sandboxed kernel and a private working
directory (:mod:`.execute`), run the trusted checks in a process of their own
(:mod:`.checks`), judge each test (:mod:`.judge`) -- under one
:class:`~autograder.options.GradeOptions`. It returns a plain result object without
writing anything outside the grader's temporary run folder; reporting and the gradebook
are the caller's. A runner decides where it runs: :class:`LocalRunner` here, ``jobs`` at
a time, or :class:`autograder.cluster.Cluster` on Dask workers; ``check`` calls it for
one notebook.
"""
from __future__ import annotations

import os
import shutil
import stat
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Protocol

import nbformat

from .cgroups import ResourceGroup
from .checks import MIME, evidence_of
from .checks_process import ChecksSetupError, run_checks_isolated
from .device import cuda_available
from .execute import TIMEOUT_ENAME, Execution, execute
from .imports import kernel_preload
from .judge import FAILED, MANUAL, NOT_RUN, PARTIAL, PASSED, SKIPPED, TestResult, judge
from .layout import SourceNotebook, Submission, notebook_from_bytes, plural, submitted_bytes
from .options import (COPY_BUDGET, CPU, KERNEL_CPU_MARGIN, MAX_CELLS, GradeOptions,
                      available_cores, default)
from .confine import GROUP, USER, machine_layers
from .policy import (Policy, closed_folders, import_paths, process_environment, python_paths,
                     shown_paths, source_folders)
from .rebuild import Rebuilt, TestCell, rebuild
from .spawn import Spawner, open_spawner

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


def planned_tests(source: SourceNotebook, device: str) -> Rebuilt:
    """The tests of ``source`` as a submission would get them (for max scores, preloads)."""
    return rebuild(source.graded_view, source.graded_view, device=device)


def _copy_tree(src: Path, dst: Path, budget: List[int]) -> None:
    """Copy regular files and folders only: no symlinks or devices out of a submission,
    and no more than ``budget[0]`` bytes in all."""
    for entry in sorted(os.scandir(src), key=lambda e: e.name):
        if entry.name.startswith(".ipynb_checkpoints") or entry.name.endswith(".ipynb"):
            continue  # the kernel runs the rebuilt notebook from memory, not files
        info = entry.stat(follow_symlinks=False)
        target = dst / entry.name
        if stat.S_ISDIR(info.st_mode):
            target.mkdir(exist_ok=True)
            _copy_tree(Path(entry.path), target, budget)
        elif stat.S_ISREG(info.st_mode) and info.st_size <= budget[0]:
            budget[0] -= info.st_size
            shutil.copyfile(entry.path, target)


_RUN_DIR: Optional[Path] = None
_RUN_DIR_LOCK = threading.Lock()


def run_dir() -> Path:
    """This grader's folder for working directories and logs (hidden from every kernel,
    but for the kernel's own working directory). One per process, whichever grading
    thread asks first: a kernel's working directory must lie in the folder it is hidden in."""
    with _RUN_DIR_LOCK:
        return _run_dir()


def _run_dir() -> Path:
    global _RUN_DIR
    if _RUN_DIR is None or not _RUN_DIR.is_dir():
        _RUN_DIR = Path(tempfile.mkdtemp(prefix=f"autograder-run-{os.getpid()}-"))
        import atexit
        atexit.register(shutil.rmtree, _RUN_DIR, True)
    return _RUN_DIR


def prepare_workdir(submission: Submission, source: SourceNotebook) -> Path:
    """A fresh directory with the learner's files and the assignment's support files.

    As nbgrader does, the instructor's non-notebook files (data, helper modules) replace
    the learner's copies. No notebook of the instructor's is ever put there.
    """
    workdir = Path(tempfile.mkdtemp(prefix="submission-", dir=run_dir()))
    if submission.folder.is_dir():
        _copy_tree(submission.folder, workdir, [COPY_BUDGET])
    base = source.path.parent
    for path in source.support_files():
        target = workdir / path.relative_to(base)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    return workdir


def sandbox_policy(submission: Submission, source: SourceNotebook, workdir: Path,
                   options: GradeOptions, group: Optional[ResourceGroup] = None) -> Policy:
    """What the submission's kernel may see and use (see :mod:`.policy`, :mod:`.confine`)."""
    hidden = {str(run_dir()), *(str(Path(h).resolve()) for h in options.hidden)}
    if not source.released:  # an instructor's notebook, in COURSE/<source dir>/<assignment>
        course_sources = source.path.resolve().parent.parent
        hidden.update((str(course_sources.parent), str(course_sources)))
        if len(submission.path.parents) > 2:
            hidden.add(str(submission.path.resolve().parents[2]))  # every student's submissions
    # A lesson checkout the kernel imports from (on PYTHONPATH) is hidden like the course
    # (its solutions/, tests/, .git): only its packages are shown again.
    sources = source_folders()
    hidden.update(sources)
    if os.geteuid() == 0:  # the kernel will run as nobody: cover what nobody may not enter
        hidden.update(closed_folders(python_paths()))
    shown = shown_paths(hidden, import_paths(sources))
    # Every layer this machine gives a kernel is required of each kernel: one that fails to
    # get it (a transient failure) does not start, rather than run with less.
    required = set(machine_layers())
    if group is not None:
        required.add(GROUP)
    if os.geteuid() == 0:
        required.add(USER)
    return Policy(workdir=str(workdir), memory=options.memory, file_size=options.file_size,
                  disk=options.disk, cpu_seconds=int(options.limits.notebook) + KERNEL_CPU_MARGIN,
                  hidden=tuple(sorted(hidden)), shown=shown,
                  cgroups=group.paths if group is not None else (),
                  required=tuple(sorted(required)))


def trusted_checks(rebuilt: Rebuilt, executed: nbformat.NotebookNode, options: GradeOptions,
                   spawner: Spawner) -> Dict[str, object]:
    """Run the checks of every split test on what its probe reported, in a process of
    this submission's own (see :func:`autograder.checks_process.run_checks_isolated`)."""
    by_id = {cell.get("id"): cell for cell in executed.cells}
    work = []
    for test in rebuilt.tests:
        cell = by_id.get(test.cell_id)
        if test.checks is None or test.skipped or cell is None:
            continue
        reports, problem = evidence_of(cell)
        if len(reports) == 1 and not problem:
            work.append((test.grade_id, test.checks, reports[0]))
    if not work:
        return {}
    return run_checks_isolated(rebuilt.setup_code, rebuilt.seed, work,
                               timeout=options.checks_timeout, folder=str(run_dir()),
                               spawner=spawner)


def test_seed(source: SourceNotebook, submission_bytes: bytes) -> int:
    """This submission's ``TEST_SEED``: the same every time it is graded, unknown in advance.

    An HMAC of the submitted file keyed with the instructor's notebook, which learners
    never see: a learner cannot compute it, so answers canned for one seed fail, and
    any change to the file draws new inputs. Grading the same file again (with any number
    of jobs, here or on a cluster) uses the same inputs, so it gets the same grade.
    """
    import hashlib
    import hmac
    digest = hmac.new(source.secret, submission_bytes, hashlib.sha256).digest()
    return int.from_bytes(digest[:4], "big") % 2**31


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
                        if MIME not in o.get("data", {})]
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


def _timed_out_cells(nb: nbformat.NotebookNode) -> int:
    return sum(any(o.get("output_type") == "error" and o.get("ename") == TIMEOUT_ENAME
                   for o in cell.get("outputs", []))
               for cell in nb.cells if cell.get("cell_type") == "code")


def _points(value: float) -> str:
    return f"{value:g} point" + ("" if value == 1 else "s")


def _summary(result: SubmissionResult, execution: Optional[Execution], notes: List[str]) -> str:
    parts = []
    if execution is not None and not execution.completed:
        parts.append(execution.message)
    elif execution is not None and _timed_out_cells(execution.notebook):
        late = _timed_out_cells(execution.notebook)
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


def kernel_environment(workdir: Path, options: GradeOptions) -> Dict[str, str]:
    """What a submission's kernel gets added to its environment."""
    env = {"DLPERF_PROFILE": options.profile, "NBGRADER_EXECUTION": "autograde",
           # Everything the kernel's libraries write goes to its working directory.
           "HOME": str(workdir), "TMPDIR": str(workdir), "IPYTHONDIR": str(workdir / ".ipython"),
           "MPLCONFIGDIR": str(workdir / ".matplotlib")}
    if options.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


KERNEL_START_ATTEMPTS = 2


def _run_in_sandbox(rebuilt: Rebuilt, submission: Submission, source: SourceNotebook,
                    options: GradeOptions, spawner: Spawner,
                    phase: Callable[..., None]) -> Execution:
    """Run the rebuilt notebook in a fresh working directory, resource group and kernel,
    and remove them afterwards. ``phase(PREPARE)`` marks the end of the preparations."""
    workdir = prepare_workdir(submission, source)
    # Memory and processes of the kernel and all it starts, bounded by the Linux kernel.
    group = ResourceGroup.create(options.memory_limit, options.processes)
    policy = sandbox_policy(submission, source, workdir, options, group)
    handle, name = tempfile.mkstemp(prefix="kernel-", suffix=".log", dir=run_dir())
    os.close(handle)
    log = Path(name)  # the kernel's own stderr: why it failed to start, if it does
    phase(PREPARE)
    try:
        return execute(rebuilt.notebook, workdir,
                       parameters={"autograder_device": options.device,
                                   "autograder_profile": options.profile},
                       limits=options.limits, env=kernel_environment(workdir, options),
                       spawner=spawner, threads=options.threads, log=log,
                       sandbox=policy.to_dict(), memory_limit=options.memory_limit,
                       output_limit=options.output_limit, group=group)
    finally:
        if group is not None:
            group.close()
        log.unlink(missing_ok=True)
        if not options.keep_workdirs:
            shutil.rmtree(workdir, ignore_errors=True)


def grade_submission(submission: Submission, source: Optional[SourceNotebook],
                     options: GradeOptions, spawner: Spawner) -> SubmissionResult:
    """The one pipeline for one notebook: read it, rebuild it on the reference, run it in a
    sandboxed kernel of its own, run the trusted checks in a process of their own, judge
    every test. ``grade`` (here and on Dask workers) and ``check`` all call this.

    Nothing is written outside the grader's temporary run folder; reporting and the
    gradebook are the caller's. ``spawner`` starts the kernel and the checks process;
    ``options`` must be resolved (a runner's :meth:`Runner.resolve`).
    """
    if not options.resolved:
        raise ValueError(f"options with device {options.device!r} and profile "
                         f"{options.profile!r}: resolve them first (Runner.resolve)")
    start = time.perf_counter()
    phases: Dict[str, float] = {}
    mark = [start]  # when the phase under way began

    def phase(name: str, seconds: Optional[float] = None) -> None:
        """``name`` is over: it took ``seconds`` of the time since the last phase ended,
        else all of it. (Milliseconds, rounded down: the phases never add up to more.)"""
        took = time.perf_counter() - mark[0] if seconds is None else seconds
        mark[0] += took
        phases[name] = int(took * 1000) / 1000

    def finish(result: SubmissionResult) -> SubmissionResult:
        result.seconds = round(time.perf_counter() - start, 3)
        result.phases = phases
        return result

    def invalid(reason: str, tests: List[TestResult]) -> SubmissionResult:
        result = SubmissionResult(submission, INVALID, "", tests=tests, device=options.device)
        result.message = f"{reason}; {result.score:g}/{result.max_score:g} points" + (
            f"; {submission.note}" if submission.note else "")
        return finish(result)

    if source is None:
        return invalid(f"no notebook {submission.notebook!r} in assignment "
                       f"{submission.assignment!r}", [])
    try:
        raw = submitted_bytes(submission.path, submission.root)
        submitted, repairs = notebook_from_bytes(raw, max_cells=MAX_CELLS)
        seed = test_seed(source, raw)
        rebuilt = rebuild(source.graded_view, submitted, device=options.device,
                          profile=options.profile, seed=seed)
        rebuilt.notes[:0] = ([submission.note] if submission.note else []) + repairs
    except ValueError as error:
        zero = [TestResult(t.grade_id, t.points, 0.0, SKIPPED if t.skipped else FAILED,
                           "Not graded: the submission could not be read.", t.hidden)
                for t in planned_tests(source, options.device).tests]
        phase(READ)
        return invalid(str(error), zero)
    phase(READ)

    # A kernel that fails to start (say, its sandbox could not be made under load) ran none
    # of the learner's code: start a fresh one, once.
    for attempt in range(KERNEL_START_ATTEMPTS):
        execution = _run_in_sandbox(rebuilt, submission, source, options, spawner,
                                    phase if attempt == 0 else lambda *_: None)
        if execution.ended != "failed-to-start":
            break
    phase(KERNEL_START, min(execution.kernel_start, time.perf_counter() - mark[0]))
    phase(CELLS)  # the rest: the cells, stopping the kernel, removing its folder

    try:
        checked = trusted_checks(rebuilt, execution.notebook, options, spawner)
    except ChecksSetupError as error:  # the instructor's setup code failed: a grader problem
        phase(CHECKS)
        result = SubmissionResult(submission, ERROR, f"the grader could not run the checks: "
                                  f"{error}", device=options.device)
        return finish(result)
    phase(CHECKS)
    tests = judge(execution.notebook, rebuilt.tests, rebuilt.manual, stopped=execution.message,
                  checked=checked)
    stopped_by_a_limit = execution.ended in ("notebook-timeout", "unresponsive")
    # A cell interrupted at the cell limit matters only if some test lost points.
    costly = _timed_out_cells(execution.notebook) and any(
        t.counts and t.score < t.max_score for t in tests)
    if execution.ended in ("memory-limit", "output-limit"):
        status = ERROR
    elif stopped_by_a_limit or costly:
        status = TIMEOUT
    elif not execution.completed:
        status = ERROR
    else:
        status = GRADED
    result = SubmissionResult(submission, status, "", tests=tests, device=options.device,
                              executed=for_the_record(execution.notebook, rebuilt.tests, tests),
                              answered=rebuilt.answered, peak_memory=execution.peak_memory,
                              peak_processes=execution.peak_processes)
    result.message = _summary(result, execution, rebuilt.notes)
    phase(JUDGE)
    return finish(result)


class Runner(Protocol):
    """Where a run's submissions are graded: :class:`LocalRunner` here, or
    :class:`autograder.cluster.Cluster` on Dask workers. A runner owns the run's spawner(s)
    and is closed when the run ends (it is a context manager)."""

    def describe(self) -> str:
        """Where it grades, in words."""

    def threads(self) -> int:
        """Submissions graded at once."""

    def prepare(self, sources: Dict[str, SourceNotebook]) -> None:
        """Work done once per run before anything is written or any kernel starts."""

    def resolve(self, options: GradeOptions) -> GradeOptions:
        """``options`` as this runner grades with them: ``auto`` device and profile
        decided, the kernel kind its spawner has."""

    def grade(self, submissions: List[Submission], sources: Dict[str, SourceNotebook],
              options: GradeOptions,
              on_result: Optional[Callable[[SubmissionResult], None]] = None
              ) -> List[SubmissionResult]:
        """Every submission's result, in their order; ``on_result`` sees each as it comes."""

    def close(self) -> None:
        """Stop what the run started (fork servers)."""


class LocalRunner:
    """Grades on this machine: ``jobs`` submissions at once, each in its own kernel.

    It owns the run's spawner and closes it: the ``spawner`` given (``python -m autograder``
    opens one before its own slow imports), or one of the ``kernel`` kind that it opens
    (:func:`autograder.spawn.open_spawner`) at once when the ``notebooks`` to preload for
    are known, so a fork server imports while the caller works, else in :meth:`prepare`.
    """

    def __init__(self, jobs: int = 1, kernel: str = default("kernel"),
                 notebooks: Optional[Iterable[Path]] = None,
                 spawner: Optional[Spawner] = None):
        self.jobs = max(1, int(jobs))
        self.kernel = kernel
        self.spawner = spawner
        self._prepared: set = set()
        if spawner is None and notebooks is not None:
            self.spawner = open_spawner(kernel, kernel_preload(notebooks),
                                        process_environment())

    def threads(self) -> int:
        return self.jobs

    def kernel_threads(self) -> int:
        """CPU threads per kernel: this machine's cores shared by the jobs."""
        return max(1, available_cores() // self.jobs)

    def describe(self) -> str:
        return f"this machine, {self.jobs} job(s)"

    def _spawner(self, sources: Dict[str, SourceNotebook]) -> Spawner:
        if self.spawner is None:
            self.spawner = open_spawner(self.kernel,
                                        kernel_preload(s.path for s in sources.values()),
                                        process_environment())
        return self.spawner

    def prepare(self, sources: Dict[str, SourceNotebook]) -> None:
        key = tuple(sorted((name, str(s.path)) for name, s in sources.items()))
        if key in self._prepared:
            return
        self._spawner(sources)
        for source in sources.values():
            source.graded_view  # once, not concurrently in the threads
        self._prepared.add(key)

    def resolve(self, options: GradeOptions) -> GradeOptions:
        spawner = self._spawner({})
        options = options.resolve(lambda: cuda_available(spawner))
        return replace(options, kernel=spawner.kind,
                       threads=options.threads or self.kernel_threads())

    def grade(self, submissions: List[Submission], sources: Dict[str, SourceNotebook],
              options: GradeOptions,
              on_result: Optional[Callable[[SubmissionResult], None]] = None
              ) -> List[SubmissionResult]:
        """Grade every submission; ``on_result`` sees each as it finishes. Results come
        back in the order of ``submissions``."""
        self.prepare(sources)
        spawner = self._spawner(sources)
        results: Dict[int, SubmissionResult] = {}
        with ThreadPoolExecutor(max_workers=self.jobs, thread_name_prefix="grade") as pool:
            futures = {pool.submit(grade_submission, sub, sources.get(sub.notebook),
                                   options, spawner): index
                       for index, sub in enumerate(submissions)}
            for future in as_completed(futures):
                index = futures[future]
                try:
                    result = future.result()
                except Exception as error:  # a grader bug must still give the student a row
                    result = SubmissionResult(submissions[index], ERROR, f"the grader failed: "
                                              f"{type(error).__name__}: {error}",
                                              device=options.device)
                results[index] = result
                if on_result is not None:
                    on_result(result)
        return [results[i] for i in range(len(submissions))]

    def close(self) -> None:
        if self.spawner is not None:
            self.spawner.close()
            self.spawner = None

    def __enter__(self) -> "LocalRunner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
