"""Grade on a Dask cluster: one task per submission, each graded on a worker as it is locally.

``python -m autograder grade ... --scheduler ADDRESS`` connects to a running Dask scheduler
(:class:`Cluster`) and sends it one task per submission (:meth:`Cluster.grade`). The task,
:func:`grade_task`, runs on a worker and calls :func:`autograder.pipeline.grade.grade_submission`
there -- the same call a local run makes -- so a submission still runs in a kernel process of
its own, in a private working directory, under the same limits. Its
:class:`~autograder.pipeline.grade.SubmissionResult` travels back by pickle; ``grades.csv``, the
results, the executed notebooks and the gradebook are written here, by the client, exactly
as a local run writes them. Nothing but grading happens on the workers.

* Kernels: every worker process opens one spawner (a fork server, or fresh interpreters)
  for the client's connection, i.e. for one grading run (:class:`SpawnerPlugin`, registered
  with the scheduler, so workers that join later get one too), and closes it when the
  client disconnects or the worker stops. The kernels are confined by the same sandbox
  as locally, with the rights the worker process has.
* GPUs: with ``--device cuda`` each task asks for the worker resource ``GPU=1``, so only
  workers started with ``dask worker ADDRESS --resources GPU=1`` take it, one at a time per
  GPU; CPU grading goes to any worker.
* Dying workers: a worker that dies mid-task loses nothing, the scheduler gives its tasks to
  other workers. A task that was on ``allowed-failures + 1`` workers that all died (Dask's
  ``distributed.scheduler.allowed-failures``, 3 by default, a setting of the scheduler's)
  fails with ``KilledWorker``. The scheduler blames every task a dying worker held, also
  those only queued behind the culprit, so such a submission is sent once more as a new
  task; a second ``KilledWorker`` gives it an ``error`` row saying so, and the run goes on.
  A task that raises (a grader bug, a worker that cannot see the files) is tried again
  ``retries`` times, then gets an ``error`` row with the exception.
* Files: a worker reads the submission from the path the client found it at, and the
  assignment's support files from the course directory's path, so both must be at the same
  paths on every machine (a shared file system, or the same checkout at the same path). Each
  task checks that its worker sees the same submission notebook, the same support files and
  the same autograder code as the client (SHA-256 digests) and fails with
  :class:`FilesDiffer` instead of grading against something else.
"""
from __future__ import annotations

import functools
import hashlib
import os
import platform
import sys
import threading
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional

from autograder.pipeline.grade import GradeOptions, grade_submission
from autograder.pipeline.result import ERROR, SubmissionResult
from autograder.sandbox.imports import kernel_preload
from autograder.layout import SourceNotebook, Submission
from autograder.options import (KILLED_WORKER_ROUNDS, RETRIES, WORKERS_TIMEOUT, available_cores,
                      default)
from autograder.sandbox.policy import process_environment
from autograder.sandbox.spawn import PACKAGE_ROOT, Spawner, open_spawner

GPU = "GPU"                # the worker resource a --device cuda task asks for


class ClusterError(RuntimeError):
    """The cluster cannot grade this run (unreachable, no workers, no GPU workers)."""


class FilesDiffer(RuntimeError):
    """A worker sees other files (or other autograder code) than the client does."""


# --------------------------------------------------------------------------------------
# What the client and the workers compare
# --------------------------------------------------------------------------------------

def file_digest(path: Path) -> Optional[str]:
    """SHA-256 of a file's bytes; None when there is no such regular file (a link or a
    pipe is not followed or read: a submission is data, never a path to follow)."""
    import stat
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            return None
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _tree_digest(base: Path, paths: List[Path]) -> str:
    digest = hashlib.sha256()
    for path in sorted(paths):
        digest.update(str(path.relative_to(base)).encode() + b"\0")
        digest.update((file_digest(path) or "missing").encode() + b"\0")
    return digest.hexdigest()


@functools.lru_cache(maxsize=None)
def code_digest() -> str:
    """Digest of the autograder package's source as this process first saw it.

    Taken once per process (the modules are imported by then): a worker left running
    across a ``git pull`` keeps grading with the code it imported, and says so.
    """
    folder = PACKAGE_ROOT / "autograder"
    return _tree_digest(folder, list(folder.glob("*.py")))


# Versions that must be the same on the client and every worker (see guide/dask.md).
MATCHING = ("dask", "distributed", "torch", "numpy", "ipykernel", "nbclient", "nbformat",
            "nbgrader", "papermill")


def _public(version: str) -> str:
    return version.split("+")[0]  # torch 2.x+cu124 on a GPU worker, 2.x+cpu elsewhere


def facts(support_dirs: Dict[str, str]) -> Dict[str, object]:
    """What a machine runs and sees: versions, autograder code, the course's support files.

    ``support_dirs`` maps notebook names to their instructor notebook's path.
    """
    from importlib.metadata import PackageNotFoundError, version
    _quiet_worker()
    versions = {"python": platform.python_version()}
    for name in MATCHING:
        try:
            versions[name] = _public(version(name))
        except PackageNotFoundError:
            versions[name] = "not installed"
    support = {}
    for name, path in support_dirs.items():
        source = SourceNotebook(assignment="", name=name, path=Path(path), notebook=None)
        support[name] = (support_digest(source) if source.path.parent.is_dir()
                         else f"no folder {source.path.parent}")
    return {"versions": versions, "code": code_digest(), "support": support}


def support_digest(source: SourceNotebook) -> str:
    """Digest of the files a submission's working directory gets from the course."""
    return _tree_digest(source.path.parent, source.support_files())


@dataclass(frozen=True)
class RunSpec:
    """What every task of one run shares: the spawner plugin's name and the expected files."""
    plugin: str                           # the SpawnerPlugin's name
    code: str                             # code_digest() on the client
    support: Dict[str, str]               # notebook -> support_digest() on the client
    threads_by_host: Dict[str, int] = field(default_factory=dict)  # Dask threads per machine


_checked: set = set()  # (what, digest) pairs this worker process has already verified
_checked_lock = threading.Lock()


def _check_once(what: str, expected: str, compute: Callable[[], str], problem: str) -> None:
    with _checked_lock:
        if (what, expected) in _checked:
            return
    if compute() != expected:
        raise FilesDiffer(problem)
    with _checked_lock:
        _checked.add((what, expected))


def check_files(submission: Submission, source: Optional[SourceNotebook], spec: RunSpec,
                submitted: Optional[str], where: str) -> None:
    """Raise :class:`FilesDiffer` unless this machine sees what the client saw."""
    _check_once("code", spec.code, code_digest,
                f"the autograder code at {PACKAGE_ROOT} on {where} differs from the client's: "
                "run the same commit of the course repository on every machine")
    if source is not None and source.name in spec.support:
        _check_once(f"support:{source.path}", spec.support[source.name],
                    lambda: support_digest(source),
                    f"the assignment's files under {source.path.parent} on {where} differ from "
                    "the client's: the course directory must be at the same path everywhere")
    seen = file_digest(submission.path)
    if seen != submitted:
        state = "cannot see" if seen is None else ("sees a file at" if submitted is None
                                                   else "sees another")
        raise FilesDiffer(f"{where} {state} {submission.path}: the submissions folder must be "
                          "at the same path on every machine")


# --------------------------------------------------------------------------------------
# On the workers
# --------------------------------------------------------------------------------------

def _quiet_worker() -> None:
    """What ``python -m autograder`` does to its own process, done to a worker process."""
    import logging
    for name in ("papermill", "traitlets", "nbclient"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    # see cli._skip_unneeded_grammar: 2 s of CPU for a check nbformat never asks for
    sys.modules.setdefault("rfc3987_syntax", None)


try:
    from distributed.diagnostics.plugin import WorkerPlugin as _WorkerPluginBase
except ImportError:  # dask is optional: this module imports without it (the plugin is unused)
    _WorkerPluginBase = object


class SpawnerPlugin(_WorkerPluginBase):
    """One spawner per worker process, for one grading run.

    Opened in ``setup``, which runs on the worker's event-loop thread: a fork server asks
    to be signalled when the thread that started it ends (``PR_SET_PDEATHSIG``), and that
    thread lives as long as the worker process. Closed in ``teardown``, i.e. when the
    client unregisters the plugin as it closes its connection, or when the worker stops.
    """

    def __init__(self, kind: str, preload: List[str]):
        self.kind = kind
        self.preload = list(preload)
        self.spawner: Optional[Spawner] = None

    def setup(self, worker) -> None:
        _quiet_worker()
        # imports in the background; its processes get the environment the grader writes
        # from the worker's (see autograder.sandbox.policy), never the worker's own
        self.spawner = open_spawner(self.kind, self.preload, process_environment())

    def teardown(self, worker) -> None:
        spawner, self.spawner = self.spawner, None
        if spawner is not None:
            spawner.close()


def kernel_threads(worker, spec: RunSpec) -> int:
    """CPU threads per kernel: this machine's cores shared by the Dask threads on it."""
    from distributed.comm import get_address_host
    cores = available_cores()
    on_host = spec.threads_by_host.get(get_address_host(worker.address), worker.state.nthreads)
    return max(1, cores // max(1, on_host))


def grade_task(submission: Submission, source: Optional[SourceNotebook], options: GradeOptions,
               spec: RunSpec, submitted: Optional[str]) -> SubmissionResult:
    """The task run on a worker for one submission: check the files, then grade it."""
    from distributed import get_worker
    worker = get_worker()
    check_files(submission, source, spec, submitted, where=f"worker {worker.address}")
    spawner = worker.plugins[spec.plugin].spawner
    if options.threads is None:
        options = replace(options, threads=kernel_threads(worker, spec))
    return grade_submission(submission, source, options, spawner)


# --------------------------------------------------------------------------------------
# On the client
# --------------------------------------------------------------------------------------

def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


class Cluster:
    """A connection to a Dask scheduler that grades submissions on its workers."""

    def __init__(self, address: str, timeout: Optional[float] = None,
                 workers_timeout: float = WORKERS_TIMEOUT, retries: int = RETRIES,
                 kernel: str = default("kernel"), notebooks: Optional[Iterable[Path]] = None):
        """Connect; ``timeout`` defaults to Dask's ``distributed.comm.timeouts.connect`` (30 s).

        ``retries``: how often a task that raised is run again (worker deaths apart).
        ``kernel``: the kind of the workers' spawners, started at once when the
        ``notebooks`` to preload for are known (else by :meth:`prepare`)."""
        try:
            from distributed import Client
        except ImportError as error:
            raise ClusterError(f"grading on a cluster needs dask and distributed "
                               f"(pip install -r requirements.txt): {error}") from None
        self.address = address
        self.retries = retries
        self.kernel = kernel
        self.plugin: Optional[str] = None  # the SpawnerPlugin's name, once started
        self._checked: set = set()
        try:
            extra = {} if timeout is None else {"timeout": timeout}
            self.client = Client(address, set_as_default=False, **extra)
        except Exception as error:  # OSError, TimeoutError, ValueError for a bad address
            raise ClusterError(f"cannot reach the Dask scheduler at {address!r}: "
                               f"{_one_line(error)}") from None
        try:
            self.client.wait_for_workers(1, timeout=workers_timeout)
        except Exception:
            self.close()
            raise ClusterError(f"no worker joined the Dask scheduler at {address} within "
                               f"{workers_timeout:g} s: start some with `dask worker {address}`"
                               ) from None
        if notebooks is not None:
            self.start_spawners(kernel_preload(notebooks))

    def start_spawners(self, preload: List[str]) -> str:
        """Open a spawner on every worker (and any that joins) for this connection.

        Returns the plugin's name. Started once; call early and fork servers import in
        the background while the client prepares. Closed by :meth:`close`.
        """
        if self.plugin is None:
            name = f"autograder-spawner-{uuid.uuid4().hex[:12]}"
            self.client.register_plugin(SpawnerPlugin(self.kernel, preload), name=name)
            self.plugin = name
        return self.plugin

    def close(self) -> None:
        if self.plugin is not None:
            try:
                self.client.unregister_worker_plugin(self.plugin)
            except Exception:
                pass  # the workers close their fork servers when they stop
            self.plugin = None
        self.client.close()

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def workers(self) -> Dict[str, dict]:
        return self.client.scheduler_info(n_workers=-1)["workers"]

    def threads(self) -> int:
        """Tasks the workers run at once (their threads), now."""
        return sum(info.get("nthreads", 1) for info in self.workers().values())

    def prepare(self, sources: Dict[str, SourceNotebook]) -> None:
        """Once per run, before anything is written: the workers must run and see what
        we do; the spawners start; the graded views are computed here and sent along."""
        key = tuple(sorted((name, str(s.path)) for name, s in sources.items()))
        if key in self._checked:
            return
        self.check_workers(sources)
        self.start_spawners(kernel_preload(s.path for s in sources.values()))
        for source in sources.values():
            source.graded_view
        self._checked.add(key)

    def resolve(self, options: GradeOptions) -> GradeOptions:
        """``auto`` -> ``cuda`` when some worker offers a GPU resource; ``cuda`` needs one.
        Threads per kernel stay None: each worker shares its own machine's cores out."""
        if options.device == "cuda" and not self.gpu_workers():
            raise ClusterError(f"--device cuda, but no worker of the Dask scheduler at "
                               f"{self.address} offers a {GPU} resource: start GPU workers "
                               f"with `dask worker {self.address} --resources {GPU}=1`")
        return replace(options.resolve(lambda: bool(self.gpu_workers())), kernel=self.kernel)

    def threads_by_host(self) -> Dict[str, int]:
        from distributed.comm import get_address_host
        found: Dict[str, int] = {}
        for address, info in self.workers().items():
            host = get_address_host(address)
            found[host] = found.get(host, 0) + info.get("nthreads", 1)
        return found

    def gpu_workers(self) -> List[str]:
        return sorted(address for address, info in self.workers().items()
                      if info.get("resources", {}).get(GPU, 0) >= 1)

    def check_workers(self, sources: Dict[str, SourceNotebook]) -> None:
        """Raise :class:`ClusterError` unless every worker runs and sees what we do."""
        paths = {name: str(source.path) for name, source in sources.items()}
        ours = facts(paths)
        try:
            theirs = self.client.run(facts, paths)
        except Exception as error:
            raise ClusterError(f"could not ask the workers what they run ({_one_line(error)}): "
                               "start them from the course checkout with PYTHONPATH set to it"
                               ) from None
        problems = []
        for worker, found in sorted(theirs.items()):
            for name, value in ours["versions"].items():
                if found["versions"].get(name) != value:
                    problems.append(f"{worker} has {name} {found['versions'].get(name)}, "
                                    f"the client {value}")
            if found["code"] != ours["code"]:
                problems.append(f"{worker} runs other autograder code (another commit, or "
                                "started before the last change: restart it)")
            for name, digest in ours["support"].items():
                if found["support"].get(name) != digest:
                    problems.append(f"{worker} sees other files beside {paths[name]}")
        if problems:
            shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more"
                                               if len(problems) > 5 else "")
            raise ClusterError(f"the workers differ from this machine: {shown}")

    def describe(self) -> str:
        workers = self.workers()
        gpus = len(self.gpu_workers())
        return (f"the Dask scheduler at {self.address} ({len(workers)} worker(s), "
                f"{self.threads()} thread(s)" + (f", {gpus} with a GPU" if gpus else "") + ")")

    def grade(self, submissions: List[Submission], sources: Dict[str, SourceNotebook],
              options: GradeOptions,
              on_result: Optional[Callable[[SubmissionResult], None]] = None,
              task: Callable = grade_task) -> List[SubmissionResult]:
        """Grade every submission on the workers; ``on_result`` sees each as it comes back.

        Results come back in the order of ``submissions``. ``task`` is what runs on a
        worker (:func:`grade_task`, or a test's wrapper around it).
        """
        from distributed import as_completed
        if not submissions:
            return []
        self.prepare(sources)
        run = uuid.uuid4().hex[:12]
        spec = RunSpec(plugin=self.plugin, code=code_digest(),
                       support={name: support_digest(s) for name, s in sources.items()},
                       threads_by_host=self.threads_by_host())
        resources = {GPU: 1} if options.device == "cuda" else None
        futures: Dict[object, int] = {}
        attempts = [0] * len(submissions)
        results: Dict[int, SubmissionResult] = {}

        def submit(index: int):
            sub = submissions[index]
            attempts[index] += 1
            # The worker reads the file at the same absolute path (the cwd is ours alone).
            # The instructor's notebook goes with every task, not scattered once: data kept
            # on workers is lost with them, the task's own arguments are not.
            future = self.client.submit(
                task, replace(sub, path=sub.path.absolute()), sources.get(sub.notebook),
                options, spec, file_digest(sub.path),
                key=f"grade-{run}-{index:06d}.{attempts[index]}-{sub.key}",
                pure=False, retries=self.retries, resources=resources)
            futures[future] = index
            return future

        try:
            pending = as_completed([submit(i) for i in range(len(submissions))],
                                   loop=self.client.loop)
            for future in pending:
                index = futures.pop(future)
                result = self._result(future, submissions[index], options, attempts[index])
                future.release()  # the worker may forget it now
                if result is None:  # its workers died: once more, as a new task
                    pending.add(submit(index))
                    continue
                result.submission = submissions[index]
                results[index] = result
                if on_result is not None:
                    on_result(result)
        finally:
            if futures:  # interrupted: the cluster should not go on grading for nobody
                self.client.cancel(list(futures))
        return [results[i] for i in range(len(submissions))]

    @staticmethod
    def _result(future, submission: Submission, options: GradeOptions,
                attempt: int) -> Optional[SubmissionResult]:
        """The task's result, an error result, or None to submit it again."""
        from distributed import KilledWorker
        try:
            return future.result()
        except KilledWorker as error:
            # The scheduler blames every task a dying worker held, also those waiting
            # behind the one that killed it: one more round tells them apart.
            if attempt < KILLED_WORKER_ROUNDS:
                return None
            message = (f"not graded: the Dask worker grading it died on each of "
                       f"{attempt * (error.allowed_failures + 1)} tries (KilledWorker, last "
                       f"on {error.last_worker.address}); the submission may crash or exhaust "
                       "the machine it runs on")
        except FilesDiffer as error:
            message = f"not graded: {error}"
        except Exception as error:  # a grader bug or a lost task must still give a row
            message = f"the grader failed on the cluster: {_one_line(error)}"
        return SubmissionResult(submission, ERROR, message, device=options.device)
