"""Where a run's submissions are graded: the :class:`Runner` protocol, and
:class:`LocalRunner`, which grades on this machine (``jobs`` at a time, each submission in a
kernel of its own). :class:`autograder.runners.cluster.Cluster` is the other runner."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import replace
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Protocol

from autograder.layout import SourceNotebook, Submission
from autograder.options import GradeOptions, available_cores, default
from autograder.pipeline.grade import grade_submission
from autograder.pipeline.result import ERROR, SubmissionResult
from autograder.sandbox.device import cuda_available
from autograder.sandbox.imports import kernel_preload
from autograder.sandbox.policy import process_environment
from autograder.sandbox.spawn import Spawner, open_spawner

class Runner(Protocol):
    """Where a run's submissions are graded: :class:`LocalRunner` here, or
    :class:`autograder.runners.cluster.Cluster` on Dask workers. A runner owns the run's spawner(s)
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
    (:func:`autograder.sandbox.spawn.open_spawner`) at once when the ``notebooks`` to preload for
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

