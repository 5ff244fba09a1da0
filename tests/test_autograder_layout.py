"""autograder.layout: finding submissions and reading the instructor's notebooks."""
from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from autograder.layout import (MAX_NOTEBOOK_BYTES, Course, SourceNotebook, find_submissions,
                              mebibytes, read_submission)
from tests.autograder_fixtures.submissions import COURSE, RELEASE, SOURCE, released, write


def test_course_reads_nbgrader_config():
    course = Course.discover(COURSE)
    assert course.source_directory == "solutions"
    assert course.course_id == "autograder-fixture"
    assert set(course.source_notebooks("demo")) == {"demo"}


def test_course_without_config_uses_solutions(tmp_path):
    (tmp_path / "solutions" / "a1").mkdir(parents=True)
    nbformat.write(nbformat.v4.new_notebook(), str(tmp_path / "solutions" / "a1" / "n.ipynb"))
    course = Course.discover(tmp_path)
    assert course.source_path == tmp_path.resolve() / "solutions"
    assert list(course.source_notebooks("a1")) == ["n"]
    with pytest.raises(FileNotFoundError, match="no assignment"):
        course.source_notebooks("missing")


def test_find_submissions_layout(tmp_path):
    write(tmp_path, "bob", released())
    write(tmp_path, "alice", released())
    write(tmp_path, "alice", released(), notebook="extra")
    (tmp_path / "carol" / "other_assignment").mkdir(parents=True)
    (tmp_path / "dave" / "demo").mkdir(parents=True)            # submitted nothing
    (tmp_path / ".ipynb_checkpoints" / "demo").mkdir(parents=True)
    found = find_submissions(tmp_path, "demo", notebooks=["demo"])
    assert [(s.student_id, s.notebook) for s in found] == [
        ("alice", "demo"), ("alice", "extra"), ("bob", "demo"), ("dave", "demo")]
    assert not found[-1].path.exists()
    assert found[0].path == tmp_path / "alice" / "demo" / "demo.ipynb"


def test_submissions_found_from_a_relative_path_can_be_read_from_any_folder(tmp_path,
                                                                            monkeypatch):
    """A Dask worker reads the file from another working directory: the folder the
    submission must lie in (``root``) is absolute, so it still holds the file there."""
    from autograder.layout import submitted_bytes
    write(tmp_path / "submitted", "bob", released())
    monkeypatch.chdir(tmp_path)
    [found] = find_submissions(Path("submitted"), "demo")
    assert found.root == tmp_path / "submitted"
    monkeypatch.chdir("/")
    assert submitted_bytes(tmp_path / found.path, found.root)


def test_find_submissions_needs_a_folder(tmp_path):
    with pytest.raises(FileNotFoundError):
        find_submissions(tmp_path / "nope", "demo")


def test_timestamp_is_read_when_present(tmp_path):
    write(tmp_path, "bob", released())
    (tmp_path / "bob" / "demo" / "timestamp.txt").write_text("2026-03-01 12:00:00.000000 UTC")
    submission = find_submissions(tmp_path, "demo")[0]
    assert submission.timestamp().year == 2026


def test_graded_view_holds_stubs_checksums_and_hidden_tests():
    view = SourceNotebook.read(SOURCE, "demo").graded_view
    release = nbformat.read(str(RELEASE), as_version=4)
    text = "\n".join(cell.source for cell in view.cells)
    assert "BEGIN SOLUTION" not in text and "range(n)]" not in text
    assert "BEGIN HIDDEN TESTS" in text
    by_id = {c.metadata["nbgrader"]["grade_id"]: c for c in view.cells if "nbgrader" in c.metadata}
    for cell in release.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution"):  # the stub a learner starts from, checksum and all
            assert by_id[meta["grade_id"]].source == cell.source
            assert by_id[meta["grade_id"]].metadata["nbgrader"]["checksum"] == meta["checksum"]


def test_support_files_exclude_notebooks(tmp_path):
    folder = tmp_path / "solutions" / "a1"
    (folder / "data").mkdir(parents=True)
    (folder / ".ipynb_checkpoints").mkdir()
    nbformat.write(nbformat.v4.new_notebook(), str(folder / "n.ipynb"))
    (folder / "helper.py").write_text("X = 1\n")
    (folder / "data" / "table.csv").write_text("a,b\n")
    (folder / ".ipynb_checkpoints" / "n-checkpoint.ipynb").write_text("{}")
    source = Course.discover(tmp_path).source_notebooks("a1")["n"]
    assert [p.relative_to(folder).as_posix() for p in source.support_files()] == [
        "data/table.csv", "helper.py"]


def test_read_submission_explains_what_is_wrong(tmp_path):
    with pytest.raises(ValueError, match="not submitted"):
        read_submission(tmp_path / "missing.ipynb")
    bad = tmp_path / "bad.ipynb"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="is not a Jupyter notebook"):
        read_submission(bad)
    assert read_submission(RELEASE).cells


# --- a notebook handed in under another name -------------------------------------------------

def _refs():
    return {"demo": SourceNotebook.read(SOURCE, "demo").graded_view}


def _other_assignment():
    """A notebook of another assignment: its cells carry other grade ids."""
    nb = released()
    for cell in nb.cells:
        if "nbgrader" in cell.metadata:
            cell.metadata["nbgrader"]["grade_id"] = "other_" + cell.metadata["nbgrader"]["grade_id"]
    return nb


@pytest.mark.parametrize("name", ["demo (1)", "demo(2)", "demo-Copy1", "Copy of demo",
                                  "demo - Copy", "demo 2", "Demo (1)"])
def test_a_notebook_renamed_by_a_tool_is_graded_as_the_expected_one(tmp_path, name):
    write(tmp_path, "bob", released(), notebook=name)
    [found] = find_submissions(tmp_path, "demo", notebooks=["demo"], references=_refs())
    assert (found.notebook, found.path.name) == ("demo", f"{name}.ipynb")
    assert f"graded '{name}.ipynb' as demo.ipynb" in found.note


def test_without_references_a_renamed_notebook_is_its_own_row(tmp_path):
    write(tmp_path, "bob", released(), notebook="demo (1)")
    found = find_submissions(tmp_path, "demo", notebooks=["demo"])
    assert [(s.notebook, s.note) for s in found] == [("demo", ""), ("demo (1)", "")]


def test_the_expected_notebook_wins_over_a_renamed_copy(tmp_path):
    write(tmp_path, "bob", released())
    write(tmp_path, "bob", released(), notebook="demo (1)")
    found = find_submissions(tmp_path, "demo", notebooks=["demo"], references=_refs())
    assert [(s.notebook, s.path.name, s.note) for s in found] == [
        ("demo", "demo.ipynb", ""), ("demo (1)", "demo (1).ipynb", "")]


def test_several_candidates_are_named_and_none_is_graded(tmp_path):
    write(tmp_path, "bob", released(), notebook="demo (1)")
    write(tmp_path, "bob", released(), notebook="demo (2)")
    found = {s.notebook: s for s in find_submissions(tmp_path, "demo", notebooks=["demo"],
                                                     references=_refs())}
    assert sorted(found) == ["demo", "demo (1)", "demo (2)"]
    assert not found["demo"].path.exists()
    assert ("2 notebooks in the folder could be it ('demo (1).ipynb' and 'demo (2).ipynb'), "
            "so none was graded") in found["demo"].note


def test_another_name_with_the_cells_is_pointed_out_not_graded(tmp_path):
    write(tmp_path, "bob", released(), notebook="my homework")
    found = {s.notebook: s for s in find_submissions(tmp_path, "demo", notebooks=["demo"],
                                                     references=_refs())}
    assert not found["demo"].path.exists()
    assert "rename it to demo.ipynb" in found["demo"].note


@pytest.mark.parametrize("content", ["other assignment", "not a notebook", "no metadata"])
def test_a_renamed_file_without_the_assignments_cells_stands_for_nothing(tmp_path, content):
    nb = released()
    if content == "no metadata":
        for cell in nb.cells:
            cell.metadata = {}
    write(tmp_path, "bob", {"other assignment": _other_assignment(), "not a notebook": "{oops",
                            "no metadata": nb}[content], notebook="demo (1)")
    found = {s.notebook: s for s in find_submissions(tmp_path, "demo", notebooks=["demo"],
                                                     references=_refs())}
    assert sorted(found) == ["demo", "demo (1)"]
    assert not found["demo"].path.exists() and found["demo"].note == ""


@pytest.mark.parametrize("size, shown", [
    (20 * 2**20 + 1, "20.1"),             # over the limit: never reads as the limit
    (20 * 2**20 + 2**20 // 20, "20.1"),
    (int(20.4 * 2**20), "20.4"),
    (int(20.40 * 2**20) + 1, "20.4"),     # 20.40 MiB and a byte: the nearest tenth, not 20.5
    (int(20.45 * 2**20) + 1, "20.5"),
    (25 * 2**20, "25.0"),
])
def test_a_size_refusal_gives_the_size_with_one_decimal_never_the_limit(tmp_path, size, shown):
    from autograder.layout import submitted_bytes
    big = tmp_path / "big.ipynb"
    with big.open("wb") as handle:
        handle.truncate(size)  # sparse: no disk used
    with pytest.raises(ValueError) as refused:
        submitted_bytes(big)
    says = f"the notebook is {shown} MiB; the limit is 20 MiB"
    assert says in str(refused.value), refused.value
    assert mebibytes(size, MAX_NOTEBOOK_BYTES) == shown  # the service's refusal says it too


def test_counts_have_their_nouns_in_the_right_number():
    from autograder.layout import notebook_from_bytes, plural
    assert [plural(n, "cell") for n in (0, 1, 2)] == ["0 cells", "1 cell", "2 cells"]
    one = b'{"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [1]}'
    two = b'{"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [1, "x"]}'
    assert notebook_from_bytes(one)[1] == ["1 damaged cell of the file was left out"]
    assert notebook_from_bytes(two)[1] == ["2 damaged cells of the file were left out"]
