"""What a learner's kernel may see and use: the :class:`Policy` the grader writes, the path
rules it is made with (which folders to cover, which paths inside them to show again), and
the environment every process the grader starts for a submission gets
(:func:`process_environment`).

The grader builds a policy for each kernel (:func:`autograder.pipeline.grade.sandbox_policy`); the
kernel's process reads it back (:mod:`autograder.kernel.confine`, :mod:`autograder.kernel.audit`). Plain data and path
arithmetic only.
"""
from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Tuple

from autograder.protocol import inside, python_paths, within_any
from autograder.sandbox.spawn import PACKAGE_ROOT

# The environment of a kernel (and of the fork server it is forked from, the checks
# process, the CUDA probe) is written by the grader, never inherited: the grader's own may
# hold secrets (a hub's API token, a cloud key of the shell that started it). From the
# grader's environment only these pass, what Python, PyTorch, CUDA and the BLAS and OpenMP
# libraries read; :func:`autograder.pipeline.grade.kernel_environment` adds the kernel's own.
ENVIRONMENT_NAMES = (
    "PATH", "LANG", "LANGUAGE", "TZ",
    "LD_LIBRARY_PATH",  # where CUDA's and other native libraries are found
    "PYTHONPATH",       # the course's packages (a checkout on PYTHONPATH)
    "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
    "PYTORCH_CUDA_ALLOC_CONF",
)
ENVIRONMENT_PREFIXES = (
    "LC_",        # the locale
    "OMP_", "KMP_", "MKL_", "GOTO_",  # OpenMP and BLAS threads and affinity
    "OPENBLAS_",  # OPENBLAS_CORETYPE, OPENBLAS_L2_SIZE: older OpenBLAS crashes without them
    #               on some CPUs; OPENBLAS_NUM_THREADS
    "CUDA_",      # CUDA_VISIBLE_DEVICES, CUDA_HOME, CUDA_MODULE_LOADING
    "DLPERF_",    # the course's own settings (DLPERF_DATA, DLPERF_DATA_DIR)
)

# A folder a kernel imports from that is not the Python installation's (a lesson checkout
# on PYTHONPATH) is hidden like the course, and only its top-level packages and modules
# are shown again: never these, though they may be packages (test suites hold reference
# answers; configuration names the course's folders).
NEVER_SHOWN = ("tests", "test", "testing", "conftest", "setup", "noxfile", "solutions",
               "source", "nbgrader_config", "jupyterhub_config")


def passes(name: str) -> bool:
    """Whether a variable of the grader's environment passes to the processes it starts
    for a submission (see :data:`ENVIRONMENT_NAMES`)."""
    return name in ENVIRONMENT_NAMES or name.startswith(ENVIRONMENT_PREFIXES)


def process_environment(source: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The environment the grader writes for a process it starts for a submission: the
    allow-listed variables of ``source`` (the grader's own environment when None), nothing
    else of it."""
    source = os.environ if source is None else source
    return {name: value for name, value in source.items() if passes(name)}


def _installation_folders() -> List[str]:
    """The Python installation's own library folders (standard library, site-packages)."""
    import site
    import sysconfig
    folders = set(site.getsitepackages())
    if site.ENABLE_USER_SITE and site.getusersitepackages():
        folders.add(site.getusersitepackages())
    for base in {sys.prefix, sys.base_prefix, sys.exec_prefix}:
        paths = sysconfig.get_paths(vars={"base": base, "platbase": base,
                                          "installed_base": base, "installed_platbase": base})
        folders.update(paths[name] for name in ("stdlib", "platstdlib", "purelib", "platlib"))
    return sorted({os.path.realpath(folder) for folder in folders})


def source_folders() -> List[str]:
    """The folders a kernel imports from that are not the Python installation's: a
    ``sys.path`` folder outside its library folders (a lesson checkout on PYTHONPATH, the
    working directory of ``python -m``), and the folder this package was imported from (a
    checkout installed in editable mode). Never one that holds the installation itself."""
    installation = _installation_folders()
    candidates = {os.path.realpath(p) for p in sys.path if p and os.path.isdir(p)}
    candidates.add(os.path.realpath(PACKAGE_ROOT))
    found = []
    for folder in sorted(candidates):
        parts = Path(folder).parts
        if within_any(folder, installation) or "site-packages" in parts \
                or "dist-packages" in parts:
            continue
        if folder == os.sep or inside(os.path.realpath(sys.base_prefix), folder):
            continue  # hiding it would hide the interpreter
        found.append(folder)
    return found


def modules_in(folder: str) -> List[str]:
    """The top-level packages (folders with ``__init__.py``) and modules in ``folder`` that
    a kernel may import: all but :data:`NEVER_SHOWN`."""
    from importlib.machinery import all_suffixes
    suffixes = sorted(all_suffixes(), key=len, reverse=True)
    found = []
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError:
        return found
    for entry in entries:
        name = entry.name
        if entry.is_dir():
            stem = name if os.path.isfile(os.path.join(entry.path, "__init__.py")) else ""
        elif entry.is_file():
            stem = next((name[:-len(s)] for s in suffixes if name.endswith(s)), "")
        else:
            stem = ""
        if stem.isidentifier() and stem not in NEVER_SHOWN:
            found.append(entry.path)
    return found


def import_paths(sources: Iterable[str]) -> List[str]:
    """What a kernel must see to import what it may: :func:`python_paths`, but of each
    source folder (:func:`source_folders`) only :func:`modules_in` it, and nothing of one
    named in :data:`NEVER_SHOWN` (a ``tests/`` on ``sys.path``)."""
    sources = list(sources)
    paths = [p for p in python_paths() if p not in sources]
    for folder in sources:
        if os.path.basename(folder) not in NEVER_SHOWN:
            paths.extend(modules_in(folder))
    return sorted(set(paths))


def shown_paths(hidden: Iterable[str], wanted: Iterable[str]) -> Tuple[str, ...]:
    """The ``wanted`` paths that a hidden folder would cover (and must be shown again),
    minus any that would show a hidden folder itself (say, a course root on sys.path)."""
    hidden = [os.path.realpath(h) for h in hidden]
    shown = set()
    for path in wanted:
        path = os.path.realpath(path)
        if any(inside(h, path) for h in hidden):
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


def compiler_programs(path: Optional[str] = None) -> Tuple[str, ...]:
    """The programs an installed library may start in a kernel (real paths): what Triton
    runs to build a kernel for a GPU, which a learner's Triton code needs there.

    Triton compiles each kernel with the ``ptxas`` its backends bundle, builds the kernel's
    launcher with the C compiler it finds on ``PATH`` (``gcc``, else ``clang``; a kernel's
    environment has no ``CC``) and finds ``libcuda`` with ``/sbin/ldconfig -p``; PyTorch's
    compiler uses the C++ one. Found here, in the grader, on the ``PATH`` kernels get and
    without importing Triton (its import reads settings the notebook chooses). Nothing else
    may be started: the kernel's audit hook allows only these, and only to a library.
    Looked for once per ``PATH`` in a grader process, not once per submission."""
    return _compiler_programs(os.environ.get("PATH", os.defpath) if path is None else path)


@functools.lru_cache(maxsize=None)
def _compiler_programs(path: str) -> Tuple[str, ...]:
    import importlib.util
    import shutil

    found = [program for program in (shutil.which(name, path=path) for name in
                                     ("gcc", "clang", "cc", "g++", "clang++", "c++"))
             if program]
    if os.path.exists("/sbin/ldconfig"):
        found.append("/sbin/ldconfig")
    try:
        triton = importlib.util.find_spec("triton")
    except (ImportError, ValueError):
        triton = None
    if triton is not None and triton.submodule_search_locations:
        for package in triton.submodule_search_locations:
            for tool in sorted(Path(package).glob("backends/*/bin/*")):
                if tool.is_file() and os.access(tool, os.X_OK):
                    found.append(str(tool))
    return tuple(sorted({os.path.realpath(program) for program in found}))
