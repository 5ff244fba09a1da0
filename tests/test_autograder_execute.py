"""autograder.pipeline.execute, .kernel_manager and .spawn: one kernel process per notebook, with limits.

These start real kernels (about a second each), on tiny notebooks that import nothing heavy.
"""
from __future__ import annotations

import json
import os
import time

import pytest
from nbformat.v4 import new_code_cell, new_notebook

from autograder.pipeline.execute import Limits, execute
from autograder.protocol import TIMEOUT_ENAME
from autograder.sandbox.imports import imported_modules, notebook_imports
from autograder.sandbox.spawn import ForkServer, FreshInterpreter, fork_supported
from tests.autograder_fixtures.submissions import SOURCE

KERNELS = ["fresh"] + (["fork"] if fork_supported() else [])


@pytest.fixture(scope="module")
def server():
    if not fork_supported():
        pytest.skip("this platform cannot fork kernels")
    with ForkServer(["json", "no_such_module_for_the_test"]) as started:
        yield started.wait_ready()


def notebook(*sources):
    cells = [new_code_cell("x = 0", metadata={"tags": ["parameters"]})]
    cells += [new_code_cell(s) for s in sources]
    for i, cell in enumerate(cells):
        cell["id"] = f"c{i}"
    return new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3",
                                                              "language": "python",
                                                              "display_name": "Python 3"}})


def run(nb, tmp_path, kernel, server=None, **kwargs):
    kwargs.setdefault("limits", Limits(cell=20, notebook=60))
    return execute(nb, tmp_path, parameters={"x": 5},
                   spawner=server if kernel == "fork" else FreshInterpreter(), **kwargs)


def cell_by_id(nb, cell_id):
    return next(c for c in nb.cells if c.get("id") == cell_id)


def stdout(cell):
    return "".join(o.get("text", "") for o in cell.outputs if o.get("name") == "stdout")


@pytest.mark.parametrize("kernel", KERNELS)
def test_runs_on_after_errors_with_parameters_cwd_and_env(tmp_path, kernel, request):
    server = request.getfixturevalue("server") if kernel == "fork" else None
    nb = notebook("raise ValueError('first')",
                  "import os\nprint(x, os.getcwd(), os.environ['AUTOGRADER_TEST'])",
                  "open('helper_mod.py', 'w').write('VALUE = 7')\nimport helper_mod\n"
                  "print(helper_mod.VALUE)")
    done = run(nb, tmp_path, kernel, server, env={"AUTOGRADER_TEST": "yes"})
    assert done.completed, done.message
    out = done.notebook
    assert any(o.get("ename") == "ValueError" for o in cell_by_id(out, "c1").outputs)
    assert stdout(cell_by_id(out, "c2")).split() == ["5", str(tmp_path), "yes"]
    assert stdout(cell_by_id(out, "c3")).strip() == "7"  # the working directory is importable
    assert any("injected-parameters" in c.metadata.get("tags", []) for c in out.cells)


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_slow_cell_is_interrupted_and_the_rest_runs(tmp_path, kernel, request):
    server = request.getfixturevalue("server") if kernel == "fork" else None
    nb = notebook("import time\ntime.sleep(60)", "print('after')")
    start = time.perf_counter()
    done = run(nb, tmp_path, kernel, server, limits=Limits(cell=2, notebook=60))
    assert time.perf_counter() - start < 30
    slow = cell_by_id(done.notebook, "c1")
    assert [o.get("ename") for o in slow.outputs if o.output_type == "error"] == [TIMEOUT_ENAME]
    assert stdout(cell_by_id(done.notebook, "c2")).strip() == "after"


def test_the_notebook_limit_stops_the_run(tmp_path, server):
    nb = notebook("import time\ntime.sleep(60)", "print('never')")
    start = time.perf_counter()
    done = run(nb, tmp_path, "fork", server, limits=Limits(cell=60, notebook=3))
    assert time.perf_counter() - start < 30
    assert done.ended == "notebook-timeout" and "3 s" in done.message
    assert cell_by_id(done.notebook, "c2").execution_count is None


def test_a_dying_kernel_is_reported_with_its_cell(tmp_path, server):
    nb = notebook("import os\nos._exit(3)", "print('never')")
    done = run(nb, tmp_path, "fork", server)
    assert done.ended == "kernel-died"
    assert "cell 3 of the executed notebook" in done.message  # after the two parameter cells
    assert cell_by_id(done.notebook, "c2").execution_count is None


def test_forked_kernels_are_separate_processes(tmp_path, server):
    nb = notebook("import os, sys, json\nprint(os.getpid(), os.getppid(), os.getpgid(0), "
                  "'' in sys.path, 'json' in sys.modules)")
    pids = []
    for _ in range(2):
        done = run(nb, tmp_path, "fork", server)
        pid, ppid, pgid, cwd_on_path, preloaded = stdout(cell_by_id(done.notebook, "c1")).split()
        assert int(ppid) == server.pid and int(pgid) == int(pid)  # own process group
        assert cwd_on_path == "True" and preloaded == "True"
        pids.append(int(pid))
    assert pids[0] != pids[1] and os.getpid() not in pids


def test_fork_server_reports_what_it_could_not_import(server):
    assert "json" in server.preloaded
    assert "no_such_module_for_the_test" in server.failed
    from autograder.sandbox.device import cuda_available
    assert cuda_available(server) in (True, False)


def test_imports_are_read_from_code_and_notebooks():
    code = ["import torch.nn as nn\nfrom os import path\n%matplotlib inline\nfrom . import x",
            "!pip list\nimport json, collections.abc", "def broken(:"]
    assert imported_modules(code) == ["torch", "os", "json", "collections"]
    assert notebook_imports([SOURCE]) == ["math", "sys", "torch"]


def test_triton_is_left_for_the_notebook_to_import(tmp_path):
    # Triton reads TRITON_INTERPRET when imported, which fused_layernorm sets first without CUDA.
    nb = {"cells": [{"cell_type": "code", "source": "import os\nimport triton\nimport torch"}]}
    (tmp_path / "t.ipynb").write_text(json.dumps(nb))
    assert notebook_imports([tmp_path / "t.ipynb"]) == ["os", "torch"]


def test_limits_must_be_positive():
    with pytest.raises(ValueError):
        Limits(cell=0)


@pytest.mark.skipif(not fork_supported(), reason="this platform cannot fork kernels")
def test_a_dead_fork_server_is_started_again(tmp_path):
    import signal
    with ForkServer([]) as server:
        server.wait_ready()
        os.kill(server.pid, signal.SIGKILL)
        server.process.wait(timeout=10)
        done = run(notebook("print('alive')"), tmp_path, "fork", server)
        assert stdout(cell_by_id(done.notebook, "c1")).strip() == "alive"
        assert server.restarts == 1


def test_a_cell_that_ignores_the_interrupt_stops_the_run(tmp_path, server):
    stubborn = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass"
    nb = notebook(stubborn, "print('never')")
    start = time.perf_counter()
    done = run(nb, tmp_path, "fork", server, limits=Limits(cell=1, notebook=60))
    assert time.perf_counter() - start < 30
    assert done.ended == "unresponsive" and "stopped responding" in done.message
    assert cell_by_id(done.notebook, "c2").execution_count is None


def test_one_engine_serves_concurrent_runs_with_their_own_limits(tmp_path, server):
    """papermill's engine is registered once; each run's output cap travels as an argument."""
    import threading

    from papermill.engines import papermill_engines

    from autograder.pipeline.execute import ENGINE
    nb = notebook("print('x' * 20000)")
    done = {}

    def grade(limit):
        folder = tmp_path / str(limit)
        folder.mkdir()
        done[limit] = run(nb, folder, "fork", server, output_limit=limit)

    threads = [threading.Thread(target=grade, args=(limit,)) for limit in (1024, 2**20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    engine = papermill_engines.get_engine(ENGINE)
    grade(4096)
    assert papermill_engines.get_engine(ENGINE) is engine
    text = {limit: "".join(o.get("text", "") for o in cell_by_id(d.notebook, "c1").outputs)
            for limit, d in done.items()}
    assert "dropped further output: more than 1 KiB" in text[1024]
    assert "dropped" not in text[2**20] and "x" * 20000 in text[2**20]
    assert "more than 4 KiB" in "".join(
        o.get("text", "") for o in cell_by_id(done[4096].notebook, "c1").outputs)
