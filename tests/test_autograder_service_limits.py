"""The submission service keeps grading whatever its clients do (limits, faults).

Each test attacks the real server (:class:`coursebook.service_process.ServiceProcess`) on
127.0.0.1 as a stranger or a learner would, with the limits lowered so that a few requests
reach them: half-sent connections past the open files, headers and bodies that never end,
a stranger's big body, 85 MiB from a learner, JSON nested 900 deep, a notebook of too many
cells, a big notebook parsed while others load pages, one learner's many uploads, a
learner's stored files, old attempts' files, a regrade. The fault test makes the
database's disk read-only and then full while uploads are being graded: every
acknowledged upload is still graded exactly once. Linux, as root (it mounts a tmpfs).
"""
from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import resource
import shutil
import socket
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

import nbformat
import pytest

from autograder.commands.submit import SubmitError, multipart, upload as submit_upload
from tests.autograder_fixtures.submissions import COURSE, GOOD_MEAN, answered
from coursebook.service_process import ServiceProcess, issue_tokens
from tests.test_autograder_service import (OFF_BY_ONE, ROSTER, feedback, graded, request, until,
                                           upload)

pytestmark = pytest.mark.integration

SLEEPY = answered(mean="import time\ntime.sleep(2)\n" + GOOD_MEAN)  # graded in 2 s more
HEADER_TIMEOUT, BODY_TIMEOUT = 2, 3
STORAGE_MIB = 8


def course_copy(tmp_path_factory, name: str, rules: str = "") -> Path:
    """The fixture course, with ``quota``, a copy of its assignment."""
    course = tmp_path_factory.mktemp(name) / "course"
    shutil.copytree(COURSE, course)
    shutil.copytree(course / "solutions" / "demo", course / "solutions" / "quota")
    (course / "roster.toml").write_text(ROSTER)
    (course / "service.toml").write_text("attempts_per_hour = 50\n" + rules)
    return course


def serve(course: Path, *extra, jobs: int = 1) -> ServiceProcess:
    return ServiceProcess(course, "--device", "cpu", "--cell-timeout", "30", *extra, jobs=jobs,
                          start_timeout=120)


@pytest.fixture(scope="module")
def limited(tmp_path_factory):
    """Two graders, limits lowered: 2 s for headers, 3 s for a body, 50 cells, one upload
    of a learner graded at once, 8 MiB of files each; the best attempt counts, only the
    last attempt's files are kept besides it."""
    course = course_copy(tmp_path_factory, "limited", 'counts = "best"\nkeep_files = 1\n'
                         '[assignments.quota]\nattempts_per_hour = 1\n')
    people = issue_tokens(course)
    server = serve(course, "--header-timeout", HEADER_TIMEOUT, "--body-timeout", BODY_TIMEOUT,
                   "--max-cells", 50, "--learner-jobs", 1, "--learner-storage", STORAGE_MIB,
                   jobs=2)
    yield server, people
    server.stop()


def closed_after(sock: socket.socket, within: float) -> float:
    """Seconds until the server closes ``sock`` (it sends nothing); fails after ``within``."""
    sock.settimeout(within)
    start = time.monotonic()
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    except socket.timeout:
        pytest.fail(f"the connection was still open after {within} s")
    return time.monotonic() - start


def rows(db: Path) -> list:
    with contextlib.closing(sqlite3.connect(db)) as connection:
        return connection.execute("SELECT id, student, attempt, state, gradings, status, path, "
                                  "executed FROM submissions ORDER BY id").fetchall()


def upload_file(server, token, raw: bytes):
    body, kind = multipart({"assignment": "demo"}, "notebook", "demo.ipynb", raw)
    return request(f"{server.url}/submit", token, body, {"Content-Type": kind})


# ------------------------------------------------------------- connections and bodies

def test_half_sent_connections_past_the_open_files_leave_learners_graded(tmp_path_factory):
    # 256 open files for the server (as 1,024 would be, with 1,100 connections); 300
    # connections that send half a request and wait: alan's upload is still taken and graded.
    course = course_copy(tmp_path_factory, "descriptors")
    people = issue_tokens(course)
    server = serve(course, "--header-timeout", 60)
    held = []
    try:
        resource.prlimit(server.process.pid, resource.RLIMIT_NOFILE, (256, 256))
        for _ in range(300):
            sock = socket.socket()
            sock.settimeout(2)
            try:
                sock.connect(("127.0.0.1", int(server.url.rsplit(":", 1)[1])))
                sock.sendall(b"POST /submit HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            except OSError:
                pass
            held.append(sock)
        started = time.monotonic()
        status, answer = upload(server, people["alan"], answered())
        assert status == 201, answer
        assert graded(server, people["alan"], json.loads(answer)["id"], timeout=60)["score"] == 8
        assert time.monotonic() - started < 60
        assert server.process.poll() is None
        assert "Too many open files" not in server.errors()
        status, health = request(f"{server.url}/health")
        assert status == 200 and json.loads(health)["graders_alive"], health
    finally:
        for sock in held:
            sock.close()
        server.stop()


def test_headers_and_bodies_that_never_end_are_cut_off(limited):
    server, people = limited
    port = int(server.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # and never the rest
        assert closed_after(sock, within=HEADER_TIMEOUT + 5) >= HEADER_TIMEOUT - 0.5
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(f"POST /submit HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
                     f"{people['alan']}\r\nContent-Type: multipart/form-data; boundary=x\r\n"
                     "Content-Length: 100000\r\n\r\n--x\r\n".encode())  # and no more
        assert closed_after(sock, within=BODY_TIMEOUT + 5) >= BODY_TIMEOUT - 0.5


@pytest.mark.parametrize("signed", [b"", b"Authorization: Bearer not-a-token\r\n"])
def test_a_strangers_big_body_is_refused_before_it_is_read(limited, signed):
    # The refusal comes before a byte of the 10 MiB body is sent, and the connection is
    # closed: what the stranger then sends goes nowhere (Tornado read it all, then said 400)
    server, _ = limited
    with socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1]))) as sock:
        sock.sendall(b"POST /submit HTTP/1.1\r\nHost: 127.0.0.1\r\n%sContent-Type: multipart/"
                     b"form-data; boundary=x\r\nContent-Length: %d\r\n\r\n"
                     % (signed, 10 * 2**20))
        sock.settimeout(5)
        try:
            answer = sock.recv(4096)
        except socket.timeout:
            pytest.fail("no answer before the body was sent")
        assert answer.split(b" ")[1] == (b"401" if signed else b"403"), answer[:200]
        with pytest.raises(OSError):  # closed: the body cannot be sent
            for _ in range(320):
                sock.sendall(b"x" * 65536)
                time.sleep(0.001)


def test_an_upload_of_any_size_over_the_limit_is_refused_with_why(limited, tmp_path):
    server, people = limited
    big = tmp_path / "demo.ipynb"
    big.write_bytes(b"{" + b" " * (85 * 2**20 - 4096))  # 85 MiB with the form
    with pytest.raises(SubmitError) as refused:  # `submit`: the answer before the body
        submit_upload(big, server.url, people["grace"], "demo")
    assert str(refused.value).startswith("413: the notebook is 85.0 MiB; the limit is 20 MiB"), \
        refused.value
    body = b"--x\r\nContent-Disposition: form-data; name=\"notebook\"; filename=\"demo.ipynb\"" \
           b"\r\n\r\n" + big.read_bytes() + b"\r\n--x--\r\n"
    status, answer = request(f"{server.url}/submit", people["grace"], body,  # no Expect:
                             {"Content-Type": "multipart/form-data; boundary=x"})  # drained
    assert status == 413 and "the limit is 20 MiB" in json.loads(answer)["error"], answer


def test_the_hours_limit_is_told_before_the_body_is_sent(limited):
    server, people = limited
    status, answer = upload(server, people["grace"], answered(), assignment="quota")
    assert status == 201, answer
    with socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1]))) as sock:
        sock.sendall(f"POST /submit?assignment=quota HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     f"Authorization: Bearer {people['grace']}\r\nAccept: application/json\r\n"
                     "Content-Type: multipart/form-data; boundary=x\r\nContent-Length: "
                     f"{2**20}\r\nExpect: 100-continue\r\n\r\n".encode())
        sock.settimeout(5)
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 429 ") and b"the limit is 1 an hour" in answer, answer


@pytest.mark.parametrize("depth", [900, 100_000])
def test_json_nested_deep_is_refused_with_a_4xx(limited, depth):
    server, people = limited
    nested = "[" * depth + "]" * depth
    raw = '{"cells": [], "metadata": {"x": %s}, "nbformat": 4, "nbformat_minor": 5}' % nested
    status, answer = upload_file(server, people["grace"], raw.encode())
    assert status == 415 and "nested more than" in json.loads(answer)["error"], (status, answer)


def tiny_cells(count: int) -> bytes:
    """A notebook of ``count`` more code cells of one character each, as a file."""
    nb = json.loads(nbformat.writes(answered()))
    nb["cells"] += [{"cell_type": "code", "metadata": {}, "source": "1", "outputs": [],
                     "execution_count": None}] * count
    return json.dumps(nb).encode()


def test_a_notebook_of_too_many_cells_is_refused_at_the_upload(limited):
    server, people = limited
    status, answer = upload_file(server, people["grace"], tiny_cells(60))
    assert status == 413, answer
    assert "cells; the limit is 50" in json.loads(answer)["error"], answer


def test_pages_answer_while_a_big_notebook_is_read(limited):
    # 60,000 tiny cells (6 MiB): reading them took seconds on the event loop
    server, people = limited
    answers = []
    raw = tiny_cells(60_000)
    sender = threading.Thread(target=lambda: answers.append(
        upload_file(server, people["linus"], raw)))
    sender.start()
    slowest = 0.0
    while sender.is_alive():
        asked = time.monotonic()
        status, _ = request(f"{server.url}/", people["mary"])
        assert status == 200
        slowest = max(slowest, time.monotonic() - asked)
        time.sleep(0.05)
    sender.join()
    assert answers[0][0] == 413, answers
    assert slowest < 1.0, f"a page took {slowest:.2f} s while a notebook was read"


def test_health_says_how_the_graders_are_and_names_no_one(limited):
    server, people = limited
    status, answer = request(f"{server.url}/health")
    data = json.loads(answer)
    assert status == 200 and data["status"] == "ok" and data["graders_alive"], data
    assert {"queued", "grading", "oldest_queued_seconds", "graders"} <= set(data), data
    assert not any(person in answer.decode() for person in people)


# ------------------------------------------------------------------ per learner

def test_one_learner_has_one_upload_graded_at_a_time(limited):
    server, people = limited
    db = server.course / "service.db"
    ids = [json.loads(upload(server, people["alan"], SLEEPY)[1])["id"] for _ in range(3)]
    ids.append(json.loads(upload(server, people["grace"], SLEEPY)[1])["id"])
    most = 0
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        states = [(student, state) for _, student, _, state, *_ in rows(db)]
        most = max(most, sum(s == ("alan", "grading") for s in states))
        if all(state == "done" for _, state in states):
            break
        time.sleep(0.05)
    assert most == 1, f"{most} of alan's uploads were graded at once"
    grace = feedback(server, people["grace"], ids[-1])
    alan_last = feedback(server, people["alan"], ids[2])
    assert grace["state"] == alan_last["state"] == "done"
    with contextlib.closing(sqlite3.connect(db)) as connection:
        first = dict(connection.execute("SELECT student || attempt, started FROM submissions "
                                        "WHERE assignment = 'demo'").fetchall())
    assert first["grace1"] < first["alan3"], "grace waited for all of alan's uploads"


def test_a_learners_stored_files_are_bounded(limited):
    server, people = limited
    padded = answered()
    padded.cells.append(nbformat.v4.new_markdown_cell("x" * (STORAGE_MIB * 2**20 // 2)))
    status, answer = upload(server, people["mary"], padded)
    assert status == 201, answer
    graded(server, people["mary"], json.loads(answer)["id"])
    status, answer = upload(server, people["mary"], padded)  # the upload and its executed copy
    assert status == 507, answer
    assert f"{STORAGE_MIB:.1f} MiB each learner may keep" in json.loads(answer)["error"], answer


def test_old_attempts_files_go_the_counted_one_stays_and_regrade_shows_it(limited):
    server, people = limited
    db = server.course / "service.db"
    for nb in (answered(), answered(squares=OFF_BY_ONE), answered(squares=OFF_BY_ONE)):
        status, answer = upload(server, people["linus"], nb)
        assert status == 201, answer
        graded(server, people["linus"], json.loads(answer)["id"])
    files = {attempt: (path, executed) for _, student, attempt, _, _, _, path, executed
             in rows(db) if student == "linus"}
    until(lambda: not Path(files[2][0]).exists(), 30, "attempt 2's files to go")
    assert not Path(files[2][1]).exists()
    for kept in (1, 3):  # the best (it counts) and the last
        assert Path(files[kept][0]).is_file() and Path(files[kept][1]).is_file()

    def linus_in_csv():
        status, answer = request(f"{server.url}/instructor/grades.csv", people["ada"])
        assert status == 200
        return [r for r in csv.DictReader(io.StringIO(answer.decode()))
                if "linus" in json.dumps(r)]
    assert [float(r["score"]) for r in linus_in_csv()] == [8.0]
    status, answer = request(f"{server.url}/instructor/regrade", people["ada"], b"",
                             method="POST")
    assert status == 200 and json.loads(answer)["queued"] >= 1, answer
    assert [float(r["score"]) for r in linus_in_csv()] == [8.0]  # while it is regraded
    until(lambda: all(r[3] == "done" for r in rows(db)), 120, "the regrade")
    assert [float(r["score"]) for r in linus_in_csv()] == [8.0]
    second = [r for r in rows(db) if r[1] == "linus" and r[2] == 2][0]
    assert second[5] == "graded"  # its row and score stay


# ------------------------------------------------------------------------ faults

def remount(folder: Path, how: str) -> None:
    for _ in range(50):  # busy while a file there is open for writing
        if subprocess.run(["mount", "-o", f"remount,{how}", str(folder)],
                          capture_output=True).returncode == 0:
            return
        time.sleep(0.1)
    raise AssertionError(f"could not remount {folder} {how}")


def fill(folder: Path) -> Path:
    filler = folder / "filler"
    with open(filler, "wb") as handle, contextlib.suppress(OSError):
        while True:
            handle.write(b"\0" * 2**20)
            handle.flush()
    return filler


def test_the_database_unavailable_and_the_disk_full_lose_no_upload(tmp_path_factory):
    course = course_copy(tmp_path_factory, "faults")
    state = course.parent / "state"
    state.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(state)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    server = None
    try:
        people = issue_tokens(course)
        shutil.copy(course / "service.db", state / "service.db")  # the tokens, on the tmpfs
        server = serve(course, "--db", state / "service.db")
        db = state / "service.db"
        acknowledged = {}

        def hand_in(who, nb=SLEEPY):
            status, answer = upload(server, people[who], nb)
            if status == 201:
                acknowledged[json.loads(answer)["id"]] = who
            return status

        # The database's disk read-only while alan's upload is graded and grace's waits
        assert hand_in("alan") == 201 and hand_in("grace") == 201
        until(lambda: any(r[3] == "grading" for r in rows(db)), 30, "a grading")
        remount(state, "ro")
        assert hand_in("linus") in (503, 507)  # not acknowledged, and not a 500
        time.sleep(6)  # alan's grading ends meanwhile: its result cannot be committed
        remount(state, "rw")
        until(lambda: all(r[3] == "done" for r in rows(db)), 60, "the uploads to be graded")
        # The disk full while mary's upload is graded
        assert hand_in("mary") == 201
        until(lambda: any(r[3] == "grading" for r in rows(db)), 30, "mary's grading")
        filler = fill(state)
        assert hand_in("linus", answered()) in (503, 507)
        time.sleep(4)
        filler.unlink()
        until(lambda: all(r[3] == "done" for r in rows(db)), 90, "mary's upload to be graded")
        stored = {r[0]: r for r in rows(db)}
        assert len(stored) == len(acknowledged) == 3, (stored, acknowledged)
        assert all(r[4] == 1 and r[5] == "graded" for r in stored.values()), stored
        for key, who in acknowledged.items():
            assert feedback(server, people[who], key)["score"] == 8
        status, answer = request(f"{server.url}/health")
        assert status == 200 and json.loads(answer)["graders_alive"], answer
    finally:
        if server is not None:
            server.stop()
        subprocess.run(["umount", "-l", str(state)], capture_output=True)


# ------------------------------------------------------------------ the settings

def test_keep_files_and_the_limits_are_checked(tmp_path_factory):
    from autograder.layout import TooManyCells, notebook_from_bytes
    from autograder.options import MAX_CELLS, ServiceLimits
    from autograder.service.config import ConfigError, read_rules
    course = course_copy(tmp_path_factory, "settings", "keep_files = 2\n"
                         "[assignments.quota]\nkeep_files = 1\n")
    default, rules = read_rules(course, ["demo", "quota"])
    assert (default.keep_files, rules["demo"].keep_files, rules["quota"].keep_files) == (2, 2, 1)
    for wrong in ("0", "true", '"all"'):
        (course / "service.toml").write_text(f"keep_files = {wrong}\n")
        with pytest.raises(ConfigError, match="keep_files must be a whole number of 1 or more"):
            read_rules(course, ["demo", "quota"])
    with pytest.raises(ValueError, match=f"max_cells can be at most {MAX_CELLS}"):
        ServiceLimits(max_cells=MAX_CELLS + 1)
    with pytest.raises(ValueError, match="header_timeout must be positive"):
        ServiceLimits(header_timeout=0)
    with pytest.raises(TooManyCells, match="has 14 cells; the limit is 5"):
        notebook_from_bytes(tiny_cells(0), max_cells=5)
