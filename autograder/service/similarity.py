"""Which learners handed in the most alike answers of an assignment: pairs to look at by hand.

It only points at pairs; it never changes a grade. ``python -m autograder similarity`` (over
nbgrader's ``submitted/`` folder or the service's uploads) and the instructor's page
``/instructor/similarity/ASSIGNMENT`` (over each learner's latest upload) both call
:func:`compare`, so they rank the same hand-ins the same way.

What is compared, for each learner: their *answer code*, the source of the answer cells as
the grader grades them (:func:`autograder.pipeline.rebuild.rebuild` resolves copied, moved and
re-created cells the same way here) and the code cells they added. Written (markdown) answers
are not compared. What is left out as given, so that it can never make two learners alike:

* in each answer cell, the lines of its released stub (the ``def`` line, the docstring,
  ``# YOUR CODE HERE``), wherever the learner kept them;
* anywhere, a stretch of code that is also in the course's given code: every code cell of
  the assignment's released notebooks (read-only helpers, stubs, tests) and any files the
  instructor names besides (``--given``).

The matching is copydetect's (Stanford MOSS's winnowing, as a maintained package): code is
tokenized, names become ``V``/``F``/``O`` and strings ``S``, comments and spaces go, so renamed
variables and moved functions still match; then every stretch of :data:`SIMILARITY_NOISE`
characters of that is a fingerprint. Every fingerprint is kept (a window of 1): winnowing
picks by hash value, and Python's string hashes change from one process to the next, so a
wider window would give the command and the page different numbers. A pair's similarity is,
for each of the two, the share of their answer code that matches the other's; pairs rank by
the mean of the two (JPlag's default), then by the tokens they share.
"""
from __future__ import annotations

import io
import re
from dataclasses import asdict, dataclass
from itertools import combinations
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from autograder.layout import (IGNORED, SourceNotebook, find_submissions, notebook_from_bytes,
                               submitted_bytes)
from autograder.options import MAX_CELLS, SIMILARITY_NOISE, SIMILARITY_PAIRS
from autograder.pipeline.rebuild import added_by_the_grader, grade_id_of, is_answer, rebuild

LANGUAGE = "python"  # the tokenizer copydetect uses (Pygments'); notebooks of the course are Python
OWN_CELL = "own cell"  # how a cell the learner added is named, with its number in the notebook
# Written between two cells of a hand-in and in place of each given line, and kept through
# copydetect's normalising (a number stays as it is): a fingerprint that holds it spans two
# cells, or the learner's code on both sides of given code, and is dropped.
BREAK = "0xCE11B4EA4"


@dataclass(frozen=True)
class AnswerCell:
    """One cell of a learner's answer code: its lines as they wrote them, and which of them
    are given (the released stub's lines, never compared)."""
    notebook: str
    cell: str                  # the answer cell's grade_id, or "own cell N"
    lines: Tuple[str, ...]
    given: Tuple[bool, ...]    # per line


@dataclass(frozen=True)
class Handin:
    """A learner's answer code of one assignment, and what could not be read of it."""
    learner: str
    cells: Tuple[AnswerCell, ...]
    notes: Tuple[str, ...] = ()


@dataclass(frozen=True)
class Line:
    number: int        # in its cell, from 1
    text: str
    match: bool        # part of code the other learner's answer has too
    given: bool        # a line of the released stub: never compared


@dataclass(frozen=True)
class ShownCell:
    notebook: str
    cell: str
    lines: Tuple[Line, ...]


@dataclass(frozen=True)
class Side:
    """One learner of a pair: how much of their answer code matches, and the cells that do."""
    learner: str
    similarity: float
    cells: Tuple[ShownCell, ...]


@dataclass(frozen=True)
class Pair:
    rank: int
    score: float                 # the mean of the two sides' similarity
    matched_tokens: int          # normalised characters of the first learner's code that match
    sides: Tuple[Side, Side]


@dataclass(frozen=True)
class Report:
    assignment: str
    learners: Tuple[str, ...]    # every learner whose hand-in was read
    alike: int                   # pairs that share any code (of those compared)
    pairs: Tuple[Pair, ...]      # the most alike, most alike first
    nothing_own: Tuple[str, ...]  # learners whose answers hold no code but the given code
    notes: Tuple[str, ...]       # hand-ins that could not be read, and why

    def as_dict(self) -> dict:
        return asdict(self)


# ------------------------------------------------------------------ the learners' answer code

def _source(cell) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def answer_cells(notebook: str, reference, submitted) -> List[AnswerCell]:
    """The answer code of ``submitted`` (one learner's notebook ``notebook``), read as the
    grader reads it against ``reference`` (the graded view), the released stub's lines
    marked as given."""
    stubs = {grade_id_of(cell): _source(cell) for cell in reference.cells if is_answer(cell)}
    cells, own = [], 0
    for cell in rebuild(reference, submitted).notebook.cells:
        if cell.cell_type != "code" or added_by_the_grader(cell):
            continue
        grade_id = grade_id_of(cell)
        if grade_id is None:  # a cell of the learner's own (rebuild keeps no metadata of it)
            own += 1
            name, stub = f"{OWN_CELL} {own}", ""
        elif is_answer(cell):
            name, stub = grade_id, stubs.get(grade_id, "")
        else:
            continue  # the course's cells: rebuild put the instructor's back
        given = {line.strip() for line in stub.splitlines() if line.strip()}
        lines = tuple(_source(cell).splitlines())
        cells.append(AnswerCell(notebook, name, lines,
                                tuple(line.strip() in given for line in lines)))
    return cells


def handin(learner: str, sources: Mapping[str, SourceNotebook], files: Mapping[str, Path],
           root: Optional[Path] = None) -> Handin:
    """``learner``'s hand-in from their notebook files (notebook name -> path), read as
    grading reads them (:func:`~autograder.layout.submitted_bytes`: never through a link,
    nothing outside ``root``); a file that grading could not read is a note, not an error."""
    cells: List[AnswerCell] = []
    notes: List[str] = []
    for name in sorted(set(files) & set(sources)):
        try:
            nb, _ = notebook_from_bytes(submitted_bytes(files[name], root), max_cells=MAX_CELLS)
            cells += answer_cells(name, sources[name].graded_view, nb)
        except ValueError as error:
            notes.append(f"{learner}: {name}.ipynb: {error}")
    return Handin(learner, tuple(cells), tuple(notes))


def submitted_handins(submitted: Path, assignment: str,
                      sources: Mapping[str, SourceNotebook]) -> List[Handin]:
    """Every learner's hand-in in nbgrader's ``SUBMITTED/<learner>/<assignment>/`` folders,
    found as ``grade`` finds them (a notebook saved under a tool's new name too)."""
    found = find_submissions(submitted, assignment, notebooks=list(sources),
                             references={name: source.graded_view
                                         for name, source in sources.items()})
    files: Dict[str, Dict[str, Path]] = {}
    roots: Dict[str, Optional[Path]] = {}
    for submission in found:
        files.setdefault(submission.student_id, {})[submission.notebook] = submission.path
        roots[submission.student_id] = submission.root
    return [handin(learner, sources, files[learner], roots[learner]) for learner in sorted(files)]


def uploaded_handins(store, assignment: str, sources: Mapping[str, SourceNotebook],
                     learners: Iterable[str]) -> List[Handin]:
    """The latest upload of each notebook of ``assignment`` by each of ``learners``, from
    the service's :class:`~autograder.service.db.Store` (graded yet or not)."""
    wanted = set(learners)
    latest: Dict[str, Dict[str, Path]] = {}
    for row in store.rows("WHERE assignment = ? ORDER BY id", (assignment,)):
        if row.student in wanted:
            latest.setdefault(row.student, {})[row.notebook] = Path(row.path)
    return [handin(learner, sources, latest[learner]) for learner in sorted(latest)]


def given_code(sources: Mapping[str, SourceNotebook], more: Sequence[Path] = ()) -> List[str]:
    """The course's given code: each code cell of the assignment's released notebooks, and
    of ``more`` (Python files and notebooks, or folders of them)."""
    pieces = [_source(cell) for source in sources.values()
              for cell in source.graded_view.cells if cell.cell_type == "code"]
    for path in map(Path, more):
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such file or folder of given code")
        files = [path] if path.is_file() else sorted(
            p for p in path.rglob("*") if p.suffix in (".py", ".ipynb")
            and not any(IGNORED.match(part) for part in p.relative_to(path).parts))
        for file in files:
            if file.suffix == ".ipynb":
                nb, _ = notebook_from_bytes(file.read_bytes())
                pieces += [_source(cell) for cell in nb.cells if cell.cell_type == "code"]
            else:
                pieces.append(file.read_text(errors="replace"))
    return pieces


# ----------------------------------------------------------------------------- the matching

@dataclass
class _Document:
    """A hand-in's answer code as one text (a :data:`BREAK` for each given line and after
    each cell), with where each line is (a given line: nowhere, an empty span)."""
    handin: Handin
    text: str
    places: List[Tuple[int, int, int, int]]  # (cell index, line index, start, end) in text
    fingerprint: object = None


def _document(handin: Handin) -> _Document:
    parts, places, at = [], [], 0
    for index, cell in enumerate(handin.cells):
        for number, (line, given) in enumerate(zip(cell.lines, cell.given)):
            places.append((index, number, at, at + (0 if given else len(line))))
            parts.append((BREAK if given else line) + "\n")
            at += len(parts[-1])
        parts.append(BREAK + "\n")
        at += len(BREAK) + 1
    return _Document(handin, "".join(parts), places)


def _fingerprint(code: str, given: frozenset = frozenset()):
    """copydetect's fingerprint of ``code``, every k-gram kept but those of ``given`` and
    those across a :data:`BREAK` (done here: copydetect's own boilerplate filter assumes
    that no k-gram repeats in a file)."""
    from copydetect import CodeFingerprint
    from copydetect.utils import get_token_coverage
    found = CodeFingerprint("answer.py", SIMILARITY_NOISE, 1, language=LANGUAGE,
                            fp=io.StringIO(code))
    k, normalised = found.k, found.filtered_code
    breaks = [at.start() for at in re.finditer(re.escape(BREAK), normalised)]
    across = {start for at in breaks for start in range(max(0, at - k + 1), at + len(BREAK))}
    kept = {}
    for value, starts in found.hash_idx.items():
        starts = [start for start in starts if start not in across]
        if starts and value not in given:
            kept[value] = starts
    found.hashes, found.hash_idx = set(kept), kept
    found.token_coverage = get_token_coverage(kept, k, len(normalised))
    return found


def _matched_lines(document: _Document, slices) -> set:
    """The places of ``document``'s lines that hold matching code (not only spaces)."""
    spans = list(zip(slices[0].tolist(), slices[1].tolist())) if len(slices) else []
    marked = set()
    for place, (_, _, start, end) in enumerate(document.places):
        if any(document.text[max(start, low):min(end, high)].strip() for low, high in spans):
            marked.add(place)
    return marked


def _side(document: _Document, similarity: float, slices) -> Side:
    marked = _matched_lines(document, slices)
    shown_cells = {document.places[place][0] for place in marked}
    lines: Dict[int, List[Line]] = {index: [] for index in shown_cells}
    for place, (index, number, _, _) in enumerate(document.places):
        if index in lines:
            cell = document.handin.cells[index]
            lines[index].append(Line(number + 1, cell.lines[number], place in marked,
                                     cell.given[number]))
    cells = document.handin.cells
    return Side(document.handin.learner, round(float(similarity), 4),
                tuple(ShownCell(cells[index].notebook, cells[index].cell, tuple(lines[index]))
                      for index in sorted(lines)))


def compare(assignment: str, handins: Sequence[Handin], given: Sequence[str],
            shown: int = SIMILARITY_PAIRS) -> Report:
    """Every pair of ``handins`` compared, ``given`` code left out; the ``shown`` most alike
    pairs with their matching lines."""
    from copydetect import compare_files
    given_hashes = frozenset().union(*(_fingerprint(code).hashes for code in given))
    documents = []
    for one in handins:
        document = _document(one)
        document.fingerprint = _fingerprint(document.text, given_hashes)
        documents.append(document)
    own = [d for d in documents if d.fingerprint.hashes]
    found = []
    for first, second in combinations(sorted(own, key=lambda d: d.handin.learner), 2):
        tokens, (one, other), slices = compare_files(first.fingerprint, second.fingerprint)
        if tokens > 0:
            found.append(((one + other) / 2, int(tokens), first, second, (one, other), slices))
    found.sort(key=lambda f: (-f[0], -f[1], f[2].handin.learner, f[3].handin.learner))
    pairs = tuple(Pair(rank, round(float(score), 4), tokens,
                       (_side(first, sims[0], slices[0]), _side(second, sims[1], slices[1])))
                  for rank, (score, tokens, first, second, sims, slices)
                  in enumerate(found[:shown], start=1))
    return Report(assignment, tuple(sorted(h.learner for h in handins)), len(found), pairs,
                  tuple(sorted(d.handin.learner for d in documents if not d.fingerprint.hashes)),
                  tuple(note for h in handins for note in h.notes))


def percent(share: float) -> str:
    return f"{100 * share:.0f} %"


def table(report: Report) -> str:
    """The ranked pairs as a plain-text table, for the terminal."""
    shown = (f" (the {len(report.pairs)} most alike shown)"
             if report.alike > len(report.pairs) else "")
    lines = [f"Similarity of {report.assignment!r}: {len(report.learners)} learner(s), "
             f"{report.alike} pair(s) sharing code beyond the given code{shown}"]
    if report.pairs:
        width = max(len(side.learner) for pair in report.pairs for side in pair.sides)
        width = max(width, len("learner"))
        lines.append(f"{'rank':>4}  {'score':>5}  {'learner':<{width}}  {'share':>5}  "
                     f"{'learner':<{width}}  {'share':>5}  {'tokens':>6}")
        for pair in report.pairs:
            a, b = pair.sides
            lines.append(f"{pair.rank:>4}  {percent(pair.score):>5}  {a.learner:<{width}}  "
                         f"{percent(a.similarity):>5}  {b.learner:<{width}}  "
                         f"{percent(b.similarity):>5}  {pair.matched_tokens:>6}")
    if report.nothing_own:
        lines.append("No code of their own beyond the given code: " + ", ".join(report.nothing_own))
    lines += [f"Not read: {note}" for note in report.notes]
    return "\n".join(lines)


def of_uploads(service, assignment: str) -> Report:
    """The report of the instructor's page: the latest upload of each of the service's
    learners (:meth:`~autograder.service.app.Service.learners`)."""
    sources = service.sources[assignment]
    return compare(assignment, uploaded_handins(service.store, assignment, sources,
                                                service.learners()), given_code(sources))
