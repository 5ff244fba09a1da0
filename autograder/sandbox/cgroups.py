"""In the grader: a resource group (cgroup, v1 ``memory`` and ``pids`` or v2) for each
kernel, which bounds the memory and the processes of the kernel and everything it starts,
reports their peaks, and kills what is left in it when closed. The kernel joins it from
its own process (:func:`autograder.kernel.confine.confine`).
"""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import List, Optional, Tuple

from autograder.sandbox.cpus import cpus_for_new_group


# The files of each cgroup version: limits to write, and what to read back.
CGROUP_FILES = {
    1: {"memory_limit": ("memory", "memory.limit_in_bytes"),
        "swap_limit": ("memory", "memory.memsw.limit_in_bytes"),
        "process_limit": ("pids", "pids.max"),
        "memory_usage": ("memory", "memory.usage_in_bytes"),
        "memory_peak": ("memory", "memory.max_usage_in_bytes"),
        "memory_events": ("memory", "memory.oom_control"),
        "process_peak": ("pids", "pids.peak"),
        "cpu_usage": ("cpuacct", "cpuacct.usage"),
        "freeze": ("freezer", "freezer.state"),
        "cpus": ("cpuset", "cpuset.cpus")},
    2: {"memory_limit": ("memory", "memory.max"),
        "swap_limit": ("memory", "memory.swap.max"),
        "process_limit": ("pids", "pids.max"),
        "memory_usage": ("memory", "memory.current"),
        "memory_peak": ("memory", "memory.peak"),
        "memory_events": ("memory", "memory.events"),
        "process_peak": ("pids", "pids.peak"),
        "cpu_usage": ("memory", "cpu.stat"),
        "freeze": ("memory", "cgroup.freeze"),
        "cpus": ("memory", "cpuset.cpus")},
}
# Controllers a group gets where the machine has them: what a speed test needs to keep the
# kernel still between timed requests, to count its CPU time and to give it CPUs of its own
# (autograder.pipeline.timing, autograder.sandbox.cpus).
OPTIONAL_V1 = ("freezer", "cpuacct", "cpuset")


def cgroup_places(mountinfo: str, own_groups: str) -> Tuple[int, dict]:
    """(version, {"memory": folder, "pids": folder}): where this process's own cgroups
    are, read from the text of ``/proc/self/mountinfo`` and ``/proc/self/cgroup``.

    cgroup v1 when both controllers have a v1 hierarchy, else the v2 hierarchy (whether
    its controllers are delegated to us is for :meth:`ResourceGroup.create` to find out);
    ``(0, {})`` when neither is mounted.
    """
    v1_mounts, v2_mount = {}, None
    for line in mountinfo.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        after = line.split(" - ", 1)[1].split()
        fstype, options = after[0], after[2].split(",") if len(after) > 2 else []
        root, point = fields[3], fields[4].encode().decode("unicode_escape")
        if fstype == "cgroup":
            for controller in ("memory", "pids", *OPTIONAL_V1):
                if controller in options:
                    v1_mounts[controller] = (root, point)
        elif fstype == "cgroup2":
            v2_mount = (root, point)
    v1_paths, v2_path = {}, None
    for line in own_groups.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "" and parts[0] == "0":
            v2_path = path
        for controller in controllers.split(","):
            if controller in ("memory", "pids", *OPTIONAL_V1):
                v1_paths[controller] = path

    def folder(mount, path) -> Optional[str]:
        root, point = mount
        if not (path == root or path.startswith(root.rstrip("/") + "/")):
            return None  # our cgroup is not inside what is mounted here
        return os.path.join(point, path[len(root.rstrip("/")):].lstrip("/")).rstrip("/")

    found = {c: folder(v1_mounts[c], v1_paths[c]) for c in ("memory", "pids")
             if c in v1_mounts and c in v1_paths}
    if len(found) == 2 and all(found.values()):
        for controller in OPTIONAL_V1:
            if controller in v1_mounts and controller in v1_paths:
                place = folder(v1_mounts[controller], v1_paths[controller])
                if place:
                    found[controller] = place
        return 1, found
    if v2_mount and v2_path is not None:
        place = folder(v2_mount, v2_path)
        if place:
            return 2, {"memory": place, "pids": place}
    return 0, {}


def _remove_stale_groups(places) -> None:
    """Remove the empty groups of graders that died without closing them (SIGKILL)."""
    for place in set(places):
        try:
            entries = os.listdir(place)
        except OSError:
            continue
        for name in entries:
            parts = name.split("-")
            if parts[0] != "autograder" or len(parts) != 4 or not parts[1].isdigit():
                continue
            try:
                os.kill(int(parts[1]), 0)
                continue  # its grader is still running
            except ProcessLookupError:
                pass
            except PermissionError:
                continue
            try:
                os.rmdir(os.path.join(place, name))
            except OSError:
                pass  # not empty: something still runs in it; leave it be


class ResourceGroup:
    """The cgroup of one kernel and everything it starts.

    The Linux kernel enforces its limits (memory, and processes plus threads) on all of
    them together, native code included; it also says how much memory they used at most,
    whether its out-of-memory killer had to act, and which processes are still in it.

    The grader makes one per kernel (:meth:`create`, which needs write access to the
    cgroup file system: root, or a delegated cgroup v2 subtree), the kernel joins it
    first thing (``Policy.cgroups``), and the grader :meth:`close` s it afterwards, killing
    whatever is still inside.
    """
    _count = 0

    def __init__(self, version: int, folders: dict):
        self.version = version
        self.folders = folders  # controller -> the group's folder

    @classmethod
    def create(cls, memory: int, processes: int) -> Optional["ResourceGroup"]:
        """A new group under this process's own cgroups, or None where none can be made."""
        if not sys.platform.startswith("linux"):
            return None
        try:
            version, places = cgroup_places(Path("/proc/self/mountinfo").read_text(),
                                            Path("/proc/self/cgroup").read_text())
        except OSError:
            return None
        if version == 2:
            try:
                delegated = Path(places["memory"], "cgroup.subtree_control").read_text().split()
            except OSError:
                return None
            if not {"memory", "pids"} <= set(delegated):
                return None
        if not version:
            return None
        if cls._count == 0:
            _remove_stale_groups(places.values())
        cls._count += 1
        name = f"autograder-{os.getpid()}-{cls._count}-{os.urandom(3).hex()}"
        folders = {c: os.path.join(place, name) for c, place in places.items()}
        group = cls(version, folders)
        try:
            for folder in set(folders.values()):
                os.mkdir(folder)
            group._write("memory_limit", memory)
            group._write("swap_limit", memory if version == 1 else 0, optional=True)
            group._write("process_limit", processes)
        except OSError:
            group.close()
            return None
        group._start_cpus()
        return group

    def _start_cpus(self) -> None:
        """Give the group its CPUs (a v1 cpuset group has none until told, and no process
        can join it then); where that fails, the group goes without the controller."""
        folder = self.cpuset_folder
        if folder is None or cpus_for_new_group(folder) or self.version == 2:
            return
        del self.folders["cpuset"]
        try:
            os.rmdir(folder)
        except OSError:
            pass

    @property
    def cpuset_folder(self) -> Optional[str]:
        """The folder whose ``cpuset.cpus`` sets the group's CPUs (None: no cpuset here)."""
        controller, name = CGROUP_FILES[self.version]["cpus"]
        folder = self.folders.get(controller)
        return folder if folder and os.path.exists(os.path.join(folder, name)) else None

    def _path(self, key: str) -> str:
        controller, name = CGROUP_FILES[self.version][key]
        return os.path.join(self.folders[controller], name)

    def _write(self, key: str, value: int, optional: bool = False) -> None:
        try:
            with open(self._path(key), "w") as handle:
                handle.write(str(value))
        except OSError:
            if not optional:
                raise

    def _read_int(self, key: str) -> int:
        try:
            return int(Path(self._path(key)).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return 0

    @property
    def paths(self) -> Tuple[str, ...]:
        """The folders the kernel joins."""
        return tuple(sorted(set(self.folders.values())))

    def memory_usage(self) -> int:
        return self._read_int("memory_usage")

    def memory_peak(self) -> int:
        return self._read_int("memory_peak")

    def process_peak(self) -> int:
        """The most processes and threads that were in the group at once (0: unknown)."""
        return self._read_int("process_peak")

    def out_of_memory_kills(self) -> int:
        """How many processes the out-of-memory killer killed in this group."""
        try:
            for line in Path(self._path("memory_events")).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def cpu_seconds(self) -> Optional[float]:
        """CPU time the group's processes have used so far (None where it is not counted)."""
        try:
            text = Path(self._path("cpu_usage")).read_text()
        except (KeyError, OSError):
            return None
        if self.version == 1:
            return int(text.split()[0]) / 1e9
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) / 1e6
        return None

    @property
    def can_freeze(self) -> bool:
        controller = CGROUP_FILES[self.version]["freeze"][0]
        return controller in self.folders and os.path.exists(self._path("freeze"))

    def freeze(self, frozen: bool = True, timeout: float = 2.0) -> bool:
        """Stop (or restart) every process of the group where it stands, and wait until it
        has; False if the machine cannot, or it did not happen within ``timeout``."""
        import time
        if not self.can_freeze:
            return False
        value = ("FROZEN" if frozen else "THAWED") if self.version == 1 else str(int(frozen))
        try:
            with open(self._path("freeze"), "w") as handle:
                handle.write(value)
        except OSError:
            return False
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.frozen() == frozen:
                return True
            time.sleep(0.0005)
        return False

    def frozen(self) -> Optional[bool]:
        try:
            if self.version == 1:
                return Path(self._path("freeze")).read_text().strip() == "FROZEN"
            events = Path(self.folders["memory"], "cgroup.events").read_text()
            return "frozen 1" in events.splitlines()
        except (KeyError, OSError):
            return None

    def processes(self) -> List[int]:
        found = set()
        for folder in self.paths:
            try:
                found.update(int(p) for p in Path(folder, "cgroup.procs").read_text().split())
            except (OSError, ValueError):
                pass
        return sorted(found)

    def close(self) -> None:
        """Kill every process still in the group, then remove it."""
        import time
        if self.can_freeze:
            self.freeze(False)  # a frozen process does not die of SIGKILL until thawed
        for _ in range(500):
            pids = self.processes()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.01)
        for folder in self.paths:
            for _ in range(100):
                try:
                    os.rmdir(folder)
                    break
                except FileNotFoundError:
                    break
                except OSError:  # a process killed a moment ago may still be leaving
                    time.sleep(0.01)
