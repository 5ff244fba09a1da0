"""CPUs of their own for the two kernels a speed test times (cgroup ``cpuset``).

While a speed test is timed (:mod:`autograder.pipeline.timing`), its learner's and clean
kernels' groups are set to the machine's last ``count`` CPUs, and every other kernel group of
the graders on this machine (the groups beside them, named by :class:`ResourceGroup`) to the
rest; afterwards every group gets all of them back. A group made meanwhile starts on the rest
(:func:`cpus_for_new_group`). The Linux kernel applies a cpuset to every thread in the group,
whatever affinity it set for itself, so no other grading can run on the timed CPUs.

What is shared between graders is a small state file (who reserved which CPUs) under a lock
file, both in the temporary folder beside the timing lock; a reservation whose grader died is
ignored. Processes outside the graders' groups (other programs on the machine) are not moved.
"""
from __future__ import annotations

import fcntl
import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, List, Optional, Set

STATE_NAME = "autograder-cpus.json"
LOCK_NAME = "autograder-cpus.lock"
CPUS_FILE = "cpuset.cpus"


def parse_cpus(text: str) -> List[int]:
    """The CPUs of a cpuset list such as ``0-3,6``."""
    cpus = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return sorted(cpus)


def format_cpus(cpus: Iterable[int]) -> str:
    return ",".join(str(cpu) for cpu in sorted(cpus))


def _folder(folder: Optional[str]) -> str:
    return folder or tempfile.gettempdir()


@contextmanager
def _locked(folder: Optional[str]):
    with open(os.path.join(_folder(folder), LOCK_NAME), "a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _reserved(folder: Optional[str]) -> Set[int]:
    """The CPUs a living grader holds for timing now (call with the lock held)."""
    try:
        state = json.loads(Path(_folder(folder), STATE_NAME).read_text())
        os.kill(int(state["pid"]), 0)
        return set(state["cpus"])
    except (OSError, ValueError, KeyError, TypeError):
        return set()  # none, unreadable, or its grader died (ProcessLookupError)


def _write(folder: str, cpus: Iterable[int]) -> bool:
    try:
        Path(folder, CPUS_FILE).write_text(format_cpus(cpus))
        return True
    except OSError:
        return False


def _all_cpus(parent: str) -> List[int]:
    try:
        return parse_cpus(Path(parent, CPUS_FILE).read_text())
    except (OSError, ValueError):
        return []


def _kernel_groups(parent: str) -> List[str]:
    """The kernel groups of the graders beside ours (see ResourceGroup's names)."""
    try:
        names = os.listdir(parent)
    except OSError:
        return []
    return [os.path.join(parent, name) for name in names
            if name.startswith("autograder-") and os.path.isdir(os.path.join(parent, name))]


def cpus_for_new_group(group_folder: str, lock_folder: Optional[str] = None) -> bool:
    """Give a new group (cgroup v1: it must have CPUs and memory nodes before a process can
    join) its parent's CPUs, less those reserved for timing now; False if it cannot."""
    parent = os.path.dirname(group_folder)
    try:
        Path(group_folder, "cpuset.mems").write_text(Path(parent, "cpuset.mems").read_text())
    except OSError:
        pass  # cgroup v2 has no such requirement (the file may not be there)
    with _locked(lock_folder):
        cpus = set(_all_cpus(parent))
        rest = cpus - _reserved(lock_folder)
        return _write(group_folder, rest or cpus)


class TimingCpus:
    """While held: ``count`` CPUs for the groups of ``folders`` alone (see the module)."""

    def __init__(self, folders: Iterable[Optional[str]], count: int = 1,
                 lock_folder: Optional[str] = None):
        folders = list(folders)
        self.folders = [f for f in folders if f and os.path.exists(os.path.join(f, CPUS_FILE))]
        # Pinned only if every timed kernel can be (else they would run on different CPUs).
        self.complete = bool(folders) and len(self.folders) == len(folders)
        self.count, self.lock_folder = count, lock_folder
        self.cpus: List[int] = []  # the timed kernels' CPUs while held (empty: not pinned)

    def __enter__(self) -> "TimingCpus":
        if not self.folders or not self.complete:
            return self
        parent = os.path.dirname(self.folders[0])
        everything = _all_cpus(parent)
        if len(everything) <= self.count:
            return self  # nothing would be left for the others
        timed, rest = everything[-self.count:], everything[:-self.count]
        with _locked(self.lock_folder):
            Path(_folder(self.lock_folder), STATE_NAME).write_text(
                json.dumps({"pid": os.getpid(), "cpus": timed}))
            # Others first: a CPU is never given to ours while another group still has it.
            for folder in _kernel_groups(parent):
                if folder not in self.folders:
                    _write(folder, rest)
            if all(_write(folder, timed) for folder in self.folders):
                self.cpus = timed
        return self

    def __exit__(self, *exc) -> None:
        if not self.cpus:
            return
        parent = os.path.dirname(self.folders[0])
        with _locked(self.lock_folder):
            Path(_folder(self.lock_folder), STATE_NAME).unlink(missing_ok=True)
            everything = _all_cpus(parent)
            for folder in _kernel_groups(parent):
                _write(folder, everything)
        self.cpus = []
