"""Confine a learner's kernel, in the kernel's own process: what it may read, write, start,
use and reach. (The grader's side: :mod:`autograder.sandbox`.)

A submission's kernel is one process (see :mod:`autograder.kernel.process`). Before it runs anything of
the learner's, :func:`confine` turns it into a process that

* lives in a **resource group of its own** (a cgroup the grader made for it, see
  :class:`autograder.sandbox.cgroups.ResourceGroup`): the memory and the number of processes and
  threads of the kernel and everything it starts are bounded by the Linux kernel, so a
  memory bomb or a fork bomb is stopped where it starts, even in native code;
* lives in a **PID namespace of its own** (as PID 2, below an init): it cannot see or signal
  any process outside it, and when it ends the Linux kernel kills everything it started;
  a small *keeper* process outside the namespace stands for it to the grader;
* has a **network namespace of its own** (nothing reachable but its own loopback; it talks
  to the grader over Unix sockets) and its own System V IPC;
* sees a **file system of its own** (a private mount namespace): the course directory
  (instructor notebooks, hidden tests, ``.git``, the gradebook), the submissions and the
  output folder are covered by empty read-only file systems, and so is a lesson checkout
  the kernel imports from (:func:`autograder.sandbox.policy.source_folders`); the Python
  environment and the checkout's packages are shown again read-only; every other mount is
  read-only and ``nosuid``; its working directory is a size-limited ``tmpfs`` holding a
  copy of the submission's files, so its disk use is bounded in total, not only per file;
  ``/dev/shm`` is a small private tmpfs;
* runs as an **unprivileged user** (``nobody``) when the grader is root, after giving up
  every capability for good (``no_new_privs``), so it can neither undo any of the above
  nor write to anything the file permissions protect;
* has hard ``setrlimit`` limits (data memory, file size, CPU seconds, open files, no core
  dumps);
* runs under a Python audit hook (:func:`autograder.kernel.audit.install_audit_hook`,
  :pep:`578`) that refuses
  to start processes, to open network connections, to load native code through
  ``ctypes``, to signal other processes and to write outside its working directory. The
  hook is defence in depth with clear error messages: native code does not raise audit
  events, so no property rests on it alone.

Namespaces, mounts, cgroups and the change of user need root (``CAP_SYS_ADMIN``); without
root the limits and the audit hook still apply and :func:`confine` says what it could not
do (guide/threat-model.md lists what holds then). Where the machine does give a layer
(:func:`autograder.sandbox.device.machine_layers` finds out once per grader process), the grader lists it in the
policy's ``required``, and a kernel that fails to get it (a transient failure under load)
raises :class:`SandboxError` and never starts: no submission runs with less isolation than
the machine gives the others. In the grader,
:func:`autograder.sandbox.processes.kill_all` kills whatever a kernel left running, and
:meth:`~autograder.sandbox.cgroups.ResourceGroup.close` kills every process still in its group.

None of this makes the kernel's own verdicts trustworthy: the learner's code runs in
it. Scores are decided elsewhere (see :mod:`autograder.pipeline.checks`).
"""
from __future__ import annotations

import ctypes
import os
import resource
import signal
import sys
from pathlib import Path
from typing import Iterable, List, Optional, Tuple

from autograder.kernel.audit import install_audit_hook
from autograder.options import KERNEL_SHM
from autograder.protocol import (FILE_SYSTEM, GROUP, LAYER_NOTES, NETWORK, NO_PID_NAMESPACE, USER,
                                 PROCESS_SPACE, Policy, inside, within_any)

# mount(2) and unshare(2) flags (linux/fs.h, linux/sched.h)
CLONE_NEWNS, CLONE_NEWNET = 0x00020000, 0x40000000
CLONE_NEWPID, CLONE_NEWIPC = 0x20000000, 0x08000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP = 1, 38, 24
# Mount points left writable: /proc (a fresh one, of the kernel's PID namespace) and the
# devices (/dev/null must work; the unprivileged user cannot open the others for writing).
KEEP_WRITABLE = ("/proc", "/dev")


class SandboxError(OSError):
    """A layer the policy requires could not be made: the kernel must not start."""


def probe_layers(answer_path: str) -> None:
    """In a throwaway process (:data:`autograder.protocol.LAYERS_PROBE_TARGET`): make each
    namespace layer in a child, as confine does, and write the name of each that worked
    to ``answer_path``, one per line."""
    import shutil
    import tempfile

    def in_child(step) -> bool:
        pid = os.fork()
        if pid == 0:
            try:
                step()
                os._exit(0)
            except BaseException:
                os._exit(1)
        return os.waitpid(pid, 0)[1] == 0

    def in_pid_namespace(step) -> None:
        """``step`` as PID 1 of a new PID namespace, as a kernel's init."""
        _check(_libc().unshare(CLONE_NEWPID), "unshare(CLONE_NEWPID)")
        if not in_child(step):
            raise OSError("failed in the new PID namespace")

    own_proc = in_child(lambda: in_pid_namespace(lambda: None))
    workdir = tempfile.mkdtemp(prefix="autograder-probe-")
    try:
        policy = Policy(workdir=workdir, disk=2**20)
        files = (lambda: in_pid_namespace(lambda: _confine_filesystem(policy, True))) \
            if own_proc else (lambda: _confine_filesystem(policy, False))
        works = {PROCESS_SPACE: own_proc, FILE_SYSTEM: in_child(files),
                 NETWORK: in_child(_confine_network)}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    with open(answer_path, "w") as answer:
        answer.write("\n".join(name for name, ok in works.items() if ok))


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def _mount(libc, source: Optional[str], target: str, fstype: Optional[str], flags: int,
           data: Optional[str] = None) -> None:
    encode = (lambda s: None if s is None else s.encode())
    _check(libc.mount(encode(source), encode(target), encode(fstype), ctypes.c_ulong(flags),
                      encode(data)), f"mount {target}")


def _mount_points() -> List[Tuple[str, int]]:
    """(mount point, flags to keep) for every mount in this namespace, from mountinfo."""
    keep = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC}
    points = []
    with open("/proc/self/mountinfo") as info:
        for line in info:
            fields = line.split()
            point = fields[4].encode().decode("unicode_escape")
            flags = 0
            for option in fields[5].split(","):
                flags |= keep.get(option, 0)
            points.append((point, flags))
    return points


def _hide(libc, folder: str, shown: List[str], fds: dict) -> None:
    """Cover ``folder`` with an empty tmpfs; bind the ``shown`` paths back read-only."""
    _mount(libc, "tmpfs", folder, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=0755")
    for path in shown:
        target = Path(path)
        relative = target.relative_to(folder)
        skeleton = Path(folder, *relative.parts[:-1])
        skeleton.mkdir(parents=True, exist_ok=True)
        if os.path.isdir(f"/proc/self/fd/{fds[path]}"):
            target.mkdir(exist_ok=True)
        else:
            target.touch()
        _mount(libc, f"/proc/self/fd/{fds[path]}", path, None, MS_BIND | MS_REC)
    _mount(libc, None, folder, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _join_groups(folders: Iterable[str]) -> None:
    """Move this process into the kernel's cgroups; whatever it starts is born there."""
    for folder in folders:
        with open(os.path.join(folder, "cgroup.procs"), "w") as procs:
            procs.write(str(os.getpid()))


def _new_pid_namespace() -> None:
    """Move the kernel into a new PID namespace; only the kernel returns from this.

    ``unshare(CLONE_NEWPID)`` puts only the caller's children in the new namespace, so
    three processes come out of it, as with bubblewrap's ``--unshare-pid``:

    * the *keeper* (the caller, outside): the process the grader knows; it waits for the
      namespace's init and exits with its status;
    * *init* (PID 1): reaps orphans and exits with the kernel's status. When it ends, the
      Linux kernel kills every process left in the namespace, daemons made with ``fork``
      + ``setsid`` included; it dies with the keeper (``PR_SET_PDEATHSIG``);
    * the *kernel* (PID 2), which returns. Not being PID 1, it has the signal semantics of
      any process (a crash kills it, ``SIGTERM`` ends it).
    """
    libc = _libc()
    _check(libc.unshare(CLONE_NEWPID), "unshare(CLONE_NEWPID)")
    if os.fork() != 0:
        _wait_and_exit(None)  # the keeper
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    kernel = os.fork()
    if kernel != 0:
        _wait_and_exit(kernel)  # init
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _wait_and_exit(kernel: Optional[int]) -> None:
    """Wait for the child (or, as init, for ``kernel``, reaping every orphan on the way),
    then exit with its status. An interrupt sent to the kernel's process group is for the
    kernel alone.

    The keeper (``kernel`` None) also exits when its own parent (the grader or its fork
    server) is gone, as ipykernel's parent poller would: init and the kernel go with it.
    """
    import time
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent, code = os.getppid(), 1
    try:
        while True:
            pid, status = os.waitpid(-1, 0 if kernel else os.WNOHANG)
            if pid and (kernel is None or pid == kernel):
                code = os.waitstatus_to_exitcode(status)
                break
            if kernel is None:
                if os.getppid() != parent:
                    break
                time.sleep(0.05)
    except ChildProcessError:
        pass
    os._exit(code if code >= 0 else 128 - code)


def _workdir_on_tmpfs(libc, workdir: str, original: int, size: int) -> None:
    """Put the working directory on a tmpfs of ``size`` bytes, holding a copy of the files
    the grader prepared (read through ``original``, a handle on the folder underneath)."""
    import shutil
    _mount(libc, "tmpfs", workdir, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},mode=0700")
    shutil.copytree(f"/proc/self/fd/{original}", workdir, symlinks=True, dirs_exist_ok=True)


def _confine_filesystem(policy: Policy, own_proc: bool) -> None:
    libc = _libc()
    _check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _mount(libc, None, "/", None, MS_REC | MS_PRIVATE)  # nothing leaks back out
    if own_proc:  # a /proc that shows the kernel's PID namespace, not the grader's
        _mount(libc, "proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    workdir = os.path.realpath(policy.workdir)
    writable = sorted({workdir, *([os.path.realpath(policy.sockets)] if policy.sockets else [])})
    hidden = sorted({os.path.realpath(h) for h in policy.hidden if os.path.isdir(h)})
    # The writable folders may lie inside a hidden folder: they are shown again, writable.
    shown = sorted({os.path.realpath(s) for s in policy.shown if os.path.exists(s)})
    keep = sorted(set(shown) | set(writable))
    # Handles on what must stay visible, taken before anything is covered.
    fds = {path: os.open(path, os.O_PATH) for path in keep}
    try:
        for folder in hidden:
            if within_any(folder, [other for other in hidden if other != folder]):
                continue  # covered already by a hidden folder around it
            shown_inside = [p for p in keep if inside(p, folder) and p != folder]
            _hide(libc, folder, shown_inside, fds)
        # The writable folders become mounts of their own, everything else read-only.
        for path in writable:
            if not within_any(path, hidden):
                _mount(libc, path, path, None, MS_BIND | MS_REC)
        for point, flags in _mount_points():
            if within_any(point, (*KEEP_WRITABLE, *writable)):
                continue
            try:  # nosuid too: no set-user-id program gives back what was given up
                _mount(libc, None, point, None,
                       MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | flags)
            except OSError:
                pass  # e.g. a mount hidden under another; its parent is read-only already
        for path in shown:
            if path not in writable and not within_any(path, KEEP_WRITABLE):
                try:
                    _mount(libc, None, path, None,
                           MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID)
                except OSError:
                    pass
        if os.path.isdir("/dev/shm"):  # shared memory of its own, not every kernel's
            _mount(libc, "tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                   f"size={KERNEL_SHM},mode=1777")
        _workdir_on_tmpfs(libc, workdir, fds[workdir], policy.disk)
    finally:
        for fd in fds.values():
            os.close(fd)
    os.chdir(workdir)  # onto the new (writable) mount, not the one now underneath it


def _confine_network() -> None:
    """A network namespace of the kernel's own: nothing reachable but its own loopback.
    System V IPC gets a namespace of its own too.

    The kernel talks to the grader over Unix sockets in a folder of its own (Jupyter's
    ``ipc`` transport, see :mod:`autograder.sandbox.kernel_manager`), which a network namespace does not cut. Native
    code (libc's ``connect``, pyzmq, ``torch.distributed``) raises no audit event, so this,
    not the audit hook, is what keeps a submission off the grader's loopback (a Dask
    scheduler, a database) and off every other network.
    """
    import fcntl
    import socket
    import struct
    _check(_libc().unshare(CLONE_NEWNET | CLONE_NEWIPC), "unshare(CLONE_NEWNET)")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:  # bring `lo` up
        request = struct.pack("16sh22x", b"lo", 0)  # struct ifreq: a name, then flags
        flags = struct.unpack("16sh22x", fcntl.ioctl(probe, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(probe, SIOCSIFFLAGS, struct.pack("16sh22x", b"lo", flags | IFF_UP))


def _give_to(user: int, policy: Policy) -> None:
    """Make the working directory (this kernel's copy) and the sockets folder the user's."""
    workdir = os.path.realpath(policy.workdir)
    for folder, dirs, files in os.walk(workdir):
        for name in [*dirs, *files]:
            os.chown(os.path.join(folder, name), user, user, follow_symlinks=False)
    for path in (workdir, policy.sockets):
        if path:
            os.chown(path, user, user)


def _drop_privileges(user: int) -> None:
    """Give up every capability for good and, as root, become ``user``.

    ``no_new_privs`` and an empty bounding set mean nothing (no set-user-id program, no
    file capability) can give them back; a root that stays uid 0 without capabilities
    would still own every root-owned file, hence the change of user.
    """
    libc = _libc()
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text()) \
        if Path("/proc/sys/kernel/cap_last_cap").exists() else 40
    for cap in range(last + 1):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # fails without CAP_SETPCAP: fine
    if os.geteuid() == 0 and user >= 0:
        os.setgroups([])
        os.setgid(user)
        os.setuid(user)  # from root to another user: every capability goes with it

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    header = Header(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    data = (Data * 2)()
    _check(libc.capset(ctypes.byref(header), data), "capset")


def _set_limits(policy: Policy) -> None:
    for limit, value in ((resource.RLIMIT_DATA, policy.memory),
                         (resource.RLIMIT_FSIZE, policy.file_size),
                         (resource.RLIMIT_CPU, policy.cpu_seconds),
                         (resource.RLIMIT_NOFILE, policy.open_files),
                         (resource.RLIMIT_CORE, 0)):
        soft, hard = resource.getrlimit(limit)
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(limit, (value, value))
    # Writing past RLIMIT_FSIZE should fail the write (OSError), not kill the kernel.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def confine(policy: Policy) -> List[str]:
    """Confine this process (a kernel about to start); returns what could not be done.

    Call it in the kernel's process before it starts threads (namespaces and the user
    change are per thread at first); add the audit hook (:func:`install_audit_hook`) once
    the kernel has opened its own sockets, before any of the learner's code runs. With a
    PID namespace, the process that called this stays behind as the keeper (see
    :func:`_new_pid_namespace`) and only the new PID 1 returns.
    """
    notes = []
    import importlib
    import warnings
    for name in ("autograder.kernel.evidence", *policy.preload):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                importlib.import_module(name)
        except Exception as error:
            notes.append(f"could not preload {name}: {type(error).__name__}")

    def attempt(layer: str, step, *args) -> bool:
        """Make one layer; a note if it fails, or SandboxError if the policy requires it."""
        try:
            step(*args)
            return True
        except OSError as error:
            note = f"{LAYER_NOTES[layer]} ({error.strerror or error})"
            if layer in policy.required:
                raise SandboxError(f"{note}, which this machine gives every kernel: the "
                                   "kernel was not started") from error
            notes.append(note)
            return False

    linux = sys.platform.startswith("linux")
    if linux:
        attempt(GROUP, _join_groups, policy.cgroups)
        own_proc = attempt(PROCESS_SPACE, _new_pid_namespace)
        attempt(FILE_SYSTEM, _confine_filesystem, policy, own_proc)
        attempt(NETWORK, _confine_network)
        if os.geteuid() == 0 and policy.user >= 0:
            _give_to(policy.user, policy)
    _set_limits(policy)
    if linux:
        attempt(USER, _drop_privileges, policy.user)
    return notes


CONNECTION_FILE = "kernel-connection.json"


def _connection_argument(argv: List[str]) -> Optional[int]:
    """Where in a kernel's arguments the connection file's path is (``-f PATH``)."""
    for at, arg in enumerate(argv):
        if arg == "-f" and at + 1 < len(argv):
            return at + 1
    return None


def start_kernel(policy: Policy, argv) -> None:
    """Confine this process, start an IPython kernel in it, add the audit hook once the
    kernel has its sockets, and serve until the kernel exits."""
    argv = list(argv)
    at = _connection_argument(argv)
    # The grader's connection file is private to it: read it while we still may, and
    # give the kernel its own copy (the key in it is the kernel's to know anyway).
    connection = Path(argv[at]).read_bytes() if at is not None else None
    try:
        notes = confine(policy)
    except SandboxError as error:  # before any of the learner's code: say why, and end
        print(f"autograder sandbox: {error}", file=sys.stderr, flush=True)
        os._exit(3)
    for note in notes:
        print(f"autograder sandbox: {note}", file=sys.stderr, flush=True)
    if not any(note.startswith(NO_PID_NAMESPACE) for note in notes) \
            and sys.platform.startswith("linux"):
        # Our parent is the namespace's init now: ipykernel would take that for being
        # orphaned and exit. The grader's end of the chain kills us if it dies.
        os.environ["JPY_PARENT_PID"] = "1"
    if connection is not None:
        copy = Path(os.getcwd(), CONNECTION_FILE)
        copy.write_bytes(connection)
        argv[at] = str(copy)
    from ipykernel.kernelapp import IPKernelApp
    app = IPKernelApp.instance()
    app.initialize(argv)
    install_audit_hook(policy)
    app.start()
