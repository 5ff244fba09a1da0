"""Grade one submission: one notebook in, one :class:`~autograder.pipeline.result.SubmissionResult` out.

:func:`grade_submission` is the one pipeline for one notebook -- read it, rebuild it on
the reference (:mod:`.rebuild`), run it in a sandboxed kernel and a private working
directory (:mod:`.execute`), run the trusted checks in a process of their own
(:mod:`.checks`), judge each test (:mod:`.judge`) -- under one
:class:`~autograder.options.GradeOptions`. It returns a plain result object without
writing anything outside the grader's temporary run folder; reporting and the gradebook
are the caller's. A runner decides where it runs (:mod:`autograder.runners`); ``check``
calls it for one notebook.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import nbformat

from autograder.layout import SourceNotebook, Submission, notebook_from_bytes, submitted_bytes
from autograder.options import MAX_CELLS, GradeOptions
from autograder.pipeline.checks import evidence_of
from autograder.pipeline.checks_process import ChecksSetupError, run_checks_isolated
from autograder.pipeline.execute import CleanPlace, Execution, execute
from autograder.pipeline.judge import FAILED, SKIPPED, TestResult, judge
from autograder.pipeline.rebuild import Rebuilt, rebuild
from autograder.pipeline.result import (CELLS, CHECKS, ERROR, GRADED, INVALID, JUDGE, KERNEL_START,
                                        PREPARE, READ, TIMEOUT, SubmissionResult, for_the_record,
                                        summary, timed_out_cells)
from autograder.sandbox.cgroups import ResourceGroup
from autograder.sandbox.spawn import Spawner
from autograder.sandbox.workdir import (clean_workdir, kernel_environment, prepare_workdir,
                                        run_dir, sandbox_policy)


def planned_tests(source: SourceNotebook, device: str) -> Rebuilt:
    """The tests of ``source`` as a submission would get them (for max scores, preloads)."""
    return rebuild(source.graded_view, source.graded_view, device=device)


def trusted_checks(rebuilt: Rebuilt, executed: nbformat.NotebookNode, options: GradeOptions,
                   spawner: Spawner) -> Dict[str, object]:
    """Run the checks of every split test on what its probe reported, in a process of
    this submission's own (see :func:`autograder.pipeline.checks_process.run_checks_isolated`)."""
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
    speed_tests = {t.cell_id: t.speed for t in rebuilt.tests if t.speed and not t.skipped}

    def clean_place() -> CleanPlace:
        """A speed test's clean kernel's place: the same limits, no file of the learner's."""
        folder = clean_workdir(source)
        clean_group = ResourceGroup.create(options.memory_limit, options.processes)

        def close() -> None:
            if clean_group is not None:
                clean_group.close()
            shutil.rmtree(folder, ignore_errors=True)
        rules = sandbox_policy(submission, source, folder, options, clean_group)
        return CleanPlace(folder, clean_group, rules.to_dict(),
                          kernel_environment(folder, options), close)
    try:
        return execute(rebuilt.notebook, workdir,
                       parameters={"autograder_device": options.device,
                                   "autograder_profile": options.profile},
                       limits=options.limits, env=kernel_environment(workdir, options),
                       spawner=spawner, threads=options.threads, log=log,
                       sandbox=policy.to_dict(), memory_limit=options.memory_limit,
                       output_limit=options.output_limit, group=group,
                       speed_tests=speed_tests, seed=rebuilt.seed, clean_place=clean_place)
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
                  checked=checked, timed=execution.speed)
    stopped_by_a_limit = execution.ended in ("notebook-timeout", "unresponsive")
    # A cell interrupted at the cell limit matters only if some test lost points.
    costly = timed_out_cells(execution.notebook) and any(
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
    result.message = summary(result, execution, rebuilt.notes)
    phase(JUDGE)
    return finish(result)


