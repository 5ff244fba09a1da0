"""The Python audit hook (:pep:`578`) of a learner's kernel, installed in the kernel's
process once it has its sockets: it refuses to start processes (but the compilers of
``Policy.programs`` when an installed library starts them: Triton on a GPU), to open network
connections, to load native code through ``ctypes``, to signal other processes and to
write outside the working directory. Defence in depth with clear messages: native code
raises no audit events, so no property rests on it alone.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from typing import Optional

from autograder.protocol import Policy, python_paths, within_any


class SandboxViolation(PermissionError):
    """What the kernel's audit hook raises for an action the grader does not allow."""


STARTS_PROCESSES = {"os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn",
                    "os.spawn", "os.startfile", "subprocess.Popen", "pty.spawn"}
CHANGES_FILES = {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown",
                 "os.truncate", "os.utime", "os.symlink", "os.link", "shutil.rmtree",
                 "shutil.copyfile", "shutil.move"}
FORBIDDEN = {
    "resource.setrlimit": "changing resource limits",
    "resource.prlimit": "changing resource limits",
    "sys.settrace": "setting a trace function",
    "sys.setprofile": "setting a profile function",
    "sys.addaudithook": None,  # allowed: another hook cannot remove ours
}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _writes(mode, flags) -> bool:
    if isinstance(mode, str):
        return any(c in mode for c in "wax+")
    return isinstance(flags, int) and bool(flags & WRITE_FLAGS)


def install_audit_hook(policy: Policy) -> None:
    """Add the audit hook that refuses what a graded kernel must not do."""
    workdir = os.path.realpath(policy.workdir)
    # The sockets' folder is the kernel's own too: a speed test's inputs are put there
    # (autograder.pipeline.timing), and the clean kernel writes them there.
    sockets = (os.path.realpath(policy.sockets),) if policy.sockets else ()
    writable = (workdir, *sockets, "/dev/null", "/proc/self/fd")
    hidden = tuple(os.path.realpath(h) for h in policy.hidden)
    shown = tuple(os.path.realpath(s) for s in policy.shown)
    own_pid = os.getpid()
    libraries = tuple(p for p in python_paths() if not within_any(p, hidden) or p in shown)
    ctypes_dir = os.path.dirname(os.path.realpath(ctypes.__file__))
    stdlib_dir = os.path.dirname(os.path.realpath(subprocess.__file__))
    own_file = os.path.realpath(__file__)
    programs = frozenset(policy.programs)
    which = shutil.which
    getframe = sys._getframe
    realpath, fspath, getcwd, join = os.path.realpath, os.fspath, os.getcwd, os.path.join
    Violation = SandboxViolation

    def resolve(path) -> Optional[str]:
        if isinstance(path, int):
            return None  # an open file descriptor: already allowed when it was opened
        try:
            path = fspath(path)
            if isinstance(path, bytes):
                path = path.decode(errors="replace")
            return realpath(join(getcwd(), path))
        except Exception:
            return ""

    # The hook's own copy of within_any: module globals are within the learner's reach.
    def within(path: str, roots) -> bool:
        return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)

    def library_caller() -> bool:
        """Whether the code asking, past this hook and the standard library, is an installed
        library's (a notebook's code is not)."""
        frame = getframe(1)
        while frame is not None:
            name = realpath(frame.f_code.co_filename)
            if not (name == own_file or within(name, (stdlib_dir,)) and not any(
                    part in name for part in ("/site-packages/", "/dist-packages/"))):
                break
            frame = frame.f_back
        caller = realpath(frame.f_code.co_filename) if frame is not None else ""
        return caller.startswith("/") and within(caller, libraries)

    def library_starts_compiler(event: str, args: tuple) -> bool:
        """A library (Triton building a GPU kernel) starting one of the policy's programs
        with ``subprocess`` (which may go through ``os.posix_spawn``)."""
        if event not in ("subprocess.Popen", "os.posix_spawn") or not programs or not args:
            return False
        program = args[0]
        if program is None and event == "subprocess.Popen" and len(args) > 1:
            argv = args[1]
            program = argv[0] if isinstance(argv, (list, tuple)) and argv else argv
        try:
            program = fspath(program)
            if isinstance(program, bytes):
                program = program.decode(errors="replace")
            if "/" not in program:
                environment = args[3] if event == "subprocess.Popen" and len(args) > 3 \
                    else args[2] if event == "os.posix_spawn" and len(args) > 2 else None
                path = (environment or {}).get("PATH") if isinstance(environment, dict) \
                    else None
                program = which(program, path=path) or ""
            program = realpath(program)
        except Exception:
            return False
        return program in programs and library_caller()

    def hook(event: str, args: tuple) -> None:
        if event == "open":
            path = resolve(args[0])
            if path is None:
                return
            if within(path, hidden) and not within(path, shown) and not within(path, writable):
                raise Violation(f"the grader does not allow reading {args[0]!r}")
            if _writes(args[1] if len(args) > 1 else None, args[2] if len(args) > 2 else 0) \
                    and not within(path, writable):
                raise Violation(f"the grader only allows writing files in the working "
                                f"directory, not {args[0]!r}")
        elif event in CHANGES_FILES:
            # copyfile, symlink and link only write their second path
            written = args[1:2] if event in ("shutil.copyfile", "os.symlink", "os.link") \
                else args[:2]
            for arg in written:
                path = resolve(arg) if isinstance(arg, (str, bytes, os.PathLike)) else None
                if path is not None and not within(path, writable):
                    raise Violation(f"the grader does not allow {event} outside the working "
                                    f"directory ({arg!r})")
        elif event in STARTS_PROCESSES or event.startswith(("os.exec", "os.spawn")):
            if not library_starts_compiler(event, args):
                raise Violation(f"the grader does not allow starting processes ({event})")
        elif event in ("os.kill", "os.killpg"):
            pid = args[0] if args else None
            if pid not in (own_pid, 0):
                raise Violation("the grader does not allow signalling other processes")
        elif event in ("socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg"):
            sock = args[0] if args else None
            family = getattr(sock, "family", None)
            if family is None or int(family) != 1:  # AF_UNIX aside, no network
                raise Violation("the grader does not allow network access")
        elif event in ("ctypes.dlopen", "ctypes.dlsym", "ctypes.call_function"):
            # Installed libraries may use ctypes (PyTorch loads CUDA lazily that way);
            # code of the learner's may not: look at who is asking, past ctypes itself.
            frame = getframe(1)
            while frame is not None and within(frame.f_code.co_filename, (ctypes_dir,)):
                frame = frame.f_back
            caller = frame.f_code.co_filename if frame is not None else ""
            if not (caller.startswith("/") and within(realpath(caller), libraries)):
                raise Violation("the grader does not allow native code through ctypes")
        elif event in FORBIDDEN and FORBIDDEN[event]:
            raise Violation(f"the grader does not allow {FORBIDDEN[event]}")

    sys.addaudithook(hook)
