"""Every limit and default of grading one notebook, defined once.

``python -m autograder grade`` (here or on a Dask cluster) and ``python -m autograder
check`` build one :class:`GradeOptions` and hand it to the one pipeline,
:func:`autograder.pipeline.grade.grade_submission`; the command line takes its defaults from the
class, so no entry point can drift from another. Each option the commands share is declared
once, in :data:`OPTIONS`: the flags, :func:`grade_options`, :func:`service_limits` and the
course's ``c.Autograder.*`` settings (:func:`config_defaults`) are all made from it.

This module imports nothing but the standard library: the command line
reads it before anything else.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Dict, Mapping, Optional, Tuple



GiB = 1024 ** 3
MiB = 1024 ** 2

AUTO = "auto"                   # device or profile: decided by the runner (see resolve)
CPU, QUICK = "cpu", "quick"     # where a test that names no device runs, and how
DEVICES = (CPU, "cuda")
PROFILES = (QUICK, "full")
KERNELS = ("fork", "fresh")     # "fork": from a warm fork server; "fresh": new interpreters
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

# Similarity of hand-ins (`python -m autograder similarity`, /instructor/similarity/NAME).
SIMILARITY_NOISE = 25           # characters of normalised code a match must span at least
#                                 (copydetect's noise threshold, its default)
SIMILARITY_PAIRS = 30           # the most alike pairs shown, with their matching lines


@dataclass(frozen=True)
class ServiceLimits:
    """What the submission service lets one connection, one upload and one learner use.

    Sizes in bytes, times in seconds. ``serve`` has a flag for each (guide/service.md);
    the defaults suit a course of some hundreds of learners."""
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


# ---------------------------------------------------------------------------------------
# The options the commands take, each declared once: its flag, what it parses, its default
# (taken from the classes above), its help, the commands that take it, and which field of
# GradeOptions, Limits or ServiceLimits it sets. The command line (cli.parser), the options
# objects (grade_options, service_limits) and the course's nbgrader_config.py
# (c.Autograder.<dest>, config_defaults) are all made from OPTIONS.

GRADING = ("grade", "check", "serve", "mutants")      # the commands that run kernels
COURSE_COMMANDS = ("grade", "serve", "gradescope", "mutants",   # those that take --course
                   "similarity")


def positive(kind, zero: bool = False):
    """A parser of ``kind`` that refuses negative numbers (and zero unless ``zero``)."""
    def parse(text: str):
        value = kind(text)
        if value < 0 or (value == 0 and not zero):
            raise argparse.ArgumentTypeError(
                f"must be {'zero or more' if zero else 'positive'}, got {text}")
        return value
    parse.kind = kind
    return parse


@dataclass(frozen=True)
class Option:
    """One option: ``--flag`` on the command line, ``c.Autograder.<dest>`` in the course's
    nbgrader_config.py, and (``target``, ``to``) the field it sets, from its value."""
    flag: str
    dest: str
    commands: Tuple[str, ...]
    help: str
    default: Any = None
    type: Optional[Callable[[str], Any]] = None
    choices: Optional[Tuple[str, ...]] = None
    metavar: Optional[str] = None
    helps: Mapping[str, str] = field(default_factory=dict)  # a command's own help, if any
    target: Optional[str] = None    # "grade.<field>", "limits.<field>" or "service.<field>"
    to: Callable[[Any], Any] = lambda value: value   # from the flag's value to the field's
    config: bool = True             # may nbgrader_config.py set it (c.Autograder.<dest>)

    def help_for(self, command: str) -> str:
        return self.helps.get(command, self.help)

    def argument(self, command: str) -> Dict[str, Any]:
        """The keywords of ``add_argument`` for ``command``."""
        words = dict(dest=self.dest, default=self.default, help=self.help_for(command))
        for name in ("type", "choices", "metavar"):
            if getattr(self, name) is not None:
                words[name] = getattr(self, name)
        return words

    def check(self, value):
        """``value`` (from nbgrader_config.py) as the flag would parse it; ValueError if
        the flag could not take it."""
        kind = getattr(self.type, "kind", None)
        if self.choices is not None:
            if not isinstance(value, str) or value not in self.choices:
                raise ValueError(f"must be one of {', '.join(self.choices)}, got {value!r}")
            return value
        if kind in (int, float):
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or (kind is int and not isinstance(value, int)):
                raise ValueError(f"must be {'an integer' if kind is int else 'a number'}, "
                                 f"got {value!r}")
            try:
                return self.type(str(value))
            except argparse.ArgumentTypeError as error:
                raise ValueError(str(error)) from None
        if not isinstance(value, str):
            raise ValueError(f"must be a string, got {value!r}")
        return value


_SERVICE = ServiceLimits()
_GRADE = ("grade", "serve", "mutants")     # the commands that grade a course's submissions
_TIMED = ("grade", "check", "serve", "gradescope", "mutants")

OPTIONS: Tuple[Option, ...] = (
    Option("--jobs", "jobs", _GRADE, type=positive(int), default=available_cores(),
           metavar="N", help="submissions graded at once (default: the number of cores, "
                             "%(default)s here)",
           helps={"grade": "submissions graded at once, each in its own kernel "
                           "(default: the number of cores, %(default)s here)",
                  "mutants": "mutants graded at once (default: one per core, %(default)s "
                             "here)"}),
    Option("--device", "device", GRADING, choices=DEVICE_CHOICES, target="grade.device",
           default=default("device"), help="as for grade",
           helps={"grade": "auto uses CUDA when PyTorch sees a GPU; GPU-only tests (grade_id "
                           "ending in _gpu) are skipped on the CPU",
                  "check": "auto uses CUDA when PyTorch sees a GPU (GPU-only tests need it)",
                  "mutants": "where the mutants run (default %(default)s)"}),
    Option("--timeout", "timeout", _TIMED, type=positive(float), target="limits.notebook",
           default=default("notebook"), metavar="SECONDS",
           help="time limit per notebook (default %(default)g)"),
    Option("--cell-timeout", "cell_timeout", _TIMED, type=positive(float),
           target="limits.cell", default=default("cell"), metavar="SECONDS",
           help="time limit per cell (default %(default)g)"),
    Option("--course", "course", COURSE_COMMANDS, type=Path, default=Path("."), metavar="DIR",
           config=False, help="the course directory (default: the current directory)",
           helps={"grade": "the nbgrader course directory with the instructor's notebooks "
                           "(default: the current directory)",
                  "serve": "the nbgrader course directory (default: the current directory)"}),
    Option("--profile", "profile", _GRADE, choices=PROFILE_CHOICES, target="grade.profile",
           default=default("profile"), help="as for grade",
           helps={"grade": "run profile for the notebooks (auto: full on CUDA, else quick)",
                  "mutants": "the notebooks' profile (default %(default)s)"}),
    # check runs on a learner's machine: a profile decided, the quick one by default
    Option("--profile", "profile", ("check",), choices=PROFILES, target="grade.profile",
           default=CHECK_PROFILE, config=False,
           help="run profile for the notebook (default %(default)s)"),
    Option("--kernel", "kernel", GRADING, choices=KERNELS, target="grade.kernel",
           default=default("kernel"),
           help="fork kernels from a process with the imports done (default) or start each "
                "as a new interpreter"),
    Option("--memory", "memory", GRADING, type=positive(float), target="grade.memory",
           to=lambda gib: int(gib * GiB), default=default("memory") / GiB, metavar="GIB",
           help="data memory per kernel in GiB (default %(default)g); a kernel that holds "
                f"more than this plus {default('memory_margin') / GiB:g} GiB is stopped"),
    Option("--disk", "disk", GRADING, type=positive(float), target="grade.disk",
           to=lambda gib: int(gib * GiB), default=default("disk") / GiB, metavar="GIB",
           help="all the files a kernel writes in its working directory, in GiB (default "
                "%(default)g)"),
    Option("--processes", "processes", GRADING, type=positive(int), target="grade.processes",
           default=default("processes"), metavar="N",
           help="processes and threads per kernel, all it starts included (default "
                "%(default)s)"),
    Option("--scheduler", "scheduler", ("grade", "serve"), metavar="ADDRESS",
           help="grade on the workers of the Dask scheduler at ADDRESS, as grade --scheduler "
                "does (--jobs is not used: as many uploads at once as the workers had threads "
                "when the service started). The course and the service's files must be at "
                "the same paths on every machine (see guide/dask.md)",
           helps={"grade": "grade on the workers of the Dask scheduler at ADDRESS (e.g. "
                           "tcp://10.0.0.5:8786), one task per submission; the workers' "
                           "threads set how many run at once (--jobs is not used), workers "
                           "started with --resources GPU=1 take --device cuda work, and auto "
                           "picks cuda when some worker has a GPU. The course and the "
                           "submissions must be at the same paths on every machine (see "
                           "guide/dask.md)"}),
    Option("--retries", "retries", ("grade", "serve"), type=positive(int, zero=True),
           default=RETRIES, metavar="N",
           help="with --scheduler: as for grade (default %(default)s)",
           helps={"grade": "with --scheduler: run a task that raised again on up to N more "
                           "tries (default %(default)s; tasks of workers that died are "
                           "always retried, up to the scheduler's allowed-failures)"}),
    # The submission service's limits (ServiceLimits)
    Option("--max-connections", "max_connections", ("serve",), type=positive(int),
           metavar="N", default=_SERVICE.max_connections, target="service.max_connections",
           help="connections at once (default %(default)s, and no more than the open-files "
                "limit allows); past it, the oldest one still sending its headers is closed"),
    Option("--header-timeout", "header_timeout", ("serve",), type=positive(float),
           metavar="SECONDS", default=_SERVICE.header_timeout, target="service.header_timeout",
           help="close a connection that has not sent a request's headers by then (or stays "
                "idle that long between requests; default %(default)g)"),
    Option("--body-timeout", "body_timeout", ("serve",), type=positive(float),
           metavar="SECONDS", default=_SERVICE.body_timeout, target="service.body_timeout",
           help="drop an upload not received by then (default %(default)g)"),
    Option("--max-cells", "max_cells", ("serve",), type=positive(int), metavar="N",
           default=_SERVICE.max_cells, target="service.max_cells",
           help="refuse a notebook of more cells (default %(default)s)"),
    Option("--learner-jobs", "learner_jobs", ("serve",), type=positive(int), metavar="N",
           default=_SERVICE.learner_jobs, target="service.learner_jobs",
           help="uploads of one learner graded at once (default %(default)s)"),
    Option("--learner-storage", "learner_storage", ("serve",), type=positive(float),
           metavar="MIB", default=_SERVICE.learner_bytes / MiB, target="service.learner_bytes",
           to=lambda mib: int(mib * MiB),
           help="MiB of files each learner's uploads may keep: the uploads and their executed "
                "copies (default %(default)g)"),
)


def options_of(command: str) -> Dict[str, Option]:
    """The declared options ``command`` takes, by dest."""
    return {option.dest: option for option in OPTIONS if command in option.commands}


def fields_of(target: str, values: Mapping[str, Any]) -> Dict[str, Any]:
    """The fields of ``target`` ("grade", "limits", "service") that ``values`` (the parsed
    command line, by dest) set through the declared options."""
    out = {}
    for option in OPTIONS:
        if option.target and option.target.split(".")[0] == target and option.dest in values:
            out[option.target.split(".", 1)[1]] = option.to(values[option.dest])
    return out


def grade_options(values: Mapping[str, Any], hidden=()) -> GradeOptions:
    """The one options object from the command line's values (``auto`` left for the
    runner to resolve)."""
    return GradeOptions(limits=Limits(**fields_of("limits", values)), hidden=tuple(hidden),
                        **fields_of("grade", values))


def service_limits(values: Mapping[str, Any]) -> ServiceLimits:
    """The service's limits from ``serve``'s values; an upload may wait for twice the
    notebook's time limit before the service reports itself stuck."""
    return ServiceLimits(**fields_of("service", values),
                         stuck_after=max(ServiceLimits.stuck_after, 2 * values["timeout"]))


# Settings of nbgrader's own that mean the same as one of ours, read when c.Autograder does
# not set it: (its class, its name, our dest).
NBGRADER_SETTINGS = (("Execute", "timeout", "cell_timeout"),)


def config_defaults(command: str, config: Optional[Mapping], source: str) -> Dict[str, Any]:
    """The defaults the course's nbgrader_config.py (its traitlets ``config``, read from
    ``source``) sets for ``command``'s options: ``c.Autograder.<dest>``, else nbgrader's own
    setting of the same thing (NBGRADER_SETTINGS). ValueError, naming the setting and the
    file, for an unknown ``c.Autograder`` name or a value its flag would not take (whether
    or not ``command`` takes that flag)."""
    if not config:
        return {}
    settable = {option.dest: option for option in OPTIONS if option.config}
    ours = dict(config.get("Autograder", {}) or {})
    unknown = sorted(set(ours) - set(settable))
    if unknown:
        raise ValueError(f"{source}: unknown setting c.Autograder.{unknown[0]} (known: "
                         f"{', '.join(sorted(settable))})")
    values = {}
    for section, name, dest in NBGRADER_SETTINGS:
        theirs = config.get(section, {}) or {}
        if dest not in ours and theirs.get(name) is not None:
            values[dest] = (f"c.{section}.{name}", theirs[name])
    values.update({dest: (f"c.Autograder.{dest}", value) for dest, value in ours.items()})
    out = {}
    for dest, (setting, value) in values.items():  # all checked, whichever command runs
        try:
            out[dest] = settable[dest].check(value)
        except ValueError as error:
            raise ValueError(f"{source}: {setting} {error}") from None
    taken = options_of(command)
    return {dest: value for dest, value in out.items() if dest in taken}
