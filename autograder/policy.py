"""What a learner's kernel may see and use: the :class:`Policy` the grader writes, and the
path rules it is made with (which folders to cover, which paths inside them to show again).

The grader builds a policy for each kernel (:func:`autograder.grade.sandbox_policy`); the
kernel's process reads it back (:mod:`.confine`, :mod:`.audit`). Plain data and path
arithmetic only.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, List, Tuple

from .options import KERNEL_CPU_SECONDS, KERNEL_OPEN_FILES, default

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
    required: Tuple[str, ...] = ()  # layers (confine.LAYER_NOTES) without which the kernel must
    #                                 not start: those this machine gives every kernel

    LISTS = ("hidden", "shown", "preload", "cgroups", "required")

    def to_dict(self) -> dict:
        return {name: list(value) if name in self.LISTS else value
                for name, value in self.__dict__.items()}

    @classmethod
    def from_dict(cls, data: dict) -> "Policy":
        return cls(**{**data, **{key: tuple(data.get(key, ())) for key in cls.LISTS}})


def python_paths() -> List[str]:
    """What a kernel imports from: the interpreter's prefixes and every ``sys.path`` folder."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix}
    paths.update(p for p in sys.path if p and os.path.isdir(p))
    return sorted({os.path.realpath(p) for p in paths})


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def within_any(path: str, folders) -> bool:
    return any(_inside(path, folder) for folder in folders)


def shown_paths(hidden: Iterable[str], wanted: Iterable[str]) -> Tuple[str, ...]:
    """The ``wanted`` paths that a hidden folder would cover (and must be shown again),
    minus any that would show a hidden folder itself (say, a course root on sys.path)."""
    hidden = [os.path.realpath(h) for h in hidden]
    shown = set()
    for path in wanted:
        path = os.path.realpath(path)
        if any(_inside(h, path) for h in hidden):
            continue  # showing it would show a hidden folder
        if within_any(path, hidden) and os.path.exists(path):
            shown.add(path)
    return tuple(sorted(shown))


def closed_folders(paths: Iterable[str]) -> Tuple[str, ...]:
    """Folders on the way to ``paths`` that other users may not enter (``/root`` of a
    Python installed in root's home). A kernel that runs as ``nobody`` gets them covered
    and the ``paths`` inside shown again, so it can import what it needs (and nothing else
    of theirs)."""
    import stat
    closed = set()
    for path in paths:
        parts = Path(os.path.realpath(path)).parts
        for depth in range(2, len(parts) + 1):
            folder = str(Path(*parts[:depth]))
            try:
                if not os.stat(folder).st_mode & stat.S_IXOTH:
                    closed.add(folder)
                    break
            except OSError:
                break
    return tuple(sorted(closed))
