"""Start one kernel per submission, each in its own process.

A kernel is started in one of two ways:

* ``fresh``: jupyter_client's usual launch (``python -m ipykernel_launcher``). Every
  submission pays for a new interpreter and for every import its notebook makes;
  ``import dlperf`` alone (PyTorch, torchvision, matplotlib) costs seconds of CPU.
* ``fork``: a *fork server* started once per grading run imports ipykernel and the
  modules the instructor's notebooks import, then ``fork()``s a new process for each
  kernel. The child is a separate process with its own memory (copy-on-write), its own
  session and process group, working directory and environment, so each submission
  still runs alone; it just starts with the imports already done.

The fork server never imports or runs anything of a learner's, never sees test code,
and never initialises CUDA (that would not survive ``fork()``): it only imports modules.
(A module that starts threads or initialises CUDA when imported is not safe to preload
this way; ``--kernel fresh`` grades without the fork server.)
It exits when its standard input closes, i.e. when the grader ends, and is started again
if it dies. Modules it preloads are imported with the grader's environment: one that
reads an environment variable at import time sees the grader's value, not the kernel's.

Both ways plug into jupyter_client as a kernel manager class (:func:`manager_class`),
which papermill/nbclient instantiate; a :class:`KernelLaunch` records the process so a
watchdog can kill it when the notebook's time is up.
"""
from __future__ import annotations

import ast
import asyncio
import importlib.util
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional

# Always worth having in the fork server: what every Python kernel imports at start-up.
KERNEL_MODULES = (
    "ipykernel.kernelapp", "ipykernel.ipkernel", "ipykernel.zmqshell", "ipykernel.debugger",
    "IPython.core.interactiveshell", "IPython.core.completer", "IPython.core.history",
    "IPython.core.debugger", "matplotlib_inline.backend_inline", "comm",
    "jupyter_client.session", "tornado.ioloop", "psutil", "pydoc", "mimetypes", "faulthandler",
    "sqlite3",
)
PACKAGE_ROOT = Path(__file__).resolve().parent.parent


def fork_supported() -> bool:
    """Whether this platform can fork kernels (POSIX with os.fork and setsid)."""
    return hasattr(os, "fork") and hasattr(os, "setsid") and sys.platform != "win32"


def imported_modules(sources: Iterable[str]) -> List[str]:
    """Top-level modules that the given code imports (IPython magics and shell lines ignored)."""
    names: List[str] = []
    for source in sources:
        lines = [line for line in source.splitlines()
                 if not line.lstrip().startswith(("%", "!"))]
        try:
            tree = ast.parse("\n".join(lines))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found = [node.module.split(".")[0]]
            else:
                continue
            names.extend(name for name in found if name not in names)
    return names


def notebook_imports(paths: Iterable[Path]) -> List[str]:
    """Installed modules that the code cells of these notebooks import.

    The files are read as plain JSON (no nbformat), so the fork server can be started
    before the grader has done its own, slow imports.
    """
    code = []
    for path in paths:
        try:
            nb = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            continue
        for cell in nb.get("cells", []):
            if isinstance(cell, dict) and cell.get("cell_type") == "code":
                source = cell.get("source", "")
                code.append("".join(source) if isinstance(source, list) else str(source))
    return importable(imported_modules(code))


def importable(names: Iterable[str]) -> List[str]:
    """The names that are installed modules (so the fork server can import them)."""
    found = []
    for name in names:
        try:
            if importlib.util.find_spec(name) is not None:
                found.append(name)
        except (ImportError, ValueError):
            pass
    return found


# --------------------------------------------------------------------------------------
# The fork server process
# --------------------------------------------------------------------------------------

def _die_with_parent() -> None:
    """Linux: get SIGTERM when the grader dies, even by SIGKILL (no orphan servers)."""
    try:
        import ctypes
        libc = ctypes.CDLL(None)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def _preload(modules: Iterable[str]) -> Dict[str, object]:
    import importlib
    import warnings
    loaded, failed = [], {}
    for name in [*KERNEL_MODULES, *modules]:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                importlib.import_module(name)
            loaded.append(name)
        except BaseException as error:  # a broken module must not stop the server
            failed[name] = f"{type(error).__name__}: {error}"
    return {"preloaded": loaded, "failed": failed}


def _become_kernel(request: dict, server_pid: int) -> None:
    """In the forked child: turn this process into an IPython kernel and run it."""
    os.setsid()  # own session and process group: signals and kills reach only this kernel
    for signum in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)
    devnull = os.open(os.devnull, os.O_RDWR)
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600) \
        if request.get("log") else devnull
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)  # never the server's protocol pipe
    os.dup2(log, 2)
    for fd in {devnull, log}:
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    os.environ["JPY_PARENT_PID"] = str(server_pid)  # the kernel exits if the server dies
    # sys.path as `python -m ipykernel_launcher` has it: without the server's own entries
    # (IPython adds the working directory back when the shell starts).
    for entry in ("", str(PACKAGE_ROOT)):
        wanted = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
        if entry in sys.path and entry not in wanted:
            sys.path.remove(entry)
    import random
    random.seed()  # not the state every sibling inherited
    threads = request.get("threads")
    if threads and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(threads))
    if request.get("sandbox"):
        from .sandbox import Policy, start_kernel
        start_kernel(Policy.from_dict(request["sandbox"]), request["argv"])
        return
    from ipykernel.kernelapp import IPKernelApp
    app = IPKernelApp.instance()
    app.initialize(request["argv"])
    app.start()


def _run_checks(request: dict) -> None:
    """In the forked child: run one submission's trusted checks (see :mod:`.checks`).

    A process of its own for each submission, so whatever process-wide state the
    instructor's checks change (PyTorch's global generator, default dtype, threads,
    module attributes) dies with it and no other submission's checks see it.
    """
    os.setsid()  # its own process group: a timeout kills it and all it started
    for signum in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)  # never the server's protocol pipe
    os.close(devnull)
    from .checks import serve_request
    serve_request(request["request"], request["result"])


def _probe_cuda() -> bool:
    """Whether PyTorch sees a CUDA GPU, asked in a throwaway child: CUDA, once initialised,
    does not survive fork(), so the server itself must never touch it."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        answer = b"0"
        try:
            os.environ.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)  # the real check, here
            import torch
            answer = b"1" if torch.cuda.is_available() else b"0"
        except BaseException:
            pass
        finally:
            os.write(write_end, answer)
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        return pipe.read(1) == b"1"


def serve(preload: Iterable[str], stdin=None, stdout=None) -> None:
    """The fork server's loop: one JSON request per line in, one JSON reply per line out."""
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel processes are reaped for us
    _die_with_parent()

    def reply(message: dict) -> None:
        stdout.write(json.dumps(message) + "\n")
        stdout.flush()

    reply({"ready": True, "pid": os.getpid(), **_preload(preload)})
    for line in stdin:
        try:
            request = json.loads(line)
            if request.get("op") == "probe-cuda":
                reply({"cuda": _probe_cuda()})
                continue
            pid = os.fork()
        except Exception as error:
            reply({"error": f"{type(error).__name__}: {error}"})
            continue
        if pid == 0:
            code = 0
            try:
                if request.get("op") == "checks":
                    _run_checks(request)
                else:
                    _become_kernel(request, server_pid=os.getppid())
            except SystemExit as done:
                code = done.code if isinstance(done.code, int) else 0
            except BaseException:
                import traceback
                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)
        reply({"pid": pid})


def main(argv: Optional[List[str]] = None) -> None:
    import argparse
    parser = argparse.ArgumentParser(description="autograder fork server (internal)")
    parser.add_argument("--preload", default="", help="comma-separated modules to import")
    args = parser.parse_args(argv)
    serve([name for name in args.preload.split(",") if name])


class ForkServer:
    """Client side of the fork server: ``fork(argv, cwd, env) -> pid``; thread-safe."""

    def __init__(self, preload: Iterable[str] = ()):
        self.preload = list(preload)
        self._lock = threading.Lock()
        self.restarts = 0
        self._spawn()

    def _spawn(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(PACKAGE_ROOT), *filter(None, [env.get("PYTHONPATH")])])
        env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"  # debugpy's import-time warning, not ours
        # Should a preloaded module ask torch.cuda.is_available() at import time, PyTorch
        # answers from NVML instead of initialising CUDA, which would not survive fork().
        env["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
        bootstrap = "from autograder.kernels import main; main()"
        self.process = subprocess.Popen(
            [sys.executable, "-c", bootstrap, "--preload", ",".join(self.preload)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
            cwd=os.path.abspath(os.sep))
        self.pid: Optional[int] = None
        self.preloaded: List[str] = []
        self.failed: Dict[str, str] = {}
        # The server imports in the background; the first request waits for it.

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

    def _ask(self, request: dict) -> dict:
        with self._lock:
            if self.process.poll() is not None and self.restarts < 3:
                # Killed (say, by the out-of-memory killer): start another, once per call.
                self.process.stdout.close()
                self.restarts += 1
                self._spawn()
            self._wait_ready_locked()
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            return self._read()

    def cuda_available(self) -> bool:
        """Whether PyTorch sees a CUDA GPU (probed in a throwaway child of the server)."""
        return bool(self._ask({"op": "probe-cuda"}).get("cuda"))

    def _read(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"fork server exited (code {self.process.poll()})")
        return json.loads(line)

    def fork_checks(self, request: str, result: str) -> int:
        """Fork a process that runs the checks described in the file ``request`` and
        writes their outcomes to the file ``result``; its pid (it is not our child)."""
        answer = self._ask({"op": "checks", "request": request, "result": result})
        if "error" in answer:
            raise RuntimeError(f"fork server could not start the checks: {answer['error']}")
        return int(answer["pid"])

    def fork(self, argv: List[str], cwd: str, env: Dict[str, str],
             threads: Optional[int] = None, log: Optional[str] = None,
             sandbox: Optional[dict] = None) -> int:
        answer = self._ask({"argv": argv, "cwd": cwd, "env": env, "threads": threads,
                            "log": log, "sandbox": sandbox})
        if "error" in answer:
            raise RuntimeError(f"fork server could not start a kernel: {answer['error']}")
        return int(answer["pid"])

    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()  # the server's loop ends on EOF
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process.stdout.close()

    def __enter__(self) -> "ForkServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --------------------------------------------------------------------------------------
# jupyter_client side
# --------------------------------------------------------------------------------------

class ForkedProcess:
    """A ``subprocess.Popen`` look-alike for a kernel forked by the server (not our child).

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
                raise subprocess.TimeoutExpired(f"kernel {self.pid}", timeout)
            time.sleep(0.02)
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


def _forked_provisioner_class():
    from jupyter_client.provisioning import LocalProvisioner
    from traitlets import Any as AnyTrait

    class ForkProvisioner(LocalProvisioner):
        """LocalProvisioner whose ``launch_kernel`` asks the fork server instead of Popen."""
        fork_server = AnyTrait()
        threads = AnyTrait()
        stderr_path = AnyTrait()
        sandbox = AnyTrait()

        async def launch_kernel(self, cmd: List[str], **kwargs):
            if "ipykernel_launcher" not in cmd:
                return await super().launch_kernel(cmd, **kwargs)
            argv = list(cmd[cmd.index("ipykernel_launcher") + 1:])
            cwd = str(kwargs.get("cwd") or os.getcwd())
            pid = self.fork_server.fork(argv, cwd=cwd, env=dict(kwargs["env"]),
                                        threads=self.threads, log=self.stderr_path,
                                        sandbox=self.sandbox)
            self.process = ForkedProcess(pid)
            self.pid = pid
            self.pgid = pid  # the child called setsid()
            self.cwd = cwd
            return self.connection_info

        async def wait(self):
            # LocalProvisioner polls every 0.1 s; a killed kernel is gone within milliseconds.
            if self.process is None:
                return 0
            while self.process.poll() is None:
                await asyncio.sleep(0.01)
            code, self.process = self.process.returncode, None
            return code

    return ForkProvisioner


def _quick_client_class():
    from queue import Empty

    from jupyter_client.asynchronous import AsyncKernelClient

    class QuickStartClient(AsyncKernelClient):
        """jupyter_client's client, minus 0.2 s of waiting for IOPub silence at start-up.

        Its ``wait_for_ready`` ends by draining IOPub until nothing arrives for 0.2 s.
        nbclient matches every output to the request that caused it, so a status message
        left over from start-up is ignored anyway; the rest of the handshake is unchanged.
        """

        async def wait_for_ready(self, timeout: Optional[float] = None) -> None:
            deadline = time.monotonic() + (float("inf") if timeout is None else timeout)
            while True:
                self.kernel_info()
                try:
                    reply = await self.shell_channel.get_msg(timeout=1)
                except Empty:
                    pass
                else:
                    if reply["msg_type"] == "kernel_info_reply":
                        try:  # IOPub connected? (else start over, as jupyter_client does)
                            await self.iopub_channel.get_msg(timeout=0.2)
                        except Empty:
                            pass
                        else:
                            self._handle_kernel_info_reply(reply)
                            return
                if not await self._async_is_alive():
                    raise RuntimeError("Kernel died before replying to kernel_info")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"Kernel didn't respond in {timeout} seconds")

    return QuickStartClient


@dataclass
class KernelLaunch:
    """How to start one submission's kernel, and (once started) which process it is."""
    cwd: Path
    env: Dict[str, str] = field(default_factory=dict)
    fork_server: Optional[ForkServer] = None
    threads: Optional[int] = None  # CPU threads for PyTorch/OpenMP in the kernel
    log: Optional[str] = None      # file for the kernel's own stderr (start-up failures)
    sandbox: Optional[dict] = None  # a sandbox.Policy as a dict: confine the kernel so
    sockets: Optional[Path] = None  # a folder for the kernel's Unix sockets (with sandbox)
    manager: object = None         # the kernel manager, set once the kernel starts
    killed: bool = False
    _log_file: object = None
    _started_pid: Optional[int] = None

    def open_log(self):
        """A file object for a fresh kernel's stderr (DEVNULL without a log path)."""
        if not self.log:
            return subprocess.DEVNULL
        if self._log_file is None:
            self._log_file = open(self.log, "ab")
        return self._log_file

    def kill(self) -> None:
        """Kill the kernel's whole process group now (the notebook watchdog calls this)."""
        self.killed = True
        self.stop()

    @property
    def pid(self) -> Optional[int]:
        """The kernel's process id, once it has started."""
        provisioner = getattr(self.manager, "provisioner", None)
        return getattr(provisioner, "pid", None)

    def stop(self) -> None:
        """Kill the kernel and everything it started, if any of it is still running."""
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        provisioner = getattr(self.manager, "provisioner", None)
        pid = self.pid or self._started_pid
        if pid:
            self._started_pid = pid
            from .sandbox import kill_all
            if kill_all(pid) == 0 and getattr(provisioner, "process", None) is not None:
                try:
                    os.killpg(pid, signal.SIGKILL)  # no /proc: the process group at least
                except (ProcessLookupError, PermissionError):
                    pass


SANDBOXED_LAUNCHER = (
    "import json, sys; from autograder.sandbox import Policy, start_kernel; "
    "start_kernel(Policy.from_dict(json.loads(sys.argv[1])), sys.argv[2:])")


def manager_class(launch: KernelLaunch):
    """An AsyncKernelManager subclass bound to ``launch`` (for nbclient's kernel_manager_class)."""
    from jupyter_client.manager import AsyncKernelManager

    class SubmissionKernelManager(AsyncKernelManager):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.client_factory = _quick_client_class()
            if launch.sockets is not None and sys.platform.startswith("linux"):
                # Unix sockets: they reach a kernel in a network namespace of its own (see
                # sandbox._confine_network); TCP would not. Not in its working directory,
                # which the kernel sees as a tmpfs of its own that the grader cannot.
                # (Linux only: that is where the namespace is, and macOS's long temporary
                # paths could pass its 104-byte limit for a socket's path.)
                self.transport = "ipc"
                self.ip = str(Path(launch.sockets) / "kernel")

        async def _async_wait(self, pollinterval: float = 0.01) -> None:
            # After a kill, look every 10 ms (not 100 ms) whether the kernel has gone.
            await super()._async_wait(pollinterval=min(pollinterval, 0.01))

        async def _async_pre_start_kernel(self, **kw):
            kw["cwd"] = str(launch.cwd)
            env = dict(os.environ)
            env.update(launch.env)
            if launch.threads:
                for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
                    env[name] = str(launch.threads)
            kw["env"] = env
            if launch.fork_server is not None and self.provisioner is None:
                self.kernel_id = self.kernel_id or str(uuid.uuid4())
                self.provisioner = _forked_provisioner_class()(
                    kernel_id=self.kernel_id, kernel_spec=self.kernel_spec, parent=self,
                    fork_server=launch.fork_server, threads=launch.threads,
                    stderr_path=launch.log, sandbox=launch.sandbox)
            else:  # a fresh interpreter: its stdout/stderr go to the log, not our terminal
                kw["stdout"] = subprocess.DEVNULL
                kw["stderr"] = launch.open_log()
            launch.manager = self
            return await super()._async_pre_start_kernel(**kw)

        def format_kernel_cmd(self, extra_arguments=None):
            cmd = super().format_kernel_cmd(extra_arguments)
            if launch.sandbox and launch.fork_server is None and "ipykernel_launcher" in cmd:
                # A fresh interpreter confines itself before the kernel starts.
                at = cmd.index("ipykernel_launcher")
                cmd = [*cmd[:at - 1], "-c", SANDBOXED_LAUNCHER, json.dumps(launch.sandbox),
                       *cmd[at + 1:]]
            return cmd

    return SubmissionKernelManager


if __name__ == "__main__":
    main()
