"""A submission's place to run: its working directory, its :class:`~autograder.protocol.Policy`
and its kernel's environment.

Every working directory lies in this grader process's run folder (:func:`run_dir`), which
every kernel has hidden but for its own directory. :func:`sandbox_policy` decides what a
kernel may see and use (what the course and a lesson checkout hide, the layers this machine
gives every kernel); :mod:`autograder.kernel.confine` applies it inside the kernel.
"""
from __future__ import annotations

import os
import shutil
import stat
import tempfile
import threading
from pathlib import Path
from typing import Dict, List, Optional

from autograder.layout import SourceNotebook, Submission
from autograder.options import COPY_BUDGET, KERNEL_CPU_MARGIN, GradeOptions
from autograder.protocol import GROUP, USER, Policy, python_paths
from autograder.sandbox.cgroups import ResourceGroup
from autograder.sandbox.device import machine_layers
from autograder.sandbox.policy import (closed_folders, compiler_programs, import_paths, shown_paths,
                                       source_folders)


def _copy_tree(src: Path, dst: Path, budget: List[int]) -> None:
    """Copy regular files and folders only: no symlinks or devices out of a submission,
    and no more than ``budget[0]`` bytes in all."""
    for entry in sorted(os.scandir(src), key=lambda e: e.name):
        if entry.name.startswith(".ipynb_checkpoints") or entry.name.endswith(".ipynb"):
            continue  # the kernel runs the rebuilt notebook from memory, not files
        info = entry.stat(follow_symlinks=False)
        target = dst / entry.name
        if stat.S_ISDIR(info.st_mode):
            target.mkdir(exist_ok=True)
            _copy_tree(Path(entry.path), target, budget)
        elif stat.S_ISREG(info.st_mode) and info.st_size <= budget[0]:
            budget[0] -= info.st_size
            shutil.copyfile(entry.path, target)


_RUN_DIR: Optional[Path] = None
_RUN_DIR_LOCK = threading.Lock()


def run_dir() -> Path:
    """This grader's folder for working directories and logs (hidden from every kernel,
    but for the kernel's own working directory). One per process, whichever grading
    thread asks first: a kernel's working directory must lie in the folder it is hidden in."""
    with _RUN_DIR_LOCK:
        return _run_dir()


def _run_dir() -> Path:
    global _RUN_DIR
    if _RUN_DIR is None or not _RUN_DIR.is_dir():
        _RUN_DIR = Path(tempfile.mkdtemp(prefix=f"autograder-run-{os.getpid()}-"))
        import atexit
        atexit.register(shutil.rmtree, _RUN_DIR, True)
    return _RUN_DIR


def prepare_workdir(submission: Submission, source: SourceNotebook) -> Path:
    """A fresh directory with the learner's files and the assignment's support files.

    As nbgrader does, the instructor's non-notebook files (data, helper modules) replace
    the learner's copies. No notebook of the instructor's is ever put there.
    """
    workdir = Path(tempfile.mkdtemp(prefix="submission-", dir=run_dir()))
    if submission.folder.is_dir():
        _copy_tree(submission.folder, workdir, [COPY_BUDGET])
    _copy_support_files(source, workdir)  # over the learner's copies
    return workdir


def clean_workdir(source: SourceNotebook) -> Path:
    """A fresh directory with the assignment's support files only: where a speed test's
    clean kernel times the baseline (no file of a learner's is in it)."""
    workdir = Path(tempfile.mkdtemp(prefix="clean-", dir=run_dir()))
    _copy_support_files(source, workdir)
    return workdir


def _copy_support_files(source: SourceNotebook, workdir: Path) -> None:
    base = source.path.parent
    for path in source.support_files():
        target = workdir / path.relative_to(base)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)


def sandbox_policy(submission: Submission, source: SourceNotebook, workdir: Path,
                   options: GradeOptions, group: Optional[ResourceGroup] = None) -> Policy:
    """What the submission's kernel may see and use (see :mod:`.policy`, :mod:`autograder.kernel.confine`)."""
    hidden = {str(run_dir()), *(str(Path(h).resolve()) for h in options.hidden)}
    if not source.released:  # an instructor's notebook, in COURSE/<source dir>/<assignment>
        course_sources = source.path.resolve().parent.parent
        hidden.update((str(course_sources.parent), str(course_sources)))
        if len(submission.path.parents) > 2:
            hidden.add(str(submission.path.resolve().parents[2]))  # every student's submissions
    # A lesson checkout the kernel imports from (on PYTHONPATH) is hidden like the course
    # (its solutions/, tests/, .git): only its packages are shown again.
    sources = source_folders()
    hidden.update(sources)
    if os.geteuid() == 0:  # the kernel will run as nobody: cover what nobody may not enter
        hidden.update(closed_folders(python_paths()))
    shown = shown_paths(hidden, import_paths(sources))
    # Every layer this machine gives a kernel is required of each kernel: one that fails to
    # get it (a transient failure) does not start, rather than run with less.
    required = set(machine_layers())
    if group is not None:
        required.add(GROUP)
    if os.geteuid() == 0:
        required.add(USER)
    return Policy(workdir=str(workdir), memory=options.memory, file_size=options.file_size,
                  disk=options.disk, cpu_seconds=int(options.limits.notebook) + KERNEL_CPU_MARGIN,
                  hidden=tuple(sorted(hidden)), shown=shown,
                  cgroups=group.paths if group is not None else (),
                  required=tuple(sorted(required)), programs=compiler_programs())


def kernel_environment(workdir: Path, options: GradeOptions) -> Dict[str, str]:
    """What a submission's kernel gets added to its environment."""
    env = {"DLPERF_PROFILE": options.profile, "NBGRADER_EXECUTION": "autograde",
           # Everything the kernel's libraries write goes to its working directory.
           "HOME": str(workdir), "TMPDIR": str(workdir), "IPYTHONDIR": str(workdir / ".ipython"),
           "MPLCONFIGDIR": str(workdir / ".matplotlib")}
    if options.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env

