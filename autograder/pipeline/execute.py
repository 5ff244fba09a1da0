"""Run one rebuilt notebook through papermill, in its own kernel and working directory.

Three things make this differ from a plain ``papermill.execute_notebook``:

* every cell runs even after an earlier one raised (``allow_errors``), so each test
  cell is judged on its own: a learner's unfinished exercise 2 must not cost the
  points of exercise 3;
* a cell that runs past the per-cell limit is interrupted (KeyboardInterrupt in the
  kernel) and recorded as a ``CellTimeoutError`` output; the run goes on with the
  next cell;
* a watchdog kills the kernel's whole process group when the per-notebook limit is
  reached; the cells not reached yet keep no outputs, and the judge reports them as
  not run.
* each cell records how the kernel answered it (its ``execute_reply`` status: ``ok``,
  ``error`` or ``aborted``) in ``metadata.autograder.reply``; a cell whose reply says it
  raised but that shows no error (the message could not be sent, or the learner's own
  exception handler swallowed it) gets an error output made from the reply. A plain test
  passes only on that positive evidence (see :mod:`.judge`).

The notebook object is executed in memory and returned whatever happened; nothing is
written next to the learner's files, so the test code (hidden tests included) never
lands in the kernel's working directory.
"""
from __future__ import annotations

import copy
import functools
import logging
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Optional

import nbformat

from autograder.pipeline.speed import SpeedTest
from autograder.pipeline.timing import SetupProblem, SpeedRun, TimedKernel, measure
from autograder.protocol import REPLY_KEY, TIMEOUT_ENAME, reply_status
from autograder.sandbox.cgroups import ResourceGroup
from autograder.sandbox.kernel_manager import KernelLaunch, manager_class
from autograder.options import FLOOD_FACTOR, KERNEL_START_TIMEOUT, MEMORY_POLL, Limits, default
from autograder.sandbox.processes import memory_of
from autograder.sandbox.spawn import Spawner

KERNEL_NAME = "python3"


@dataclass
class Execution:
    """What running one notebook gave: the executed notebook and how the run ended."""
    notebook: nbformat.NotebookNode
    seconds: float
    ended: str     # completed, notebook-timeout, unresponsive, kernel-died, failed-to-start,
    #                memory-limit or output-limit
    message: str   # one line for the grades table; empty when completed
    peak_memory: int = 0  # bytes: the most the kernel and its processes held at once
    peak_processes: int = 0  # the most processes and threads it had at once (0: unknown)
    kernel_start: float = 0.0  # seconds of ``seconds`` until the kernel answered (all of
    #                            them if it never did); the rest ran the cells and stopped it
    speed: Dict[str, dict] = field(default_factory=dict)  # by cell id: what timing measured

    @property
    def completed(self) -> bool:
        return self.ended == "completed"


def _prepare_for_papermill(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The metadata papermill's own loader would add (it reads files; we pass a node)."""
    nb = nbformat.v4.upgrade(nb) or nb
    nb.metadata.setdefault("papermill", {"default_parameters": {}, "parameters": {},
                                         "environment_variables": {}})
    for cell in nb.cells:
        cell.metadata.setdefault("tags", [])
        cell.metadata.setdefault("papermill", {})
    return nb


def _printable(text) -> str:
    """``text`` without what JSON in UTF-8 cannot carry (lone surrogates)."""
    return str(text or "").encode("utf-8", "replace").decode("utf-8")


def _record_reply(cell, execute_reply, **_) -> None:
    """Keep the kernel's answer to the cell, and make every error it reports visible.

    After a per-cell timeout the cell shows the KeyboardInterrupt our interrupt caused;
    say what really happened instead (nbclient only puts it in the reply). A reply with
    status ``error`` but no error output is an error that never reached us as an output:
    its message could not be encoded, or a handler set with ``set_custom_exc`` hid it."""
    content = (execute_reply or {}).get("content", {})
    status = content.get("status")
    cell.metadata[REPLY_KEY] = {"reply": status if isinstance(status, str) else None}
    if content.get("ename") == TIMEOUT_ENAME:
        cell.outputs = [o for o in cell.get("outputs", [])
                        if not (o.get("output_type") == "error"
                                and o.get("ename") == "KeyboardInterrupt")]
        cell.outputs.append(nbformat.v4.new_output(
            "error", ename=TIMEOUT_ENAME, evalue=content.get("evalue", ""), traceback=[]))
    elif status != "ok" and not any(o.get("output_type") == "error"
                                    for o in cell.get("outputs", [])):
        why = (f"the kernel answered {status!r} but showed no error: it raised one that "
               "could not be shown")
        evalue = _printable(content.get("evalue"))
        cell.outputs.append(nbformat.v4.new_output(
            "error", ename=_printable(content.get("ename")) or "Error", traceback=[],
            evalue=f"{evalue} ({why})" if evalue else why))


def _last_started(nb: nbformat.NotebookNode) -> str:
    """Name the last cell sent to the kernel (by its nbgrader grade_id if it has one)."""
    started = [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code"
               and c.metadata.get("papermill", {}).get("start_time") is not None]
    if not started:
        return "the first cell"
    index, cell = started[-1]
    grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
    return f"cell {grade_id!r}" if grade_id else f"cell {index + 1} of the executed notebook"


ENGINE = "autograder"  # our papermill engine, registered once (see _register_engine)


def _output_size(msg: dict) -> int:
    content = msg.get("content", {})
    size = len(str(content.get("text", "")))
    for value in (content.get("data") or {}).values():
        size += len(value) if isinstance(value, str) else len(str(value))
    return size + sum(len(str(line)) for line in content.get("traceback", []))


@functools.lru_cache(maxsize=None)
def _register_engine() -> str:
    """Register the autograder's papermill engine, once per process.

    papermill's way of extending: one engine, with each run's own limits passed as keyword
    arguments through ``execute_notebook_with_engine`` (``output_limit``, ``on_flood``).
    The engine builds a notebook client that keeps at most ``output_limit`` bytes of
    output (one note says the rest was dropped) and calls ``on_flood`` once a kernel has
    printed ``FLOOD_FACTOR`` times that, so printing gigabytes costs the grader neither
    memory nor time.
    """
    from papermill.clientwrap import PapermillNotebookClient
    from papermill.engines import NBClientEngine, papermill_engines
    from papermill.utils import merge_kwargs, remove_args

    from nbclient.util import run_sync

    class CappedClient(PapermillNotebookClient):
        def __init__(self, nb_man, *, output_limit: int, on_flood, speed=None, **kwargs):
            super().__init__(nb_man, **kwargs)
            self.output_limit, self.on_flood = output_limit, on_flood
            self.kept, self.noted = 0, False
            self.speed: Optional[SpeedRun] = speed

        async def async_execute_cell(self, cell, cell_index, execution_count=None,
                                     store_history=True):
            cell = await super().async_execute_cell(cell, cell_index, execution_count,
                                                    store_history)
            run = self.speed
            if run is not None and cell.get("id") in run.tests and reply_status(cell) == "ok":
                learner = TimedKernel(self.kc, run.group, run.exchange,
                                      self.km.interrupt_kernel, freeze_between=True)
                test = run.tests[cell["id"]]
                run.results[cell["id"]] = await measure(
                    test, run.device, run.seed, learner, run.start_clean, test.clean_source)
            return cell

        execute_cell = run_sync(async_execute_cell)

        def output(self, outs, msg, display_id, cell_index):
            self.kept += _output_size(msg)
            if self.kept <= self.output_limit:
                return super().output(outs, msg, display_id, cell_index)
            if self.kept > FLOOD_FACTOR * self.output_limit:
                self.on_flood()
            if not self.noted:
                self.noted = True
                outs.append(nbformat.v4.new_output(
                    "stream", name="stderr",
                    text=f"[the autograder dropped further output: more than "
                         f"{self.output_limit // 1024} KiB]\n"))
            return None

    class CappedEngine(NBClientEngine):
        @classmethod
        def execute_managed_notebook(cls, nb_man, kernel_name, log_output=False,
                                     stdout_file=None, stderr_file=None,
                                     start_timeout=KERNEL_START_TIMEOUT,
                                     execution_timeout=None, **kwargs):
            kwargs = remove_args(["input_path", "timeout", "startup_timeout"], **kwargs)
            final = merge_kwargs(kwargs, timeout=execution_timeout, startup_timeout=start_timeout,
                                 kernel_name=kernel_name, log=logging.getLogger("papermill"),
                                 log_output=log_output, stdout_file=stdout_file,
                                 stderr_file=stderr_file)
            return CappedClient(nb_man, **final).execute()

    papermill_engines.register(ENGINE, CappedEngine)
    return ENGINE


def _watch_memory(launch: KernelLaunch, limit: int, done: threading.Event, seen: dict) -> None:
    """Poll the kernel's memory; kill it past ``limit`` bytes (the rlimit's back-up where
    no resource group bounds it)."""
    while not done.wait(MEMORY_POLL):
        pid = launch.pid
        if not pid:
            continue
        used = memory_of(pid)
        seen["peak"] = max(seen.get("peak", 0), used)
        if used > limit:
            seen["over"] = True
            launch.kill()
            return


@dataclass
class CleanPlace:
    """Where a speed test's clean kernel runs: nothing of the learner's is in it."""
    workdir: Path
    group: Optional[ResourceGroup]
    sandbox: Optional[dict]
    env: Dict[str, str]
    close: Callable[[], None]


def _launch(workdir: Path, spawner: Spawner, env: Optional[Dict[str, str]],
            threads: Optional[int], log: Optional[Path],
            sandbox: Optional[dict]) -> KernelLaunch:
    sockets = None
    if sandbox:  # the kernel's Unix sockets: a folder of their own beside its working one
        sockets = Path(tempfile.mkdtemp(prefix="ipc-", dir=Path(workdir).parent))
        sandbox = {**sandbox, "sockets": str(sockets)}
    return KernelLaunch(cwd=Path(workdir), spawner=spawner, env=dict(env or {}),
                        threads=threads, log=str(log) if log else None, sandbox=sandbox,
                        sockets=sockets)


def _stop(launch: KernelLaunch) -> None:
    launch.stop()  # the kernel, and everything it started
    if launch.sockets is not None:
        shutil.rmtree(launch.sockets, ignore_errors=True)


def _exchange(launch: KernelLaunch) -> Path:
    """A folder the kernel reads and writes at the same path: its sockets' (in a sandbox),
    else one beside its working directory (removed with the working directory's parent run)."""
    if launch.sockets is not None:
        return Path(launch.sockets)
    return Path(tempfile.mkdtemp(prefix="exchange-", dir=Path(launch.cwd).parent))


def _clean_kernels(place: Callable[[], CleanPlace], spawner: Spawner,
                   threads: Optional[int]):
    """A function that starts a clean kernel for a speed test (see :mod:`.timing`)."""
    async def start() -> TimedKernel:
        where = place()
        launch = _launch(where.workdir, spawner, where.env, threads, None, where.sandbox)
        manager = manager_class(launch)(kernel_name=KERNEL_NAME)
        client = None

        def close() -> None:
            if client is not None:
                client.stop_channels()
            _stop(launch)
            where.close()
        try:
            await manager.start_kernel()
            client = manager.client()
            client.start_channels()
            await client.wait_for_ready(timeout=KERNEL_START_TIMEOUT)
        except Exception as error:
            close()
            raise SetupProblem(f"a clean kernel did not start: {type(error).__name__}: "
                               f"{error}") from None
        # Kept still between requests as the learner's is, so both wake alike.
        return TimedKernel(client, where.group, _exchange(launch), manager.interrupt_kernel,
                           freeze_between=True, on_close=close)
    return start


def execute(nb: nbformat.NotebookNode, workdir: Path, *, parameters: Dict[str, object],
            spawner: Spawner, limits: Limits = Limits(),
            env: Optional[Dict[str, str]] = None, threads: Optional[int] = None,
            log: Optional[Path] = None, sandbox: Optional[dict] = None,
            memory_limit: Optional[int] = None,
            output_limit: int = default("output_limit"),
            group: Optional[ResourceGroup] = None,
            speed_tests: Optional[Dict[str, SpeedTest]] = None, seed: int = 0,
            clean_place: Optional[Callable[[], CleanPlace]] = None) -> Execution:
    """Execute ``nb`` with papermill in a new kernel whose working directory is ``workdir``.

    ``parameters`` go into the notebook the papermill way (an ``injected-parameters``
    cell after the cell tagged ``parameters``); ``env`` is added to the kernel's
    environment; ``spawner`` starts the kernel's process (forked or fresh); ``threads``
    caps PyTorch/OpenMP threads in the kernel. ``group`` (the kernel's cgroup, which
    ``sandbox`` names) bounds its memory; without one a watchdog stops a kernel that holds
    more than ``memory_limit`` bytes. ``speed_tests`` (by cell id) are timed right after
    their cell ran, against clean kernels that ``clean_place`` makes room for.
    """
    from nbclient.exceptions import CellTimeoutError, DeadKernelError
    from papermill.engines import papermill_engines
    from papermill.parameterize import parameterize_notebook

    nb = _prepare_for_papermill(copy.deepcopy(nb))
    nb = parameterize_notebook(nb, parameters, kernel_name=KERNEL_NAME, language="python",
                               comment="Parameters injected by the autograder")
    launch = _launch(workdir, spawner, env, threads, log, sandbox)
    speed = None
    if speed_tests and clean_place is not None:
        speed = SpeedRun(speed_tests, str(parameters.get("autograder_device", "cpu")), seed,
                         group, _exchange(launch), _clean_kernels(clean_place, spawner, threads))
    watchdog = threading.Timer(limits.notebook, launch.kill)
    watchdog.daemon = True
    flooded = threading.Event()

    def on_flood() -> None:
        flooded.set()
        launch.kill()

    engine = _register_engine()
    done, memory = threading.Event(), {}
    if memory_limit and group is None:
        threading.Thread(target=_watch_memory, args=(launch, memory_limit, done, memory),
                         daemon=True).start()
    start = time.perf_counter()
    ready: list = []  # when the kernel answered, before the first cell (nbclient's hook)
    ended, message = "completed", ""
    watchdog.start()
    try:
        papermill_engines.execute_notebook_with_engine(
            engine, nb, kernel_name=KERNEL_NAME, input_path=None, output_path=None,
            progress_bar=False, log_output=False, start_timeout=KERNEL_START_TIMEOUT,
            execution_timeout=limits.cell, autosave_cell_every=0,
            kernel_manager_class=manager_class(launch),
            allow_errors=True, interrupt_on_timeout=True,
            error_on_timeout={
                "ename": TIMEOUT_ENAME,
                "evalue": (f"the cell ran longer than the {limits.cell:g} s limit "
                           "and was interrupted"),
                "traceback": [],
            },
            shutdown_kernel="immediate",
            on_cell_executed=_record_reply,
            on_notebook_start=lambda **_: ready.append(time.perf_counter()),
            output_limit=output_limit, on_flood=on_flood, speed=speed,
        )
    except DeadKernelError:
        ended = "kernel-died"
        message = (f"the kernel died while running {_last_started(nb)} "
                   "(it exited, crashed or ran out of memory)")
    except CellTimeoutError:
        # Interrupted after the per-cell limit, the kernel still did not answer.
        ended = "unresponsive"
        message = (f"the kernel stopped responding in {_last_started(nb)} after the "
                   f"{limits.cell:g} s cell limit, and was stopped")
    except Exception as error:  # start-up failures and other nbclient/jupyter_client errors
        # Not ready (nbclient's hook never ran): it never answered, so no cell ran in it.
        ended = "kernel-died" if ready else "failed-to-start"
        first_line = (str(error).strip().splitlines() or [""])[0]
        message = f"{type(error).__name__}: {first_line}".rstrip(": ")
    finally:
        watchdog.cancel()
        done.set()
        _stop(launch)  # whatever nbclient left running, and everything the kernel started
    seconds = time.perf_counter() - start
    if group is not None:
        memory["peak"] = group.memory_peak()
        memory["over"] = group.out_of_memory_kills() > 0 and ended != "completed"
    if memory.get("over"):
        ended = "memory-limit"
        message = (f"the kernel used more than {memory_limit / 2**30:.1f} GiB of memory and "
                   "was stopped")
    elif flooded.is_set():
        ended = "output-limit"
        message = (f"the notebook printed more than {FLOOD_FACTOR * output_limit // 2**20} MiB "
                   "and was stopped")
    elif launch.killed:
        ended = "notebook-timeout"
        message = f"the notebook ran longer than the {limits.notebook:g} s limit and was stopped"
    if ended == "failed-to-start" and log and Path(log).exists():
        tail = [line for line in Path(log).read_text(errors="replace").splitlines() if line.strip()]
        if tail:
            message += f"; kernel stderr: {tail[-1][:200]}"
    logging.getLogger(__name__).debug("executed in %.2f s: %s %s", seconds, ended, message)
    return Execution(notebook=nb, seconds=seconds, ended=ended, message=message,
                     peak_memory=memory.get("peak", 0),
                     peak_processes=group.process_peak() if group is not None else 0,
                     kernel_start=(ready[0] - start) if ready else seconds,
                     speed=dict(speed.results) if speed is not None else {})
