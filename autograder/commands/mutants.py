"""``python -m autograder mutants ASSIGNMENT``: which rules of a task do its tests not check?

Mutation analysis, for instructors. What the learner writes in each answer cell of the
instructor's notebook (the code between ``### BEGIN SOLUTION`` and ``### END SOLUTION``, or
the whole cell without them) is changed in one small way at a time -- an operator swapped, a comparison moved by one, a constant
changed, a statement or a ``return`` dropped, a condition negated, two arguments
swapped -- and every such *mutant* is handed in as a learner would hand it in: the
released notebook with the instructor's answers typed in, one of them mutated. Each is
graded with the one pipeline (:func:`autograder.pipeline.grade.grade_submission`, on a
:class:`~autograder.pipeline.grade.LocalRunner`, in parallel like any submission). A mutant that
still gets the reference answers' score *survives*: no test noticed the change, so either
a rule of the task is not checked, or the mutant behaves exactly as the original (an
*equivalent* mutant). The instructor marks the latter, with a reason, in
``equivalent_mutants.toml`` beside the assignment's notebook::

    [[equivalent]]
    id = "roofline_answer:12:11:compare"         # as the report prints it
    line = "if moving > computing:"              # the original line, to notice a stale entry
    reason = "at the ridge both roofs give the same time"

Mutants are made on the syntax tree (:mod:`ast`) and shown as the changed line. Each is
handed in ``seeds`` times, as copies whose bytes differ (so each gets its own ``TEST_SEED``,
as different learners' files do): a mutant is killed only if it loses points in every copy,
since a rule that a seeded case reaches for some learners only is no rule for the others.
"""
from __future__ import annotations

import ast
import copy
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from autograder.layout import EQUIVALENT_MUTANTS as EQUIVALENT_FILE
SOLUTION_MARKER = re.compile(r"^[ \t]*### (BEGIN|END) SOLUTION[ \t]*\n?", re.MULTILINE)

# Operators a mutant swaps in for another: each the mistake one keystroke away.
BINARY = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult,
          ast.FloorDiv: ast.Div, ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult,
          ast.LShift: ast.RShift, ast.RShift: ast.LShift, ast.BitAnd: ast.BitOr,
          ast.BitOr: ast.BitAnd, ast.MatMult: ast.Mult}
COMPARE = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt,
           ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In,
           ast.Is: ast.IsNot, ast.IsNot: ast.Is}
BOOLEAN = {ast.And: ast.Or, ast.Or: ast.And}


@dataclass(frozen=True)
class Mutant:
    """One answer cell's code with one change."""
    cell: str       # the answer cell's grade_id
    line: int       # 1-based line of the cell's code where the change is
    column: int
    operator: str   # binary, compare, boolean, constant, statement, return, negate, arguments
    original: str   # that line as the instructor wrote it
    changed: str    # what the change makes of it, as code
    code: str       # the whole cell's code with the change

    @property
    def id(self) -> str:
        return f"{self.cell}:{self.line}:{self.column}:{self.operator}"


def solution_code(source: str) -> str:
    """An answer cell's code as a learner who solved it would hand it in."""
    return SOLUTION_MARKER.sub("", source)


def solution_lines(source: str) -> Optional[set]:
    """The lines of :func:`solution_code` (1-based) that lie between ``### BEGIN SOLUTION``
    and ``### END SOLUTION``: what the learner writes. None for a cell without markers,
    which the learner writes whole. What the instructor wrote around the regions (a
    constructor, a signature with its defaults) is given, and no site of a mutant."""
    inside, kept, lines = False, 0, set()
    found = False
    for line in source.splitlines():
        if SOLUTION_MARKER.fullmatch(line):
            inside, found = "BEGIN" in line, True
            continue
        kept += 1
        if inside:
            lines.add(kept)
    return lines if found else None


def _docstrings(tree: ast.AST) -> set:
    """ids of the docstring statements and their strings: no site of a mutant."""
    found = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            found.update((id(body[0]), id(body[0].value)))
    return found


def _sites(tree: ast.AST) -> List[Tuple[ast.AST, str]]:
    """Every (node, operator) a mutant can change, in source order."""
    skip = _docstrings(tree)
    # an f-string's literal parts, and a raised exception's message, are text for people,
    # not constants of the program
    skip.update(id(value) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr)
                for value in node.values)
    skip.update(id(arg) for node in ast.walk(tree)
                if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)
                for arg in node.exc.args if isinstance(arg, ast.Constant))
    found = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in BINARY:
            found.append((node, "binary"))
        elif isinstance(node, ast.Compare):
            found.extend((node, f"compare{i}") for i, op in enumerate(node.ops)
                         if type(op) in COMPARE)
        elif isinstance(node, ast.BoolOp):
            found.append((node, "boolean"))
        elif isinstance(node, ast.Constant) and (
                isinstance(node.value, (bool, int, float))
                or (isinstance(node.value, str) and node.value)):
            found.append((node, "constant"))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
            found.append((node, "unary"))
        elif isinstance(node, ast.Call) and len(node.args) >= 2 \
                and not any(isinstance(a, ast.Starred) for a in node.args[:2]):
            found.append((node, "arguments"))
        if isinstance(node, (ast.If, ast.While, ast.IfExp, ast.Assert)):
            found.append((node, "negate"))
        if isinstance(node, ast.stmt) and not isinstance(
                node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import,
                       ast.ImportFrom)):
            found.append((node, "return" if isinstance(node, ast.Return) else "statement"))
    return sorted(found, key=lambda item: (item[0].lineno, item[0].col_offset, item[1]))


def _changed_constant(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 2 if value else 1.0
    return value + "_"  # a non-empty string


def _mutate(node: ast.AST, operator: str, parents: Dict[int, ast.AST]) -> bool:
    """Change ``node`` in place (statements: in their parent's body); False if it cannot."""
    if operator == "binary":
        node.op = BINARY[type(node.op)]()
    elif operator.startswith("compare"):
        index = int(operator[len("compare"):])
        node.ops[index] = COMPARE[type(node.ops[index])]()
    elif operator == "boolean":
        node.op = BOOLEAN[type(node.op)]()
    elif operator == "constant":
        node.value = _changed_constant(node.value)
    elif operator == "negate":
        node.test = ast.UnaryOp(op=ast.Not(), operand=node.test)
    elif operator == "unary":
        parent = parents[id(node)]
        for name, value in ast.iter_fields(parent):
            if value is node:
                setattr(parent, name, node.operand)
                break
            if isinstance(value, list) and any(item is node for item in value):
                value[[i for i, item in enumerate(value) if item is node][0]] = node.operand
                break
    elif operator == "arguments":
        node.args[0], node.args[1] = node.args[1], node.args[0]
    elif operator in ("statement", "return"):
        parent = parents[id(node)]
        for name in ("body", "orelse", "finalbody", "handlers"):
            body = getattr(parent, name, None)
            if isinstance(body, list) and any(item is node for item in body):
                index = [i for i, item in enumerate(body) if item is node][0]
                body[index] = ast.Pass()
                return True
        return False
    return True


def mutants_of(cell: str, source: str) -> List[Mutant]:
    """Every mutant of one answer cell that compiles, changed only where the learner writes
    (see :func:`solution_lines`); ``source`` as the instructor's notebook holds it."""
    code, writable = solution_code(source), solution_lines(source)
    tree = ast.parse(code)
    original = ast.unparse(tree)
    lines = code.splitlines()
    made, seen = [], set()
    for index, (node, operator) in enumerate(_sites(tree)):
        if writable is not None and node.lineno not in writable:
            continue
        mutated = copy.deepcopy(tree)
        site = [n for n, op in _sites(mutated)][index]
        parents = {id(child): parent for parent in ast.walk(mutated)
                   for child in ast.iter_child_nodes(parent)}
        if not _mutate(site, operator, parents):
            continue
        try:
            changed_code = ast.unparse(ast.fix_missing_locations(mutated))
            compile(changed_code, f"<mutant of {cell}>", "exec")
        except (SyntaxError, ValueError, TypeError):
            continue
        if changed_code == original or changed_code in seen:
            continue
        seen.add(changed_code)
        line = node.lineno
        shown = _changed_line(site, operator, parents)
        made.append(Mutant(cell, line, node.col_offset, operator.rstrip("0123456789"),
                           lines[line - 1].strip() if line <= len(lines) else "",
                           shown, changed_code))
    return made


def _changed_line(site: ast.AST, operator: str, parents: Dict[int, ast.AST]) -> str:
    """The first line of the mutated statement that holds ``site``, as code."""
    if operator in ("statement", "return"):
        return "(line dropped)"
    while not isinstance(site, ast.stmt) and id(site) in parents:
        site = parents[id(site)]
    return ast.unparse(site).splitlines()[0]


def answer_cells(notebook) -> Dict[str, str]:
    """grade_id -> the source of each answer (code) cell of an instructor notebook."""
    cells = {}
    for cell in notebook.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.cell_type == "code" and meta.get("solution") and not meta.get("grade"):
            cells[meta["grade_id"]] = cell.source
    return cells


def handed_in(released, answers: Dict[str, str]):
    """The released notebook with ``answers`` (grade_id -> code) typed in."""
    nb = copy.deepcopy(released)
    for cell in nb.cells:
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if grade_id in answers:
            cell.source = answers[grade_id]
    return nb


def another_copy(notebook, copy_number: int):
    """The notebook as handed in for the ``copy_number``-th time: the same cells, its bytes
    changed by a metadata entry, so that it is graded with another ``TEST_SEED``."""
    if copy_number:
        notebook.metadata["autograder_mutants"] = {"copy": copy_number}
    return notebook


@dataclass(frozen=True)
class Equivalent:
    id: str
    line: str
    reason: str


def read_equivalents(folder: Path) -> Dict[str, Equivalent]:
    """The mutants the instructor marked as equivalent, by id; ValueError for a bad file."""
    path = Path(folder) / EQUIVALENT_FILE
    if not path.is_file():
        return {}
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"{path}: not valid TOML: {error}") from None
    marked = {}
    for number, entry in enumerate(data.get("equivalent", []), 1):
        if not isinstance(entry, dict) or not all(isinstance(entry.get(k), str) and entry[k]
                                                  for k in ("id", "line", "reason")):
            raise ValueError(f"{path}: [[equivalent]] number {number} needs id, line and "
                             "reason, each a non-empty string")
        marked[entry["id"]] = Equivalent(entry["id"], entry["line"], entry["reason"])
    return marked


@dataclass
class MutationReport:
    assignment: str
    reference_score: float
    max_score: float
    mutants: List[Mutant]
    killed: List[Mutant]
    equivalent: List[Tuple[Mutant, Equivalent]]
    survived: List[Mutant]
    stale: List[Equivalent]   # marked equivalent, but no such mutant (or another line) now
    seeds: int = 1            # copies of each mutant handed in, each with its own TEST_SEED
    kept_full_marks: Dict[str, int] = field(default_factory=dict)  # survivor id -> copies
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.survived and not self.stale


def classify(assignment: str, mutants: List[Mutant],
             scores: Dict[str, List[Optional[float]]], reference: float, max_score: float,
             marked: Dict[str, Equivalent]) -> MutationReport:
    """Sort mutants by what grading them gave: ``scores`` holds each mutant's scores by id,
    one per copy handed in (None: not graded normally -- an error, a time-out -- which
    kills that copy too). A mutant is killed when every copy is."""
    killed, equivalent, survived = [], [], []
    full = {}  # mutant id -> how many of its copies kept full marks
    for mutant in mutants:
        copies = scores.get(mutant.id) or [None]
        full[mutant.id] = sum(score is not None and score >= reference for score in copies)
        if full[mutant.id] == 0:
            killed.append(mutant)
        elif mutant.id in marked and marked[mutant.id].line == mutant.original:
            equivalent.append((mutant, marked[mutant.id]))
        else:
            survived.append(mutant)
    by_id = {m.id: m for m in mutants}
    stale = [e for i, e in marked.items()
             if i not in by_id or by_id[i].original != e.line
             or by_id[i] not in [m for m, _ in equivalent]]
    seeds = max((len(copies) for copies in scores.values()), default=1)
    return MutationReport(assignment, reference, max_score, mutants, killed, equivalent,
                          survived, stale, seeds=seeds,
                          kept_full_marks={m.id: full[m.id] for m in survived})


def format_report(report: MutationReport) -> str:
    seeds = "" if report.seeds == 1 else f", each handed in {report.seeds} times"
    lines = [f"{report.assignment}: {len(report.mutants)} mutants of the reference answers "
             f"({report.reference_score:g}/{report.max_score:g} points{seeds}): "
             f"{len(report.killed)} killed, {len(report.equivalent)} equivalent, "
             f"{len(report.survived)} survived ({report.seconds:.1f} s)"]
    if report.survived:
        lines.append("Survivors (full marks although changed: a rule no test checks, or an "
                     f"equivalent mutant to mark in {EQUIVALENT_FILE}):")
        for mutant in report.survived:
            kept = report.kept_full_marks.get(mutant.id, report.seeds)
            seeds = ("" if kept == report.seeds else
                     f"  [full marks for {kept} of {report.seeds} seeds: a seeded case only]")
            lines.append(f"  {mutant.id}  line {mutant.line}: {mutant.original}{seeds}")
            lines.append(f"      {mutant.operator}: {mutant.changed}")
    for entry in report.stale:
        lines.append(f"Stale entry in {EQUIVALENT_FILE}: {entry.id} ({entry.line!r}) is no "
                     "surviving mutant of the current answers; remove or update it")
    return "\n".join(lines)


def run_mutants(course_dir: Path, assignment: str, runner, options,
                progress=None, seeds: int = 1) -> MutationReport:
    """Make every mutant of ``assignment``'s answer cells, grade ``seeds`` copies of each
    (and of the reference answers) with ``runner`` (a :class:`~autograder.pipeline.grade.LocalRunner`)
    and sort them. ``options`` as for ``grade``; the course and the mutants' folder are
    hidden from the kernels as ``grade`` hides them."""
    if seeds < 1:
        raise ValueError(f"seeds must be at least 1, got {seeds}")
    import dataclasses
    import tempfile
    import time

    import nbformat

    from autograder.layout import Course, find_submissions

    start = time.perf_counter()
    course = Course.discover(course_dir)
    sources = course.source_notebooks(assignment)
    marked = read_equivalents(course.assignment_path(assignment))
    mutants: List[Mutant] = []
    handed: Dict[str, object] = {}  # student id -> (notebook name, notebook)
    for name, source in sorted(sources.items()):
        answers = answer_cells(source.notebook)
        released = source.graded_view
        solved = {cell: solution_code(source) for cell, source in answers.items()}
        for copy_number in range(seeds):
            handed[f"reference-{name}-{copy_number}"] = (
                name, another_copy(handed_in(released, solved), copy_number))
        for cell, source in answers.items():
            for mutant in mutants_of(cell, source):
                mutants.append(mutant)
                for copy_number in range(seeds):
                    handed[f"mutant-{len(mutants):04d}-{copy_number}"] = (
                        name, another_copy(handed_in(released, {**solved, cell: mutant.code}),
                                           copy_number))
    runner.prepare(sources)
    with tempfile.TemporaryDirectory(prefix="mutants-") as folder:
        submitted = Path(folder)
        for student, (name, nb) in handed.items():
            target = submitted / student / assignment / f"{name}.ipynb"
            target.parent.mkdir(parents=True)
            nbformat.write(nb, str(target))
        options = runner.resolve(dataclasses.replace(
            options, hidden=tuple(options.hidden) + (str(course.root), str(submitted))))
        results = runner.grade(find_submissions(submitted, assignment, notebooks=list(sources)),
                               sources, options, on_result=progress)
    by_student: Dict[str, List] = {}
    for result in results:
        by_student.setdefault(result.submission.student_id, []).append(result)

    def score(student: str) -> Optional[float]:
        graded = by_student.get(student, [])
        if not graded or any(r.status != "graded" for r in graded):
            return None
        return sum(r.score for r in graded)

    references = [s for s in handed if s.startswith("reference-") and s.endswith("-0")]
    reference = sum(score(s) or 0.0 for s in references)
    max_score = sum(r.max_score for s in references for r in by_student.get(s, []))
    every_reference = [s for s in handed if s.startswith("reference-")]
    if any(score(s) is None for s in every_reference):
        raise ValueError(f"the reference answers of {assignment!r} were not graded normally: "
                         + "; ".join(r.message for s in every_reference
                                     for r in by_student.get(s, [])))
    for copy_number in range(1, seeds):
        again = sum(score(s[:-1] + str(copy_number)) for s in references)
        if again != reference:
            raise ValueError(f"the reference answers of {assignment!r} scored {reference:g} "
                             f"with one TEST_SEED and {again:g} with another: a test that "
                             "depends on the seed fails correct answers")
    scores = {m.id: [score(f"mutant-{i:04d}-{c}") for c in range(seeds)]
              for i, m in enumerate(mutants, 1)}
    report = classify(assignment, mutants, scores, reference, max_score, marked)
    report.seconds = time.perf_counter() - start
    return report
