"""Each layer of a kernel's isolation (autograder/kernel/confine.py, audit.py, cgroups.py), seen from inside the kernel.

A real kernel, confined the way the grader confines a submission's, reports what it sees;
each test checks one layer on its own, so that one layer failing cannot hide behind
another (the hostile corpus checks what they hold together). Needs root on Linux: the
grader builds these layers only there.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import pytest
from nbformat.v4 import new_code_cell, new_notebook

from autograder.pipeline.execute import Limits, execute
from autograder.sandbox.workdir import run_dir
from autograder.sandbox.cgroups import ResourceGroup, cgroup_places
from autograder.protocol import FILE_SYSTEM, GROUP, NETWORK, NOBODY, PROCESS_SPACE, Policy, python_paths
from autograder.sandbox.device import machine_layers
from autograder.sandbox.policy import closed_folders, shown_paths
from autograder.sandbox.spawn import fork_supported, open_spawner

ISOLATING = sys.platform.startswith("linux") and os.geteuid() == 0

DISK = 64 * 2**20
PROCESSES = 64

LOOK = r'''
import json, os, socket
seen = {"pid": os.getpid(), "uid": os.getuid(), "gid": os.getgid(),
        "processes": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
        "interfaces": [name for _, name in socket.if_nameindex()],
        "cwd": os.getcwd(), "files": sorted(os.listdir(".")),
        "disk": os.statvfs(".").f_blocks * os.statvfs(".").f_frsize,
        "shm": os.listdir("/dev/shm"),
        "hidden_run_dir": sorted(os.listdir(os.path.dirname(os.getcwd())))}
own_cpus = "/sys/fs/cgroup/cpuset" + next(
    (line.split(":", 2)[2] for line in open("/proc/self/cgroup").read().splitlines()
     if line.split(":")[1] == "cpuset"), "/") + "/cpuset.cpus"
seen["own_cpus"] = own_cpus
for name, path in (("sys", "/sys/fs/cgroup/pids/cgroup.procs"), ("etc", "/etc/hostname"),
                   ("proc", "/proc/sys/kernel/hostname"), ("cpus", own_cpus)):
    try:
        os.close(os.open(path, os.O_WRONLY))
        seen[name] = "writable"
    except OSError as error:
        seen[name] = error.strerror
print("SEEN" + json.dumps(seen))
'''


@pytest.fixture(scope="module", params=["fork", "fresh"])
def seen(request, tmp_path_factory):
    """What a confined kernel reports, in each kernel mode; also the group's peak."""
    if not ISOLATING:
        pytest.skip("the grader isolates kernels as root on Linux (see guide/threat-model.md)")
    if request.param == "fork" and not fork_supported():
        pytest.skip("no fork server here")
    outside = Path(tempfile.mkdtemp(dir="/dev/shm")) if os.path.isdir("/dev/shm") else None
    workdir = Path(tempfile.mkdtemp(prefix="submission-", dir=run_dir()))
    (workdir / "data.csv").write_text("x,y\n1,2\n")
    group = ResourceGroup.create(2**31, PROCESSES)
    assert group is not None, "root on Linux, yet no cgroup could be made"
    hidden = (str(run_dir()), *closed_folders(python_paths()))
    policy = Policy(workdir=str(workdir), disk=DISK, hidden=hidden,
                    shown=shown_paths(hidden, python_paths()), cgroups=group.paths)
    nb = new_notebook(cells=[new_code_cell(LOOK)], metadata={"kernelspec": {
        "name": "python3", "language": "python", "display_name": "Python 3"}})
    spawner = open_spawner(request.param)
    try:
        done = execute(nb, workdir, parameters={}, limits=Limits(cell=60, notebook=120),
                       spawner=spawner, sandbox=policy.to_dict(), group=group,
                       env={"HOME": str(workdir), "TMPDIR": str(workdir)}, log=run_dir() / "k.log")
    finally:
        group.close()
        spawner.close()
    text = "".join(o.get("text", "") for o in done.notebook.cells[-1].outputs)
    assert "SEEN" in text, (done.ended, done.message, (run_dir() / "k.log").read_text()[-3000:])
    report = json.loads(text.split("SEEN", 1)[1])
    report["grader_files"] = sorted(os.listdir(workdir))
    report["peak_processes"] = done.peak_processes
    report["group_left"] = [os.path.exists(p) for p in group.paths]
    if outside is not None:
        outside.rmdir()
    report["outside_shm"] = outside.name if outside is not None else None
    return report


def test_the_kernel_has_a_pid_namespace_of_its_own(seen):
    assert seen["pid"] == 2  # below the namespace's init
    assert seen["processes"] == [1, 2], seen["processes"]


def test_the_kernel_runs_as_nobody(seen):
    assert (seen["uid"], seen["gid"]) == (NOBODY, NOBODY)


def test_the_kernel_has_only_its_own_loopback(seen):
    assert seen["interfaces"] == ["lo"], seen["interfaces"]


def test_the_working_directory_is_a_tmpfs_of_the_disk_limit(seen):
    assert seen["disk"] == DISK
    assert "data.csv" in seen["files"]
    # What the kernel writes there stays in its own tmpfs, not in the grader's folder.
    assert "kernel-connection.json" in seen["files"]
    assert "kernel-connection.json" not in seen["grader_files"]


def test_other_working_directories_are_hidden(seen):
    # In the grader's run folder the kernel sees its own working directory and the
    # folder of its own sockets, nothing else.
    others = [name for name in seen["hidden_run_dir"] if name != os.path.basename(seen["cwd"])]
    assert len(others) == 1 and others[0].startswith("ipc-"), seen["hidden_run_dir"]


def test_shared_memory_is_the_kernels_own(seen):
    assert seen["outside_shm"] not in seen["shm"]


def test_system_files_cgroups_and_sysctls_are_not_writable(seen):
    for name in ("sys", "etc", "proc"):
        assert seen[name] != "writable", (name, seen[name])
    # its own group's CPUs (a speed test's timed CPU is set there) included
    assert "autograder-" in seen["own_cpus"] or not os.path.exists("/sys/fs/cgroup/cpuset")
    assert seen["cpus"] != "writable", seen["own_cpus"]


def test_the_resource_group_counted_the_kernel_and_is_removed(seen):
    assert 0 < seen["peak_processes"] <= PROCESSES
    assert seen["group_left"] == [False] * len(seen["group_left"])


def test_cgroup_places_are_read_from_mountinfo():
    mountinfo = (
        "30 25 0:26 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
        "31 25 0:27 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n"
        "32 25 0:28 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n")
    own = "4:memory:/job/7\n8:pids:/\n0::/user.slice\n"
    assert cgroup_places(mountinfo, own) == (1, {"memory": "/sys/fs/cgroup/memory/job/7",
                                                 "pids": "/sys/fs/cgroup/pids"})
    only_v2 = "32 25 0:28 /outer /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
    assert cgroup_places(only_v2, "0::/outer/grader\n") == (
        2, {"memory": "/sys/fs/cgroup/grader", "pids": "/sys/fs/cgroup/grader"})
    assert cgroup_places("", "0::/\n") == (0, {})


# A cell that says so if any of the learner's code ran.
MARK = "print('RAN')"


def run_with_group_folder(tmp_path, required: tuple, kernel: str = "fork"):
    """A kernel told to join a cgroup folder that does not exist (its resource group cannot
    be made, as under a transient failure), with ``required`` layers; what came of it."""
    workdir = Path(tempfile.mkdtemp(prefix="submission-", dir=run_dir()))
    policy = Policy(workdir=str(workdir), cgroups=(str(tmp_path / "no-such-cgroup"),),
                    required=required, user=-1)
    nb = new_notebook(cells=[new_code_cell(MARK)], metadata={"kernelspec": {
        "name": "python3", "language": "python", "display_name": "Python 3"}})
    spawner = open_spawner(kernel)
    try:
        done = execute(nb, workdir, parameters={}, limits=Limits(cell=60, notebook=120),
                       spawner=spawner, sandbox=policy.to_dict(),
                       env={"HOME": str(workdir), "TMPDIR": str(workdir)},
                       log=tmp_path / "kernel.log")
        return done, "RAN" in "".join(o.get("text", "") for o in done.notebook.cells[-1].outputs)
    finally:
        spawner.close()
        import shutil
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="cgroups are Linux's")
@pytest.mark.parametrize("kernel", ["fork", "fresh"])
def test_a_kernel_that_cannot_get_a_required_layer_never_starts(tmp_path, kernel):
    if kernel == "fork" and not fork_supported():
        pytest.skip("no fork server here")
    done, ran = run_with_group_folder(tmp_path, required=(GROUP,), kernel=kernel)
    assert done.ended == "failed-to-start" and not ran, (done.ended, done.message)
    assert "no resource group" in done.message and "was not started" in done.message, \
        done.message


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="cgroups are Linux's")
def test_a_layer_the_machine_does_not_give_is_a_note_and_the_kernel_runs(tmp_path):
    done, ran = run_with_group_folder(tmp_path, required=())
    assert done.ended == "completed" and ran, (done.ended, done.message)
    assert "no resource group" in (tmp_path / "kernel.log").read_text()


def test_the_grader_requires_every_namespace_a_root_grader_gets_here():
    """What the probe finds is what the kernels of the tests above got: all three
    namespaces as root on Linux, none otherwise."""
    expected = {NETWORK, PROCESS_SPACE, FILE_SYSTEM} if ISOLATING else set()
    assert set(machine_layers()) == expected


@pytest.mark.skipif(not ISOLATING, reason="needs root on Linux to start the probe as nobody")
def test_the_probe_finds_no_namespace_for_an_unprivileged_user():
    """The probe makes the layers as a kernel does: where that fails (here: as nobody, who
    may not make namespaces), it reports none, and none is required."""
    import subprocess
    root = str(Path(__file__).resolve().parent.parent)
    # Imports first, as root: nobody may not enter the folder Python is installed in here.
    import tempfile
    handle, name = tempfile.mkstemp(dir="/tmp", prefix="layers-")  # a folder nobody may enter
    os.close(handle)
    answer = Path(name)
    answer.chmod(0o666)
    code = (f"import os, shutil, sys, tempfile; sys.path.insert(0, {root!r}); "
            "from autograder.kernel.confine import _libc, probe_layers; _libc(); "
            f"os.setgroups([]); os.setgid({NOBODY}); os.setuid({NOBODY}); "
            f"probe_layers({str(answer)!r})")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd="/")
    try:
        assert done.returncode == 0 and answer.read_text() == "", (answer.read_text(), done.stderr)
    finally:
        answer.unlink()
