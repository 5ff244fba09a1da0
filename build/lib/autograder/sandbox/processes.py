"""In the grader: the processes of a kernel (it and all it started) and their memory, read
from ``/proc``; :func:`kill_all` ends whatever a kernel left running.
"""
from __future__ import annotations

import os
import signal
from typing import List, Optional, Tuple


def _stat(pid: str) -> Optional[Tuple[int, int]]:
    """(parent pid, session id) of a living process, from /proc/<pid>/stat; None for one
    that has exited (a zombie waits for its parent to collect it; it runs nothing)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        if fields[0] in ("Z", "X"):
            return None
        return int(fields[1]), int(fields[3])
    except (OSError, IndexError, ValueError):
        return None


def processes_of(kernel_pid: int) -> List[int]:
    """The kernel and every process it started: its descendants, and whatever is still
    in its session (the kernel called ``setsid``; an orphan keeps the session)."""
    table = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            info = _stat(entry.name)
            if info is not None:
                table[int(entry.name)] = info
    found = {pid for pid, (_, session) in table.items() if session == kernel_pid}
    if kernel_pid in table:
        found.add(kernel_pid)
    grew = True
    while grew:
        more = {pid for pid, (parent, _) in table.items() if parent in found} - found
        found |= more
        grew = bool(more)
    found.discard(os.getpid())
    return sorted(found)


def kill_all(kernel_pid: int, rounds: int = 50) -> int:
    """SIGKILL the kernel and everything it started until nothing is left; how many."""
    if not os.path.isdir("/proc"):
        return 0
    import time
    killed = set()
    for _ in range(rounds):
        pids = processes_of(kernel_pid)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01)
    return len(killed)


def memory_of(kernel_pid: int) -> int:
    """Resident memory (bytes) of the kernel and everything it started, summed."""
    total = 0
    page = os.sysconf("SC_PAGE_SIZE")
    for pid in processes_of(kernel_pid):
        try:
            with open(f"/proc/{pid}/statm") as statm:
                total += int(statm.read().split()[1]) * page
        except (OSError, IndexError, ValueError):
            continue
    return total


# --------------------------------------------------------------------------------------
# In the grader: a resource group (cgroup) for each kernel
# --------------------------------------------------------------------------------------

# The files of each cgroup version: limits to write, and what to read back.
