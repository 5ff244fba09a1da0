"""``python -m autograder grade`` and ``check`` end to end on the fixture assignment."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from autograder.commands.cli import parser
from tests.autograder_fixtures.submissions import (COURSE, CPU_MAX_SCORE, RELEASE, answered,
                                                   graded_cases, write)
from tests.helpers import autograder

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Grade every fixture case plus the ones that cannot be graded normally, once."""
    base = tmp_path_factory.mktemp("cli")
    submitted, out = base / "submitted", base / "out"
    expected = {}
    for student, (nb, score) in graded_cases().items():
        write(submitted, student, nb)
        expected[student] = ("graded", score)
    write(submitted, "crashes", answered(squares="import os\nos._exit(1)"))
    expected["crashes"] = ("error", 0.0)
    write(submitted, "loops", answered(squares="def squares(n):\n    while True:\n        pass"))
    expected["loops"] = ("timeout", 4.0)  # the mean tests still pass: 1 + 1 + 2
    write(submitted, "broken", "{this is not json")
    expected["broken"] = ("invalid", 0.0)
    (submitted / "absent" / "demo").mkdir(parents=True)
    expected["absent"] = ("invalid", 0.0)
    db = base / "gradebook.db"
    done = autograder("grade", submitted, "--assignment", "demo", "--out", out,
                      "--course", COURSE, "--jobs", 2, "--device", "cpu",
                      "--timeout", 60, "--cell-timeout", 3, "--gradebook", f"sqlite:///{db}")
    return {"done": done, "out": out, "db": db, "expected": expected, "base": base}


def rows(graded):
    with (graded["out"] / "grades.csv").open() as handle:
        return {row["student_id"]: row for row in csv.DictReader(handle)}


@pytest.mark.integration
def test_exit_code_zero_and_a_row_for_every_submission(graded):
    done = graded["done"]
    assert done.returncode == 0, done.stderr[-3000:]
    found = rows(graded)
    assert set(found) == set(graded["expected"])
    for student, (status, score) in graded["expected"].items():
        row = found[student]
        assert (row["status"], float(row["score"])) == (status, score), row
        assert float(row["max_score"]) == CPU_MAX_SCORE
        assert row["message"] and "\n" not in row["message"]


@pytest.mark.integration
def test_messages_say_why(graded):
    found = rows(graded)
    assert "kernel died" in found["crashes"]["message"]
    assert "time limit" in found["loops"]["message"]
    assert "is not a Jupyter notebook" in found["broken"]["message"]
    assert "not submitted" in found["absent"]["message"]
    assert "skipped on the CPU" in found["correct"]["message"]


@pytest.mark.integration
def test_summary_table_is_printed(graded):
    stdout = graded["done"].stdout
    assert "student" in stdout and "off_by_one" in stdout
    assert f"{len(graded['expected'])} submission(s)" in stdout
    assert "1 timeout, 1 error, 2 invalid" in stdout


@pytest.mark.integration
def test_results_json_and_executed_notebooks(graded):
    folder = graded["out"] / "off_by_one" / "demo"
    data = json.loads((folder / "demo.results.json").read_text())
    assert data["score"] == 5.0
    tests = {t["name"]: t for t in data["tests"]}
    assert tests["test_squares"]["score"] == 0
    assert "squares(3) gave [1, 4, 9]" in tests["test_squares"]["output"]
    assert tests["test_partial"]["score"] == 1.0
    nb = nbformat.read(str(folder / "demo.ipynb"), as_version=4)
    # It reaches learners through nbgrader's feedback: hidden tests are named, never shown.
    assert not any("BEGIN HIDDEN TESTS" in c.source for c in nb.cells)
    assert any("hidden tests, not shown" in c.source for c in nb.cells)
    assert not (graded["out"] / "broken" / "demo" / "demo.ipynb").exists()
    assert (graded["out"] / "broken" / "demo" / "demo.results.json").exists()


def nbgrader(*args, cwd):
    env = dict(os.environ, PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
    return subprocess.run([sys.executable, "-m", "nbgrader", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.integration
def test_nbgrader_export_and_feedback_read_what_the_grader_wrote(graded):
    export = graded["base"] / "export.csv"
    done = nbgrader("export", "--db", f"sqlite:///{graded['db']}", "--to", export, cwd=COURSE)
    assert done.returncode == 0, done.stderr[-3000:]
    with export.open() as handle:
        exported = {row["student_id"]: float(row["raw_score"]) for row in csv.DictReader(handle)}
    ours = {student: float(row["score"]) for student, row in rows(graded).items()}
    assert exported == ours
    feedback = graded["base"] / "feedback"
    done = nbgrader("generate_feedback", "demo", "--db", f"sqlite:///{graded['db']}",
                    f"--CourseDirectory.autograded_directory={graded['out']}",
                    f"--CourseDirectory.feedback_directory={feedback}", cwd=COURSE)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (feedback / "off_by_one" / "demo" / "demo.html").exists()


@pytest.mark.integration
def test_unknown_assignment_is_a_usage_error(tmp_path):
    done = autograder("grade", tmp_path, "--assignment", "nope", "--out", tmp_path / "o",
                      "--course", COURSE)
    assert done.returncode == 2 and "no assignment 'nope'" in done.stderr


def test_grade_options_keep_the_interface():
    args = parser().parse_args(["grade", "sub", "--assignment", "a", "--out", "o", "--jobs", "3",
                                "--device", "cuda", "--timeout", "10", "--gradebook"])
    assert (args.jobs, args.device, args.timeout, args.gradebook) == (
        3, "cuda", 10.0, "sqlite:///gradebook.db")
    args = parser().parse_args(["grade", "sub", "--assignment", "a", "--out", "o",
                                "--gradebook", "postgresql://db"])
    assert args.gradebook == "postgresql://db" and args.device == "auto"
    with pytest.raises(SystemExit):
        parser().parse_args(["grade", "sub", "--assignment", "a", "--out", "o", "--jobs", "0"])


@pytest.mark.integration
def test_check_shows_each_visible_test(tmp_path):
    off_by_one = "def squares(n):\n    return [k * k for k in range(1, n + 1)]"
    path = write(tmp_path, "me", answered(squares=off_by_one))
    done = autograder("check", path, "--device", "cpu")
    assert done.returncode == 1, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert any(line.split()[:3] == ["FAIL", "test_squares", "0/2"] for line in lines), done.stdout
    assert any(line.split()[:3] == ["PASS", "test_mean", "1/1"] for line in lines)
    assert any(line.split()[:2] == ["HIDE", "test_mean_hidden"] for line in lines)
    assert any(line.split()[:2] == ["SKIP", "test_squares_gpu"] for line in lines)
    assert "squares(3) gave [1, 4, 9]" in done.stdout
    assert "3 of 6 points from the visible tests" in done.stdout


@pytest.mark.integration
def test_check_passes_a_correct_notebook_and_flags_edited_tests(tmp_path):
    nb = answered()
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == "test_mean":
            cell.source = "pass"
    path = write(tmp_path, "me", nb)
    done = autograder("check", path, "--device", "cpu")
    assert "you edited test cell 'test_mean'" in done.stdout
    done = autograder("check", path, "--device", "cpu", "--source", RELEASE)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert "6 of 6 points" in done.stdout


@pytest.mark.integration
def test_the_pip_package_checks_a_notebook_and_leaves_the_service_out(tmp_path):
    """What `pip install` of the course gives a learner, in an environment where the checkout
    is not importable: `check` runs the whole pipeline (sandbox included); `serve` says where
    the service is instead of failing on an import."""
    import sysconfig
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()"
                                "['purelib'])"], capture_output=True, text=True,
                               check=True).stdout.strip())
    # The grader's dependencies from this environment, but not its .pth files: the editable
    # install of the checkout stays out (a learner has the package, not the checkout).
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    import shutil
    source = tmp_path / "source"  # a copy: setuptools builds in the source folder
    for name in ("dlperf", "autograder"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", source)
    built = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                            "--no-build-isolation", "--target", str(site), str(source)],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    where = subprocess.run([python, "-c", "import autograder; print(autograder.__file__)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True)
    assert where.stdout.startswith(str(site)), where
    assert not (site / "autograder" / "service").exists()
    path = write(tmp_path / "work", "me", answered())
    check = subprocess.run([python, "-m", "autograder", "check", str(path), "--device", "cpu",
                            "--source", str(RELEASE)], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=300)
    assert check.returncode == 0 and "6 of 6 points" in check.stdout, check.stdout + check.stderr
    serve = subprocess.run([python, "-m", "autograder", "serve", "--course", str(COURSE)],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert serve.returncode == 2, serve.stderr[-2000:]
    assert "not part of the installed package" in serve.stderr
