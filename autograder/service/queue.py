"""The service's graders: take queued uploads in fair order and grade each on the one
pipeline, exactly as ``python -m autograder grade`` does.

Each upload becomes a :class:`~autograder.layout.Submission` and goes through the
runner's ``grade``, one upload a call, ``jobs`` at a time: :class:`~autograder.pipeline.grade.LocalRunner`
(its sandbox, its spawner, :func:`~autograder.pipeline.grade.grade_submission`) or, with ``serve
--scheduler``, :class:`~autograder.runners.cluster.Cluster`, whose workers run the same function on
the upload at its path here (so they must see the service's files at the same path). Its results are written
by :mod:`autograder.pipeline.report` into a folder of that upload's own; the attempt that counts goes into
nbgrader's gradebook (:mod:`autograder.pipeline.gradebook`); then the row is committed ``done``. A service
killed before that commit grades the upload again at its next start; writing the files
and the gradebook again replaces what the first try wrote, so nothing is counted twice.

Nothing stops the graders but the service's own stop: an error of the database or the
disk (unreadable, locked, full) is logged once, the upload it met goes back to the queue,
and the graders wait a little longer each time (:data:`~.options.SERVICE_ERROR_BACKOFF`)
before they try again. A learner has at most ``learner_jobs`` uploads graded at once.
Once an upload is graded, the files of that learner's older attempts past the
assignment's ``keep_files`` are removed (never those of the attempt that counts); their
rows, scores and feedback stay.
"""
from __future__ import annotations

import json
import sqlite3
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Dict, List, Optional

from autograder.feedback import shown_tests
from autograder.layout import Course, SourceNotebook, Submission
from autograder.options import SERVICE_ERROR_BACKOFF, SERVICE_POLL, GradeOptions, ServiceLimits
from autograder.service.board import measured_speeds
from autograder.service.config import Rules
from autograder.service.db import DONE, Row, Store

TROUBLE = (OSError, sqlite3.Error)  # the disk's or the database's, not the upload's: retried


class GradingFailed(Exception):
    """The runner could not grade an upload (whatever the error): it gets an error result,
    and is not retried (an upload that always fails must not pause every grader)."""


def graded_folder(files: Path, row: Row) -> Path:
    """Where one upload's results go: ``FILES/graded/<id>/<student>/<assignment>/``."""
    return Path(files) / "graded" / str(row.id)


class Graders:
    """``runner.threads()`` graders over the store's queue, in threads of this process."""

    def __init__(self, store: Store, runner, course: Course,
                 sources: Dict[str, Dict[str, SourceNotebook]], options: GradeOptions,
                 rules: Dict[str, Rules], files: Path, gradebook: Optional[str] = None,
                 on_done: Optional[Callable[[Row], None]] = None,
                 on_change: Optional[Callable[[int], None]] = None,
                 limits: ServiceLimits = ServiceLimits()):
        self.store, self.runner, self.course = store, runner, course
        self.sources, self.options, self.rules = sources, options, rules
        self.files, self.gradebook, self.on_done = Path(files), gradebook, on_done
        self.on_change = on_change  # called with an upload's id once its state is committed
        self.limits = limits
        self.last_claim: Optional[float] = None  # when a grader last took an upload
        self.last_error: Optional[str] = None    # the error met last, while it lasts
        self._backoff = 0.0                      # seconds to wait before the next try
        self._resume = 0.0                       # monotonic time before which none is taken
        self._trouble_lock = threading.Lock()
        # Uploads graded at once: the runner's threads when the service starts. On a Dask
        # cluster (a Cluster runner, one upload per task) that is the workers' threads then:
        # a worker that joins later shares the tasks, or replaces one that left, but does
        # not raise the number until the service restarts. Claiming more than the threads
        # would only queue uploads inside Dask, out of the fair order and out of sight of
        # the queue page; with fewer threads left, the extra tasks wait there for a worker.
        self.jobs = max(1, runner.threads())
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._slots = threading.Semaphore(self.jobs)
        self._gradebook_lock = threading.Lock()
        self._writer = None           # the gradebook, opened once (under the lock)
        self._registered: set = set()  # assignments registered in it
        # twice the jobs: an upload's results are written, and committed, while the next
        # one is graded (the slots, not the pool, limit the gradings to ``jobs``)
        self._pool = ThreadPoolExecutor(max_workers=2 * self.jobs, thread_name_prefix="service")
        self._thread = threading.Thread(target=self._dispatch, name="service-queue",
                                        daemon=True)

    def start(self) -> None:
        for sources in self.sources.values():
            self.runner.prepare(sources)
        self.store.requeue_interrupted()
        self._thread.start()

    def wake(self) -> None:
        """Something was queued: look now rather than at the next poll."""
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5)
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._gradebook_lock:
            self._close_gradebook()

    def _close_gradebook(self) -> None:
        if self._writer is not None:
            writer, self._writer = self._writer, None
            self._registered.clear()
            writer.close()

    def alive(self) -> bool:
        """Whether the thread that hands uploads to the graders runs."""
        return self._thread.is_alive()

    def _trouble(self, what: str, error: BaseException) -> None:
        """An error of the disk or the database: say it once (and again only when it
        changes), and wait longer before the next try, up to the longest backoff."""
        first, longest = SERVICE_ERROR_BACKOFF
        message = f"{what}: {type(error).__name__}: {error}"
        with self._trouble_lock:
            self._backoff = min(longest, self._backoff * 2) if self._backoff else first
            self._resume = time.monotonic() + self._backoff
            if message != self.last_error:
                print(f"service: {message} (trying again in {self._backoff:g} s, then less "
                      "often while it lasts)", file=sys.stderr, flush=True)
                if not isinstance(error, TROUBLE):
                    traceback.print_exception(error)
            self.last_error = message

    def _untroubled(self) -> None:
        with self._trouble_lock:
            if self.last_error is not None:
                print("service: working again", file=sys.stderr, flush=True)
            self._backoff, self.last_error = 0.0, None

    def _dispatch(self) -> None:
        while not self._stop.is_set():
            pause = self._resume - time.monotonic()
            if pause > 0:
                self._stop.wait(pause)
                continue
            self._slots.acquire()
            try:
                row = None if self._stop.is_set() else \
                    self.store.claim_next(self.limits.learner_jobs)
            except BaseException as error:  # even a bug here must not stop the graders
                self._slots.release()
                self._trouble("taking the next upload", error)
                continue
            if row is None:
                self._slots.release()
                self._wake.wait(SERVICE_POLL)
                self._wake.clear()
                continue
            self.last_claim = time.time()
            try:
                self._changed(row.id)
                self._pool.submit(self._grade_and_release, row)
            except BaseException as error:  # (stopping: the pool is shut)
                self._slots.release()
                self._trouble(f"handing upload {row.id} to a grader", error)
                self._put_back(row)

    def _changed(self, submission_id: int) -> None:
        if self.on_change is not None:
            self.on_change(submission_id)

    def _grade_and_release(self, row: Row) -> None:
        released = []

        def release() -> None:  # the slot, once: when graded, before the bookkeeping
            if not released:
                released.append(True)
                self._slots.release()
                self._wake.set()
        try:
            try:
                self.grade(row, graded=release)
            except TROUBLE:
                raise
            except Exception as error:  # a service bug: the upload still gets a result
                traceback.print_exc()
                why = str(error) if isinstance(error, GradingFailed) else \
                    f"{type(error).__name__}: {error}"
                self._failed(row, f"the service failed: {why}")
            self._untroubled()
        except BaseException as error:  # the disk or the database: graded again later
            release()
            self._trouble(f"grading upload {row.id}", error)
            self._put_back(row)
        finally:
            release()

    def _put_back(self, row: Row) -> None:
        """Queue the row again, however long the database takes to come back."""
        while True:
            try:
                self.store.put_back(row.id)
                break
            except BaseException as error:
                self._trouble(f"queueing upload {row.id} again", error)
                if self._stop.wait(max(0.1, self._resume - time.monotonic())):
                    return  # stopping: the next start queues it again
        self._changed(row.id)
        self._wake.set()

    def submission(self, row: Row) -> Submission:
        path = Path(row.path)
        return Submission(row.student, row.assignment, row.notebook, path,
                          root=self.files / "uploads")

    def grade(self, row: Row, graded: Optional[Callable[[], None]] = None) -> None:
        """Grade one claimed row and commit its result (the one way a row gets one);
        ``graded`` is called once the grading is over, before its results are written."""
        from autograder.pipeline.report import csv_row, gradescope, write_submission
        sources = self.sources[row.assignment]
        try:
            result = self.runner.grade([self.submission(row)], sources, self.options)[0]
        except Exception as error:
            raise GradingFailed(f"{type(error).__name__}: {error}") from error
        if graded is not None:
            graded()
        rules = self.rules[row.assignment]
        penalty = rules.penalty(result.score, row.days_late)
        if penalty:
            result.message += (f"; handed in {row.days_late} day(s) late: {penalty:g} "
                               f"point(s) off, {result.score - penalty:g} count")
        out = graded_folder(self.files, row)
        written = write_submission(result, out)
        results = next(p for p in written if p.name.endswith(".results.json"))
        executed = next((p for p in written if p.suffix == ".ipynb"), None)
        line = csv_row(result)
        line["score"] = f"{result.score - penalty:g}"
        if self.gradebook:
            self._record(row, result, penalty)
        shown = gradescope(result)  # what results.json holds
        self.store.finish(row.id, status=result.status, score=result.score,
                          max_score=result.max_score, penalty=penalty,
                          message=result.message, seconds=result.seconds,
                          phases=json.dumps(result.phases),
                          csv_row=json.dumps(line), results=str(results),
                          tests=json.dumps(shown_tests(shown)),
                          speeds=json.dumps(measured_speeds(shown)),
                          executed=str(executed) if executed else None)
        self._changed(row.id)
        try:
            self.prune(row)
        except TROUBLE as error:
            self._trouble(f"removing old attempts' files of upload {row.id}", error)
        if self.on_done is not None:
            self.on_done(row)

    def prune(self, row: Row) -> List[Path]:
        """Remove the notebooks (the upload, the executed copy) of the learner's attempts
        of this notebook older than the last ``keep_files``, except the one that counts
        and any not graded yet. Returns the files removed."""
        rules = self.rules[row.assignment]
        attempts = self.store.rows("WHERE student = ? AND assignment = ? AND notebook = ? "
                                   "ORDER BY attempt", (row.student, row.assignment,
                                                        row.notebook))
        counted = self.store.counted(row.student, row.assignment, row.notebook, rules.counts)
        removed = []
        for old in attempts[:-rules.keep_files]:
            if old.state != DONE or (counted is not None and old.id == counted.id):
                continue
            for name in (old.path, old.executed):
                path = Path(name) if name else None
                if path is not None and path.is_file():
                    path.unlink()
                    removed.append(path)
        return removed

    def _failed(self, row: Row, message: str) -> None:
        from autograder.pipeline.result import ERROR, SubmissionResult
        from autograder.pipeline.report import csv_row
        result = SubmissionResult(self.submission(row), ERROR, message)
        self.store.finish(row.id, status=ERROR, score=0.0, max_score=0.0, penalty=0.0,
                          message=message, seconds=0.0, csv_row=json.dumps(csv_row(result)),
                          speeds=None)  # (a regrade that failed: on no board meanwhile)
        self._changed(row.id)

    def _record(self, row: Row, result, penalty: float) -> None:
        """Put the result into nbgrader's gradebook if it is the attempt that counts."""
        rule = self.rules[row.assignment].counts
        counted = self.store.counted(row.student, row.assignment, row.notebook, rule)
        if counted is not None and counted.id != row.id:
            mine = result.score - penalty
            if rule == "last" and counted.attempt > row.attempt:
                return
            if rule == "best" and (counted.counted_score or 0.0, counted.attempt) > (
                    mine, row.attempt):
                return
        from autograder.pipeline.gradebook import GradebookWriter
        with self._gradebook_lock:
            # One writer for the service's life: opening nbgrader's gradebook (its engine,
            # its schema check) and registering the assignment took some 0.15 s per upload,
            # in the grading slot (benchmarks/submit_load.py)
            try:
                if self._writer is None:
                    self._writer = GradebookWriter(self.gradebook,
                                                   course_id=self.course.course_id)
                if row.assignment not in self._registered:
                    self._writer.register_assignment(row.assignment,
                                                     self.sources[row.assignment])
                    self._registered.add(row.assignment)
                self._writer.record(result)
            except Exception:
                self._close_gradebook()  # open it afresh for the next upload
                raise
