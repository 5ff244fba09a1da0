"""Grading on a Dask cluster: a real scheduler and two worker processes on loopback.

The scheduler and the workers are started as an instructor would (``dask scheduler``,
``dask worker``), each in a process of its own; the workers' nannies restart a worker that
dies. The scheduler gives up on a task after two deaths (``allowed-failures`` 1), the
grader after two such rounds.
"""
from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from autograder.runners.cluster import Cluster, grade_task
from autograder.pipeline.execute import Limits
from autograder.pipeline.grade import GradeOptions
from autograder.pipeline.result import ERROR, GRADED, SubmissionResult
from autograder.layout import Course, find_submissions
from tests.autograder_fixtures.submissions import (COURSE, CPU_MAX_SCORE, GOOD_SQUARES, answered,
                                                   graded_cases, write)
from tests.dask_cluster import CLUSTER_ENV, cluster, dask, stop  # noqa: F401 - cluster: a fixture
from tests import helpers
from tests.helpers import checkout_env

distributed = pytest.importorskip("distributed")

ROOT = Path(__file__).resolve().parent.parent
OPTIONS = GradeOptions(device="cpu", profile="quick", limits=Limits(cell=30, notebook=120))
SLOW_SQUARES = "import time\ntime.sleep(3)\ndef squares(n):\n    return [k * k for k in range(n)]"
def autograder(*args, env=None, timeout=300):
    return helpers.autograder(*args, env={**CLUSTER_ENV, **(env or {})}, timeout=timeout)


MEASURED = ("seconds", "execution_time", "peak_memory")  # how long and how big, not scores


def measured(name: str) -> bool:
    return name.startswith(MEASURED)


def csv_rows(out: Path) -> list:
    with (out / "grades.csv").open() as handle:
        return [{k: v for k, v in row.items() if not measured(k)}
                for row in csv.DictReader(handle)]


def results_json(out: Path) -> dict:
    found = {}
    for path in sorted(out.rglob("*.results.json")):
        data = json.loads(path.read_text())
        data = {k: v for k, v in data.items() if not measured(k)}
        data["extra_data"] = {k: v for k, v in data["extra_data"].items() if not measured(k)}
        found[str(path.relative_to(out))] = data
    return found


def gradebook_scores(db: Path) -> dict:
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{db}") as gradebook:
        return {(student.id, grade.name): (grade.auto_score, grade.needs_manual_grade)
                for student in gradebook.students
                for grade in gradebook.find_submission_notebook(
                    "demo", "demo", student.id).grades}


@pytest.mark.integration
def test_cluster_grades_exactly_as_the_local_run(cluster, tmp_path):
    submitted = tmp_path / "submitted"
    for student, (nb, _) in graded_cases().items():
        write(submitted, student, nb)
    write(submitted, "crashes", answered(squares="import os\nos._exit(1)"))
    write(submitted, "loops", answered(squares="def squares(n):\n    while True:\n        pass"))
    write(submitted, "broken", "{this is not json")
    (submitted / "absent" / "demo").mkdir(parents=True)
    common = [submitted, "--assignment", "demo", "--course", COURSE, "--device", "cpu",
              "--timeout", 60, "--cell-timeout", 3, "--no-progress"]
    runs = {}
    for name, extra in (("local", ["--jobs", 2]), ("dask", ["--scheduler", cluster.address])):
        out, db = tmp_path / name, tmp_path / f"{name}.db"
        done = autograder("grade", *common, "--out", out, "--gradebook", f"sqlite:///{db}",
                          *extra)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        runs[name] = (out, db, done.stdout)
    assert "on the Dask scheduler at" in runs["dask"][2]
    local, remote = runs["local"], runs["dask"]
    rows = csv_rows(remote[0])
    assert len(rows) == len(graded_cases()) + 4 and {r["status"] for r in rows} == {"graded", "error", "timeout",
                                                                "invalid"}
    assert rows == csv_rows(local[0])
    assert results_json(remote[0]) == results_json(local[0])
    assert gradebook_scores(remote[1]) == gradebook_scores(local[1])
    executed = sorted(p.relative_to(remote[0]) for p in remote[0].rglob("*.ipynb"))
    assert executed == sorted(p.relative_to(local[0]) for p in local[0].rglob("*.ipynb"))


def grade_on(address, submissions, sources, task=grade_task):
    """What ``python -m autograder grade --scheduler`` does: one Cluster, its grade()."""
    with Cluster(address) as cluster:
        return cluster.grade(submissions, sources, OPTIONS, task=task)


def _worker_busy_with(client, marker: str):
    """(worker address, pid of its process) of a worker now running a task with marker."""
    for address, keys in client.processing().items():
        if any(marker in str(key) for key in keys):
            return address, client.run(os.getpid, workers=[address])[address]
    return None


@pytest.mark.integration
def test_a_worker_killed_mid_run_loses_no_submission(cluster, tmp_path):
    for n in range(3):
        write(tmp_path, f"slow{n}", answered(squares=SLOW_SQUARES))
    submissions = find_submissions(tmp_path, "demo", notebooks=["demo"])
    sources = Course.discover(COURSE).source_notebooks("demo")
    outcome = {}
    grading = threading.Thread(target=lambda: outcome.update(results=grade_on(
        cluster.address, submissions, sources)))
    grading.start()
    victim, deadline = None, time.monotonic() + 60
    while victim is None and grading.is_alive():
        assert time.monotonic() < deadline, "no task started on a worker"
        victim = _worker_busy_with(cluster.client, "slow")
        time.sleep(0.2)
    assert victim is not None
    time.sleep(1.0)  # the submission's kernel is running its sleep now
    os.kill(victim[1], signal.SIGKILL)
    grading.join(timeout=180)
    assert not grading.is_alive()
    results = outcome["results"]
    assert [r.submission for r in results] == submissions
    assert [(r.status, r.score, r.max_score) for r in results] == [
        (GRADED, CPU_MAX_SCORE, CPU_MAX_SCORE)] * 3, [r.message for r in results]
    cluster.client.wait_for_workers(2, timeout=120)  # the nanny started another


NATIVE_CONNECT = """
import sysconfig
code = ('import ctypes, socket, struct\\n'
        'libc = ctypes.CDLL(None)\\n'
        'fd = libc.socket(2, 1, 0)\\n'
        'address = struct.pack("=H", 2) + struct.pack("!H", {port}) + socket.inet_aton("{host}")'
        ' + bytes(8)\\n'
        'print("connect returned", libc.connect(fd, address, len(address)))\\n')
exec(compile(code, sysconfig.get_paths()['purelib'] + '/innocent.py', 'exec'))
"""


@pytest.mark.integration
def test_a_kernel_on_a_worker_cannot_reach_the_scheduler(cluster, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root here (see guide/threat-model.md)")
    host, port = cluster.address.removeprefix("tcp://").rsplit(":", 1)
    # The good answer, after libc's connect() to the scheduler (no audit event)
    write(tmp_path, "probe", answered(
        squares=NATIVE_CONNECT.format(host=host, port=port) + GOOD_SQUARES))
    submissions = find_submissions(tmp_path, "demo", notebooks=["demo"])
    sources = Course.discover(COURSE).source_notebooks("demo")
    [result] = grade_on(cluster.address, submissions, sources)
    printed = [output.get("text", "") for cell in result.executed.cells
               for output in cell.get("outputs", []) if output.get("output_type") == "stream"]
    # (A kernel whose network namespace could not be made says why in the message.)
    assert any("connect returned -1" in text for text in printed), (printed, result.message)
    assert (result.status, result.score) == (GRADED, CPU_MAX_SCORE), result.message


def kills_its_worker(submission, *args):
    """The task, but the worker process dies for the student 'killer' (as a crash would)."""
    if submission.student_id == "killer":
        os._exit(1)
    return grade_task(submission, *args)


@pytest.mark.integration
def test_a_submission_that_kills_every_worker_gets_an_error_row(cluster, tmp_path):
    write(tmp_path, "correct", answered())
    write(tmp_path, "killer", answered())
    submissions = find_submissions(tmp_path, "demo", notebooks=["demo"])
    sources = Course.discover(COURSE).source_notebooks("demo")
    cluster.client.wait_for_workers(2, timeout=120)
    results = grade_on(cluster.address, submissions, sources, task=kills_its_worker)
    by_student = {r.submission.student_id: r for r in results}
    assert (by_student["correct"].status, by_student["correct"].score) == (GRADED, CPU_MAX_SCORE), \
        by_student["correct"].message
    killer = by_student["killer"]
    assert killer.status == ERROR and killer.score == 0
    assert "died on each of 4 tries" in killer.message and "KilledWorker" in killer.message
    assert "\n" not in killer.message
    cluster.client.wait_for_workers(2, timeout=120)


@pytest.mark.integration
def test_a_worker_that_cannot_see_the_submission_says_so(cluster, tmp_path):
    write(tmp_path, "ann", answered())
    submission = find_submissions(tmp_path, "demo")[0]
    sources = Course.discover(COURSE).source_notebooks("demo")
    with distributed.Client(cluster.address, set_as_default=False) as client:
        gone = client.submit(grade_task, submission, sources["demo"], OPTIONS,
                             _spec(sources), "0" * 64, pure=False)  # not what the worker sees
        with pytest.raises(Exception, match="submissions folder must be at the same path"):
            gone.result(timeout=120)


def _spec(sources):
    from autograder.runners.cluster import RunSpec, code_digest, support_digest
    return RunSpec(plugin="never-reached", code=code_digest(),
                   support={name: support_digest(s) for name, s in sources.items()})


def test_scheduler_flags_and_no_dask_without_them():
    from autograder.commands.cli import parser
    args = parser().parse_args(["grade", "sub", "--assignment", "a", "--out", "o",
                                "--scheduler", "tcp://10.0.0.5:8786", "--retries", "0"])
    assert (args.scheduler, args.retries) == ("tcp://10.0.0.5:8786", 0)
    args = parser().parse_args(["grade", "sub", "--assignment", "a", "--out", "o"])
    assert (args.scheduler, args.retries) == (None, 1)
    code = ("import sys, autograder.commands.cli, autograder.pipeline.grade, autograder.pipeline.report; "
            "autograder.commands.cli.parser(); print(sorted({'dask', 'distributed'} & set(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          env=checkout_env(), timeout=120)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr[-2000:]


@pytest.mark.integration
def test_unreachable_scheduler_is_a_usage_error(tmp_path):
    write(tmp_path, "ann", answered())
    done = autograder("grade", tmp_path, "--assignment", "demo", "--course", COURSE,
                      "--out", tmp_path / "out", "--scheduler", "tcp://127.0.0.1:9",
                      "--no-progress", timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "cannot reach the Dask scheduler at 'tcp://127.0.0.1:9'" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "out").exists()


@pytest.mark.integration
def test_cuda_without_gpu_workers_is_a_usage_error(cluster, tmp_path):
    from autograder.runners.cluster import ClusterError
    with Cluster(cluster.address) as connected:
        resolved = connected.resolve(GradeOptions())
        assert (resolved.device, resolved.profile) == ("cpu", "quick")
        assert connected.resolve(GradeOptions(device="cpu")).device == "cpu"
        with pytest.raises(ClusterError, match="--resources GPU=1"):
            connected.resolve(GradeOptions(device="cuda"))


def where_it_ran(submission, source, options, spec, submitted):
    """A task that grades nothing and says which worker ran it."""
    from distributed import get_worker
    return SubmissionResult(submission, GRADED, get_worker().address, device=options.device)


@pytest.mark.integration
def test_cuda_submissions_go_only_to_workers_with_a_gpu(cluster, tmp_path):
    for n in range(4):
        write(tmp_path, f"s{n}", answered())
    submissions = find_submissions(tmp_path, "demo", notebooks=["demo"])
    sources = Course.discover(COURSE).source_notebooks("demo")
    gpu = dask("worker", cluster.address, "--nthreads", "1", "--host", "127.0.0.1",
               "--no-dashboard", "--name", "gpu", "--resources", "GPU=1",
               log=cluster.base / "gpu-worker.log")  # no GPU: only the label matters here
    try:
        cluster.client.wait_for_workers(3, timeout=120)
        with Cluster(cluster.address) as connected:
            assert connected.resolve(GradeOptions()).device == "cuda"
            gpu_workers = connected.gpu_workers()
            assert len(gpu_workers) == 1
            results = connected.grade(submissions, sources,
                                      replace(OPTIONS, device="cuda", kernel="fresh"),
                                      task=where_it_ran)
        assert [r.message for r in results] == gpu_workers * 4
    finally:
        stop(gpu)
        deadline = time.monotonic() + 60
        while len(cluster.client.nthreads()) > 2 and time.monotonic() < deadline:
            time.sleep(0.2)
