"""Nothing of the grader's environment reaches a learner, and a lesson checkout on
PYTHONPATH shows a kernel its packages only.

A secret (a random value, and a fake hub token) is put in the environment of the grader
(``grade``, ``check``, ``serve``, a Dask cluster's workers); the submission prints
``os.environ`` and every ``/proc/<pid>/environ`` it can read (its own, its parent's,
``/proc/1``). The secret must be in nothing a learner or an instructor gets back: the
executed notebook, the results, the CSV, the service's store and pages, the command's
output. The BLAS and thread settings must still reach the kernel. The same submission
lists and reads the checkout's ``solutions/`` and ``tests/`` while the checkout is on
PYTHONPATH (as the guide's set-ups have it), and imports ``dlperf`` from it.
"""
from __future__ import annotations

import json
import os
import platform
import re
import secrets as random_tokens
import shutil
import time
from pathlib import Path

import pytest

from autograder.pipeline.grade import GradeOptions
from autograder.sandbox.workdir import sandbox_policy
from autograder.layout import Course, find_submissions
from autograder.sandbox.spawn import fork_supported, open_spawner
from tests import helpers
from tests.autograder_fixtures.submissions import COURSE, answered, write

ROOT = Path(__file__).resolve().parent.parent
DUMP = "tests.autograder_fixtures.environ:dump"  # a spawner's target: what it can read
SECRET = random_tokens.token_hex(16)
HUB_TOKEN = random_tokens.token_hex(16)
LEAKS = (SECRET, HUB_TOKEN)
# What OpenBLAS, OpenMP and the locale read: these must pass. (A core type any CPU of
# the architecture runs, so the grader's own BLAS is not broken by it.)
CORETYPE = {"x86_64": "Prescott", "aarch64": "ARMV8"}.get(platform.machine(), "")
PASSING = {"OPENBLAS_CORETYPE": CORETYPE, "OPENBLAS_L2_SIZE": "1048576",
           "OMP_NUM_THREADS": "1", "LC_ALL": "C.UTF-8"}
GRADER_ENV = {"AUTOGRADER_TEST_SECRET": SECRET, "JUPYTERHUB_API_TOKEN": HUB_TOKEN,
              "JUPYTERHUB_API_URL": "http://127.0.0.1:1/hub/api", **PASSING}

# The answer: squares() as it should be, after printing all the environment it can read.
SNOOP = r'''
import os

def _read(path):
    try:
        with open(path, "rb") as handle:
            return handle.read().replace(b"\0", b"\n").decode(errors="replace")
    except OSError as error:
        return f"unreadable ({error.strerror})"

print("ENVIRON", dict(os.environ))
for _pid in ["self", "1", str(os.getppid())] + [p for p in os.listdir("/proc") if p.isdigit()]:
    print("PROC", _pid, _read(f"/proc/{_pid}/environ"))
print("PASSED", {name: os.environ.get(name) for name in %(passing)r})

def squares(n):
    return [k * k for k in range(n)]
'''
# ... or a squares() that returns the secrets it found, for the failure message to quote.
RETURNS = r'''
def squares(n):
    found = [v for k, v in os.environ.items() if "SECRET" in k or "TOKEN" in k]
    for _pid in ["self", str(os.getppid())]:
        found += [line for line in _read(f"/proc/{_pid}/environ").splitlines()
                  if "SECRET" in line or "TOKEN" in line]
    return found
'''
# ... and, in `grade`, what it can find of the checkout on its PYTHONPATH.
CHECKOUT = r'''
def _listing(path):
    try:
        return sorted(os.listdir(path))
    except OSError as error:
        return f"unreadable ({error.strerror})"

print("CHECKOUT", _listing(%(root)r))
print("SOLUTIONS", _listing(%(root)r + "/solutions"))
print("TESTS", _listing(%(root)r + "/tests"))
print("CONFTEST", _read(%(root)r + "/tests/conftest.py")[:40])
import dlperf
print("DLPERF", dlperf.__file__)
'''


def snoop(checkout: bool = False, returns: bool = False):
    code = SNOOP % {"passing": sorted(PASSING)}
    if returns:
        code = code[:code.index("\ndef squares")] + RETURNS
    if checkout:
        code = code.replace("\ndef squares", CHECKOUT % {"root": str(ROOT)} + "\ndef squares")
    return answered(squares=code)


def leaked(text: str) -> list:
    return [secret for secret in LEAKS if secret in text]


def leaks_in(folder: Path) -> dict:
    """Every file under ``folder`` that holds a secret, with what it holds."""
    found = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            hits = leaked(path.read_bytes().decode(errors="replace"))
            if hits:
                found[str(path.relative_to(folder))] = hits
    return found


def printed(nb_path: Path) -> str:
    """All the text outputs of an executed notebook."""
    nb = json.loads(nb_path.read_text())
    return "".join("".join(o.get("text", "")) for cell in nb["cells"]
                   for o in cell.get("outputs", []))


def passed_settings(text: str) -> dict:
    found = re.search(r"PASSED (\{.*\})", text)
    assert found, text[-2000:]
    import ast
    return ast.literal_eval(found.group(1))


# ----------------------------------------------------------------- unit tests: the spawner

def test_the_written_environment_is_the_allow_list():
    from autograder.sandbox.policy import ENVIRONMENT_NAMES, process_environment
    grader = {"AUTOGRADER_TEST_SECRET": SECRET, "JUPYTERHUB_API_TOKEN": HUB_TOKEN,
              "AWS_SECRET_ACCESS_KEY": SECRET, "HOME": "/root", "PATH": "/usr/bin",
              "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": "0", "LD_LIBRARY_PATH": "/x",
              "MKL_NUM_THREADS": "2", "OPENBLAS_NUM_THREADS": "2", **PASSING}
    written = process_environment(grader)
    assert not leaked(repr(written))
    assert "HOME" not in written  # a kernel gets its own (its working directory)
    for name in ("PATH", "PYTHONPATH", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH",
                 "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", *PASSING):
        assert written[name] == grader[name], name
    assert set(ENVIRONMENT_NAMES) >= {"PATH", "PYTHONPATH", "LD_LIBRARY_PATH"}


@pytest.mark.parametrize("kind", ["fork", "fresh"])
def test_a_spawners_processes_never_hold_the_grader_environment(kind, tmp_path, monkeypatch):
    """Neither a started process's ``os.environ`` nor its ``/proc/self/environ`` (the fork
    server's, for a forked one), nor its parent's, holds what the grader's held."""
    from autograder.sandbox.policy import process_environment
    if kind == "fork" and not fork_supported():
        pytest.skip("no fork() here")
    for name, value in GRADER_ENV.items():
        monkeypatch.setenv(name, value)
    with open_spawner(kind, ["json"], process_environment()) as spawner:
        for n, env in enumerate((None, {**process_environment(), "HOME": str(tmp_path)})):
            out = tmp_path / f"dump{n}.json"
            process = spawner.start(DUMP, str(out), env=env)
            process.wait(timeout=60)
            seen = json.loads(out.read_text())
            assert not leaked(json.dumps(seen)), (kind, n, seen)
            for name, value in PASSING.items():
                assert seen["environ"].get(name) == value, (name, seen["environ"])
                if os.path.exists("/proc/self/environ"):  # the process's own, as exec'd
                    assert f"{name}={value}" in seen["self"], seen["self"]


def test_every_command_opens_its_spawner_with_the_written_environment(monkeypatch):
    """``grade``/``check``/``serve`` (the command line's spawner), a local runner and a Dask
    worker's plugin give their spawner the written environment, never their own."""
    import argparse
    from autograder.commands.cli import _open_spawner
    from autograder.runners.cluster import SpawnerPlugin
    from autograder.runners.local import LocalRunner
    from autograder.sandbox.policy import process_environment
    for name, value in GRADER_ENV.items():
        monkeypatch.setenv(name, value)
    plugin = SpawnerPlugin("fresh", [])
    plugin.setup(None)
    with LocalRunner(1, "fresh", notebooks=[]) as runner:
        spawners = [_open_spawner(argparse.Namespace(kernel="fresh"), []), runner.spawner,
                    plugin.spawner]
        for spawner in spawners:
            assert spawner.env == process_environment(), spawner
            assert not leaked(repr(spawner.env)) and spawner.env["OPENBLAS_CORETYPE"] == CORETYPE
    plugin.teardown(None)


# ----------------------------------------------------------- unit tests: the checkout

def test_a_checkout_on_the_path_is_hidden_but_its_packages(tmp_path, monkeypatch):
    from autograder.sandbox.policy import NEVER_SHOWN, source_folders
    monkeypatch.syspath_prepend(str(ROOT))
    assert str(ROOT) in source_folders()
    write(tmp_path, "ann", answered())
    submission = find_submissions(tmp_path, "demo")[0]
    source = Course.discover(COURSE).source_notebooks("demo")["demo"]
    policy = sandbox_policy(submission, source, tmp_path, GradeOptions(device="cpu"))
    assert str(ROOT) in policy.hidden
    shown_here = {Path(p).name for p in policy.shown if Path(p).parent == ROOT}
    assert {"dlperf", "autograder"} <= shown_here
    assert not shown_here & {"tests", "solutions", ".git", "conftest.py", *NEVER_SHOWN}
    assert not any(p == str(ROOT) or p.startswith(str(ROOT / "solutions"))
                   or p.startswith(str(ROOT / "tests")) for p in policy.shown)
    # A tests/ folder on sys.path itself (pytest puts one there when it is no package) is
    # hidden, and nothing of it shown.
    monkeypatch.syspath_prepend(str(ROOT / "tests"))
    policy = sandbox_policy(submission, source, tmp_path, GradeOptions(device="cpu"))
    assert str(ROOT / "tests") in policy.hidden or str(ROOT) in policy.hidden
    assert not any(p.startswith(str(ROOT / "tests")) for p in policy.shown), policy.shown


# ------------------------------------------------ integration: grade, check, serve, Dask

def run(*commands, timeout=300) -> list:
    """Run ``python -m autograder`` once per argument list, all at once, as
    helpers.autograder does (this checkout on PYTHONPATH), with the secret in the
    environment; the completed processes, in order."""
    import subprocess
    import sys
    env = dict(os.environ, PYTHONPATH=str(ROOT), **GRADER_ENV)
    started = [subprocess.Popen([sys.executable, "-m", "autograder", *map(str, args)],
                                cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for args in commands]
    done = []
    for process, args in zip(started, commands):
        stdout, stderr = process.communicate(timeout=timeout)
        done.append(subprocess.CompletedProcess(process.args, process.returncode, stdout,
                                                stderr))
    return done


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """``grade`` one snooping submission and ``check`` one (at once), with the secret in
    the grader's environment and the checkout on its PYTHONPATH."""
    base = tmp_path_factory.mktemp("secrets")
    submitted, out = base / "submitted", base / "out"
    write(submitted, "eve", snoop(checkout=True))
    path = write(base / "check", "eve", snoop(returns=True))
    done, checked = run(["grade", submitted, "--assignment", "demo", "--out", out, "--course",
                         COURSE, "--device", "cpu", "--timeout", 120],
                        ["check", path, "--device", "cpu"])
    return {"done": done, "out": out, "checked": checked, "notebook": path}


@pytest.mark.integration
def test_grade_shows_no_secret_anywhere(graded):
    done, out = graded["done"], graded["out"]
    assert done.returncode == 0, done.stderr[-3000:]
    executed = next(out.rglob("demo.ipynb"))
    text = printed(executed)
    assert "ENVIRON" in text and "PROC self" in text, text[-2000:]
    assert leaks_in(out) == {}
    assert not leaked(done.stdout + done.stderr)
    assert (out / "grades.csv").is_file() and list(out.rglob("*.results.json"))


@pytest.mark.integration
def test_the_blas_and_thread_settings_reach_the_kernel(graded):
    text = printed(next(graded["out"].rglob("demo.ipynb")))
    settings = passed_settings(text)
    assert {name: settings[name] for name in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE",
                                              "LC_ALL")} == \
        {name: PASSING[name] for name in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "LC_ALL")}
    assert settings["OMP_NUM_THREADS"]  # the grader's share of the cores per kernel


@pytest.mark.integration
def test_check_shows_no_secret(graded):
    checked = graded["checked"]
    assert checked.returncode == 1 and "squares(" in checked.stdout, \
        checked.stdout[-2000:] + checked.stderr[-3000:]  # a failure message, quoting squares()
    assert not leaked(checked.stdout + checked.stderr)
    assert leaks_in(graded["notebook"].parent.parent) == {}


@pytest.mark.integration
@pytest.mark.skipif(os.geteuid() != 0, reason="the file system view needs root")
def test_a_checkout_on_pythonpath_shows_the_kernel_only_its_packages(graded):
    text = printed(next(graded["out"].rglob("demo.ipynb")))
    listing = re.search(r"CHECKOUT (.*)", text).group(1)
    assert "dlperf" in listing and "autograder" in listing, listing
    assert not re.search(r"'(tests|solutions|\.git|README\.md|conftest\.py)'", listing), listing
    for name in ("SOLUTIONS", "TESTS"):
        found = re.search(rf"{name} (.*)", text).group(1)
        assert found.startswith("unreadable"), (name, found)
    assert re.search(r"CONFTEST unreadable", text), text[-2000:]
    assert f"DLPERF {ROOT / 'dlperf' / '__init__.py'}" in text, text[-2000:]


@pytest.mark.integration
def test_serve_shows_no_secret(tmp_path):
    from autograder.commands.submit import multipart
    from coursebook.service_process import ServiceProcess, issue_tokens
    import nbformat
    import urllib.request
    course = tmp_path / "course"
    shutil.copytree(COURSE, course)
    (course / "roster.toml").write_text('instructors = ["ada"]\nlearners = ["eve"]\n')
    token = issue_tokens(course, "eve")["eve"]
    server = ServiceProcess(course, "--device", "cpu", "--cell-timeout", "30",
                            env=GRADER_ENV, start_timeout=120)
    try:
        body, kind = multipart({"assignment": "demo"}, "notebook", "demo.ipynb",
                               nbformat.writes(snoop(returns=True)).encode())

        def get(path, data=None, headers=None):
            request = urllib.request.Request(f"{server.url}{path}", data=data,
                                             headers={"Authorization": f"Bearer {token}",
                                                      **(headers or {})})
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.read().decode()

        answer = get("/submit", body, {"Content-Type": kind})
        submission = re.search(r"/submissions/([\w-]+)", answer).group(1)
        deadline = time.monotonic() + 120
        while json.loads(get(f"/submissions/{submission}.json"))["state"] != "done":
            assert time.monotonic() < deadline, server.errors()
            time.sleep(0.5)
        pages = [get(f"/submissions/{submission}{end}") for end in (".json", "", "/notebook")]
        assert "ENVIRON" in pages[2], pages[2][-2000:]
        assert not leaked("".join(pages))
    finally:
        server.stop()
    assert leaks_in(course) == {}  # the store, the results, the executed notebook, its log


@pytest.mark.integration
def test_dask_workers_show_no_secret(tmp_path, monkeypatch, request):
    """Workers started from a shell that holds the secret grade without passing it on."""
    pytest.importorskip("distributed")
    from tests.dask_cluster import CLUSTER_ENV, dask, scheduler, stop
    for name, value in GRADER_ENV.items():
        monkeypatch.setenv(name, value)  # the workers' environment, as started below
    process, address = scheduler(tmp_path)
    processes = [process]
    try:
        processes.append(dask("worker", address, "--nthreads", "1", "--host", "127.0.0.1",
                              "--no-dashboard", log=tmp_path / "worker.log"))
        submitted, out = tmp_path / "submitted", tmp_path / "out"
        write(submitted, "eve", snoop(returns=True))
        done = helpers.autograder("grade", submitted, "--assignment", "demo", "--out", out,
                                  "--course", COURSE, "--device", "cpu", "--scheduler",
                                  address, env={**CLUSTER_ENV, **GRADER_ENV}, timeout=300)
    finally:
        for process in reversed(processes):
            stop(process)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "ENVIRON" in printed(next(out.rglob("demo.ipynb")))
    assert leaks_in(out) == {} and not leaked(done.stdout + done.stderr)
    assert leaks_in(tmp_path / "submitted") == {}
