"""The course on the lowest PyTorch it supports: 2.11, what the lent GPU machines have.

A second environment, made once under ``_build/torch-lowest`` (a few minutes, about 5 GB):
Python 3.12 with ``torch==2.11.*`` and the matching torchvision, the scientific packages those
machines have, and only what running notebooks needs besides. The course's package is
used from the checkout, as there. In it, the tests of ``dlperf`` pass and every chapter
runs from top to bottom with papermill, in the quick profile, from a folder that holds
nothing of the repository.
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENV = ROOT / "_build" / "torch-lowest"
LOWEST = ["torch==2.11.*", "torchvision==0.26.*"]
# What the GPU machines have besides PyTorch, and what running the notebooks needs.
MACHINE = ["numpy", "matplotlib", "pandas", "scipy", "pytest"]
NOTEBOOKS = ["nbformat", "papermill", "ipykernel", "jupytext"]
CHAPTERS = sorted(path.stem for path in (ROOT / "chapters").glob("*.md"))
DLPERF_TESTS = ["test_parallel.py", "test_timing.py", "test_distributed.py", "test_profile.py",
                "test_hardware.py", "test_data.py"]

pytestmark = pytest.mark.integration


def python312():
    """A Python 3.12 interpreter that runs, or None."""
    candidates = [shutil.which("python3.12"), *sorted(glob.glob(
        os.path.expanduser("~/.pyenv/versions/3.12*/bin/python3.12"))), "/usr/bin/python3.12"]
    for candidate in filter(None, candidates):
        try:
            done = subprocess.run([candidate, "--version"], capture_output=True, text=True,
                                  timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0 and done.stdout.startswith("Python 3.12"):
            return candidate
    return None


def run(command, **kwargs):
    done = subprocess.run(command, capture_output=True, text=True, **kwargs)
    assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def lowest():
    """The environment's python, and the environment variables to run the course with."""
    base = python312()
    if base is None:
        pytest.skip("no Python 3.12 on this machine")
    python = ENV / "bin" / "python"
    ready = ENV / ".ready"
    wanted = " ".join(LOWEST + MACHINE + NOTEBOOKS)
    if not ready.exists() or ready.read_text() != wanted:
        shutil.rmtree(ENV, ignore_errors=True)
        run([base, "-m", "venv", str(ENV)])
        run([python, "-m", "pip", "install", "--quiet", *LOWEST, *MACHINE, *NOTEBOOKS],
            timeout=1800)
        run([python, "-m", "pip", "install", "--quiet", "--no-deps", "d2l==1.0.3"], timeout=600)
        run([python, "-m", "ipykernel", "install", "--sys-prefix", "--name", "python3"])
        ready.write_text(wanted)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DLPERF_PROFILE": "quick",
           "PATH": f"{ENV / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    env.pop("VIRTUAL_ENV", None)
    version = run([python, "-c", "import torch; print(torch.__version__)"], env=env).stdout
    assert version.startswith("2.11."), version
    return python, env


def test_dlperf_passes_its_tests_on_the_lowest_torch(lowest):
    python, env = lowest
    run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "ignore",
         *[str(ROOT / "tests" / name) for name in DLPERF_TESTS]], env=env, cwd=ROOT, timeout=1800)


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_runs_on_the_lowest_torch(lowest, chapter, tmp_path):
    python, env = lowest
    notebook, executed = tmp_path / f"{chapter}.ipynb", tmp_path / f"{chapter}.out.ipynb"
    run([python, "-m", "jupytext", "--to", "ipynb", "--output", str(notebook),
         str(ROOT / "chapters" / f"{chapter}.md")], env=env)
    run([python, "-m", "papermill", str(notebook), str(executed), "--cwd", str(tmp_path),
         "-k", "python3"], env=env, timeout=1800)
