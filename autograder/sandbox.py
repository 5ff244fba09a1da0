"""Confine a learner's kernel: what it may read, write, start, use and reach.

A submission's kernel is one process (see :mod:`.kernels`). Before it runs anything of
the learner's, :func:`confine` makes it a process that

* cannot see the course: the course directory (instructor notebooks, hidden tests,
  ``.git``, the gradebook), the folder of submissions and the output folder are covered
  by empty read-only file systems in a private mount namespace; only the Python
  environment and packages the kernel imports from there are shown again, read-only;
* cannot change any file outside its working directory: every other mount is read-only
  in that namespace;
* has hard resource limits (``setrlimit``): data memory, the size of any file it writes,
  CPU seconds, open files; no core dumps;
* has given up every Linux capability and cannot gain one back (``no_new_privs``), so
  even as root it can neither lift those limits nor undo the mounts;
* runs under a Python audit hook (:func:`install_audit_hook`, :pep:`578`) that refuses
  to start processes (``fork``, ``subprocess``, ``os.system``, ``exec``), to open network
  connections, to load native code through ``ctypes``, to change resource limits, to set
  trace or profile hooks, to signal any process but its own, and to open files for
  writing outside its working directory; audit hooks cannot be removed once added.

Mount namespaces and capabilities need root (or ``CAP_SYS_ADMIN``); without them the
limits and the audit hook still apply and :func:`confine` says what it could not do.
When the kernel ends, :func:`kill_all` kills whatever it may have left running: its
descendants and every process still in its session.

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
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP = 38, 24
# Mount points left writable: pseudo file systems and devices (/dev/null must work).
KEEP_WRITABLE = ("/proc", "/sys", "/dev")


@dataclass(frozen=True)
class Policy:
    """What a learner's kernel may use. Sizes in bytes, times in seconds."""
    workdir: str
    memory: int = 4 * GiB          # RLIMIT_DATA: heap and private memory of the kernel
    file_size: int = 256 * MiB     # RLIMIT_FSIZE: the largest file it may write
    cpu_seconds: int = 3600        # RLIMIT_CPU: a last resort behind the wall-clock limits
    open_files: int = 512          # RLIMIT_NOFILE
    hidden: Tuple[str, ...] = ()   # folders to cover with an empty read-only file system
    shown: Tuple[str, ...] = ()    # paths inside hidden folders to show again, read-only
    preload: Tuple[str, ...] = ()  # modules to import before confining (they may need
    #                                to load native libraries, which the learner may not)

    def to_dict(self) -> dict:
        return {"workdir": self.workdir, "memory": self.memory, "file_size": self.file_size,
                "cpu_seconds": self.cpu_seconds, "open_files": self.open_files,
                "hidden": list(self.hidden), "shown": list(self.shown),
                "preload": list(self.preload)}

    @classmethod
    def from_dict(cls, data: dict) -> "Policy":
        return cls(**{**data, **{key: tuple(data.get(key, ()))
                                 for key in ("hidden", "shown", "preload")}})


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


def _confine_filesystem(policy: Policy) -> None:
    libc = _libc()
    _check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _mount(libc, None, "/", None, MS_REC | MS_PRIVATE)  # nothing leaks back out
    workdir = os.path.realpath(policy.workdir)
    hidden = sorted({os.path.realpath(h) for h in policy.hidden if os.path.isdir(h)})
    # The working directory may lie inside a hidden folder: show it again, writable.
    shown = sorted({os.path.realpath(s) for s in policy.shown if os.path.exists(s)})
    keep = sorted(set(shown) | {workdir})
    # Handles on what must stay visible, taken before anything is covered.
    fds = {path: os.open(path, os.O_PATH) for path in keep}
    try:
        for folder in hidden:
            if within_any(folder, [other for other in hidden if other != folder]):
                continue  # covered already by a hidden folder around it
            inside = [p for p in keep if _inside(p, folder) and p != folder]
            _hide(libc, folder, inside, fds)
        # The working directory becomes its own (writable) mount, everything else read-only.
        if not within_any(workdir, hidden):
            _mount(libc, workdir, workdir, None, MS_BIND | MS_REC)
        for point, flags in _mount_points():
            if within_any(point, (*KEEP_WRITABLE, workdir)):
                continue
            try:
                _mount(libc, None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)
            except OSError:
                pass  # e.g. a mount hidden under another; its parent is read-only already
        for path in shown:
            if path != workdir and not within_any(path, KEEP_WRITABLE):
                try:
                    _mount(libc, None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY)
                except OSError:
                    pass
    finally:
        for fd in fds.values():
            os.close(fd)
    os.chdir(workdir)  # onto the new (writable) mount, not the one now underneath it


def _confine_network() -> None:
    """A network namespace of the kernel's own: nothing reachable but its own loopback.

    The kernel talks to the grader over Unix sockets in its working directory (Jupyter's
    ``ipc`` transport, see :mod:`.kernels`), which a network namespace does not cut. Native
    code (libc's ``connect``, pyzmq, ``torch.distributed``) raises no audit event, so this,
    not the audit hook, is what keeps a submission off the grader's loopback (a Dask
    scheduler, a database) and off every other network.
    """
    import fcntl
    import socket
    import struct
    _check(_libc().unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:  # bring `lo` up
        request = struct.pack("16sh22x", b"lo", 0)  # struct ifreq: a name, then flags
        flags = struct.unpack("16sh22x", fcntl.ioctl(probe, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(probe, SIOCSIFFLAGS, struct.pack("16sh22x", b"lo", flags | IFF_UP))


def _drop_capabilities() -> None:
    """Give up every capability, for good (root stays uid 0 but without its powers)."""
    libc = _libc()
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text()) \
        if Path("/proc/sys/kernel/cap_last_cap").exists() else 40
    for cap in range(last + 1):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # fails without CAP_SETPCAP: fine

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

    Call it in the kernel's process before it starts threads (a mount namespace is per
    thread at first); add the audit hook (:func:`install_audit_hook`) once the kernel
    has opened its own sockets, before any of the learner's code runs.
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
    if sys.platform.startswith("linux"):
        try:
            _confine_filesystem(policy)
        except OSError as error:
            notes.append(f"no private file system view ({error.strerror or error})")
        try:
            _confine_network()
        except OSError as error:
            notes.append(f"no private network ({error.strerror or error})")
    _set_limits(policy)
    if sys.platform.startswith("linux"):
        try:
            _drop_capabilities()
        except OSError as error:
            notes.append(f"capabilities kept ({error.strerror or error})")
    return notes


def start_kernel(policy: Policy, argv) -> None:
    """Confine this process, start an IPython kernel in it, add the audit hook once the
    kernel has its sockets, and serve until the kernel exits."""
    for note in confine(policy):
        print(f"autograder sandbox: {note}", file=sys.stderr, flush=True)
    from ipykernel.kernelapp import IPKernelApp
    app = IPKernelApp.instance()
    app.initialize(list(argv))
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
    """(parent pid, session id) of a process, from /proc/<pid>/stat."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
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
