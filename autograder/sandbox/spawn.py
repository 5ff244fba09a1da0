"""Start a process by naming what it runs: ``spawner.start("module:function", *args)``.

This is the grader's one way to start a process (a learner's kernel, a submission's trusted
checks, the CUDA probe). It knows nothing of grading: a *target* is a dotted name, its
arguments are strings, and the process it gets runs alone, in a session and process group
of its own, with stdin and stdout on ``/dev/null`` and stderr on ``/dev/null`` or a log
file. Two implementations of :class:`Spawner`:

* :class:`ForkServer`: a server started once per run imports the modules it is told to
  (PyTorch, ipykernel, ...) and ``fork()``s a child per request; the child starts with
  those imports done. See :mod:`.forkserver` for the server itself.
* :class:`FreshInterpreter`: a new ``python`` per process; it pays for every import, and
  works where ``fork()`` does not.

:func:`open_spawner` is where "fork or fresh?" is decided, once per run. A spawner is
given the environment of the processes it starts (the fork server's own included), and
never passes on its caller's: a grader's environment may hold secrets that the learner's
code must not see (the grader writes one, :func:`autograder.sandbox.policy.process_environment`).

This module imports only the standard library and :mod:`autograder.options` (plain
declarations): a fresh interpreter imports it first.
"""
from __future__ import annotations

import importlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Protocol, Sequence

from autograder.options import KERNELS

PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the folder that holds autograder/


def fork_supported() -> bool:
    """Whether this platform can fork (POSIX with os.fork and setsid)."""
    return hasattr(os, "fork") and hasattr(os, "setsid") and sys.platform != "win32"


def resolve_target(name: str) -> Callable:
    """The function a dotted target names (``package.module:function``)."""
    module, _, function = name.partition(":")
    if not module or not function:
        raise ValueError(f"a target is 'module:function', got {name!r}")
    return getattr(importlib.import_module(module), function)


def run_target(name: str, args: Sequence[str]) -> None:
    """In the new process: import the target, then give ``sys.path`` back the look of a
    plain interpreter's with the requested ``PYTHONPATH`` (not the spawner's own entries,
    which only served to import the target), then call it."""
    target = resolve_target(name)
    wanted = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    for entry in ("", str(PACKAGE_ROOT)):
        if entry in sys.path and entry not in wanted:
            sys.path.remove(entry)
    target(*args)


class Process(Protocol):
    """What :meth:`Spawner.start` returns: the part of ``subprocess.Popen`` callers use."""
    pid: int
    returncode: Optional[int]

    def poll(self) -> Optional[int]: ...

    def wait(self, timeout: Optional[float] = None) -> int: ...

    def kill(self) -> None: ...

    def terminate(self) -> None: ...

    def send_signal(self, signum: int) -> None: ...


class Spawner(Protocol):
    """Starts processes by target name; one per run, closed when the run ends."""
    kind: str  # "fork" or "fresh"

    def start(self, target: str, *args: str, cwd: Optional[str] = None,
              env: Optional[Dict[str, str]] = None, stderr: Optional[str] = None) -> Process:
        """Start ``target(*args)`` in a new process. ``env`` replaces the environment
        (None: the environment the spawner was given, with this package on
        ``PYTHONPATH``); ``stderr`` is a file to append the process's stderr to."""
        ...

    def close(self) -> None: ...


def open_spawner(kind: str, preload: Iterable[str] = (),
                 env: Optional[Dict[str, str]] = None) -> Spawner:
    """The run's spawner: a fork server that preloads ``preload`` where ``kind`` is fork
    and the platform can fork, else a fresh interpreter per process. ``env`` is the
    environment of the processes it starts (None: an empty one, never this process's)."""
    if kind not in KERNELS:  # the spawners, as --kernel names them
        raise ValueError(f"kind must be one of {KERNELS}, got {kind!r}")
    if kind == "fork" and fork_supported():
        return ForkServer(preload, env)
    return FreshInterpreter(env)


def _environment(env: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """``env`` (None: an empty one), with this package importable by a new interpreter."""
    env = dict(env or {})
    env["PYTHONPATH"] = os.pathsep.join(
        [str(PACKAGE_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env


# --------------------------------------------------------------------------------------
# A fresh interpreter per process
# --------------------------------------------------------------------------------------

# The package's root goes on sys.path here, not in the environment: the process gets
# exactly the environment it was given.
FRESH_BOOTSTRAP = ("import sys; sys.path.insert(0, {root!r}); "
                   "from autograder.sandbox.spawn import run_target; run_target(sys.argv[1], sys.argv[2:])")


class FreshInterpreter:
    """:class:`Spawner` that starts ``python -c BOOTSTRAP target args...`` each time, with
    ``env`` (None: an empty one) unless a start names one of its own."""
    kind = "fresh"

    def __init__(self, env: Optional[Dict[str, str]] = None):
        self.env = dict(env or {})

    def start(self, target: str, *args: str, cwd: Optional[str] = None,
              env: Optional[Dict[str, str]] = None, stderr: Optional[str] = None
              ) -> subprocess.Popen:
        # Without an environment of its own, the spawner's, where this package is
        # importable (as for a forked child, whose server's PYTHONPATH names it).
        env = _environment(self.env) if env is None else env
        log = open(stderr, "ab") if stderr else subprocess.DEVNULL
        try:
            return subprocess.Popen(
                [sys.executable, "-c", FRESH_BOOTSTRAP.format(root=str(PACKAGE_ROOT)), target,
                 *args], cwd=cwd, env=env,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                start_new_session=True)
        finally:
            if stderr:
                log.close()  # the child has its own copy

    def close(self) -> None:
        pass

    def __enter__(self) -> "FreshInterpreter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --------------------------------------------------------------------------------------
# Forked from a warm server
# --------------------------------------------------------------------------------------

class ForkedProcess:
    """A ``subprocess.Popen`` look-alike for a process forked by the server (not our child).

    Exit is observed through a pidfd where Linux has them (no confusion with a reused
    pid), else by probing the pid; the exit status itself is not ours to collect.
    """
    stdin = stdout = stderr = None

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: Optional[int] = None
        self._pidfd: Optional[int] = None
        if hasattr(os, "pidfd_open"):
            try:
                self._pidfd = os.pidfd_open(pid)
            except OSError:
                self._pidfd = None

    def poll(self) -> Optional[int]:
        if self.returncode is not None:
            return self.returncode
        if self._pidfd is not None:
            ready, _, _ = select.select([self._pidfd], [], [], 0)
            gone = bool(ready)
        else:
            try:
                os.kill(self.pid, 0)
                gone = False
            except ProcessLookupError:
                gone = True
            except PermissionError:
                gone = False
        if gone:
            self.returncode = -1  # unknown: the server, not we, reaped it
            if self._pidfd is not None:
                os.close(self._pidfd)
                self._pidfd = None
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"process {self.pid}", timeout)
            time.sleep(0.01)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class ForkServer:
    """:class:`Spawner` that asks a warm fork server (:mod:`.forkserver`); thread-safe.

    The server imports ``preload`` in the background from the moment this object exists;
    the first request waits for it. A server that died (say, killed by the out-of-memory
    killer) is started again, up to ``MAX_RESTARTS`` times.

    The server is started with ``env`` (None: an empty one), never this process's own: a
    forked child replaces ``os.environ``, but its ``/proc/self/environ`` shows the
    environment the server was started with, and what the server preloads reads it.
    """
    kind = "fork"
    MAX_RESTARTS = 3
    CLOSE_TIMEOUT = 5.0  # seconds the server gets to exit once its stdin closes

    def __init__(self, preload: Iterable[str] = (), env: Optional[Dict[str, str]] = None):
        self.preload = list(preload)
        self.env = dict(env or {})
        self._lock = threading.Lock()
        self.restarts = 0
        self._spawn()

    def _spawn(self) -> None:
        env = _environment(self.env)
        env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"  # debugpy's import-time warning, not ours
        # Should a preloaded module ask torch.cuda.is_available() at import time, PyTorch
        # answers from NVML instead of initialising CUDA, which would not survive fork().
        env["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
        self.process = subprocess.Popen(
            [sys.executable, "-c", "from autograder.sandbox.forkserver import main; main()",
             "--preload", ",".join(self.preload)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
            cwd=os.path.abspath(os.sep))
        self.pid: Optional[int] = None
        self.preloaded: List[str] = []
        self.failed: Dict[str, str] = {}

    def wait_ready(self) -> "ForkServer":
        """Block until the server has done its imports (at most once)."""
        with self._lock:
            self._wait_ready_locked()
        return self

    def _wait_ready_locked(self) -> None:
        if self.pid is not None:
            return
        hello = self._read()
        if not hello.get("ready"):
            raise RuntimeError(f"fork server failed to start: {hello}")
        self.pid = hello["pid"]
        self.preloaded = hello["preloaded"]
        self.failed = hello["failed"]

    def _read(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"fork server exited (code {self.process.poll()})")
        return json.loads(line)

    def start(self, target: str, *args: str, cwd: Optional[str] = None,
              env: Optional[Dict[str, str]] = None, stderr: Optional[str] = None
              ) -> ForkedProcess:
        request = {"target": target, "args": list(args), "cwd": cwd, "env": env,
                   "stderr": stderr}
        with self._lock:
            if self.process.poll() is not None and self.restarts < self.MAX_RESTARTS:
                self.process.stdout.close()
                self.restarts += 1
                self._spawn()
            self._wait_ready_locked()
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            answer = self._read()
        if "error" in answer:
            raise RuntimeError(f"fork server could not start {target}: {answer['error']}")
        return ForkedProcess(int(answer["pid"]))

    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()  # the server's loop ends on EOF
            try:
                self.process.wait(timeout=self.CLOSE_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process.stdout.close()

    def __enter__(self) -> "ForkServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

