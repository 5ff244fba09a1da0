"""CPUs of their own for a speed test's timed kernels (autograder/sandbox/cpus.py).

While a speed test is timed, its two kernels' groups get the machine's last CPU and every
other kernel group beside them the rest, whatever affinity their processes asked for; a
group made meanwhile starts on the rest; afterwards all get every CPU back. Needs root and
a writable cgroup v1 ``cpuset`` with two CPUs or more (as on the course's machines).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autograder.sandbox.cgroups import ResourceGroup
from autograder.sandbox.cpus import (STATE_NAME, TimingCpus, cpus_for_new_group, format_cpus,
                                     parse_cpus)


def test_cpu_lists_are_read_and_written_as_the_kernel_writes_them():
    assert parse_cpus("0-3,6\n") == [0, 1, 2, 3, 6]
    assert parse_cpus("5") == [5] and parse_cpus("") == []
    assert format_cpus([3, 1, 2]) == "1,2,3"
    assert parse_cpus(format_cpus(range(8))) == list(range(8))


def test_without_a_cpuset_nothing_is_pinned(tmp_path):
    with TimingCpus([None, str(tmp_path)], 1, str(tmp_path)) as held:
        assert held.cpus == []
    with TimingCpus([], 1, str(tmp_path)) as held:
        assert held.cpus == []


def _cpuset_root() -> Path:
    return Path("/sys/fs/cgroup/cpuset")


def _usable() -> bool:
    root = _cpuset_root()
    return (sys.platform.startswith("linux") and os.geteuid() == 0
            and (root / "cpuset.cpus").exists() and len(os.sched_getaffinity(0)) >= 2
            and os.access(root, os.W_OK))


needs_cpuset = pytest.mark.skipif(not _usable(), reason="needs root, a writable cgroup v1 "
                                  "cpuset and two CPUs or more")


def _cpus(group: ResourceGroup):
    return parse_cpus(Path(group.cpuset_folder, "cpuset.cpus").read_text())


@needs_cpuset
def test_the_timed_kernels_get_the_last_cpu_and_every_other_group_the_rest(tmp_path):
    groups = [ResourceGroup.create(2**30, 64) for _ in range(3)]
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        learner, clean, other = groups
        assert all(g is not None and g.cpuset_folder for g in groups)
        everything = _cpus(other)
        assert len(everything) >= 2 and _cpus(learner) == everything
        # A process of another grading, which asked to run anywhere.
        Path(other.cpuset_folder, "cgroup.procs").write_text(str(sleeper.pid))
        os.sched_setaffinity(sleeper.pid, everything)
        with TimingCpus([learner.cpuset_folder, clean.cpuset_folder], 1,
                        str(tmp_path)) as held:
            assert held.cpus == everything[-1:]
            assert _cpus(learner) == _cpus(clean) == everything[-1:]
            assert _cpus(other) == everything[:-1]
            assert everything[-1] not in os.sched_getaffinity(sleeper.pid)
            state = json.loads((tmp_path / STATE_NAME).read_text())
            assert state == {"pid": os.getpid(), "cpus": everything[-1:]}
            # A kernel that starts meanwhile starts on the rest.
            late = Path(learner.cpuset_folder).parent / f"autograder-{os.getpid()}-late-0"
            late.mkdir()
            try:
                assert cpus_for_new_group(str(late), str(tmp_path))
                assert parse_cpus((late / "cpuset.cpus").read_text()) == everything[:-1]
            finally:
                late.rmdir()
        assert _cpus(learner) == _cpus(clean) == _cpus(other) == everything
        assert not (tmp_path / STATE_NAME).exists()
    finally:
        sleeper.kill()
        sleeper.wait()
        for group in groups:
            if group is not None:
                group.close()


@needs_cpuset
def test_a_reservation_whose_grader_died_is_ignored(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / STATE_NAME).write_text(json.dumps({"pid": dead.pid, "cpus": [0]}))
    group = ResourceGroup.create(2**30, 64)
    late = Path(group.cpuset_folder).parent / f"autograder-{os.getpid()}-late-1"
    late.mkdir()
    try:
        assert cpus_for_new_group(str(late), str(tmp_path))
        assert parse_cpus((late / "cpuset.cpus").read_text()) == _cpus(group)
    finally:
        late.rmdir()
        group.close()
