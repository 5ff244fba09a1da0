"""What the grader and the processes it starts agree on, and nothing else.

The grader's side (:mod:`autograder.sandbox`, :mod:`autograder.pipeline`) and the code that
runs in a learner's kernel (:mod:`autograder.kernel`) import nothing of each other; they share
these names: the targets the grader starts by name, the :class:`Policy` it writes for a
kernel (and the path arithmetic both sides do on it), the sandbox's layers, and the marks the
kernel's outputs carry back (evidence, timeouts, replies). Plain data; it imports only
:mod:`autograder.options`, for the limits a policy defaults to.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import List, Tuple

from autograder.options import KERNEL_CPU_SECONDS, KERNEL_OPEN_FILES, default

# Processes the grader starts through a spawner, by "module:function".
KERNEL_TARGET = "autograder.kernel.process:main"            # a learner's kernel
LAYERS_PROBE_TARGET = "autograder.kernel.confine:probe_layers"  # which layers this machine gives
CHECKS_TARGET = "autograder.pipeline.checks:serve_request"  # the instructor's checks
DEVICE_PROBE_TARGET = "autograder.sandbox.device:probe"     # whether PyTorch sees a GPU
TARGETS = (KERNEL_TARGET, LAYERS_PROBE_TARGET, CHECKS_TARGET, DEVICE_PROBE_TARGET)

# What a probe cell prints for the checks: one display_data output of this type, printed
# by EVIDENCE_MODULE's ``emit`` in the kernel.
EVIDENCE_MIME = "application/vnd.autograder.evidence+json"
EVIDENCE_MODULE = "autograder.kernel.evidence"

# What a kernel imports of this package besides its target, before the learner's code runs
# (a fork server preloads them, so no kernel pays for them).
KERNEL_IMPORTS = ("autograder.kernel.confine", EVIDENCE_MODULE)

# Marks of the executed notebook: the error name of a cell stopped at its time limit, and the
# cell metadata key under which the kernel's reply to each cell is kept.
TIMEOUT_ENAME = "CellTimeoutError"
REPLY_KEY = "autograder"


def reply_status(cell) -> "str | None":
    """How the kernel answered the cell (``ok``, ``error``, ``aborted``); None: no answer."""
    return cell.get("metadata", {}).get(REPLY_KEY, {}).get("reply")

# The layers a policy may require, each with the note the kernel gives when it cannot make it.
NO_PID_NAMESPACE = "no private process space"
GROUP, PROCESS_SPACE, FILE_SYSTEM, NETWORK, USER = (
    "resource group", "process space", "file system view", "network", "user")
LAYER_NOTES = {GROUP: "no resource group", PROCESS_SPACE: NO_PID_NAMESPACE,
               FILE_SYSTEM: "no private file system view", NETWORK: "no private network",
               USER: "privileges kept"}

NOBODY = 65534  # the user and group a kernel of a root grader runs as


@dataclass(frozen=True)
class Policy:
    """What a learner's kernel may use. Sizes in bytes, times in seconds."""
    workdir: str
    memory: int = default("memory")        # RLIMIT_DATA: heap and private memory
    file_size: int = default("file_size")  # RLIMIT_FSIZE: the largest file it may write
    cpu_seconds: int = KERNEL_CPU_SECONDS  # RLIMIT_CPU: a last resort behind wall-clock limits
    open_files: int = KERNEL_OPEN_FILES    # RLIMIT_NOFILE
    disk: int = default("disk")            # size of the tmpfs holding the working directory
    hidden: Tuple[str, ...] = ()   # folders to cover with an empty read-only file system
    shown: Tuple[str, ...] = ()    # paths inside hidden folders to show again, read-only
    preload: Tuple[str, ...] = ()  # modules to import before confining (they may need
    #                                to load native libraries, which the learner may not)
    sockets: str = ""              # a folder for the kernel's Unix sockets (writable)
    cgroups: Tuple[str, ...] = ()  # the cgroup folders to join (see ResourceGroup)
    user: int = NOBODY             # run as this user and group when started as root
    required: Tuple[str, ...] = ()  # layers (LAYER_NOTES) without which the kernel must
    #                                 not start: those this machine gives every kernel
    programs: Tuple[str, ...] = ()  # what an installed library may start (real paths): the
    #                                 compilers a GPU kernel is built with (policy.py)

    LISTS = ("hidden", "shown", "preload", "cgroups", "required", "programs")

    def to_dict(self) -> dict:
        return {name: list(value) if name in self.LISTS else value
                for name, value in self.__dict__.items()}

    @classmethod
    def from_dict(cls, data: dict) -> "Policy":
        return cls(**{**data, **{key: tuple(data.get(key, ())) for key in cls.LISTS}})


def inside(path: str, folder: str) -> bool:
    """Whether ``path`` is ``folder`` or lies below it (plain strings, no file system)."""
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def within_any(path: str, folders) -> bool:
    return any(inside(path, folder) for folder in folders)


def python_paths() -> List[str]:
    """What a kernel imports from: the interpreter's prefixes and every ``sys.path`` folder."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix}
    paths.update(p for p in sys.path if p and os.path.isdir(p))
    return sorted({os.path.realpath(p) for p in paths})
