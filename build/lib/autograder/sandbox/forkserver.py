"""The fork server process: import once, then ``fork()`` a child per request.

Started by :class:`autograder.sandbox.spawn.ForkServer` (its client). It imports the modules it is
told to, then reads one JSON request per line on stdin -- a target name, its arguments,
a working directory, an environment, a stderr file -- forks, and answers with the child's
pid. The child becomes a process of its own (session, process group, file descriptors,
working directory, environment, random state) and runs the target
(:func:`autograder.sandbox.spawn.run_target`).

The server never imports or runs anything of a learner's, never sees test code, and never
initialises CUDA (that would not survive ``fork()``): it only imports modules. (A module
that starts threads or initialises CUDA when imported is not safe to preload this way;
``--kernel fresh`` grades without the server.) It exits when its stdin closes, i.e. when
the grader ends.

The server is started with the environment the grader writes for a submission's
processes (:func:`autograder.sandbox.policy.process_environment`), never the grader's own: a
forked child replaces ``os.environ``, but its ``/proc/self/environ`` still shows the
environment the server was started with. Modules it preloads are imported with that
environment: one that reads an environment variable at import time sees the server's
value, not the child's.
"""
from __future__ import annotations

import json
import os
import signal
import sys
from typing import Dict, Iterable, List, Optional

from autograder.sandbox.spawn import run_target


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
    for name in modules:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                importlib.import_module(name)
            loaded.append(name)
        except BaseException as error:  # a broken module must not stop the server
            failed[name] = f"{type(error).__name__}: {error}"
    return {"preloaded": loaded, "failed": failed}


def _become(request: dict) -> None:
    """In the forked child: a process of its own, then the requested target."""
    os.setsid()  # own session and process group: signals and kills reach only this child
    for signum in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)
    devnull = os.open(os.devnull, os.O_RDWR)
    log = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600) \
        if request.get("stderr") else devnull
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)  # never the server's protocol pipe
    os.dup2(log, 2)
    for fd in {devnull, log}:
        os.close(fd)
    if request.get("cwd"):
        os.chdir(request["cwd"])
    if request.get("env") is not None:
        os.environ.clear()
        os.environ.update(request["env"])
    import random
    random.seed()  # not the state every sibling inherited
    run_target(request["target"], request.get("args", []))


def serve(preload: Iterable[str], stdin=None, stdout=None) -> None:
    """The server's loop: one JSON request per line in, one JSON reply per line out."""
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the children are reaped for us
    _die_with_parent()

    def reply(message: dict) -> None:
        stdout.write(json.dumps(message) + "\n")
        stdout.flush()

    reply({"ready": True, "pid": os.getpid(), **_preload(preload)})
    for line in stdin:
        try:
            request = json.loads(line)
            pid = os.fork()
        except Exception as error:
            reply({"error": f"{type(error).__name__}: {error}"})
            continue
        if pid == 0:
            code = 0
            try:
                _become(request)
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
    # Nothing is left to flush or clean up: skip the interpreter's teardown of what was
    # preloaded (half a second with PyTorch), which every grading run would wait for.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
