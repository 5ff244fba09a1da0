"""Every limit and default of grading one notebook, defined once.

``python -m autograder grade`` (here or on a Dask cluster) and ``python -m autograder
check`` build one :class:`GradeOptions` and hand it to the one pipeline,
:func:`autograder.grade.grade_submission`; the command line takes its defaults from the
class, so no entry point can drift from another.

This module imports nothing heavy (the standard library, :mod:`.spawn`): the command line
reads it before anything else.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from typing import Callable, Optional, Tuple

from .spawn import KINDS

GiB = 1024 ** 3
MiB = 1024 ** 2

AUTO = "auto"                   # device or profile: decided by the runner (see resolve)
CPU, QUICK = "cpu", "quick"     # where a test that names no device runs, and how
DEVICES = (CPU, "cuda")
PROFILES = (QUICK, "full")
KERNELS = KINDS                 # "fork": from a warm fork server; "fresh": new interpreters
DEVICE_CHOICES = (AUTO, *DEVICES)
PROFILE_CHOICES = (AUTO, *PROFILES)
CHECK_PROFILE = QUICK         # `check`'s profile: a learner's answer in seconds

# Limits that have no option of their own.
KERNEL_START_TIMEOUT = 60.0     # seconds a kernel may take to start and answer
CHECKS_START_MARGIN = 30.0      # seconds a checks process may take to start (a fresh one
#                                 imports PyTorch), on top of checks_timeout per test
KERNEL_CPU_MARGIN = 60          # CPU seconds (RLIMIT_CPU) beyond the notebook's time limit
KERNEL_CPU_SECONDS = 3600       # RLIMIT_CPU of a policy made without options
KERNEL_OPEN_FILES = 512         # RLIMIT_NOFILE of a kernel
KERNEL_SHM = 64 * MiB           # its private /dev/shm (a tmpfs)
FLOOD_FACTOR = 4                # a kernel printing this many times output_limit is stopped
MEMORY_POLL = 0.1               # seconds between looks at a kernel's memory (no cgroup)
COPY_BUDGET = 100 * 10**6       # bytes of a submission's folder copied at most (nbgrader's
#                                 collect step refuses files over 100 MB too)
WORKERS_TIMEOUT = 60.0          # seconds a Dask run waits for a first worker
RETRIES = 1                     # Dask: re-runs of a task that raised (deaths counted apart)
KILLED_WORKER_ROUNDS = 2        # Dask: rounds of allowed-failures + 1 worker deaths
MAX_CELLS = 2000                # cells of a submitted notebook (a course's have < 100): more
#                                 is refused as invalid before they are read one by one
GRADESCOPE_FILE_LIMIT = 5 * MiB   # the largest file a Gradescope autograder zip may hold
GRADESCOPE_ZIP_LIMIT = 20 * MiB   # all its files together, before compression

# The submission service (`python -m autograder serve`, issue 28). Its upload limit is the
# grader's own limit on a submitted notebook (layout.MAX_NOTEBOOK_BYTES).
SERVICE_HOST = "127.0.0.1"      # where it listens unless told otherwise
SERVICE_PORT = 8765             # its port (0: any free one, printed at start)
SERVICE_DB = "service.db"       # its database, in the course folder unless --db says
SERVICE_ATTEMPTS_PER_HOUR = 10  # uploads per learner and assignment in any hour
SERVICE_COUNTS = "last"         # which attempt counts: "last" or "best"
SERVICE_LATE = "refuse"         # after the deadline: "refuse", or "penalty" per day late
SERVICE_POLL = 0.5              # seconds between looks at the queue when nothing woke it
SERVICE_LONG_POLL = 20.0        # seconds a `.json` feedback request may wait for a change
SERVICE_SUBMIT_WAIT = 1800.0    # seconds `submit` waits for its feedback
SERVICE_HTTP_TIMEOUT = 60.0     # seconds `submit` waits for one answer of the service
SERVICE_DB_BUSY = 30.0          # seconds a database call waits for another's write
SERVICE_REFRESH = 2             # seconds between reloads of a page waiting for a grade
SERVICE_FORM_OVERHEAD = 64 * 1024  # an upload's body beyond the notebook (the form's fields)
SERVICE_ID_BYTES = 16           # random bytes of a submission's id in its URLs
SERVICE_SESSION_DAYS = 14.0     # a browser stays signed in this long after its sign-in
#                                 (server side and in its cookie), unless it signs out
SERVICE_FORM_BYTES = 64 * 1024  # the largest body of any request but an upload (read before
#                                 anyone is known: sign-out, regrade); an upload's is raised
#                                 to the upload limit once its sender is signed in
SERVICE_FD_RESERVE = 64         # open files kept for the database, logs and graders, plus
SERVICE_FD_PER_JOB = 32         # this many per grader (its kernel's sockets and pipes)
SERVICE_ERROR_BACKOFF = (0.5, 30.0)  # seconds a grader waits after an error: first, longest
SERVICE_KEEP_FILES = 5          # attempts whose files are kept (service.toml keep_files)


@dataclass(frozen=True)
class ServiceLimits:
    """What the submission service lets one connection, one upload and one learner use.

    Sizes in bytes, times in seconds. ``serve`` has a flag for each (README: Running the
    submission service); the defaults suit a course of some hundreds of learners."""
    max_connections: int = 1000     # connections at once (also bounded by the open-files
    #                                 limit, less the reserve); past it, the oldest one still
    #                                 sending its headers is closed, or the new one gets 503
    header_timeout: float = 10.0    # a connection that has not sent its headers by then (and
    #                                 one idle between requests) is closed
    body_timeout: float = 120.0     # a request body not received by then is dropped (20 MiB
    #                                 at 1.4 Mbit/s)
    max_cells: int = MAX_CELLS      # cells of an uploaded notebook (at most MAX_CELLS: more
    #                                 could not be graded)
    learner_jobs: int = 2           # uploads of one learner graded at once
    learner_bytes: int = 500 * MiB  # files one learner's uploads keep (uploads, executed)
    stuck_after: float = 1800.0     # /health says 503 when the oldest queued upload has
    #                                 waited this long with no grading started meanwhile

    def __post_init__(self):
        for name in ("max_connections", "header_timeout", "body_timeout", "max_cells",
                     "learner_jobs", "learner_bytes", "stuck_after"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)!r}")
        if self.max_cells > MAX_CELLS:
            raise ValueError(f"max_cells can be at most {MAX_CELLS} (the grader refuses more), "
                             f"got {self.max_cells}")


@dataclass(frozen=True)
class Limits:
    """Time limits in seconds: per cell (interrupt, go on) and per notebook (kill, stop)."""
    cell: float = 300.0
    notebook: float = 900.0

    def __post_init__(self):
        if self.cell <= 0 or self.notebook <= 0:
            raise ValueError(f"time limits must be positive, got {self}")
        if self.cell > self.notebook:  # a cell can never run longer than its notebook
            object.__setattr__(self, "cell", self.notebook)


@dataclass(frozen=True)
class GradeOptions:
    """How one notebook is graded. Sizes in bytes, times in seconds."""
    device: str = AUTO              # "cpu", "cuda", or "auto": CUDA where PyTorch sees a GPU
    profile: str = AUTO             # "quick", "full", or "auto": full on CUDA, else quick
    kernel: str = "fork"            # "fork": from a warm fork server; "fresh": a new interpreter
    limits: Limits = field(default_factory=Limits)
    checks_timeout: float = 60.0    # the trusted checks of one test cell
    memory: int = 4 * GiB           # data memory of a kernel (RLIMIT_DATA)
    memory_margin: int = 1 * GiB    # resident memory beyond `memory` (the libraries it maps:
    #                                 PyTorch alone is some hundreds of MB) before it is killed
    file_size: int = 256 * MiB      # the largest file a kernel may write
    disk: int = 1 * GiB             # all files of a kernel's working directory together
    processes: int = 512            # processes and threads of a kernel and all it starts
    output_limit: int = 2 * MiB     # output kept per notebook; 4 times this stops the kernel
    threads: Optional[int] = None   # CPU threads per kernel (PyTorch, OpenMP); None: all
    keep_workdirs: bool = False     # leave the working directories for inspection
    hidden: Tuple[str, ...] = ()    # more folders kernels must not see (course, output)

    def __post_init__(self):
        if self.device not in DEVICE_CHOICES:
            raise ValueError(f"device must be one of {DEVICE_CHOICES}, got {self.device!r}")
        if self.profile not in PROFILE_CHOICES:
            raise ValueError(f"profile must be one of {PROFILE_CHOICES}, got {self.profile!r}")
        if self.kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS}, got {self.kernel!r}")
        for name in ("checks_timeout", "memory", "file_size", "disk", "processes",
                     "output_limit"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)!r}")

    @property
    def resolved(self) -> bool:
        """Whether device and profile are decided (what grading a submission needs)."""
        return self.device != AUTO and self.profile != AUTO

    def resolve(self, cuda_available: Callable[[], bool]) -> "GradeOptions":
        """These options with ``auto`` decided: the device by ``cuda_available()`` (asked
        only when needed), the profile by the device (full on CUDA, else quick)."""
        device = self.device
        if device == AUTO:
            device = "cuda" if cuda_available() else CPU
        profile = self.profile if self.profile != AUTO else ("full" if device == "cuda"
                                                              else QUICK)
        return replace(self, device=device, profile=profile)

    @property
    def memory_limit(self) -> int:
        """Resident memory past which the kernel is stopped."""
        return self.memory + self.memory_margin


def default(name: str):
    """The default of one option (for the command line's help and defaults)."""
    for option in fields(GradeOptions):
        if option.name == name:
            return option.default_factory() if callable(option.default_factory) \
                else option.default
    if name in ("cell", "notebook"):
        return getattr(Limits(), name)
    raise KeyError(name)


def available_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
