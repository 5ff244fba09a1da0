"""What the grader forgives or refuses behaves the same through the submission service (issue 28).

Every accident of ``coursebook/accidents.py`` (habits of real learners, tampering, broken files) is
handed in to ``python -m autograder serve`` by its own learner, as ``python -m autograder
submit`` hands in, and its feedback is compared with the row ``python -m autograder grade``
gives the same file (the ``accident_rows`` fixture, shared with
``tests/test_autograder_accidents.py``): the same status, points and message; a file ``grade``
calls invalid may instead be refused at the upload, with its reason.

What differs by design is the file's name. ``grade`` finds a notebook in a learner's folder by
its name and says so when it forgives a renamed download; on the service the learner chooses
the assignment and uploads one file, which is graded as that assignment's notebook whatever it
is called. So the accidents about names are held to their content: the reference answers under
another name get full marks, another assignment's notebook no more than the blank release.
"""
from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest

from autograder.commands.submit import SubmitError, upload, wait
from coursebook.accidents import ACCIDENTS, CELL_TIMEOUT, write
from coursebook.cases import ASSIGNMENTS, SOLUTIONS
from coursebook.service_process import ROOT, ServiceProcess, issue_tokens

pytestmark = pytest.mark.integration

# The assignment whose instructor's notebook is smallest: the quickest to grade
ASSIGNMENT = min(ASSIGNMENTS, key=lambda a: (SOLUTIONS / a / f"{ASSIGNMENTS[a]}.ipynb")
                 .stat().st_size)
NOTEBOOK = ASSIGNMENTS[ASSIGNMENT]
INSTRUCTOR = "instructor"


def about_the_name(accident) -> bool:
    return accident.files != ("{}.ipynb",) or accident.other


@pytest.fixture(scope="module")
def handed_in(tmp_path_factory):
    """Each accident's first file uploaded by its learner: name -> feedback, or the refusal."""
    base = tmp_path_factory.mktemp("service-accidents")
    course = base / "course"
    (course / "solutions").mkdir(parents=True)
    shutil.copy(ROOT / "nbgrader_config.py", course)
    shutil.copytree(SOLUTIONS / ASSIGNMENT, course / "solutions" / ASSIGNMENT)
    (course / "roster.toml").write_text(
        f'instructors = ["{INSTRUCTOR}"]\n'
        f"learners = [{', '.join(repr(a.name) for a in ACCIDENTS)}]\n")
    files = {}
    for accident in ACCIDENTS:
        folder = base / "files" / accident.name
        write(accident, ASSIGNMENT, folder / f"{NOTEBOOK}.ipynb")
        files[accident.name] = folder / accident.files[0].format(NOTEBOOK)
    people = issue_tokens(course)
    server = ServiceProcess(course, "--device", "cpu", "--cell-timeout", CELL_TIMEOUT,
                            "--no-gradebook", jobs=2)

    def hand_in(name: str):
        try:
            sent = upload(files[name], server.url, people[name], ASSIGNMENT)
        except SubmitError as refusal:
            return refusal
        return wait(server.url, people[name], sent["id"], timeout=600)

    try:
        with ThreadPoolExecutor(max_workers=8) as pool:
            found = dict(zip(files, pool.map(hand_in, files)))
    finally:
        server.stop()
    return found


@pytest.mark.parametrize("accident", ACCIDENTS, ids=[a.name for a in ACCIDENTS])
def test_the_service_grades_an_accident_as_grade_does(handed_in, accident_rows, accident):
    rows = accident_rows(ASSIGNMENT)
    row, got = rows[accident.name], handed_in[accident.name]
    if isinstance(got, SubmitError):  # refused at the upload: only what grade calls invalid
        assert row["status"] == "invalid", (row, got)
        assert str(got).startswith(("400:", "413:", "415:")), got
        return
    points = (float(got["score"]), float(got["max_score"]))
    if about_the_name(accident):
        solved = rows["solved"]
        if accident.other:
            assert float(got["score"]) <= float(rows["blank"]["score"]), got["message"]
        else:
            assert points == (float(solved["score"]), float(solved["max_score"])), got["message"]
        return
    assert got["status"] == row["status"], (got["message"], row["message"])
    assert points == (float(row["score"]), float(row["max_score"])), (got["message"], row)
    assert got["message"] == row["message"]


def test_refusals_are_the_files_that_are_not_notebooks(handed_in):
    refused = sorted(name for name, got in handed_in.items() if isinstance(got, SubmitError))
    assert refused == sorted(a.name for a in ACCIDENTS
                             if a.raw is not None and a.status == "invalid"), refused
