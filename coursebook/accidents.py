"""Honest accidents and nbgrader's tampering kinds, built on any of the course's real assignments.

nbgrader's own tests define the broken and tampered notebooks its ``autograde`` must
survive (changed grade and locked cells, forged points and checksums, duplicated grade
ids, schema versions too old or too new, a notebook too new for nbformat, infinite
loops). Here each kind is built anew on this course's released notebooks, blank or with the
reference answers typed in, next to the accidents honest learners have: an answer cell
copied with Jupyter's copy and paste, cells dragged out of order, a file without its
format version, an answer cell re-created without its metadata, a renamed download, other
front ends' metadata (Colab, VS Code, JupyterLite), other line ends and encodings, cells split
or merged, magics, a leftover ``input()``, large saved outputs (several after issues in
nbgrader's tracker: #424, #1398, #1210, #1941). ``expect`` says what a fair grader gives
each: ``"full"`` (what the solved notebook gets), ``"blank"`` (what the unedited release gets;
tampering may earn no more), and the ``grades.csv`` status; ``says`` is a phrase its message
must hold (``NAME``: the assignment's notebook name).

tests/test_autograder_accidents.py grades them; benchmarks/accidents.py grades them with
``nbgrader autograde`` too, side by side.
"""
from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Union

import nbformat

from coursebook.cases import (ASSIGNMENTS, answer_cells, grade_cells, nbgrader_meta,
                               release_notebook, submission)


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
    files: tuple = ("{}.ipynb",)        # the file names it is handed in as ({}: the notebook)
    other: bool = False                 # another assignment's notebook (the next one's)


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


def _fresh_cell(source: str):
    """A cell the learner made (Insert > Cell, or pasted as text): no nbgrader metadata."""
    return nbformat.v4.new_code_cell(source)


def _recreate_answers(where: str = "in place", extra=None, split: bool = False):
    """Every answer cell deleted and its work typed into fresh cells: in its place, or
    above the text before it (``where="above"``); split into one cell per top-level
    statement; with ``extra(nb)`` appended to the work (a trick)."""
    def change(nb):
        for cell in list(answer_cells(nb).values()):
            source = cell.source + ("\n" + extra(nb) if extra else "")
            if split:
                import ast
                lines = source.splitlines()
                body = ast.parse(source).body
                parts = ["\n".join(lines[s.lineno - 1 - len(s.decorator_list if hasattr(
                    s, "decorator_list") else []):s.end_lineno]) for s in body]
            else:
                parts = [source]
            at = nb.cells.index(cell)
            nb.cells[at:at + 1] = [_fresh_cell(part) for part in parts]
            if where == "above" and at > 0 and nb.cells[at - 1].cell_type == "markdown" \
                    and not nbgrader_meta(nb.cells[at - 1]):
                text = nb.cells.pop(at - 1)
                nb.cells.insert(at - 1 + len(parts), text)
    return change


def _setup_names_redefined(nb):
    """The trick: the given code's TEST_SEED and first helper redefined in the answer."""
    import ast
    setup = next(c for c in nb.cells if c.cell_type == "code" and nbgrader_meta(c).get("locked")
                 and not nbgrader_meta(c).get("grade"))
    helpers = [s.name for s in ast.parse(setup.source).body
               if isinstance(s, (ast.FunctionDef, ast.ClassDef))]
    return "TEST_SEED = 0" + "".join(f"\n{name} = None" for name in helpers[:1])


def _visible_test(nb):
    """The trick: the first visible test's code pasted under the answer."""
    return next(c.source for c in grade_cells(nb).values() if "Visible" in c.source)


def _colab(nb):
    """As Colab saves it: its own notebook and cell metadata, the cell ids moved into the
    cell metadata, format 4.0, the accelerator it ran on."""
    nb.metadata = {"colab": {"provenance": [], "name": "assignment.ipynb"},
                   "kernelspec": {"name": "python3", "display_name": "Python 3"},
                   "language_info": {"name": "python"}, "accelerator": "GPU"}
    nb.nbformat_minor = 0
    for number, cell in enumerate(nb.cells):
        cell.metadata["id"] = f"cOlAb{number:04d}"
        cell.pop("id", None)
        if cell.cell_type == "code":
            cell.metadata["colab"] = {"base_uri": "https://localhost:8080/"}
            cell.metadata["outputId"] = f"out{number:04d}"


def _vscode(nb):
    """As VS Code saves it: its interpreter's hash and a virtual environment's kernel."""
    nb.metadata["vscode"] = {"interpreter": {"hash": "0" * 64}}
    nb.metadata["kernelspec"] = {"name": ".venv", "display_name": ".venv", "language": "python"}
    nb.metadata["language_info"] = {"name": "python", "version": "3.12.3",
                                    "pygments_lexer": "ipython3"}
    for cell in nb.cells:
        cell.metadata["vscode"] = {"languageId": "python"}


def _jupyterlite(nb):
    """As JupyterLite saves it: the Pyodide kernel."""
    nb.metadata["kernelspec"] = {"name": "python", "display_name": "Python (Pyodide)",
                                 "language": "python"}
    nb.metadata["language_info"] = {"name": "python", "version": "3.8",
                                    "mimetype": "text/x-python"}


def _old_jupyter(nb):
    """As Jupyter before 2021 saved it: format 4.4, no cell ids."""
    nb.nbformat_minor = 4
    for cell in nb.cells:
        cell.pop("id", None)


def _crlf(nb):
    """As a Windows editor re-saves it: CRLF line ends, in the file and in every source."""
    for cell in nb.cells:
        cell.source = cell.source.replace("\n", "\r\n")
    return nbformat.writes(nb).replace("\n", "\r\n").encode()


def _encoded(encoding: str):
    def raw(nb):
        nb.cells[0].source += "\n\nCafé, naïve, déjà vu."  # text a cp1252 file can hold
        return nbformat.writes(nb).encode(encoding)
    return raw


def _answer_merged_with_test(nb):
    """Shift+M on the answer cell and the visible test below it: one cell, the answer's
    metadata, both sources."""
    for cell in list(answer_cells(nb).values()):
        at = nb.cells.index(cell)
        below = next(c for c in nb.cells[at + 1:] if c.cell_type == "code")
        cell.source = cell.source + "\n\n" + below.source
        nb.cells.remove(below)


def _answer_split_with_metadata(nb):
    """Ctrl+Shift+- above the answer's last top-level statement (at its top, if it has only
    one): two cells, each with the answer's metadata (the split copies it)."""
    import ast
    for cell in list(answer_cells(nb).values()):
        lines = cell.source.splitlines()
        last = ast.parse(cell.source).body[-1]
        cut = min([last.lineno] + [d.lineno for d in getattr(last, "decorator_list", [])]) - 1
        first, second = copy.deepcopy(cell), copy.deepcopy(cell)
        first.source, second.source = "\n".join(lines[:cut]), "\n".join(lines[cut:])
        second["id"] = f"{cell.get('id', 'x')}-2"[:64]
        at = nb.cells.index(cell)
        nb.cells[at:at + 1] = [first, second]


def _answer_as_markdown(nb):
    """The answer cell's type switched to Markdown by a stray key (M)."""
    for cell in answer_cells(nb).values():
        cell.cell_type = "markdown"
        cell.pop("outputs", None)
        cell.pop("execution_count", None)


def _magics(nb):
    """Magics and shell commands in the learner's cells: a timed answer and a pip line."""
    for cell in answer_cells(nb).values():
        cell.source = "%%time\n" + cell.source
    nb.cells.insert(1, nbformat.v4.new_code_cell("!pip install torch\n%time x = sum(range(10))"))


def _input_leftover(nb):
    nb.cells.append(nbformat.v4.new_code_cell("name = input('Your name? ')\nprint(name)"))


def _saved_outputs(mib: float):
    """A learner's cell whose saved output (a plot, as base64) makes the file ``mib`` MiB."""
    def raw(nb):
        cell = nbformat.v4.new_code_cell("plot()")
        cell.outputs = [nbformat.v4.new_output("display_data", data={"image/png": ""})]
        nb.cells.append(cell)
        size = len(nbformat.writes(nb).encode())
        cell.outputs[0]["data"]["image/png"] = "A" * (int(mib * 2**20) - size)
        return nbformat.writes(nb).encode()
    return raw


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
             _long_extra_cell, says="1 cell ran past the per-cell time limit and was "
             "interrupted; no points depended on it"),
    Accident("answer_cell_recreated", "every answer cell deleted, its work typed into a fresh "
             "cell in its place", True, _recreate_answers(), says="graded your cell"),
    Accident("answer_recreated_above", "every answer cell deleted, its work typed into a fresh "
             "cell above the exercise's text", True, _recreate_answers("above"),
             says="graded your cell"),
    Accident("answer_recreated_split", "every answer cell deleted, its work typed into fresh "
             "cells, one per function", True, _recreate_answers(split=True),
             says="graded your cell"),
    Accident("renamed_download", "saved by the browser as a second download, NAME (1).ipynb",
             True, files=("{} (1).ipynb",), says="graded 'NAME (1).ipynb' as NAME.ipynb"),
    Accident("colab_copy", "saved from Colab's File > Save a copy, Copy of NAME.ipynb", True,
             files=("Copy of {}.ipynb",), says="graded 'Copy of NAME.ipynb' as NAME.ipynb"),
    Accident("two_downloads", "two renamed downloads, NAME (1) and NAME (2), and no NAME",
             True, files=("{} (1).ipynb", "{} (2).ipynb"), expect="blank", status="invalid",
             says="2 notebooks in the folder could be it"),
    Accident("renamed_by_hand", "renamed by hand to homework.ipynb", True,
             files=("homework.ipynb",), expect="blank", status="invalid",
             says="rename it to NAME.ipynb"),
    # --- other front ends, systems and habits -----------------------------------------------
    Accident("colab", "saved by Colab (its metadata, cell ids in the metadata, format 4.0)",
             True, _colab),
    Accident("vscode", "saved by VS Code (its metadata, a .venv kernel)", True, _vscode),
    Accident("jupyterlite", "saved by JupyterLite (the Pyodide kernel)", True, _jupyterlite),
    Accident("old_jupyter", "saved by an older Jupyter (format 4.4, no cell ids)", True,
             _old_jupyter),
    Accident("crlf", "CRLF line ends, in the file and in every cell", True, raw=_crlf),
    Accident("utf16", "re-saved as UTF-16 by a Windows tool", True, raw=_encoded("utf-16"),
             says="saved as UTF-16 text"),
    Accident("cp1252", "re-saved as Windows-1252 text (accents in it)", True,
             raw=_encoded("cp1252"), says="saved as Windows-1252 text"),
    Accident("answer_merged_with_test", "each answer cell merged with the test cell below it",
             True, _answer_merged_with_test, says="was missing: the original was put back"),
    Accident("answer_split", "each answer cell split in two, both halves keeping its metadata",
             True, _answer_split_with_metadata, says="graded copy 2 of 2"),
    Accident("answer_as_markdown", "each answer cell switched to Markdown", True,
             _answer_as_markdown),
    Accident("magics", "%%time on the answers, !pip install and %time in a cell of its own",
             True, _magics),
    Accident("input_leftover", "a leftover input() call in a cell of the learner's own", True,
             _input_leftover),
    Accident("large_outputs", "15 MiB of saved outputs (a plot)", True,
             raw=_saved_outputs(15)),
    Accident("too_large_outputs", "20.4 MiB of saved outputs", True, raw=_saved_outputs(20.4),
             expect="blank", status="invalid", says="is 20.4 MiB; the limit is 20 MiB"),
    # --- tampering: never more than the blank release -------------------------------------
    Accident("renamed_other_assignment", "another assignment's solved notebook, renamed NAME "
             "(1).ipynb", True, files=("{} (1).ipynb",), other=True, expect="blank",
             status="invalid", says="notebook not submitted"),
    Accident("recreated_with_helpers", "answers re-created in fresh cells that also redefine "
             "the given code's helpers", True, _recreate_answers(extra=_setup_names_redefined),
             expect="blank", says="of the given code, so it was graded as unanswered"),
    Accident("recreated_with_test", "answers re-created in fresh cells that also hold a copy "
             "of a test cell", True, _recreate_answers(extra=_visible_test), expect="blank",
             says="the code of a test cell, so it was graded as unanswered"),
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
    if accident.other:  # the solved notebook of the next assignment, in this one's folder
        names = sorted(ASSIGNMENTS)
        assignment = names[(names.index(assignment) + 1) % len(names)]
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
    """Hand the accident in where ``path`` (the expected notebook) is, under its file names."""
    made = build(accident, assignment)
    path.parent.mkdir(parents=True, exist_ok=True)
    for name in accident.files:
        target = path.parent / name.format(path.stem)
        if isinstance(made, bytes):
            target.write_bytes(made)
        else:
            nbformat.write(made, str(target))


CELL_TIMEOUT = 6  # seconds per cell: the never-ending extra cell is stopped after this (the
#                  reference answers take under a second per notebook)


def grade_all(base: Path, assignment: str) -> dict:
    """Hand every accident of ``assignment`` in under ``base/submitted`` (one student each,
    named for the accident) and grade them with the grader's command (guide/grader.md); student -> row of
    grades.csv (the expected notebook's row, not a renamed file's)."""
    import csv
    import subprocess
    import sys

    from coursebook.cases import ROOT
    notebook = ASSIGNMENTS[assignment]
    for accident in ACCIDENTS:
        write(accident, assignment, base / "submitted" / accident.name / assignment
              / f"{notebook}.ipynb")
    done = subprocess.run(
        [sys.executable, "-m", "autograder", "grade", "submitted", "--assignment", assignment,
         "--out", "graded", "--course", str(ROOT), "--device", "cpu", "--no-progress",
         "--cell-timeout", str(CELL_TIMEOUT)],
        cwd=base, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
        timeout=1200)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    with (base / "graded" / "grades.csv").open() as handle:
        return {row["student_id"]: row for row in csv.DictReader(handle)
                if row["notebook"] == notebook}
