"""The autograder against broken and hostile submissions (tests/hostile_submissions.py).

One grading run holds every case beside good submissions, as a real class would. Every
submission gets a row with the status and score its case expects; nothing a trick does
earns a point beyond the honest baseline; no process of any kernel is left running; no
file outside the output folder changes; every kernel stays within its memory and time;
no kernel reaches the grader's loopback or signals a process outside it; a fork bomb and
a disk fill stop at their limits.
"""
from __future__ import annotations

import csv
import hashlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from coursebook.cases import ROOT
from autograder.sandbox.cgroups import ResourceGroup
from tests.hostile_submissions import ASSIGNMENT, CASES, NOTEBOOK, PROCESS_LIMIT, build
from tests.helpers import checkout_env

pytestmark = pytest.mark.integration

MEMORY_GIB, DISK_GIB, TIMEOUT, CELL_TIMEOUT = 1.0, 0.25, 60, 8
MARGIN_SECONDS, MARGIN_MIB = 20, 1024 + 256  # the grader's fixed allowance beyond the limits
SENTINEL = Path("/tmp/hostile-was-here")


def fingerprint(*folders: Path) -> dict:
    """path -> sha256 of every file under ``folders`` (what must not change)."""
    found = {}
    for folder in folders:
        for path in sorted(folder.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                found[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def isolation_available() -> bool:
    """Whether the grader here can give kernels namespaces and a resource group."""
    group = ResourceGroup.create(2**30, 64) if os.geteuid() == 0 else None
    if group is None:
        return False
    group.close()
    return True


ISOLATED = isolation_available()
GRADED_CASES = [case for case in CASES if ISOLATED or not case.isolated]


def kernel_processes(grader_pid: int) -> list:
    """Processes the grader with this pid left behind: those in a resource group (cgroup) it
    made, working in its run folder, or started by a trick ('sleep 1000000'). Scoped to that
    grader, so that another grader running on the machine (another checkout's tests) is not
    counted; a kernel's processes cannot leave their cgroup, so none escapes the first test."""
    mark_group = f"/autograder-{grader_pid}-"
    mark_folder = f"/autograder-run-{grader_pid}-"
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            cwd = os.readlink(f"/proc/{entry.name}/cwd")
            cmdline = Path(f"/proc/{entry.name}/cmdline").read_bytes().replace(b"\0", b" ")
            groups = Path(f"/proc/{entry.name}/cgroup").read_text()
            state = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state == "Z":
            continue  # exited, waiting for its parent to collect it: nothing runs
        if mark_group in groups or mark_folder in cwd or b"sleep 1000000" in cmdline:
            found.append((int(entry.name), cwd, cmdline[:80]))
    return found


@pytest.mark.skipif(not ISOLATED, reason="needs root and writable cgroups")
def test_the_leftover_check_sees_the_graders_processes_only(tmp_path):
    """A process in a resource group this process made, or working in its run folder, is
    found; the same under another grader's pid is not."""
    group = ResourceGroup.create(2**30, 64)
    folder = tmp_path / f"autograder-run-{os.getpid()}-x"
    folder.mkdir()
    in_group = subprocess.Popen(["sleep", "60"], preexec_fn=lambda: [
        Path(path, "cgroup.procs").write_text(str(os.getpid())) for path in group.paths])
    in_folder = subprocess.Popen(["sleep", "60"], cwd=folder)
    try:
        found = {pid for pid, _, _ in kernel_processes(os.getpid())}
        assert {in_group.pid, in_folder.pid} <= found, found
        others = {pid for pid, _, _ in kernel_processes(os.getpid() + 1)}
        assert not {in_group.pid, in_folder.pid} & others, others
    finally:
        in_folder.kill()
        in_folder.wait()
        group.close()
        in_group.wait()


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    base = tmp_path_factory.mktemp("hostile")
    submitted, out, gradebook = base / "submitted", base / "out", base / "gradebook.db"
    # A listener on the grader's loopback, where a Dask scheduler or a database could be.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    listener.setblocking(False)
    # A process outside the grader that a kernel must not be able to signal.
    victim = subprocess.Popen(["sleep", "3600"])
    places = {"submitted": submitted, "out": out, "gradebook": gradebook,
              "port": listener.getsockname()[1], "victim": victim.pid}
    for case in GRADED_CASES:
        folder = submitted / case.student / ASSIGNMENT
        folder.mkdir(parents=True)
        if not case.filename:
            continue  # submitted nothing
        if case.place is not None:
            case.place(folder, folder / case.filename)
            continue
        content = build(case, places)
        target = folder / case.filename
        if isinstance(content, dict):  # a notebook of any nbformat version
            target.write_text(json.dumps(content))
        elif isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content)
    SENTINEL.unlink(missing_ok=True)
    protected = fingerprint(submitted, ROOT / "solutions", ROOT / "exercises", ROOT / "autograder")
    grader = subprocess.Popen(
        [sys.executable, "-m", "autograder", "grade", str(submitted), "--assignment", ASSIGNMENT,
         "--out", str(out), "--gradebook", f"sqlite:///{gradebook}", "--no-progress",
         "--timeout", str(TIMEOUT), "--cell-timeout", str(CELL_TIMEOUT),
         "--memory", str(MEMORY_GIB), "--disk", str(DISK_GIB),
         "--processes", str(PROCESS_LIMIT), "--jobs", "2"],
        cwd=ROOT, env=checkout_env(), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = grader.communicate(timeout=1500)
    except subprocess.TimeoutExpired:
        grader.kill()
        grader.communicate()
        raise
    done = subprocess.CompletedProcess(grader.args, grader.returncode, stdout, stderr)
    with (out / "grades.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    reached = []
    while True:
        try:
            connection, peer = listener.accept()
        except BlockingIOError:
            break
        reached.append(peer)
        connection.close()
    listener.close()
    victim_alive = victim.poll() is None
    victim.kill()
    victim.wait()
    return {"done": done, "rows": rows, "out": out, "submitted": submitted,
            "protected": protected, "gradebook": gradebook, "left": kernel_processes(grader.pid),
            "reached": reached, "victim_alive": victim_alive}


def test_no_kernel_reached_the_graders_loopback(graded):
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root here (see guide/threat-model.md)")
    assert graded["reached"] == [], f"connections from kernels: {graded['reached']}"


def test_no_kernel_signalled_a_process_outside_it(graded):
    assert graded["victim_alive"], "a kernel killed a process outside the grader"


def row_of(graded, student: str, notebook: str = NOTEBOOK) -> dict:
    # grades.csv writes an id a spreadsheet would evaluate (=, +, -, @) after an apostrophe
    written = f"'{student}" if student.startswith(("=", "+", "-", "@")) else student
    rows = [r for r in graded["rows"] if r["student_id"] == written and r["notebook"] == notebook]
    assert len(rows) == 1, f"{student}: expected one row, got {rows}"
    return rows[0]


def test_the_run_succeeds_and_every_submission_gets_a_row(graded):
    done = graded["done"]
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    for case in GRADED_CASES:
        row_of(graded, case.student)


def test_the_honest_scores_are_what_they_should_be(graded):
    full, baseline = (float(row_of(graded, s)["score"]) for s in ("good_solution", "baseline"))
    assert 0 < baseline < full, (baseline, full)
    assert float(row_of(graded, "good_solution")["max_score"]) == full


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_each_case_gets_its_score_and_status(graded, case):
    if case not in GRADED_CASES:
        pytest.skip("needs the grader's isolation (root on Linux, writable cgroups)")
    full, baseline = (float(row_of(graded, s)["score"]) for s in ("good_solution", "baseline"))
    row = row_of(graded, case.student)
    statuses = case.status if isinstance(case.status, tuple) else (case.status,)
    if case.expect == "at most baseline":
        fair = float(row["score"]) <= baseline
    else:
        fair = float(row["score"]) == {"full": full, "baseline": baseline}.get(case.expect,
                                                                               case.expect)
    assert row["status"] in statuses and fair, (
        f"{case.name} ({case.threat}): expected {statuses} with {case.expect}; got "
        f"{row['status']} with {row['score']}: {row['message']}")
    assert row["message"].strip(), "every row says why"
    assert case.says in row["message"], row["message"]


def extra_data(graded, student: str) -> dict:
    path = graded["out"] / student / ASSIGNMENT / f"{NOTEBOOK}.results.json"
    return json.loads(path.read_text())["extra_data"]


@pytest.mark.skipif(not ISOLATED, reason="needs the grader's isolation")
def test_the_fork_bomb_stopped_at_the_process_limit(graded):
    peak = extra_data(graded, "native_fork_bomb")["peak_processes"]
    assert PROCESS_LIMIT // 2 < peak <= PROCESS_LIMIT, peak  # it did explode, that far only


@pytest.mark.skipif(not ISOLATED, reason="needs the grader's isolation")
def test_the_disk_fill_stopped_at_the_disk_limit(graded):
    executed = json.loads((graded["out"] / "native_disk_fill" / ASSIGNMENT
                           / f"{NOTEBOOK}.ipynb").read_text())
    printed = "".join("".join(output.get("text", "")) for cell in executed["cells"]
                      for output in cell.get("outputs", []))
    assert "No space left on device" in printed, printed[-2000:]
    stopped_at = int(printed.split("stopped after ")[1].split()[0])
    assert stopped_at <= DISK_GIB * 1024, stopped_at


def test_no_kernel_process_is_left_running(graded):
    assert graded["left"] == [], graded["left"]


def test_no_file_outside_the_output_folder_changed(graded):
    after = fingerprint(graded["submitted"], ROOT / "solutions", ROOT / "exercises",
                        ROOT / "autograder")
    changed = sorted(k for k in set(after) | set(graded["protected"])
                     if after.get(k) != graded["protected"].get(k))
    assert not changed, changed
    assert not SENTINEL.exists()


def test_results_and_gradebook_are_the_graders(graded):
    results = json.loads((graded["out"] / "cheat_write_results" / ASSIGNMENT
                          / f"{NOTEBOOK}.results.json").read_text())
    assert results["extra_data"]["student_id"] == "cheat_write_results"
    import sqlite3
    with sqlite3.connect(graded["gradebook"]) as db:
        students = {row[0] for row in db.execute("select id from student")}
        grades = db.execute("select count(*) from grade").fetchone()[0]
    assert {c.student for c in GRADED_CASES} <= students and grades > 0


def test_every_kernel_stayed_within_its_memory_and_time(graded):
    for case in GRADED_CASES:
        path = graded["out"] / case.student / ASSIGNMENT / f"{NOTEBOOK}.results.json"
        if not path.exists():
            continue
        extra = json.loads(path.read_text())["extra_data"]
        assert extra["peak_memory_mib"] <= MEMORY_GIB * 1024 + MARGIN_MIB, (case.name, extra)
        assert extra["seconds"] <= TIMEOUT + MARGIN_SECONDS, (case.name, extra)


def test_feedback_never_shows_hidden_tests_or_the_solution(graded):
    solution_line = "total += tensor.detach().to(total.device)"
    for case in GRADED_CASES:
        folder = graded["out"] / case.student
        for path in folder.rglob("*") if folder.exists() else []:
            if not path.is_file():
                continue
            text = path.read_text(errors="replace")
            assert "BEGIN HIDDEN TESTS" not in text, path
            if case.allreduce is not None:  # (the solution's authors may see their own code)
                assert solution_line not in text, path
