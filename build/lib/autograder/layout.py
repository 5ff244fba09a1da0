"""Where things are: the submissions to grade and the instructor's notebooks they answer.

Submissions follow nbgrader's layout, ``SUBMITTED/<student_id>/<assignment>/<notebook>.ipynb``
(an optional ``timestamp.txt`` beside the notebooks says when it was submitted). The
reference for every notebook is the instructor's version in the course's *source*
directory (``solutions/`` here, or whatever ``nbgrader_config.py`` names), read through
:meth:`SourceNotebook.graded_view`: the notebook exactly as nbgrader records it in the
gradebook, with the solutions replaced by the released stubs but the hidden tests kept.
Nothing in the grader ever sends the raw solutions to a learner's kernel.
"""
from __future__ import annotations

import copy
import functools
import os
import re
import stat
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

if TYPE_CHECKING:  # nbformat is imported where it is used: starting up stays quick
    import nbformat

DEFAULT_SOURCE_DIRECTORY = "solutions"
MAX_NOTEBOOK_BYTES = 20 * 2**20  # larger submissions are refused, not parsed
MAX_NOTEBOOK_DEPTH = 100  # JSON nested deeper is refused (Jupyter's own files nest < 20;
#                           nbformat's validation recurses and would overflow the stack)
# The instructor's justifications of equivalent mutants (autograder.commands.mutants): beside the
# notebook, never copied into a release, a kernel's working directory or a Gradescope zip.
EQUIVALENT_MUTANTS = "equivalent_mutants.toml"
IGNORED = re.compile(r"^(\.|__pycache__$|equivalent_mutants\.toml$)")  # .ipynb_checkpoints, caches


@dataclass(frozen=True)
class Submission:
    """One learner's notebook of one assignment (the file may be missing or broken)."""
    student_id: str
    assignment: str
    notebook: str          # the notebook's name without .ipynb, as nbgrader names it
    path: Path             # SUBMITTED/<student_id>/<assignment>/<notebook>.ipynb
    root: Optional[Path] = None  # SUBMITTED: nothing whose real path lies outside is read
    note: str = ""         # what the learner should know about how the file was found

    @property
    def folder(self) -> Path:
        return self.path.parent

    @property
    def key(self) -> str:
        return f"{self.student_id}/{self.assignment}/{self.notebook}"

    def timestamp(self) -> Optional[datetime]:
        """The submission time from nbgrader's ``timestamp.txt``, if there is one."""
        stamp = self.folder / "timestamp.txt"
        if not stamp.is_file():
            return None
        try:
            from nbgrader.utils import parse_utc
            return parse_utc(stamp.read_text().strip())
        except Exception:
            return None


@dataclass
class SourceNotebook:
    """The instructor's notebook (from the source directory) that submissions answer."""
    assignment: str
    name: str
    path: Path
    notebook: "nbformat.NotebookNode" = field(repr=False)
    config: object = field(default=None, repr=False)  # the course's nbgrader (traitlets) config
    released: bool = False  # a released (student) notebook, the reference of `check`

    @classmethod
    def read_released(cls, path: Path) -> "SourceNotebook":
        """A released notebook as the reference (``check``): its test cells are taken as
        they are, hidden tests already gone; its folder is the learner's, not a course's."""
        path = Path(path).resolve()
        return cls(assignment=path.parent.name, name=path.stem, path=path,
                   notebook=read_submission(path), released=True)

    @classmethod
    def read(cls, path: Path, assignment: str, config=None) -> "SourceNotebook":
        import nbformat
        nb = nbformat.read(str(path), as_version=4)
        return cls(assignment=assignment, name=Path(path).stem, path=Path(path), notebook=nb,
                   config=config)

    @functools.cached_property
    def graded_view(self) -> "nbformat.NotebookNode":
        """The notebook as ``nbgrader generate_assignment`` records it in the gradebook.

        nbgrader's own preprocessors replace each solution region by the released stub
        and add the cell checksums; the hidden tests stay. This is what the grader
        trusts: its test and read-only cells are run as they are, its stubs tell
        whether a learner answered at all. A released notebook is that already.
        """
        if self.released:
            return copy.deepcopy(self.notebook)
        from nbgrader.preprocessors import (ClearOutput, ClearSolutions, ComputeChecksums,
                                            LockCells)
        from traitlets.config import Config
        config = self.config if self.config is not None else Config()
        nb = copy.deepcopy(self.notebook)
        resources: Dict[str, object] = {}
        for step in (LockCells, ClearSolutions, ClearOutput, ComputeChecksums):
            nb, resources = step(config=config).preprocess(nb, resources)
        return nb

    @functools.cached_property
    def secret(self) -> bytes:
        """SHA-256 of the notebook file: the key of its submissions' ``TEST_SEED``s (read once)."""
        import hashlib
        return hashlib.sha256(self.path.read_bytes()).digest()

    def support_files(self) -> List[Path]:
        """Files beside the notebook that nbgrader copies into every submission (data, modules).

        None for a released notebook: the learner's folder already has what it has."""
        if self.released:
            return []
        folder = self.path.parent
        return sorted(p for p in folder.rglob("*")
                      if p.is_file() and p.suffix != ".ipynb"
                      and not any(IGNORED.match(part) for part in p.relative_to(folder).parts))


@dataclass
class Course:
    """A course directory: where the source notebooks are (``nbgrader_config.py`` may say)."""
    root: Path
    source_directory: str = DEFAULT_SOURCE_DIRECTORY
    course_id: str = ""  # nbgrader's CourseDirectory.course_id (the gradebook's course)
    config: object = field(default=None, repr=False)  # everything nbgrader_config.py sets

    @classmethod
    def discover(cls, root: Path = Path(".")) -> "Course":
        """Read ``CourseDirectory.source_directory`` from ``root/nbgrader_config.py`` if set."""
        root = Path(root).resolve()
        source, course_id, config = DEFAULT_SOURCE_DIRECTORY, "", None
        config_file = root / "nbgrader_config.py"
        if config_file.is_file():
            from traitlets.config.loader import PyFileConfigLoader
            config = PyFileConfigLoader(config_file.name, path=str(root)).load_config()
            course_dir = config.get("CourseDirectory", {})
            source = course_dir.get("source_directory", source)
            course_id = course_dir.get("course_id", course_id)
            if "root" in course_dir:
                root = (root / course_dir["root"]).resolve()
        return cls(root=root, source_directory=source, course_id=course_id, config=config)

    @property
    def source_path(self) -> Path:
        return self.root / self.source_directory

    def assignment_path(self, assignment: str) -> Path:
        return self.source_path / assignment

    def source_notebooks(self, assignment: str) -> Dict[str, SourceNotebook]:
        """The instructor's notebooks of ``assignment``, by notebook name."""
        folder = self.assignment_path(assignment)
        if not folder.is_dir():
            raise FileNotFoundError(
                f"no assignment {assignment!r}: {folder} is not a directory")
        notebooks = {p.stem: SourceNotebook.read(p, assignment, self.config)
                     for p in sorted(folder.glob("*.ipynb"))}
        if not notebooks:
            raise FileNotFoundError(f"assignment {assignment!r} has no notebooks in {folder}")
        return notebooks


# How tools rename a file they save beside one of the same name, or a copy: a browser's
# second download ("name (1)", "name(1)"), Jupyter's File > Duplicate ("name-Copy1"),
# Colab's File > Save a copy ("Copy of name"), a file manager's copy ("name - Copy",
# "name copy", "name 2"), a name saved with its extension twice ("name.ipynb").
RENAMES = (r"{} ?\(\d+\)", r"{}-Copy\d*", r"Copy of {}", r"{} - Copy( \(\d+\))?",
           r"{} copy( \d+)?", r"{} \d+", r"{}\.ipynb")


def renamed_by_a_tool(name: str, expected: str) -> bool:
    """Whether ``name`` is ``expected`` as a browser, Jupyter, Colab or a file manager
    renames it (:data:`RENAMES`); letter case aside."""
    return any(re.fullmatch(pattern.format(re.escape(expected)), name, re.IGNORECASE)
               for pattern in RENAMES)


def _grade_ids(nb) -> set:
    found = set()
    for cell in nb.get("cells", []):
        meta = cell.get("metadata", {}).get("nbgrader") if isinstance(cell, dict) else None
        if isinstance(meta, dict) and isinstance(meta.get("grade_id"), str):
            found.add(meta["grade_id"])
    return found


def _renamed(folder: Path, names: set, references: Dict[str, "nbformat.NotebookNode"],
             root: Optional[Path]) -> Tuple[Dict[str, Tuple[Path, str]], Dict[str, str]]:
    """The assignment's notebooks missing from ``folder`` that a file of another name
    stands for: ``(taken, notes)``. A file stands for one when at least half of that
    notebook's nbgrader cells (by ``grade_id``) are in it. It is taken, with a note, when
    it is the only one that does and its name is the expected one as a tool renames it
    (:func:`renamed_by_a_tool`); otherwise the missing notebook's note says which files
    could be it, and none is graded in its place."""
    missing = [name for name in references if name not in names]
    unknown = sorted(names - set(references))
    taken: Dict[str, Tuple[Path, str]] = {}
    notes: Dict[str, str] = {}
    if not missing or not unknown:
        return taken, notes
    wanted = {name: _grade_ids(references[name]) for name in missing}
    holds: Dict[str, List[str]] = {name: [] for name in missing}
    for name in unknown:
        try:
            nb, _ = notebook_from_bytes(submitted_bytes(folder / f"{name}.ipynb", root))
        except ValueError:
            continue  # not readable as a notebook: it stands for nothing
        ids = _grade_ids(nb)
        for expected, its_ids in wanted.items():
            if its_ids and 2 * len(ids & its_ids) >= len(its_ids):
                holds[expected].append(name)
    for expected, could in holds.items():
        files = " and ".join(f"'{name}.ipynb'" for name in could)
        if len(could) == 1 and renamed_by_a_tool(could[0], expected):
            taken[expected] = (folder / f"{could[0]}.ipynb", (
                f"graded '{could[0]}.ipynb' as {expected}.ipynb: it holds this assignment's "
                f"cells, and {expected}.ipynb was not in the folder (a browser or Jupyter "
                "renames a second copy so)"))
        elif len(could) == 1:
            notes[expected] = (f"the folder holds {files}, which has this assignment's cells "
                               f"but another name: rename it to {expected}.ipynb and submit "
                               "it again")
        elif could:
            notes[expected] = (f"{len(could)} notebooks in the folder could be it ({files}), "
                               f"so none was graded: keep the one you mean, named "
                               f"{expected}.ipynb, and submit it again")
    return taken, notes


def find_submissions(submitted: Path, assignment: str,
                     notebooks: Optional[List[str]] = None,
                     references: Optional[Dict[str, "nbformat.NotebookNode"]] = None
                     ) -> List[Submission]:
    """Every ``SUBMITTED/<student>/<assignment>/<notebook>.ipynb``, sorted by student and notebook.

    With ``notebooks`` (the assignment's notebook names), a student who submitted the
    assignment but not one of its notebooks still gets a :class:`Submission` for it (its
    path does not exist), so that every student and notebook gets a row in the grades.
    With ``references`` (name -> the graded view), a missing notebook may be found under
    another name (:func:`_renamed`): the file is then graded as that notebook, with a note,
    and gets no row of its own.
    """
    submitted = Path(submitted)
    if not submitted.is_dir():
        raise FileNotFoundError(f"{submitted} is not a directory of submissions")
    found: List[Submission] = []
    for student_dir in sorted(p for p in submitted.iterdir() if p.is_dir()):
        if IGNORED.match(student_dir.name):
            continue
        folder = student_dir / assignment
        if not folder.is_dir():
            continue
        names = {p.stem for p in folder.glob("*.ipynb") if not IGNORED.match(p.name)}
        root = submitted.absolute()  # a Dask worker has another cwd
        taken, notes = _renamed(folder, names, references, root) if references else ({}, {})
        names -= {path.stem for path, _ in taken.values()}
        names.update(notebooks or [])
        names.update(references or [])
        for name in sorted(names):
            path, note = taken.get(name, (folder / f"{name}.ipynb", notes.get(name, "")))
            found.append(Submission(student_dir.name, assignment, name, path, root=root,
                                    note=note))
    return found


SAVE_AGAIN = "open it in Jupyter, check that it shows your work, save it and submit it again"
NOTEBOOK_FORMAT = 4  # the nbformat major version the grader reads (older ones are upgraded)


KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a named pipe"),
         (stat.S_ISDIR, "a folder"), (stat.S_ISSOCK, "a socket"),
         (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"))


def mebibytes(size: int, limit: Optional[int] = None) -> str:
    """A size in MiB with one decimal, rounded to the nearest (20.4 MiB and a few bytes is
    20.4, not 20.5); over a ``limit``, rounded up where the nearest would read as the limit
    or less (20 MiB and one byte is 20.1, not 20.0)."""
    import math
    tenths = round(size * 10 / 2**20)
    if limit is not None and size > limit and tenths * 2**20 <= limit * 10:
        tenths = math.ceil(size * 10 / 2**20)
    return f"{tenths / 10:.1f}"


def too_big(size: int, again: str = "upload") -> str:
    """Why a notebook of ``size`` bytes is refused, and what to do."""
    return (f"the notebook is {mebibytes(size, MAX_NOTEBOOK_BYTES)} MiB; the limit is "
            f"{MAX_NOTEBOOK_BYTES / 2**20:g} MiB (clear its outputs, save it and {again} it "
            "again)")


def plural(count: int, word: str, words: str = "") -> str:
    """``1 cell``, ``2 cells``: a count with its noun in the right number."""
    return f"{count} {word if count == 1 else words or word + 's'}"


def submitted_bytes(path: Path, root: Optional[Path] = None) -> bytes:
    """The bytes of a submitted file, read as data: never through a link, never from a
    pipe or a device (which could block the grader), never from outside ``root``.
    ``ValueError`` with one sentence for the learner when it cannot be read."""
    path = Path(path)
    if root is not None and not os.path.realpath(path.parent).startswith(
            os.path.realpath(root).rstrip(os.sep) + os.sep):
        raise ValueError("the submission's folder is a link to somewhere outside the "
                         "submissions: submit the notebook file itself")
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise ValueError("notebook not submitted") from None
    except OSError as error:
        raise ValueError(f"the notebook could not be read ({error.strerror}); submit it "
                         "again") from None
    for test, kind in KINDS:
        if test(info.st_mode):
            raise ValueError(f"the notebook is {kind}, not a file: submit the notebook "
                             "file itself")
    if info.st_size > MAX_NOTEBOOK_BYTES:
        raise ValueError(too_big(info.st_size, "submit"))
    try:  # O_NOFOLLOW and O_NONBLOCK: swapped for a link or a pipe since the lstat, it fails
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as error:
        raise ValueError(f"the notebook could not be read ({error.strerror}); submit the "
                         "notebook file itself") from None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise ValueError("the notebook is not a regular file: submit the notebook file "
                             "itself")
        return handle.read(MAX_NOTEBOOK_BYTES + 1)


def read_notebook(path: Path) -> Tuple["nbformat.NotebookNode", List[str]]:
    """:func:`notebook_from_bytes` of :func:`submitted_bytes` (no ``root`` check)."""
    return notebook_from_bytes(submitted_bytes(path))


def decoded(raw: bytes) -> Tuple[str, str]:
    """The text of a notebook file and, when it was not UTF-8, the encoding it was in.

    Notebooks are UTF-8 (a byte-order mark is allowed); a file re-saved by a Windows tool
    may be UTF-16 (with its byte-order mark) or, for text with accents, Windows-1252."""
    import codecs
    if raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return raw.decode("utf-16"), "UTF-16"
    try:
        return raw.decode("utf-8-sig"), ""
    except UnicodeDecodeError:
        text = raw.decode("cp1252")  # raises for the five bytes it has no character for
        if not text.lstrip().startswith("{"):
            raise
        return text, "Windows-1252"


def json_depth(data) -> int:
    """How deeply ``data`` (parsed JSON) nests lists and objects, without recursion."""
    deepest, pending = 0, [(data, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, depth)
            pending.extend((value, depth + 1) for value in item
                           if isinstance(value, (dict, list)))
    return deepest


class TooManyCells(ValueError):
    """A notebook of more cells than the caller takes (refused before they are read)."""


def notebook_from_bytes(raw: bytes, max_cells: Optional[int] = None
                        ) -> Tuple["nbformat.NotebookNode", List[str]]:
    """A learner's notebook from the file's bytes, forgiving what can be forgiven.
    With ``max_cells``, a notebook of more cells is :class:`TooManyCells`, found before
    the cells are read one by one (seconds for a 20 MiB file of tiny cells).

    Returns the notebook and notes on what was repaired (to tell the learner). Raises
    ``ValueError`` with one sentence a learner understands, saying what is wrong with the
    file and what to do, never a library's internal error.
    """
    import json

    import nbformat
    if len(raw) > MAX_NOTEBOOK_BYTES:
        raise ValueError(f"the notebook is over {MAX_NOTEBOOK_BYTES // 2**20} MiB, the limit "
                         "(clear its outputs and submit again)")
    try:
        text, encoding = decoded(raw)
        data = json.loads(text)
    except RecursionError:
        data = None
    except (UnicodeDecodeError, ValueError):
        what = "empty" if not raw else "not JSON text (cut short, or another kind of file)"
        raise ValueError(f"the file is not a Jupyter notebook: it is {what}; "
                         f"{SAVE_AGAIN}") from None
    if data is None or json_depth(data) > MAX_NOTEBOOK_DEPTH:
        raise ValueError(f"the file is JSON nested more than {MAX_NOTEBOOK_DEPTH} levels deep, "
                         f"which no Jupyter notebook is; {SAVE_AGAIN}")
    if not isinstance(data, dict) or not isinstance(data.get("cells", data.get("worksheets")),
                                                    list):
        raise ValueError("the file is JSON but not a Jupyter notebook (it has no list of "
                         "cells): submit the .ipynb file that Jupyter saves for your work")
    if max_cells is not None and len(data.get("cells") or ()) > max_cells:
        raise TooManyCells(f"the notebook has {len(data['cells'])} cells; the limit is "
                           f"{max_cells} (merge or delete cells, save it and submit it again)")
    notes: List[str] = []
    if encoding:
        notes.append(f"the file was saved as {encoding} text, not UTF-8: it was read as "
                     f"{encoding}")
    version = data.get("nbformat")
    if not isinstance(version, int) or isinstance(version, bool):
        if "worksheets" in data:  # the layout of versions 1 to 3
            raise ValueError("the notebook has no format version and an old layout "
                             f"(worksheets); {SAVE_AGAIN}")
        notes.append("the notebook file had no format version: it was read as version "
                     f"{NOTEBOOK_FORMAT}")
        data["nbformat"], version = NOTEBOOK_FORMAT, NOTEBOOK_FORMAT
        data.setdefault("nbformat_minor", 0)
    if version > NOTEBOOK_FORMAT:
        raise ValueError(f"the notebook is in format version {version}, newer than the "
                         f"version {NOTEBOOK_FORMAT} this grader reads; save it from Jupyter "
                         f"as a version {NOTEBOOK_FORMAT} notebook and submit it again")
    if version < NOTEBOOK_FORMAT:
        try:
            nb = nbformat.reads(text, as_version=NOTEBOOK_FORMAT)
        except Exception:
            raise ValueError(f"the notebook is in the old format version {version} and could "
                             f"not be converted to version {NOTEBOOK_FORMAT}; {SAVE_AGAIN} "
                             "(Jupyter saves the current version)") from None
        notes.append(f"the notebook was in the old format version {version} and was "
                     f"converted to version {NOTEBOOK_FORMAT}")
        data = dict(nb)
    if not isinstance(data.get("metadata"), dict):
        data["metadata"] = {}
    cells, dropped = [], 0
    for cell in data.get("cells", []):
        if not isinstance(cell, dict) or cell.get("cell_type") not in ("code", "markdown",
                                                                      "raw"):
            dropped += 1
            continue
        source = cell.get("source", "")
        source = "".join(map(str, source)) if isinstance(source, list) else str(source)
        cell = {**cell, "source": source.replace("\r\n", "\n"),  # a Windows editor's line ends
                "metadata": cell["metadata"] if isinstance(cell.get("metadata"), dict) else {}}
        cells.append(cell)
    if dropped:
        notes.append(f"{plural(dropped, 'damaged cell')} of the file "
                     f"{'was' if dropped == 1 else 'were'} left out")
    data["cells"] = cells
    return nbformat.from_dict(data), notes


def read_submission(path: Path) -> "nbformat.NotebookNode":
    """:func:`read_notebook` without the notes."""
    return read_notebook(path)[0]
