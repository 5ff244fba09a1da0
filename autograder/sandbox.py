"""Confine a learner's kernel: what it may read, write, start, use and reach.

A submission's kernel is one process (see :mod:`.kernels`). Before it runs anything of
the learner's, :func:`confine` turns it into a process that

* lives in a **resource group of its own** (a cgroup the grader made for it, see
  :class:`ResourceGroup`): the memory and the number of processes and threads of the
  kernel and everything it starts are bounded by the Linux kernel, so a memory bomb or a
  fork bomb is stopped where it starts, even in native code;
* lives in a **PID namespace of its own** (as PID 2, below an init): it cannot see or signal
  any process outside it, and when it ends the Linux kernel kills everything it started;
  a small *keeper* process outside the namespace stands for it to the grader;
* has a **network namespace of its own** (nothing reachable but its own loopback; it talks
  to the grader over Unix sockets) and its own System V IPC;
* sees a **file system of its own** (a private mount namespace): the course directory
  (instructor notebooks, hidden tests, ``.git``, the gradebook), the submissions and the
  output folder are covered by empty read-only file systems; the Python environment is
  shown again read-only; every other mount is read-only and ``nosuid``; its working
  directory is a size-limited ``tmpfs`` holding a copy of the submission's files, so its
  disk use is bounded in total, not only per file; ``/dev/shm`` is a small private tmpfs;
* runs as an **unprivileged user** (``nobody``) when the grader is root, after giving up
  every capability for good (``no_new_privs``), so it can neither undo any of the above
  nor write to anything the file permissions protect;
* has hard ``setrlimit`` limits (data memory, file size, CPU seconds, open files, no core
  dumps);
* runs under a Python audit hook (:func:`install_audit_hook`, :pep:`578`) that refuses
  to start processes, to open network connections, to load native code through
  ``ctypes``, to signal other processes and to write outside its working directory. The
  hook is defence in depth with clear error messages: native code does not raise audit
  events, so no property rests on it alone.

Namespaces, mounts, cgroups and the change of user need root (``CAP_SYS_ADMIN``); without
root the limits and the audit hook still apply and :func:`confine` says what it could not
do (the README's threat model lists what holds then). In the grader, :func:`kill_all`
kills whatever a kernel left running, and :meth:`ResourceGroup.close` kills every process
still in its group.

None of this makes the kernel's own verdicts trustworthy: the learner's code runs in
it. Scores are decided elsewhere (see :mod:`.checks`).
"""
from __future__ import annotations

import ctypes
import os
import resource
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, List, Optional, Tuple

GiB = 1024 ** 3
MiB = 1024 ** 2

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
NOBODY = 65534  # the user and group a kernel of a root grader runs as
NO_PID_NAMESPACE = "no private process space"  # confine's note when unshare(CLONE_NEWPID) fails


@dataclass(frozen=True)
class Policy:
    """What a learner's kernel may use. Sizes in bytes, times in seconds."""
    workdir: str
    memory: int = 4 * GiB          # RLIMIT_DATA: heap and private memory of the kernel
    file_size: int = 256 * MiB     # RLIMIT_FSIZE: the largest file it may write
    cpu_seconds: int = 3600        # RLIMIT_CPU: a last resort behind the wall-clock limits
    open_files: int = 512          # RLIMIT_NOFILE
    disk: int = 1 * GiB            # size of the tmpfs that holds the working directory
    hidden: Tuple[str, ...] = ()   # folders to cover with an empty read-only file system
    shown: Tuple[str, ...] = ()    # paths inside hidden folders to show again, read-only
    preload: Tuple[str, ...] = ()  # modules to import before confining (they may need
    #                                to load native libraries, which the learner may not)
    sockets: str = ""              # a folder for the kernel's Unix sockets (writable)
    cgroups: Tuple[str, ...] = ()  # the cgroup folders to join (see ResourceGroup)
    user: int = NOBODY             # run as this user and group when started as root

    LISTS = ("hidden", "shown", "preload", "cgroups")

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


# --------------------------------------------------------------------------------------
# In the kernel process, before it starts
# --------------------------------------------------------------------------------------

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
            inside = [p for p in keep if _inside(p, folder) and p != folder]
            _hide(libc, folder, inside, fds)
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
                   f"size={64 * MiB},mode=1777")
        _workdir_on_tmpfs(libc, workdir, fds[workdir], policy.disk)
    finally:
        for fd in fds.values():
            os.close(fd)
    os.chdir(workdir)  # onto the new (writable) mount, not the one now underneath it


def _confine_network() -> None:
    """A network namespace of the kernel's own: nothing reachable but its own loopback.
    System V IPC gets a namespace of its own too.

    The kernel talks to the grader over Unix sockets in a folder of its own (Jupyter's
    ``ipc`` transport, see :mod:`.kernels`), which a network namespace does not cut. Native
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
    for name in ("autograder.evidence", *policy.preload):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                importlib.import_module(name)
        except Exception as error:
            notes.append(f"could not preload {name}: {type(error).__name__}")
    linux = sys.platform.startswith("linux")
    if linux:
        try:
            _join_groups(policy.cgroups)
        except OSError as error:
            notes.append(f"no resource group ({error.strerror or error})")
        own_proc = False
        try:
            _new_pid_namespace()
            own_proc = True
        except OSError as error:
            notes.append(f"{NO_PID_NAMESPACE} ({error.strerror or error})")
        try:
            _confine_filesystem(policy, own_proc)
        except OSError as error:
            notes.append(f"no private file system view ({error.strerror or error})")
        try:
            _confine_network()
        except OSError as error:
            notes.append(f"no private network ({error.strerror or error})")
        if os.geteuid() == 0 and policy.user >= 0:
            _give_to(policy.user, policy)
    _set_limits(policy)
    if linux:
        try:
            _drop_privileges(policy.user)
        except OSError as error:
            notes.append(f"privileges kept ({error.strerror or error})")
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
    notes = confine(policy)
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


# --------------------------------------------------------------------------------------
# The audit hook
# --------------------------------------------------------------------------------------

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
    writable = (workdir, "/dev/null", "/proc/self/fd")
    hidden = tuple(os.path.realpath(h) for h in policy.hidden)
    shown = tuple(os.path.realpath(s) for s in policy.shown)
    own_pid = os.getpid()
    libraries = tuple(p for p in python_paths() if not within_any(p, hidden) or p in shown)
    ctypes_dir = os.path.dirname(os.path.realpath(ctypes.__file__))
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


# --------------------------------------------------------------------------------------
# In the grader: the processes and memory of a kernel
# --------------------------------------------------------------------------------------

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
CGROUP_FILES = {
    1: {"memory_limit": ("memory", "memory.limit_in_bytes"),
        "swap_limit": ("memory", "memory.memsw.limit_in_bytes"),
        "process_limit": ("pids", "pids.max"),
        "memory_usage": ("memory", "memory.usage_in_bytes"),
        "memory_peak": ("memory", "memory.max_usage_in_bytes"),
        "memory_events": ("memory", "memory.oom_control"),
        "process_peak": ("pids", "pids.peak")},
    2: {"memory_limit": ("memory", "memory.max"),
        "swap_limit": ("memory", "memory.swap.max"),
        "process_limit": ("pids", "pids.max"),
        "memory_usage": ("memory", "memory.current"),
        "memory_peak": ("memory", "memory.peak"),
        "memory_events": ("memory", "memory.events"),
        "process_peak": ("pids", "pids.peak")},
}


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
            for controller in ("memory", "pids"):
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
            if controller in ("memory", "pids"):
                v1_paths[controller] = path

    def folder(mount, path) -> Optional[str]:
        root, point = mount
        if not (path == root or path.startswith(root.rstrip("/") + "/")):
            return None  # our cgroup is not inside what is mounted here
        return os.path.join(point, path[len(root.rstrip("/")):].lstrip("/")).rstrip("/")

    found = {c: folder(v1_mounts[c], v1_paths[c]) for c in ("memory", "pids")
             if c in v1_mounts and c in v1_paths}
    if len(found) == 2 and all(found.values()):
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
        return group

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
