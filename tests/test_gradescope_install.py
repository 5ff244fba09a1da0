"""The Gradescope zip installed for real: setup.sh, as Gradescope runs it when it builds the
image, installs the grader from the package registries into a fresh environment, and
run_autograder with that environment grades a solved and a wrong notebook of a real assignment
(the course's smallest) into Gradescope's results.json.

What runs as on Gradescope and what does not (guide/gradescope-install.md):

* apt-get is a stub that logs its two commands (``update``; ``install ca-certificates python3
  python3-venv``) and installs nothing: on the Ubuntu image they need root, and on a test machine
  (a Debian host, or CI's runner) they would change the system. Every later line of setup.sh runs
  unchanged: the machine's python3 makes the small environment pip installs uv into (from PyPI, at
  the lock's pin); uv makes the grader's environment and installs every package from the
  registries with requirements.lock as constraints, bytecode compiled.
* Python 3.12: Gradescope's Ubuntu 22.04 has none, so there uv downloads its own build; here uv
  takes the first ``python3.12`` on PATH, which the test puts there (the machine's own: CI's
  /usr/bin/python3.12, pyenv's). Without one the test is skipped and says so.
* PyTorch: from PyTorch's CPU index (``--torch-backend cpu``) where this machine reaches
  download.pytorch.org; where it does not, ``AUTOGRADER_TORCH_BACKEND=`` makes setup.sh take the
  same version from PyPI (its CUDA build, which grades on a CPU alike) and
  test_pytorch_is_the_cpu_build is skipped, saying why.
* uv's cache: the user's (``uv cache dir``), which ``make setup`` has filled, so a second run
  downloads little; on Gradescope setup.sh uses a temporary one. The venv lives in a folder others
  may enter, as /opt/dlperf-grader does (the learner's kernel runs as nobody where the grader is root).

Measured on a 2-core machine (Python 3.12.1, PyTorch from PyPI): setup.sh 58 to 77 s on an empty
cache (4 GB of wheels at 200 MB/s), 34 to 44 s warm, 31 s of which compile bytecode; each grading
3 to 5 s; the module 71 s cold, 55 to 63 s warm.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import pytest

from autograder.commands.gradescope import locked_versions
from coursebook.cases import WRONG, expected_losses, load_wrong, submission, unjudged
from tests.helpers import autograder, python312
from tests.test_autograder_gradescope import (ASSIGNMENT, NOTEBOOK, full_marks, run_autograder,
                                              unpack)

pytestmark = pytest.mark.integration

TORCH_INDEX_HOST = "download.pytorch.org"
# A pin the test moves back in the zip's lock, to see setup.sh install what the lock says
# rather than the newest version (a package grading installs, pure Python, small)
OLDER_PIN = ("six", "1.16.0")
APT_STUB = """#!/bin/sh
echo "apt-get $*" >> "$(dirname "$0")/apt-get.log"
"""


def reaches(host: str) -> bool:
    try:
        socket.create_connection((host, 443), timeout=10).close()
        return True
    except OSError:
        return False


def uv_cache() -> dict:
    """``UV_CACHE_DIR`` set to the user's uv cache, where this environment has uv."""
    done = subprocess.run([sys.executable, "-m", "uv", "cache", "dir"], capture_output=True,
                          text=True)
    return {"UV_CACHE_DIR": done.stdout.strip()} if done.returncode == 0 else {}


def wrong_case() -> dict:
    """The assignment's first wrong submission whose lost points are all known."""
    for path in WRONG:
        case = load_wrong(path)
        if case["assignment"] == ASSIGNMENT and not unjudged(case) \
                and expected_losses(case, cuda=False):
            return case
    raise AssertionError(f"tests/wrong_submissions holds no judged case of {ASSIGNMENT}")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    python = python312()
    if python is None:
        pytest.skip("no Python 3.12 on this machine for uv to take (on Gradescope uv "
                    "downloads its own)")
    base = tmp_path_factory.mktemp("gradescope-install")
    out = base / "autograder.zip"
    done = autograder("gradescope", "--assignment", ASSIGNMENT, "--out", out)
    assert done.returncode == 0, done.stderr[-3000:]
    source = unpack(out, base / "image")
    lock = source / "source" / "requirements.lock"
    name, older = OLDER_PIN
    pinned = re.compile(rf"^{name}==.*$", re.MULTILINE)
    assert pinned.search(lock.read_text()), f"the lock pins no {name}"
    lock.write_text(pinned.sub(f"{name}=={older}", lock.read_text()))
    stubs = base / "stubs"  # apt-get, and the one python3.12 uv may take
    stubs.mkdir()
    (stubs / "apt-get").write_text(APT_STUB)
    (stubs / "apt-get").chmod(0o755)
    (stubs / "python3.12").symlink_to(python)
    opt = Path(tempfile.mkdtemp(prefix="dlperf-gradescope-"))  # as /opt: others may enter
    opt.chmod(0o755)
    venv = opt / "dlperf-grader"
    cpu_index = reaches(TORCH_INDEX_HOST)
    env = dict(os.environ, PATH=f"{stubs}:{os.environ['PATH']}", AUTOGRADER_VENV=str(venv),
               **uv_cache(), **({} if cpu_index else {"AUTOGRADER_TORCH_BACKEND": ""}))
    env.pop("PYTHONPATH", None)
    start = time.monotonic()
    setup = subprocess.run(["bash", str(source / "source" / "setup.sh")], cwd=source / "source",
                           env=env, capture_output=True, text=True, timeout=1500)
    seconds = time.monotonic() - start
    print(f"setup.sh took {seconds:.0f} s (uv cache: {env.get('UV_CACHE_DIR', 'a fresh one')}; "
          f"PyTorch from {'its CPU index' if cpu_index else 'PyPI'})")
    try:
        yield {"base": base, "zip": out, "setup": setup, "venv": venv, "seconds": seconds,
               "locked": locked_versions(lock.read_text()),
               "cpu_index": cpu_index, "apt": (stubs / "apt-get.log").read_text().splitlines()
               if (stubs / "apt-get.log").exists() else []}
    finally:
        shutil.rmtree(opt, ignore_errors=True)


def test_setup_sh_installs_every_package_at_the_lock_version(installed):
    setup = installed["setup"]
    assert setup.returncode == 0, (setup.stdout[-3000:], setup.stderr[-3000:])
    assert installed["apt"] == ["apt-get update", "apt-get install -y --no-install-recommends "
                                "ca-certificates python3 python3-venv"]
    python = installed["venv"] / "bin" / "python"
    assert "grader ready: Python 3.12" in setup.stdout
    listing = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m, json; print(json.dumps("
         "{d.metadata['Name']: d.version for d in m.distributions()}))"],
        capture_output=True, text=True, check=True, env={"PATH": os.defpath})
    versions = json.loads(listing.stdout)
    locked = installed["locked"]  # the zip's lock, one pin moved back (OLDER_PIN)
    normal = {name.lower().replace("_", "-").replace(".", "-"): version
              for name, version in versions.items()}
    assert normal.pop("dlperf") == "0.1.0"  # the course's package, from package/
    unpinned = sorted(set(normal) - set(locked))
    assert not unpinned, f"installed at no version of requirements.lock: {unpinned}"
    differ = {name: (version, locked[name]) for name, version in normal.items()
              if version.split("+")[0] != locked[name]}
    assert not differ, differ
    assert {name for name, version in normal.items() if "+" in version} <= {"torch",
                                                                            "torchvision"}
    assert {"torch", "torchvision", "numpy", "nbgrader", "papermill", "ipykernel"} <= set(normal)
    assert normal[OLDER_PIN[0]] == OLDER_PIN[1]
    site = installed["venv"] / "lib" / "python3.12" / "site-packages"
    assert (site / "torch" / "__pycache__" / "__init__.cpython-312.pyc").is_file()  # compiled


def test_pytorch_is_the_cpu_build(installed):
    if not installed["cpu_index"]:
        pytest.skip(f"{TORCH_INDEX_HOST} is out of reach here: setup.sh took PyPI's build of "
                    "the same PyTorch version (AUTOGRADER_TORCH_BACKEND=)")
    assert installed["setup"].returncode == 0
    python = installed["venv"] / "bin" / "python"
    done = subprocess.run([str(python), "-c", "import torch; print(torch.__version__, "
                           "torch.version.cuda)"], capture_output=True, text=True, check=True)
    assert done.stdout.split()[0].endswith("+cpu") and done.stdout.split()[1] == "None"


def test_run_autograder_grades_a_solved_and_a_wrong_notebook(installed):
    assert installed["setup"].returncode == 0
    python = str(installed["venv"] / "bin" / "python")
    case = wrong_case()
    results = {}
    for name, notebook in (("solved", submission(ASSIGNMENT, {})),
                           ("wrong", submission(ASSIGNMENT, case["answers"]))):
        root = unpack(installed["zip"], installed["base"] / name)
        nbformat.write(notebook, str(root / "submission" / NOTEBOOK))
        done, results[name] = run_autograder(root, python=python)
        assert done.returncode == 0, done.stderr[-3000:]
        assert f"$ {python} -m autograder grade" in done.stdout  # the installed grader ran
    solved, wrong = results["solved"], results["wrong"]
    assert full_marks(solved), solved["output"]
    maximum = {test["name"]: test["max_score"] for test in solved["tests"]}
    losses = expected_losses(case, cuda=False)
    assert {test["name"]: test["score"] for test in wrong["tests"]} == {
        name: points - losses.get(name, 0) for name, points in maximum.items()}, (
        case["name"], wrong["output"])
    assert wrong["score"] == sum(maximum.values()) - sum(losses.values()) > 0
    assert [t["status"] for t in wrong["tests"] if t["name"] in losses] == ["failed"] * len(losses)
