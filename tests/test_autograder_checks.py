"""autograder.pipeline.checks: the trusted checks of each submission run in a process of their own."""
from __future__ import annotations

import json
import threading

import pytest

from autograder.pipeline.checks import run_checks
from autograder.pipeline.checks_process import ChecksSetupError, run_checks_isolated
from autograder.sandbox.spawn import ForkServer, FreshInterpreter

SETUP = "import torch\nTEST_SEED = 0\ndef double(x):\n    return 2 * x"


def report(**values) -> str:
    return json.dumps({"values": values})


@pytest.fixture(scope="module")
def server():
    with ForkServer(["torch"]) as started:
        yield started


@pytest.fixture(params=["fork", "fresh"])
def isolated(request, server, tmp_path):
    """run_checks_isolated, from the fork server or from a fresh interpreter."""
    def run(tests, setup=SETUP, timeout=20.0, seed=7):
        return run_checks_isolated(setup, seed, tests, timeout=timeout, folder=str(tmp_path),
                                   spawner=server if request.param == "fork"
                                   else FreshInterpreter())
    return run


def test_outcomes_are_those_of_the_checks_run_here(isolated):
    tests = [("good", "assert value == double(21)", report(value=42)),
             ("bad", "assert value == double(21), f'got {value}'", report(value=41)),
             ("printed", "print('seed', TEST_SEED)\n0.5", report()),
             ("no report", "assert False", None)]
    assert isolated(tests) == run_checks(SETUP, 7, tests)
    outcomes = isolated(tests)
    assert outcomes["good"].passed and not outcomes["bad"].passed
    assert outcomes["bad"].message == "AssertionError: got 41"
    assert outcomes["printed"].printed == "seed 7\n" and outcomes["printed"].credit == 0.5
    assert "no report" not in outcomes


def test_a_hanging_check_fails_only_its_own_test(isolated):
    tests = [("first", "assert True", report()),
             ("hangs", "while True:\n    pass", report()),
             ("after", "assert value == 1", report(value=1))]
    outcomes = isolated(tests, timeout=1.0)
    assert outcomes["first"].passed and outcomes["after"].passed
    assert not outcomes["hangs"].passed
    assert outcomes["hangs"].message.startswith("TimeoutError: the checks of this test ran "
                                                "longer than 1 s")


def test_a_check_that_kills_its_process_fails_only_its_own_test(isolated):
    tests = [("first", "assert True", report()),
             ("crashes", "import os\nos._exit(3)", report()),
             ("after", "assert value == 1", report(value=1))]
    outcomes = isolated(tests)
    assert outcomes["first"].passed and outcomes["after"].passed
    assert not outcomes["crashes"].passed
    assert "crashed" in outcomes["crashes"].message


def test_global_state_does_not_cross_between_submissions(server, tmp_path):
    """One submission's checks reseed PyTorch's global generator; another's, graded at the
    same time in another thread, draw from it: each draws what it would alone."""
    draw = "value = torch.rand(3).tolist()"
    alone = run_checks_isolated(SETUP, 1, [("draw", f"{draw}\nprint(value)", report())],
                                timeout=20, folder=str(tmp_path), spawner=server)
    seen = []

    def meddle():
        run_checks_isolated(SETUP, 1, [("meddles", "torch.manual_seed(123)\n"
                                        "torch.set_default_dtype(torch.float64)", report())],
                            timeout=20, folder=str(tmp_path), spawner=server)

    def read():
        seen.append(run_checks_isolated(SETUP, 1, [("draw", f"{draw}\nprint(value)", report())],
                                        timeout=20, folder=str(tmp_path), spawner=server))

    for _ in range(5):
        threads = [threading.Thread(target=meddle), threading.Thread(target=read)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert all(outcome["draw"].printed == alone["draw"].printed for outcome in seen)


def test_failing_setup_cells_are_the_graders_problem(isolated):
    with pytest.raises(ChecksSetupError, match="ZeroDivisionError"):
        isolated([("t", "assert True", report())], setup="1 / 0")
