"""A learner's Triton kernel is compiled inside the sandbox: on a GPU, Triton runs ``ptxas``
and the C compiler, which the kernel's audit hook refuses to any code but an installed
library's, and to a library only for the grader's list (``Policy.programs``).

The first GPU run (NVIDIA H200, 2026-11-27) graded every fused_layernorm notebook, the
solution too, 0 of 10, before the hook had this exception (the run kept no message; a refusal
to start ``ptxas`` or the compiler is the cause the code points to). On a CPU, Triton's interpreter compiles
nothing, so this file starts the same programs the way Triton does on a GPU (its
``ptxas --version`` probe and its launcher build) in a kernel confined as the grader confines
one, and checks that a notebook's own code still cannot start them, nor a library anything
else.
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path

import pytest
from nbformat.v4 import new_code_cell, new_notebook

from autograder.pipeline.execute import Limits, execute
from autograder.protocol import Policy, python_paths
from autograder.sandbox.cgroups import ResourceGroup
from autograder.sandbox.policy import closed_folders, compiler_programs, shown_paths
from autograder.sandbox.spawn import open_spawner
from autograder.sandbox.workdir import run_dir

ISOLATING = sys.platform.startswith("linux") and os.geteuid() == 0
HAS_TRITON = importlib.util.find_spec("triton") is not None

TRIES = r'''
import json, os, subprocess, tempfile
import triton
from triton.backends.nvidia.compiler import get_ptxas, get_ptxas_version
from triton.runtime.build import _build, _find_compiler

seen = {}
def attempt(name, action):
    try:
        seen[name] = ["ran", action()]
    except Exception as error:
        seen[name] = [type(error).__name__, str(error)]

attempt("library_ptxas", lambda: get_ptxas_version(90).split("\n")[0])
attempt("notebook_ptxas",
        lambda: subprocess.run([get_ptxas(90).path, "--version"]).returncode)
attempt("notebook_shell", lambda: os.system("true"))

SOURCE = """
#define PY_SSIZE_T_CLEAN
#include <Python.h>
static PyObject *answer(PyObject *self, PyObject *args) { return PyLong_FromLong(42); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, ""}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "probe", NULL, -1, methods};
PyMODINIT_FUNC PyInit_probe(void) { return PyModule_Create(&module); }
"""
folder = tempfile.mkdtemp()
with open(os.path.join(folder, "probe.c"), "w") as source:
    source.write(SOURCE)

def launcher():  # what Triton does for each kernel's launcher on a GPU
    import importlib.util
    built = _build("probe", os.path.join(folder, "probe.c"), folder, [], [], [], [])
    spec = importlib.util.spec_from_file_location("probe", built)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.answer()

os.environ["CC"] = "/bin/sh"  # the notebook picks the program Triton starts
_find_compiler.cache_clear()
attempt("library_other_program", launcher)
del os.environ["CC"]
_find_compiler.cache_clear()
attempt("library_compiler", launcher)
print("SEEN" + json.dumps(seen))
'''


@pytest.fixture(scope="module")
def seen():
    if not ISOLATING:
        pytest.skip("the grader isolates kernels as root on Linux (see the README)")
    if not HAS_TRITON:
        pytest.skip("Triton is not installed")
    workdir = Path(tempfile.mkdtemp(prefix="submission-", dir=run_dir()))
    group = ResourceGroup.create(2**31, 64)
    hidden = (str(run_dir()), *closed_folders(python_paths()))
    policy = Policy(workdir=str(workdir), disk=256 * 2**20, hidden=hidden,
                    shown=shown_paths(hidden, python_paths()),
                    cgroups=group.paths if group is not None else (),
                    programs=compiler_programs())
    nb = new_notebook(cells=[new_code_cell(TRIES)], metadata={"kernelspec": {
        "name": "python3", "language": "python", "display_name": "Python 3"}})
    spawner = open_spawner("fork")
    try:
        done = execute(nb, workdir, parameters={}, limits=Limits(cell=120, notebook=180),
                       spawner=spawner, sandbox=policy.to_dict(), group=group,
                       env={"HOME": str(workdir), "TMPDIR": str(workdir)},
                       log=run_dir() / "compilers.log")
    finally:
        if group is not None:
            group.close()
        spawner.close()
    text = "".join(o.get("text", "") for o in done.notebook.cells[-1].outputs)
    assert "SEEN" in text, (done.ended, done.message, done.notebook.cells[-1].outputs)
    return json.loads(text.split("SEEN", 1)[1])


def test_the_grader_lists_tritons_tools_and_a_c_compiler():
    programs = compiler_programs()
    assert any(Path(p).name.startswith("ptxas") for p in programs) or not HAS_TRITON
    assert any("gcc" in Path(p).name or "clang" in Path(p).name for p in programs), programs
    assert not any(Path(p).name in ("sh", "bash", "dash", "python3") for p in programs)


def test_triton_runs_its_ptxas_and_builds_a_launcher_in_the_kernel(seen):
    assert seen["library_ptxas"][0] == "ran", seen
    assert seen["library_compiler"] == ["ran", 42], seen


def test_a_notebooks_own_code_still_starts_nothing(seen):
    for case in ("notebook_ptxas", "notebook_shell"):
        assert seen[case][0] == "SandboxViolation", seen
        assert "does not allow starting processes" in seen[case][1]


def test_a_library_may_start_nothing_else(seen):
    assert seen["library_other_program"][0] == "SandboxViolation", seen
