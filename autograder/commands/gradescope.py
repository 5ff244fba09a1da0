"""Gradescope: the autograder zip of one assignment, and what it runs for each submission.

``python -m autograder gradescope --assignment NAME`` (:func:`build`) writes the zip that
Gradescope's "Configure Autograder" page takes. It holds:

* ``setup.sh``: run once, as root, when Gradescope builds its image (:data:`IMAGE`, with
  network): uv, Python :data:`PYTHON` installed by uv, PyTorch's CPU build and the course's
  other requirements (listed in ``requirements.txt``), then the course's package from
  ``package/``, in a virtual environment at :data:`VENV`, every package at the version the
  course's ``requirements.lock`` (``make lock``, in the zip too) pins;
* ``run_autograder``: run for each submission; it calls :func:`run` (``python -m
  autograder.commands.gradescope ROOT``), which lays the upload out as ``submitted/<student>/<NAME>/``
  and grades it with ``python -m autograder grade``, the same pipeline and sandbox as
  everywhere, then writes ``ROOT/results/results.json``;
* ``package/`` (``pyproject.toml`` and the packages it ships), ``course/`` (the course's
  ``nbgrader_config.py`` and ``solutions/NAME/`` only: the instructor's notebook, hidden
  tests included, and its support files), ``gradescope.json`` (the assignment and its limits).

The solutions reach Gradescope's ``/autograder/source`` only, which learners never see;
grading hides ``course/`` from the learner's kernel and makes it readable by its owner alone.
Nothing else of the course is in the zip.
"""
from __future__ import annotations

import ast
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import tomllib
import zipfile
from pathlib import Path
from typing import Dict, List, Tuple

from autograder.layout import IGNORED, Course, plural
from autograder.options import COPY_BUDGET, GRADESCOPE_FILE_LIMIT, GRADESCOPE_ZIP_LIMIT, Limits

MANIFEST = "gradescope.json"
PACKAGE, COURSE = "package", "course"   # the zip's folders
VENV = "/opt/dlperf-grader"             # where setup.sh installs, run_autograder runs
STUDENT = "submission"                   # the student folder of the one upload graded
# The base image to pick on Gradescope's "Configure Autograder" page: its newest Ubuntu (24.04
# is not offered: gradescope/autograder_samples#136), whose own python3 is 3.10.
IMAGE = "Ubuntu 22.04"
PYTHON = "3.12"                          # installed by uv; requirements.lock is for it
LOCK = "requirements.lock"               # the course's pins (scripts/lock.py, `make lock`)
TOOLS = ["uv"]                           # what setup.sh installs with, pinned in the lock too
TORCH_BACKEND = "cpu"                    # uv's --torch-backend: Gradescope has no GPU
SKIPPED = re.compile(r"^(__MACOSX|.*\.pyc|.*\.egg-info|build)$")  # never copied or graded

SETUP_SH = r"""#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image. Written by
# `python -m autograder gradescope --assignment @ASSIGNMENT@`.
# Base image: @IMAGE@, variant Base (picked on Configure Autograder). It installs uv, then
# with uv Python @PYTHON@ (the image's own python3 is 3.10), PyTorch's CPU build, the course's
# requirements (requirements.txt beside this file) and the course's package from package/,
# into a virtual environment: every package at its version in requirements.lock.
set -euo pipefail
SOURCE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LOCK="$SOURCE/@LOCK@"
VENV="${AUTOGRADER_VENV:-@VENV@}"
TOOLS="$VENV-tools"  # uv, and the Python it installs (outside root's home: the kernel's user reads it)
TORCH_BACKEND="${AUTOGRADER_TORCH_BACKEND-@TORCH_BACKEND@}"  # empty: PyPI's build
export DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
export UV_PYTHON_INSTALL_DIR="$TOOLS/python"
if [ -z "${UV_CACHE_DIR:-}" ]; then  # the downloads of this build alone, not kept in the image
    UV_CACHE_DIR="$(mktemp -d)"
    export UV_CACHE_DIR
    trap 'rm -rf "$UV_CACHE_DIR"' EXIT
fi
system="$(. /etc/os-release 2>/dev/null && echo "${NAME:-?} ${VERSION_ID:-?}")" || system="?"
if [ "$system" != "@IMAGE@" ]; then
    echo "warning: written for Gradescope's @IMAGE@ image, running on $system" >&2
fi

apt-get update
apt-get install -y --no-install-recommends ca-certificates python3 python3-venv
python3 -m venv --clear "$TOOLS/uv"
"$TOOLS/uv/bin/python" -m pip install --constraint "$LOCK" @TOOLS@
UV="$TOOLS/uv/bin/uv"
"$UV" venv --clear --python @PYTHON@ "$VENV"
"$UV" pip install --python "$VENV/bin/python" --constraint "$LOCK" --build-constraints "$LOCK" \
    ${TORCH_BACKEND:+--torch-backend "$TORCH_BACKEND"} --compile-bytecode \
    @PACKAGES@ "$SOURCE/@PACKAGE@[grader]"
"$VENV/bin/python" -c "import sys, torch, dlperf, autograder.commands.cli; \
print('grader ready: Python', sys.version.split()[0], 'PyTorch', torch.__version__)"
"""

RUN_AUTOGRADER = r"""#!/usr/bin/env bash
# Gradescope runs this for each submission. Written by
# `python -m autograder gradescope --assignment @ASSIGNMENT@`.
# AUTOGRADER_ROOT (default /autograder) holds source/ (the zip), submission/ (what the
# learner uploaded) and results/; AUTOGRADER_PYTHON is the Python setup.sh installed.
ROOT="${AUTOGRADER_ROOT:-/autograder}"
PYTHON="${AUTOGRADER_PYTHON:-@VENV@/bin/python}"
RESULTS="$ROOT/results/results.json"
mkdir -p "$ROOT/results"
rm -f "$RESULTS"
# The grader of the zip's copy (the files setup.sh installed)
export PYTHONPATH="$ROOT/source/@PACKAGE@${PYTHONPATH:+:$PYTHONPATH}"
"$PYTHON" -m autograder.commands.gradescope "$ROOT"
status=$?
if [ ! -s "$RESULTS" ]; then  # the grader did not even start: still a result, saying so
    printf '{"score": 0, "output": "%s", "tests": []}\n' "The autograder failed before it \
could grade this submission (exit status $status). This is not your doing: tell your course \
staff (the autograder's log says why), then submit again." > "$RESULTS"
fi
exit 0
"""


# ---------------------------------------------------------------------------- building

def _fill(template: str, **values: str) -> str:
    for key, value in values.items():
        template = template.replace(f"@{key}@", value)
    return template


def _files_under(folder: Path) -> List[Path]:
    """Regular files under ``folder``, caches, checkpoints and build leftovers left out."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and not p.is_symlink()
                  and not any(IGNORED.match(part) or SKIPPED.match(part)
                              for part in p.relative_to(folder).parts))


def _name(requirement: str) -> str:
    """A requirement's distribution name, normalised (PEP 503)."""
    name = re.split(r"[<>=!~\[ ;@]", requirement.strip(), maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()


def _imports(notebooks) -> set:
    """Top-level modules the notebooks' code cells import (magics and shell lines aside)."""
    found = set()
    for nb in notebooks:
        for cell in nb.cells:
            if cell.cell_type != "code":
                continue
            code = "\n".join("" if line.lstrip().startswith(("%", "!")) else line
                             for line in cell.source.splitlines())
            try:
                tree = ast.parse(code)
            except SyntaxError:
                continue
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    found.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    found.add(node.module.split(".")[0])
    return found


def requirements(root: Path, notebooks) -> List[str]:
    """The course's own lines of ``requirements.txt`` for what grading needs: the package's
    dependencies and its ``grader`` extra (``pyproject.toml``), and the distributions the
    assignment's notebooks import. ``ValueError`` for one the course does not pin."""
    from importlib.metadata import packages_distributions
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    declared = {_name(r): r for r in [*project.get("dependencies", []),
                                      *project.get("optional-dependencies", {}).get("grader", [])]}
    ours = set(_packages(root))
    owners = packages_distributions()
    wanted = dict(declared)
    for module in sorted(_imports(notebooks) - set(sys.stdlib_module_names) - ours):
        if module not in owners:
            raise ValueError(f"the assignment imports {module!r}, which is not installed "
                             "here: install it, add it to requirements.txt and try again")
        wanted.update({_name(d): d for d in owners[module]})
    pinned: Dict[str, str] = {}
    path = root / "requirements.txt"
    if path.is_file():
        for line in path.read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line and not line.startswith("-"):
                pinned[_name(line)] = line
    missing = sorted(set(wanted) - set(pinned) - set(declared))
    if missing:
        raise ValueError(f"the assignment needs {', '.join(missing)}, which "
                         f"{path.name} does not list: add {'them' if len(missing) > 1 else 'it'}")
    return [pinned.get(name, declared.get(name, name)) for name in sorted(wanted)]


def _packages(root: Path) -> List[str]:
    """The packages ``pyproject.toml`` ships (``tool.setuptools.packages``)."""
    pyproject = tomllib.loads((root / "pyproject.toml").read_text())
    return list(pyproject.get("tool", {}).get("setuptools", {}).get("packages", []))


# The lock's platform, for the markers of requirement lines (scripts/lock.py resolves for it)
LOCKED_FOR = {"python_version": PYTHON, "python_full_version": f"{PYTHON}.0",
              "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
              "os_name": "posix", "implementation_name": "cpython"}


def locked_versions(text: str) -> Dict[str, str]:
    """Normalised name -> version of each ``name==version`` line of a lock."""
    found = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            found[_name(name)] = version.split(";", 1)[0].strip()
    return found


def unlocked(lines: List[str], locked: Dict[str, str]) -> List[str]:
    """The requirement lines the lock fails: a package it does not pin, or pins at a version
    the line excludes (``torch==2.14.1`` in the lock meets ``torch>=2.4``). A line whose
    marker leaves out the lock's platform asks nothing of it."""
    from packaging.requirements import Requirement
    from packaging.version import Version
    missed = []
    for line in lines:
        requirement = Requirement(line)
        if requirement.marker and not requirement.marker.evaluate(LOCKED_FOR):
            continue
        version = locked.get(_name(requirement.name))
        if version is None or not requirement.specifier.contains(Version(version),
                                                                 prereleases=True):
            missed.append(line)
    return missed


def contents(course: Course, assignment: str, limits: Limits) -> Dict[str, object]:
    """The zip's files: name in the zip -> a path to copy or the text to write."""
    sources = course.source_notebooks(assignment)
    root = course.root
    if not (root / "pyproject.toml").is_file():
        raise FileNotFoundError(f"{root} has no pyproject.toml: the zip installs the course's "
                                "package from it")
    files: Dict[str, object] = {f"{PACKAGE}/pyproject.toml": root / "pyproject.toml"}
    for package in _packages(root):  # each listed package's own files, as pip ships them
        folder = root / package.replace(".", "/")
        for path in _files_under(folder):
            if path.parent == folder:
                files[f"{PACKAGE}/{path.relative_to(root).as_posix()}"] = path
    if (root / "nbgrader_config.py").is_file():
        files[f"{COURSE}/nbgrader_config.py"] = root / "nbgrader_config.py"
    folder = course.assignment_path(assignment)
    for path in _files_under(folder):
        files[f"{COURSE}/{course.source_directory}/{assignment}/"
              f"{path.relative_to(folder).as_posix()}"] = path
    lines = requirements(root, [source.notebook for source in sources.values()])
    lock = root / LOCK
    if not lock.is_file():
        raise FileNotFoundError(f"{root} has no {LOCK}: run `make lock` (scripts/lock.py), "
                                "which pins every package setup.sh installs")
    missed = unlocked([*lines, *TOOLS], locked_versions(lock.read_text()))
    if missed:
        raise ValueError(f"{LOCK} does not pin {', '.join(missed)} as requirements.txt asks: "
                         "run `make lock` and build again")
    files[LOCK] = lock
    torch = [line for line in lines if _name(line) == "torch"]
    files["requirements.txt"] = (
        f"# What setup.sh installs for {assignment}, at the versions {LOCK} pins "
        f"({' '.join(torch)}: PyTorch's {TORCH_BACKEND} build)\n" + "\n".join(lines) + "\n")
    values = dict(ASSIGNMENT=assignment, VENV=VENV, PACKAGE=PACKAGE, IMAGE=IMAGE, PYTHON=PYTHON,
                  LOCK=LOCK, TORCH_BACKEND=TORCH_BACKEND, TOOLS=" ".join(TOOLS),
                  PACKAGES=" ".join(map(shlex.quote, lines)))
    files["setup.sh"] = _fill(SETUP_SH, **values)
    files["run_autograder"] = _fill(RUN_AUTOGRADER, **values)
    files[MANIFEST] = json.dumps({"assignment": assignment, "notebooks": sorted(sources),
                                  "timeout": limits.notebook, "cell_timeout": limits.cell,
                                  "image": IMAGE, "python": PYTHON},
                                 indent=2) + "\n"
    return files


def _size(item) -> int:
    return item.stat().st_size if isinstance(item, Path) else len(item.encode())


def build(course: Course, assignment: str, out: Path, limits: Limits = Limits()) -> dict:
    """Write the Gradescope zip of ``assignment`` to ``out``; what it holds, in a dict.

    ``ValueError`` when a file is over :data:`GRADESCOPE_FILE_LIMIT` or all of them are over
    :data:`GRADESCOPE_ZIP_LIMIT` (uncompressed), naming the largest."""
    files = contents(course, assignment, limits)
    sizes = {name: _size(item) for name, item in files.items()}
    largest = max(sizes, key=sizes.get)
    if sizes[largest] > GRADESCOPE_FILE_LIMIT:
        raise ValueError(f"{largest} is {sizes[largest] / 2**20:.1f} MiB; a file of the zip "
                         f"may hold {GRADESCOPE_FILE_LIMIT / 2**20:g} MiB at most")
    if sum(sizes.values()) > GRADESCOPE_ZIP_LIMIT:
        raise ValueError(f"the zip's files hold {sum(sizes.values()) / 2**20:.1f} MiB, over "
                         f"{GRADESCOPE_ZIP_LIMIT / 2**20:g} MiB (the largest: {largest})")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in sorted(files):
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            executable = name in ("setup.sh", "run_autograder")
            info.external_attr = ((0o755 if executable else 0o644) | stat.S_IFREG) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            item = files[name]
            archive.writestr(info, item.read_bytes() if isinstance(item, Path) else item)
    partial.replace(out)
    return {"path": out, "files": sorted(files), "bytes": out.stat().st_size,
            "requirements": files["requirements.txt"]}


# ------------------------------------------------------------- grading one submission

def _lay_out(upload: Path, folder: Path, notebooks: List[str]) -> List[str]:
    """Copy the learner's upload into ``folder`` (``submitted/<student>/<assignment>/``):
    regular files only (links are left out, never followed), at most ``COPY_BUDGET`` bytes.
    When the top holds none of the assignment's notebooks, the notebooks in subfolders (an
    uploaded folder or zip) are taken up to it. Returns notes for the learner."""
    notes: List[str] = []
    budget = COPY_BUDGET
    found: List[Tuple[Path, Path]] = []
    for path in sorted(upload.rglob("*")) if upload.is_dir() else []:
        relative = path.relative_to(upload)
        if any(IGNORED.match(part) or SKIPPED.match(part) for part in relative.parts):
            continue
        info = path.lstat()
        if stat.S_ISLNK(info.st_mode):
            notes.append(f"'{relative}' is a link, not a file: it was left out")
        elif stat.S_ISREG(info.st_mode) and info.st_size <= budget:
            budget -= info.st_size
            found.append((path, relative))
    top = {rel.name for _, rel in found if len(rel.parts) == 1 and rel.suffix == ".ipynb"}
    if not top & {f"{name}.ipynb" for name in notebooks}:
        lifted = {}
        for path, relative in found:
            if relative.suffix == ".ipynb" and relative.name not in top | set(lifted):
                lifted[relative.name] = (path, Path(relative.name))
                notes.append(f"took '{relative}' out of its folder")
        found += lifted.values()
    for path, relative in found:
        target = folder / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    if not found:
        wanted = " and ".join(f"{name}.ipynb" for name in notebooks)
        notes.append(f"Your submission holds no file: upload {wanted}, the notebook you "
                     "worked in")
    elif not any(rel.suffix == ".ipynb" for _, rel in found):
        names = ", ".join(f"'{rel}'" for _, rel in found[:5])
        notes.append(f"Your submission holds no notebook (.ipynb file), only {names}: upload "
                     f"{' and '.join(f'{name}.ipynb' for name in notebooks)}")
    return notes


def _combined(results: Dict[str, dict], notes: List[str], others: List[str]) -> dict:
    """One results.json from each notebook's (the test names get the notebook's name when
    the assignment has several)."""
    several = len(results) > 1
    tests, outputs, extra, board = [], [], {}, []
    for name, result in results.items():
        for test in result.get("tests", []):
            tests.append({**test, "name": f"{name}: {test['name']}"} if several else test)
        for entry in result.get("leaderboard", []):  # speed tests' speedups
            board.append({**entry, "name": f"{name}: {entry['name']}"} if several else entry)
        outputs.append(f"{name}.ipynb: {result['output']}" if several else result["output"])
        extra[name] = result.get("extra_data", {})
    for number, test in enumerate(tests, start=1):
        test["number"] = str(number)
    if others:
        notes = notes + [f"not graded, not part of this assignment: "
                         f"{', '.join(repr(o + '.ipynb') for o in others)}"]
    return {**({"leaderboard": board} if board else {}),
            "score": round(sum(r["score"] for r in results.values()), 6),
            "execution_time": sum(r.get("execution_time", 0) for r in results.values()),
            "output": "\n".join([*notes, *outputs]), "tests": tests,
            "extra_data": extra if several else next(iter(extra.values()))}


def failed(message: str) -> dict:
    """A result of 0 points that says why (never no result at all)."""
    return {"score": 0, "output": message, "tests": []}


def grade_upload(root: Path) -> dict:
    """Grade ``ROOT/submission`` against ``ROOT/source`` with ``python -m autograder grade``."""
    source = root / "source"
    manifest = json.loads((source / MANIFEST).read_text())
    assignment, notebooks = manifest["assignment"], manifest["notebooks"]
    # The solutions, for the grader's user alone: where the container refuses the kernel
    # its mount namespace, the kernel (the user nobody) still cannot read them.
    (source / COURSE).chmod(0o700)
    with tempfile.TemporaryDirectory(prefix="gradescope-") as tmp:
        submitted, out = Path(tmp) / "submitted", Path(tmp) / "graded"
        folder = submitted / STUDENT / assignment
        folder.mkdir(parents=True)
        notes = _lay_out(root / "submission", folder, notebooks)
        command = [sys.executable, "-m", "autograder", "grade", str(submitted),
                   "--assignment", assignment, "--out", str(out),
                   "--course", str(source / COURSE), "--jobs", "1", "--no-progress",
                   "--timeout", str(manifest["timeout"]),
                   "--cell-timeout", str(manifest["cell_timeout"])]
        print("$", shlex.join(command), flush=True)
        done = subprocess.run(command, cwd=tmp)
        graded = out / STUDENT / assignment
        results = {}
        for name in notebooks:
            path = graded / f"{name}.results.json"
            if not path.is_file():
                raise RuntimeError(f"the grader wrote no result for {name}.ipynb (exit "
                                   f"status {done.returncode})")
            results[name] = json.loads(path.read_text())
        others = sorted(p.name[:-len(".results.json")] for p in graded.glob("*.results.json")
                        if p.name[:-len(".results.json")] not in notebooks)
        return _combined(results, notes, others)


def run(root: Path) -> Path:
    """Grade the submission under ``root`` (Gradescope's ``/autograder``) and write
    ``root/results/results.json``, whatever happens."""
    start = time.monotonic()
    try:
        result = grade_upload(root)
    except Exception as error:  # a result that says so, never none
        print(f"error: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
        result = failed("The autograder could not grade this submission "
                        f"({type(error).__name__}: {error}). This is not your doing: tell "
                        "your course staff, then submit again.")
    result.setdefault("execution_time", max(1, round(time.monotonic() - start)))
    target = root / "results" / "results.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(result, indent=2) + "\n")
    score = result["score"]
    print(f"Wrote {target}: {score:g} points; {result['output']}", flush=True)
    return target


def main(argv: List[str]) -> int:
    root = Path(argv[0] if argv else os.environ.get("AUTOGRADER_ROOT", "/autograder"))
    run(root.resolve())
    return 0


def describe(built: dict, cpu_points: float) -> str:
    """What the command prints after building."""
    return (f"Wrote {built['path']} ({plural(len(built['files']), 'file')}, "
            f"{built['bytes'] / 1024:.0f} KiB). On Gradescope: a Programming Assignment, "
            f"Configure Autograder, Zip file upload, base image {IMAGE} (Base); its points "
            f"are {cpu_points:g} (the CPU maximum: Gradescope has no GPU, so GPU-only tests "
            "are skipped). Building the image takes a few minutes (guide/gradescope-install.md).")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
