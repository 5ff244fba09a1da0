"""``python -m autograder serve --scheduler``: the submission service grading on Dask (issue 28).

A real scheduler and two one-thread workers on loopback (:mod:`tests.dask_cluster`), the
service started as an instructor starts it, learners uploading over HTTP as
``test_autograder_service.py`` does; the uploads must be graded by tasks on the workers.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import pytest

from tests.autograder_fixtures.submissions import answered
from tests.dask_cluster import CLUSTER_ENV, ROOT, cluster  # noqa: F401 - cluster: a fixture
from tests.test_autograder_service import (OFF_BY_ONE, Server, assert_phases_shown, graded,
                                           request, tokens, upload, with_rules)

distributed = pytest.importorskip("distributed")


def graded_here(dask_worker) -> list:
    """The grade tasks this worker ran (run on each worker by ``Client.run``)."""
    return sorted({str(entry[0]) for entry in dask_worker.state.log
                   if str(entry[0]).startswith("grade-")})


@pytest.mark.integration
def test_serve_grades_each_upload_on_a_worker_of_the_scheduler(cluster, tmp_path_factory):
    course = with_rules(tmp_path_factory, "on-dask")
    people = tokens(course)
    server = Server(course, "--scheduler", cluster.address)
    try:
        assert (f"2 grader(s) on the Dask scheduler at {cluster.address} (2 worker(s), "
                "2 thread(s))") in server.banner, server.banner
        uploads = {}
        for learner, nb in (("alan", answered()), ("grace", answered(squares=OFF_BY_ONE))):
            status, body = upload(server, people[learner], nb)
            assert status == 201, body
            uploads[learner] = json.loads(body)["id"]
        right = graded(server, people["alan"], uploads["alan"], timeout=300)
        wrong = graded(server, people["grace"], uploads["grace"], timeout=300)
        assert (right["status"], right["score"], right["max_score"]) == ("graded", 8.0, 8.0)
        assert (wrong["status"], wrong["score"]) == ("graded", 5.0), wrong["message"]
        tests = {t["name"]: t for t in wrong["tests"]}
        assert (tests["test_squares"]["status"], tests["test_squares"]["score"]) == ("failed", 0)
        assert "squares(3) gave [1, 4, 9], expected [0, 1, 4]" in tests["test_squares"]["output"]
        # Graded on the workers, one task per upload, named for it; none in the server
        ran = cluster.client.run(graded_here)
        tasks = [key for keys in ran.values() for key in keys]
        assert sorted(key.rsplit("-", 1)[1] for key in tasks) == \
            ["alan/demo/demo", "grace/demo/demo"], ran
        # The executed notebook and the phases came back from the worker
        status, body = request(f"{server.url}/submissions/{uploads['alan']}/notebook",
                               people["alan"])
        assert status == 200 and b'"cells"' in body
        status, body = request(f"{server.url}/instructor", people["ada"])
        assert status == 200
        assert_phases_shown(body.decode(), course / "service.db")
    finally:
        server.kill(signal.SIGTERM)


@pytest.mark.integration
def test_serve_with_an_unreachable_scheduler_is_a_clear_error(tmp_path_factory):
    course = with_rules(tmp_path_factory, "no-dask")
    done = subprocess.run(
        [sys.executable, "-m", "autograder", "serve", "--course", str(course), "--port", "0",
         "--scheduler", "tcp://127.0.0.1:9"], cwd=ROOT, capture_output=True, text=True,
        env=dict(os.environ, **CLUSTER_ENV), timeout=180)
    assert done.returncode == 2, done.stdout + done.stderr[-3000:]
    assert done.stderr.startswith("error: cannot reach the Dask scheduler at "
                                  "'tcp://127.0.0.1:9'"), done.stderr[-3000:]
    assert "Traceback" not in done.stderr and not re.search(r"Serving", done.stdout)
