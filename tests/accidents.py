"""Honest accidents and nbgrader's tampering kinds, on each of the course's real assignments.

nbgrader's own tests define the broken and tampered notebooks its ``autograde`` must
survive (changed grade and locked cells, forged points and checksums, duplicated grade
ids, schema versions too old or too new, a notebook too new for nbformat, infinite
loops). Here each kind is built anew on this course's released notebooks, blank or with the
reference answers typed in, next to the accidents honest learners have: an answer cell
copied with Jupyter's copy and paste, cells dragged out of order, a file without its
format version. ``expect`` says what a fair grader gives each: ``"full"`` (what the solved
notebook gets), ``"blank"`` (what the unedited release gets; tampering may earn no more),
and the ``grades.csv`` status; ``says`` is a phrase its message must hold.

tests/test_autograder_accidents.py grades them; benchmarks/accidents.py grades them with
``nbgrader autograde`` too, side by side.
"""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Callable, Optional, Union

import nbformat

from tests.assignments import answer_cells, grade_cells, nbgrader_meta, release_notebook, submission


@dataclass(frozen=True)
class Accident:
    name: str
    what: str
    solved: bool                        # built on the solved notebook (else the blank release)
    change: Optional[Callable] = None   # nb -> nb (or None: changed in place)
    raw: Optional[Callable] = None      # nb -> the file's bytes, for broken files
    expect: str = "full"                # "full" or "blank"
    status: str = "graded"
    says: str = ""                      # a phrase the grades.csv message must hold


def _copy_answers(solution_in: int):
    """Every answer cell copied with its metadata (as Jupyter's copy and paste does) before
    the learner wrote in it; the work is in copy ``solution_in``, the other keeps the stub."""
    def change(nb):
        for cell in list(answer_cells(nb).values()):
            stub = copy.deepcopy(cell)
            stub.source = stub.metadata["released_stub"]
            if "id" in cell:  # Jupyter gives a pasted cell an id of its own
                stub["id"] = f"{cell['id']}-copy"[:64]
            first, second = (cell, stub) if solution_in == 0 else (stub, cell)
            at = nb.cells.index(cell)
            nb.cells[at:at + 1] = [first, second]
        for cell in answer_cells(nb).values():
            cell.metadata.pop("released_stub", None)
    return change


def _reverse(nb):
    nb.cells.reverse()


def _tests_first(nb):
    tests = {id(c) for c in grade_cells(nb).values()}
    nb.cells = [c for c in nb.cells if id(c) in tests] + [c for c in nb.cells if id(c) not in tests]


def _setup_last(nb):
    setup = [c for c in nb.cells if c.cell_type == "code" and nbgrader_meta(c).get("locked")
             and not nbgrader_meta(c).get("grade") and not nbgrader_meta(c).get("solution")]
    nb.cells = [c for c in nb.cells if c not in setup] + setup


def _schema(version: int):
    def change(nb):
        for cell in nb.cells:
            if "nbgrader" in cell.metadata:
                cell.metadata["nbgrader"]["schema_version"] = version
    return change


def _forge_points(nb):
    for cell in grade_cells(nb).values():
        cell.metadata["nbgrader"]["points"] = 100
        cell.metadata["nbgrader"]["checksum"] = "0" * 32


def _edit_tests(nb):
    for cell in grade_cells(nb).values():
        cell.source = "pass  # changed by the learner"


def _edit_locked(nb):
    for cell in nb.cells:
        meta = nbgrader_meta(cell)
        if meta.get("locked") and not meta.get("grade") and cell.cell_type == "code":
            cell.source = "def sizes(shards):\n    return []\nTEST_SEED = 0"


def _duplicate_test_ids(nb):
    for cell in list(grade_cells(nb).values()):
        twin = copy.deepcopy(cell)
        twin.source = "pass  # a copy that passes"
        nb.cells.insert(nb.cells.index(cell) + 1, twin)


def _answers_as_tests(nb):
    """The cheat nbgrader's fixtures try: an answer cell re-tagged as a graded test."""
    for cell in answer_cells(nb).values():
        cell.metadata["nbgrader"].update(grade=True, solution=False, points=100)


def _without(key: str):
    def raw(nb):
        data = json.loads(nbformat.writes(nb))
        data.pop(key)
        return json.dumps(data).encode()
    return raw


def _version(major: int):
    def raw(nb):
        return json.dumps({**json.loads(nbformat.writes(nb)), "nbformat": major}).encode()
    return raw


def _old_format(nb):
    cells = [nbformat.v3.new_code_cell(input=c.source, metadata=dict(c.metadata))
             if c.cell_type == "code" else nbformat.v3.new_text_cell("markdown", source=c.source)
             for c in nb.cells]
    return nbformat.writes(nbformat.v3.new_notebook(
        worksheets=[nbformat.v3.new_worksheet(cells=cells)]), version=3).encode()


def _long_extra_cell(nb):
    nb.cells.append(nbformat.v4.new_code_cell("import time\ntime.sleep(10**6)  # forgot a break"))


ACCIDENTS = [
    Accident("solved", "the reference answers typed in", True, says="points"),
    Accident("blank", "the release, unanswered", False, expect="blank"),
    # --- honest accidents: full marks, and the message says what was done -----------------
    Accident("copied_answer_solved_first", "every answer cell copied; the work in the first copy",
             True, _copy_answers(0), says="graded copy 1 of 2"),
    Accident("copied_answer_solved_second", "every answer cell copied; the work in the second",
             True, _copy_answers(1), says="graded copy 2 of 2"),
    Accident("cells_reversed", "every cell in reverse order", True, _reverse,
             says="order was restored"),
    Accident("tests_above_answers", "the test cells dragged above everything", True, _tests_first,
             says="order was restored"),
    Accident("setup_at_the_end", "the setup cell moved to the end", True, _setup_last,
             says="order was restored"),
    Accident("schema_too_old", "nbgrader metadata of schema version 1", True, _schema(1)),
    Accident("schema_too_new", "nbgrader metadata of a future schema version", True, _schema(99)),
    Accident("no_nbformat_key", "a file without its nbformat key", True,
             raw=_without("nbformat"), says="no format version"),
    Accident("no_nbformat_minor", "a file without its nbformat_minor key", True,
             raw=_without("nbformat_minor")),
    Accident("long_extra_cell", "a cell of the learner's own that never ends", True,
             _long_extra_cell, says="no points depended on them"),
    # --- tampering: never more than the blank release -------------------------------------
    Accident("forged_points", "test cells claim 100 points, checksums forged", False,
             _forge_points, expect="blank"),
    Accident("edited_tests", "test cells edited to pass", False, _edit_tests, expect="blank",
             says="was edited"),
    Accident("edited_locked", "the locked setup cell rewritten", False, _edit_locked,
             expect="blank"),
    Accident("duplicated_test_ids", "each test cell followed by a passing copy with its id",
             False, _duplicate_test_ids, expect="blank", says="dropped a duplicate"),
    Accident("answers_as_tests", "answer cells re-tagged as graded tests worth 100", False,
             _answers_as_tests, expect="blank"),
    # --- broken files: a row, and a sentence that says what is wrong -----------------------
    Accident("not_json", "not JSON at all", True, raw=lambda nb: b"\x89PNG\r\n\x1a\n...",
             expect="blank", status="invalid", says="not a Jupyter notebook"),
    Accident("empty_file", "an empty file", True, raw=lambda nb: b"", expect="blank",
             status="invalid", says="it is empty"),
    Accident("json_not_notebook", "JSON, but no cells", True,
             raw=lambda nb: json.dumps({"answer": 42}).encode(), expect="blank",
             status="invalid", says="JSON but not a Jupyter notebook"),
    Accident("nbformat_too_new", "a notebook of a future format version", True,
             raw=_version(5), expect="blank", status="invalid", says="newer than the version 4"),
    Accident("nbformat_3", "a notebook saved in the old format 3", True, raw=_old_format,
             says="old format version 3"),
]


def build(accident: Accident, assignment: str) -> Union[bytes, nbformat.NotebookNode]:
    """The file an accident hands in, for ``assignment``."""
    nb = submission(assignment, {}) if accident.solved else copy.deepcopy(
        release_notebook(assignment))
    stubs = answer_cells(release_notebook(assignment))
    for grade_id, cell in answer_cells(nb).items():
        cell.metadata["released_stub"] = stubs[grade_id].source  # for the change, then gone
    if accident.change is not None:
        nb = accident.change(nb) or nb
    for cell in nb.cells:
        cell.metadata.pop("released_stub", None)
    if accident.raw is not None:
        return accident.raw(nb)
    return nb


def write(accident: Accident, assignment: str, path) -> None:
    made = build(accident, assignment)
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(made, bytes):
        path.write_bytes(made)
    else:
        nbformat.write(made, str(path))
