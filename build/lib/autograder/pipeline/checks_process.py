"""Run one submission's trusted checks in a process of their own, started by the run's
spawner (target :func:`autograder.pipeline.checks.serve_request`).

A process of its own for each submission, so whatever process-wide state the instructor's
checks change (PyTorch's global generator, default dtype, threads, module attributes)
dies with it and no other submission's checks see it. Request and outcomes travel through
two files in the grader's run folder.

Its environment is the spawner's, the one the grader writes for a submission's processes
(:func:`autograder.sandbox.policy.process_environment`), not the grader's own: it runs no learner
code, but what the checks print and the values their messages quote go into the feedback,
and nothing it needs is secret.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from typing import Dict, List, Optional, Sequence, Tuple

from autograder.protocol import CHECKS_TARGET
from autograder.pipeline.checks import CheckOutcome
from autograder.options import CHECKS_START_MARGIN
from autograder.sandbox.spawn import Spawner



class ChecksSetupError(RuntimeError):
    """The instructor's setup cells failed where the checks run: a grader problem."""


def _run_process(request: dict, folder: str, spawner: Spawner) -> Tuple[List[dict], str]:
    """Run one checks process on ``request``; the lines it wrote, and how it ended."""
    handle, request_path = tempfile.mkstemp(prefix="checks-", suffix=".json", dir=folder)
    with os.fdopen(handle, "w") as out:
        json.dump(request, out)
    result_path = request_path[:-len(".json")] + ".out"
    open(result_path, "w").close()
    deadline = time.monotonic() + CHECKS_START_MARGIN + request["timeout"] * len(request["tests"])
    try:
        process = spawner.start(CHECKS_TARGET, request_path, result_path)
        ended = "ended before giving its verdict (it crashed)"
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            ended = "ran past its time limit and was stopped"
            try:
                os.killpg(process.pid, signal.SIGKILL)  # it, and anything it started
            except (ProcessLookupError, PermissionError):
                pass
            process.wait()
        with open(result_path) as handle:
            lines = [json.loads(line) for line in handle if line.endswith("\n")]
    finally:
        for path in (request_path, result_path):
            os.unlink(path)
    return lines, ended


def run_checks_isolated(setup_code: str, seed: int,
                        tests: Sequence[Tuple[str, str, Optional[str]]], *, timeout: float,
                        folder: str, spawner: Spawner) -> Dict[str, CheckOutcome]:
    """Outcomes by grade id, as :func:`autograder.pipeline.checks.run_checks` gives them, from a
    process of their own that ``spawner`` starts.

    Each test's checks get ``timeout`` seconds; a test whose checks hang or crash the
    process fails with a message saying so, and the tests after it run in a new process.
    Raises :class:`ChecksSetupError` when the setup cells fail there.
    """
    pending = [test for test in tests if test[2] is not None]
    outcomes: Dict[str, CheckOutcome] = {}
    while pending:
        request = {"setup_code": setup_code, "seed": int(seed), "timeout": float(timeout),
                   "tests": [list(test) for test in pending]}
        lines, ended = _run_process(request, folder, spawner)
        if not lines:
            raise ChecksSetupError(f"the process running the checks {ended} before the "
                                   "setup cells had run")
        if "setup_error" in lines[0]:
            raise ChecksSetupError(lines[0]["setup_error"])
        for line in lines[1:]:
            outcomes[line["grade_id"]] = CheckOutcome(
                bool(line["passed"]), str(line["message"]), str(line["printed"]),
                line["credit"])
        pending = [test for test in pending if test[0] not in outcomes]
        if pending:  # the first test without a verdict is the one that broke the process
            grade_id = pending.pop(0)[0]
            outcomes[grade_id] = CheckOutcome(
                False, f"RuntimeError: the process running the checks of this test {ended}",
                "")
    return outcomes
