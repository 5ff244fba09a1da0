"""``python -m autograder gradescope``: the zip for Gradescope, built with the real command for
the course's smallest assignment, unpacked as Gradescope unpacks it and run as Gradescope runs
it (``run_autograder`` with ``AUTOGRADER_ROOT`` pointing at a temporary ``/autograder``).
setup.sh's installs are not run here (this environment already has them):
tests/test_gradescope_install.py runs them for real."""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest

from autograder.options import GRADESCOPE_FILE_LIMIT, GRADESCOPE_ZIP_LIMIT
from coursebook.cases import (ASSIGNMENTS, HIDDEN, SOLUTIONS, release_notebook,
                               solution_notebook, submission)
from tests.helpers import autograder

ROOT = Path(__file__).resolve().parent.parent
# The smallest assignment (its instructor's notebook), the quickest to grade
ASSIGNMENT = min(ASSIGNMENTS, key=lambda a: (SOLUTIONS / a / f"{ASSIGNMENTS[a]}.ipynb")
                 .stat().st_size)
NOTEBOOK = f"{ASSIGNMENTS[ASSIGNMENT]}.ipynb"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("gradescope") / "autograder.zip"
    done = autograder("gradescope", "--assignment", ASSIGNMENT, "--out", out)
    assert done.returncode == 0, done.stderr[-3000:]
    with zipfile.ZipFile(out) as archive:
        infos = {info.filename: info for info in archive.infolist()}
        texts = {name: archive.read(name).decode() for name in
                 ("setup.sh", "run_autograder", "requirements.txt", "gradescope.json",
                  "requirements.lock")}
    return {"zip": out, "done": done, "infos": infos, "texts": texts}


def unpack(zip_path: Path, root: Path) -> Path:
    """``root`` laid out as Gradescope's /autograder: source/ (the zip, modes kept as unzip
    keeps them), run_autograder copied beside it, submission/ and results/ empty."""
    source = root / "source"
    with zipfile.ZipFile(zip_path) as archive:
        for info in archive.infolist():
            archive.extract(info, source)
            (source / info.filename).chmod((info.external_attr >> 16) & 0o777)
    shutil.copy2(source / "run_autograder", root / "run_autograder")
    (root / "submission").mkdir()
    (root / "results").mkdir()
    return root


def run_autograder(root: Path, python: str = sys.executable):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the zip's copy runs
    env.update(AUTOGRADER_ROOT=str(root), AUTOGRADER_PYTHON=python)
    done = subprocess.run([str(root / "run_autograder")], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600)
    results = json.loads((root / "results" / "results.json").read_text())
    return done, results


# --------------------------------------------------------------------- the zip itself

def test_the_command_writes_the_zip_and_says_its_points(built):
    assert built["zip"].is_file()
    assert "Zip file upload" in built["done"].stdout
    assert "base image Ubuntu 22.04" in built["done"].stdout
    manifest = json.loads(built["texts"]["gradescope.json"])
    assert (manifest["image"], manifest["python"]) == ("Ubuntu 22.04", "3.12")
    assert "# Base image: Ubuntu 22.04" in built["texts"]["setup.sh"]
    max_points = sum(float(c.metadata["nbgrader"]["points"]) for c in
                     solution_notebook(ASSIGNMENT).cells
                     if c.metadata.get("nbgrader", {}).get("grade")
                     and not c.metadata["nbgrader"].get("solution")
                     and not c.metadata["nbgrader"]["grade_id"].endswith("_gpu"))
    assert f"its points are {max_points:g}" in built["done"].stdout


def test_the_zip_holds_this_assignment_and_nothing_else_of_the_course(built):
    names = set(built["infos"])
    assert {"setup.sh", "run_autograder", "requirements.txt", "gradescope.json"} <= names
    solutions = {f"course/solutions/{ASSIGNMENT}/{p.relative_to(SOLUTIONS / ASSIGNMENT)}"
                 for p in (SOLUTIONS / ASSIGNMENT).rglob("*") if p.is_file()}
    assert {n for n in names if n.startswith("course/")} == solutions | {
        "course/nbgrader_config.py"}
    package = {n for n in names if n.startswith("package/")}
    assert {n.split("/")[1] for n in package} == {"pyproject.toml", "dlperf", "autograder"}
    assert all(n.endswith(".py") for n in package - {"package/pyproject.toml"}), package
    rest = names - package - solutions
    assert rest == {"setup.sh", "run_autograder", "requirements.txt", "gradescope.json",
                    "requirements.lock", "course/nbgrader_config.py"}
    assert built["texts"]["requirements.lock"] == (ROOT / "requirements.lock").read_text()
    others = set(ASSIGNMENTS) - {ASSIGNMENT}
    assert not [n for n in names for other in others if other in n]
    assert json.loads(built["texts"]["gradescope.json"])["assignment"] == ASSIGNMENT


def test_the_zip_is_small(built):
    sizes = {name: info.file_size for name, info in built["infos"].items()}
    assert max(sizes.values()) <= GRADESCOPE_FILE_LIMIT
    assert sum(sizes.values()) <= GRADESCOPE_ZIP_LIMIT
    assert built["zip"].stat().st_size < 1024 ** 2  # in fact a few hundred KiB


def test_a_large_file_is_refused(tmp_path):
    course = tmp_path / "course"
    course.mkdir()
    for name in ("pyproject.toml", "requirements.txt", "requirements.lock", "nbgrader_config.py"):
        shutil.copy2(ROOT / name, course / name)
    for package in ("dlperf", "autograder"):
        shutil.copytree(ROOT / package, course / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(SOLUTIONS / ASSIGNMENT, course / "solutions" / ASSIGNMENT)
    big = course / "solutions" / ASSIGNMENT / "weights.bin"
    big.write_bytes(b"\0" * (GRADESCOPE_FILE_LIMIT + 1))
    out = tmp_path / "out.zip"
    done = autograder("gradescope", "--assignment", ASSIGNMENT, "--course", course,
                      "--out", out)
    assert done.returncode == 2
    assert "weights.bin" in done.stderr and "MiB" in done.stderr, done.stderr
    assert not out.exists()


def test_an_unknown_assignment_is_an_error(tmp_path):
    done = autograder("gradescope", "--assignment", "no_such_thing", "--out", tmp_path / "x.zip")
    assert done.returncode == 2
    assert "no assignment 'no_such_thing'" in done.stderr
    assert not (tmp_path / "x.zip").exists()


def test_the_scripts_are_executable_bash(built, tmp_path):
    for name in ("setup.sh", "run_autograder"):
        assert (built["infos"][name].external_attr >> 16) & 0o111 == 0o111, name
        script = tmp_path / name
        script.write_text(built["texts"][name])
        assert built["texts"][name].startswith("#!/usr/bin/env bash\n")
        done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert done.returncode == 0, (name, done.stderr)


def test_setup_installs_the_course_pins(built):
    setup, listed = built["texts"]["setup.sh"], built["texts"]["requirements.txt"]
    lines = [line for line in listed.splitlines() if line and not line.startswith("#")]
    course = {line.strip() for line in (ROOT / "requirements.txt").read_text().splitlines()}
    assert set(lines) <= course, set(lines) - course  # the course's own lines, pins and all
    names = {re.split(r"[<>=!~]", line)[0] for line in lines}
    assert {"torch", "torchvision", "numpy", "nbgrader", "papermill", "ipykernel"} <= names
    assert "torch==" in listed
    install = setup[setup.index('"$UV" pip install'):]
    install = install[:install.index('[grader]"')]
    for line in lines:
        assert shlex.quote(line) in install, line
    assert '--constraint "$LOCK" --build-constraints "$LOCK"' in install
    assert '--torch-backend "$TORCH_BACKEND"' in install
    assert 'TORCH_BACKEND="${AUTOGRADER_TORCH_BACKEND-cpu}"' in setup
    assert '"$TOOLS/uv/bin/python" -m pip install --constraint "$LOCK" uv' in setup


STUB = """#!/bin/bash
echo "$(basename "$0") $*" >> "$STEPS"
if [ "$1" = venv ] || [ "$1 $2" = "-m venv" ]; then  # python3 -m venv DIR, uv venv DIR
    folder="${@: -1}"
    mkdir -p "$folder/bin" && cp "$0" "$folder/bin/python" && cp "$0" "$folder/bin/uv"
fi
"""


def run_setup_with_stubs(root: Path, tmp_path: Path, **env) -> list:
    """setup.sh with apt-get and Python stubbed (each logs its command): the steps it takes."""
    stubs = tmp_path / "stubs"
    stubs.mkdir(exist_ok=True)
    for name in ("apt-get", "python3"):
        (stubs / name).write_text(STUB)
        (stubs / name).chmod(0o755)
    steps = tmp_path / "steps.log"
    steps.unlink(missing_ok=True)
    env = dict(os.environ, PATH=f"{stubs}:{os.environ['PATH']}", STEPS=str(steps), **env)
    done = subprocess.run(["bash", str(root / "source" / "setup.sh")], cwd=root / "source",
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return steps.read_text().splitlines()


def test_setup_sh_takes_its_steps_in_order(built, tmp_path):
    root = unpack(built["zip"], tmp_path / "autograder")
    venv, source = tmp_path / "venv", root / "source"
    lock = source / "requirements.lock"
    log = run_setup_with_stubs(root, tmp_path, AUTOGRADER_VENV=str(venv))
    assert log[:2] == ["apt-get update", "apt-get install -y --no-install-recommends "
                       "ca-certificates python3 python3-venv"]
    assert log[2:5] == [f"python3 -m venv --clear {venv}-tools/uv",
                        f"python -m pip install --constraint {lock} uv",
                        f"uv venv --clear --python 3.12 {venv}"]
    install = log[5]
    assert install.startswith(f"uv pip install --python {venv}/bin/python --constraint {lock} "
                              f"--build-constraints {lock} --torch-backend cpu --compile-bytecode ")
    assert install.endswith(f" {source}/package[grader]") and " torch==" in install
    assert log[6].startswith("python -c import sys, torch, dlperf, autograder.commands.cli")
    assert len(log) == 7
    # PyPI's PyTorch build where the CPU index is out of reach (the real install's test)
    log = run_setup_with_stubs(root, tmp_path, AUTOGRADER_VENV=str(venv),
                               AUTOGRADER_TORCH_BACKEND="")
    assert "--torch-backend" not in log[5] and " torch==" in log[5]


def test_a_stale_lock_is_refused(tmp_path):
    """A requirement the lock does not meet (a line added to requirements.txt without `make
    lock`) stops the build: setup.sh would install that package at no pinned version."""
    course = tmp_path / "course"
    course.mkdir()
    for name in ("pyproject.toml", "requirements.txt", "nbgrader_config.py"):
        shutil.copy2(ROOT / name, course / name)
    lock = (ROOT / "requirements.lock").read_text()
    numpy = re.search(r"^numpy==.*$", lock, re.MULTILINE)
    (course / "requirements.lock").write_text(lock.replace(numpy.group(0), "numpy==1.26.4"))
    for package in ("dlperf", "autograder"):
        shutil.copytree(ROOT / package, course / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(SOLUTIONS / ASSIGNMENT, course / "solutions" / ASSIGNMENT)
    out = tmp_path / "out.zip"
    done = autograder("gradescope", "--assignment", ASSIGNMENT, "--course", course,
                      "--out", out)
    assert done.returncode == 2
    assert "requirements.lock does not pin numpy>=2,<3" in done.stderr, done.stderr
    assert "make lock" in done.stderr and not out.exists()
    (course / "requirements.lock").unlink()
    done = autograder("gradescope", "--assignment", ASSIGNMENT, "--course", course,
                      "--out", out)
    assert done.returncode == 2 and "has no requirements.lock" in done.stderr, done.stderr


def test_a_grader_that_cannot_start_still_gives_a_result(built, tmp_path):
    root = unpack(built["zip"], tmp_path / "autograder")
    done, results = run_autograder(root, python="/bin/false")
    assert done.returncode == 0
    assert results["score"] == 0
    assert "failed before it could grade" in results["output"]


# ------------------------------------------------------------- grading, as on Gradescope

def _uploads():
    solved = submission(ASSIGNMENT, {})
    return {
        "solved": {NOTEBOOK: solved},
        "release": {NOTEBOOK: release_notebook(ASSIGNMENT)},
        "renamed": {NOTEBOOK.replace(".ipynb", " (1).ipynb"): solved, "notes.txt": "mine"},
        "in_a_folder": {f"work/{NOTEBOOK}": solved, "scratch.ipynb": solved},
        "empty": {},
        "no_notebook": {NOTEBOOK.replace(".ipynb", ".py"): "print('hello')\n"},
    }


@pytest.fixture(scope="module")
def graded(built, tmp_path_factory):
    base = tmp_path_factory.mktemp("gradescope-runs")
    found = {}
    for case, files in _uploads().items():
        root = unpack(built["zip"], base / case)
        for name, content in files.items():
            path = root / "submission" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, str):
                path.write_text(content)
            else:
                nbformat.write(content, str(path))
        found[case] = run_autograder(root)
    found["course_mode"] = stat.S_IMODE((base / "solved" / "source" / "course").stat().st_mode)
    # The same files graded directly by `python -m autograder grade`, to compare
    submitted = base / "direct"
    for case in ("solved", "release"):
        folder = submitted / case / ASSIGNMENT
        folder.mkdir(parents=True)
        shutil.copy2(base / case / "submission" / NOTEBOOK, folder / NOTEBOOK)
    done = autograder("grade", submitted, "--assignment", ASSIGNMENT, "--out", base / "out",
                      "--jobs", 1, "--no-progress")
    assert done.returncode == 0, done.stderr[-3000:]
    found["direct"] = {case: json.loads((base / "out" / case / ASSIGNMENT /
                                         f"{ASSIGNMENTS[ASSIGNMENT]}.results.json").read_text())
                       for case in ("solved", "release")}
    return found


def scores(results: dict) -> dict:
    return {test["name"]: (test["score"], test["max_score"]) for test in results["tests"]}


def full_marks(results: dict) -> bool:
    total = sum(test["max_score"] for test in results["tests"])
    return total > 0 and results["score"] == total and all(
        test.get("status", "passed") == "passed" for test in results["tests"])


@pytest.mark.integration
def test_every_upload_gets_a_result_and_the_script_exits_zero(graded):
    for case in _uploads():
        done, results = graded[case]
        assert done.returncode == 0, (case, done.stderr[-2000:])
        assert {"score", "output", "tests"} <= set(results), case
        assert results["output"], case


@pytest.mark.integration
def test_the_solved_notebook_gets_full_marks_as_the_grader_gives(graded):
    _, results = graded["solved"]
    assert full_marks(results), results
    assert graded["course_mode"] == 0o700  # the solutions: the grader's user alone
    assert scores(results) == scores(graded["direct"]["solved"])
    assert {t["visibility"] for t in results["tests"]} <= {"visible", "after_published"}


@pytest.mark.integration
def test_the_release_gets_what_the_grader_gives_it(graded):
    _, results = graded["release"]
    direct = graded["direct"]["release"]
    assert results["score"] == direct["score"]
    assert scores(results) == scores(direct)
    assert results["output"] == direct["output"]


@pytest.mark.integration
def test_a_renamed_download_is_graded_with_a_note(graded):
    _, results = graded["renamed"]
    assert full_marks(results), results["output"]
    renamed = NOTEBOOK.replace(".ipynb", " (1).ipynb")
    assert f"graded '{renamed}' as {NOTEBOOK}" in results["output"]


@pytest.mark.integration
def test_a_notebook_in_a_folder_is_found_and_others_are_named(graded):
    _, results = graded["in_a_folder"]
    assert full_marks(results), results["output"]
    assert f"took 'work/{NOTEBOOK}' out of its folder" in results["output"]
    assert "not graded, not part of this assignment: 'scratch.ipynb'" in results["output"]


@pytest.mark.integration
def test_an_empty_upload_gets_zero_and_says_so(graded):
    _, results = graded["empty"]
    assert results["score"] == 0
    assert f"Your submission holds no file: upload {NOTEBOOK}" in results["output"]
    assert "notebook not submitted" in results["output"]
    _, results = graded["no_notebook"]
    assert results["score"] == 0
    assert "holds no notebook (.ipynb file), only" in results["output"]


@pytest.mark.integration
def test_no_hidden_test_reaches_the_results(graded):
    released = json.dumps(nbformat.writes(release_notebook(ASSIGNMENT)))
    hidden = [line.strip() for cell in solution_notebook(ASSIGNMENT).cells
              for block in HIDDEN.findall(cell.source) for line in block.splitlines()
              if len(line.strip()) > 20 and "HIDDEN TESTS" not in line]
    hidden = [line for line in hidden if line not in released]
    assert hidden, "found no hidden test line to look for"
    for case in _uploads():
        done, results = graded[case]
        shown = json.dumps(results) + done.stdout + done.stderr
        leaked = [line for line in hidden if line in shown or json.dumps(line)[1:-1] in shown]
        assert not leaked, (case, leaked[:3])


def test_the_combined_results_keep_the_speed_tests_leaderboard():
    """The bundle's results.json carries what each notebook's result gave Gradescope's
    leaderboard (the speed tests' speedups), named by notebook when there are several:
    `grade` writes it per notebook (tests/test_autograder_speed.py), and the bundle's
    combination kept only the tests before."""
    from autograder.commands.gradescope import _combined

    def result(board):
        return {"score": 1.0, "output": "graded", "execution_time": 3,
                "tests": [{"name": "speed", "score": 1.0, "max_score": 4.0}],
                "extra_data": {}, **({"leaderboard": board} if board else {})}
    entry = {"name": "speed speedup (cpu)", "value": 4.2, "order": "desc"}
    assert _combined({"speedy": result([entry])}, [], [])["leaderboard"] == [entry]
    both = _combined({"a": result([entry]), "b": result([]), "c": result([entry])}, [], [])
    assert [e["name"] for e in both["leaderboard"]] == ["a: speed speedup (cpu)",
                                                        "c: speed speedup (cpu)"]
    assert "leaderboard" not in _combined({"speedy": result([])}, [], [])
