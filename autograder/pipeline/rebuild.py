"""Rebuild a submission into the notebook that is actually run: trusted parts plus answers.

The learner owns exactly one thing in a notebook: the *source* of its solution cells
(and any cells they added). Everything else comes from the instructor's reference
(:attr:`autograder.layout.SourceNotebook.graded_view`):

* test cells and read-only cells are the instructor's, hidden tests included, whatever
  the submission says; edited ones are restored, deleted ones put back, duplicates
  dropped;
* the known cells run in the reference's order, whatever order the submission has them
  in (a learner who moved cells neither loses nor gains points); a cell of the learner's
  own stays right after the known cell it followed in the submission;
* an answer cell that appears more than once (Jupyter copies a cell's metadata with
  it) is graded in the copy the learner wrote in (the last, if several); the other
  copies they wrote in stay where they were, as the learner's own cells, and copies that
  still hold the released stub are left out;
* an answer cell whose metadata is gone (deleted, and the answer typed into a fresh
  cell) is re-created from the learner's own cells in its place, between the known
  cells around it, when they define every name its released stub defines and nothing
  the instructor's cells define (:func:`_recreated_answers`); the stub is then not put
  back, so it never runs after the learner's definitions;
* cell metadata is the reference's for known cells and empty for the learner's own, so
  tags a learner added (``skip-execution``, ``raises-exception``, ``parameters``,
  ``injected-parameters``...) have no effect; outputs are cleared;
* two cells go on top: a ``parameters`` cell with the device and run profile (papermill
  injects the real values after it) and a setup cell that applies them to the
  environment before any of the notebook runs;
* GPU-only test cells (``grade_id`` ending in ``_gpu``) are tagged ``skip-execution``
  when the device is the CPU, and reported as skipped.
* read-only cells the instructor tagged ``skip-when-grading`` (an ungraded part that only
  measures or shows, and costs time in every kernel) are tagged ``skip-execution``, and
  are not part of the trusted checks' setup code.
* a test cell split at ``### CHECKS`` keeps only its probe, followed by the report of
  the values its checks read (:mod:`.checks`); the checks themselves never reach the
  kernel;
* right after the read-only cell that assigns ``TEST_SEED``, a cell sets this run's seed.

The result also lists the test cells to judge, by the cell id given to each here.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional

import nbformat
from nbformat.v4 import new_notebook

from autograder.pipeline.checks import SEED_NAME, assigns_seed, probe_source, setup_names, split_test
from autograder.pipeline.speed import DeclarationError, SpeedTest, clean_source, declaration
from autograder.options import CPU, DEVICES, PROFILES, QUICK

GPU_SUFFIX = "_gpu"
HIDDEN_BEGIN, HIDDEN_END = "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"
# Tags with a meaning to papermill or nbclient: only the grader may set them.
CONTROL_TAGS = {"parameters", "injected-parameters", "skip-execution", "raises-exception",
                "papermill-error-cell-tag"}
KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
# The instructor's tag for a read-only cell the grader does not run (a learner's copy of
# the tag has no effect: known cells get the reference's metadata, the learner's own none).
SKIP_WHEN_GRADING = "skip-when-grading"
# The ids of the cells the grader puts in: two on top, and one after the cell that assigns
# TEST_SEED (none of them is the learner's or the course's: see added_by_the_grader).
PARAMETERS_ID, SETUP_ID, SEED_ID = "autograder-parameters", "autograder-setup", "seed-{}"


@dataclass(frozen=True)
class TestCell:
    """An autograded test cell of the rebuilt notebook."""
    __test__ = False  # not a pytest test class
    grade_id: str
    points: float
    cell_id: str
    hidden: bool     # it contains hidden tests (their text must not reach the learner)
    gpu_only: bool
    skipped: bool    # not run on this device
    checks: Optional[str] = None  # run by the grader on the probe's report (see .checks)
    visible_source: str = ""      # what learners were shown of the cell
    speed: Optional[SpeedTest] = None  # a speed test: timed by the grader (see .speed)


@dataclass(frozen=True)
class ManualCell:
    """A cell graded by a person (a written answer), with whether it was answered."""
    grade_id: str
    points: float
    answered: bool


@dataclass
class Rebuilt:
    notebook: nbformat.NotebookNode
    tests: List[TestCell]
    manual: List[ManualCell] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)  # what was restored or dropped, and why
    answered: Dict[str, bool] = field(default_factory=dict)  # answer cell -> changed from stub
    setup_code: str = ""  # the instructor's read-only code cells, for the trusted checks
    seed: int = 0         # this run's TEST_SEED

    @property
    def max_score(self) -> float:
        return sum(t.points for t in self.tests if not t.skipped)


def _nbgrader(cell) -> dict:
    meta = cell.get("metadata", {}).get("nbgrader")
    return meta if isinstance(meta, dict) else {}


def grade_id_of(cell) -> Optional[str]:
    gid = _nbgrader(cell).get("grade_id")
    return gid if isinstance(gid, str) and gid else None


def is_test(cell) -> bool:
    """An autograded test: a graded code cell that is not an answer."""
    meta = _nbgrader(cell)
    return cell.get("cell_type") == "code" and bool(meta.get("grade")) and not meta.get("solution")


def is_answer(cell) -> bool:
    return bool(_nbgrader(cell).get("solution"))


def is_setup(cell) -> bool:
    """A read-only code cell of the instructor's (helpers, imports): trusted code."""
    return (cell.get("cell_type") == "code" and grade_id_of(cell) is not None
            and not is_test(cell) and not is_answer(cell))


def skipped_when_grading(cell) -> bool:
    """A read-only code cell the instructor tagged ``skip-when-grading``."""
    return is_setup(cell) and SKIP_WHEN_GRADING in cell.get("metadata", {}).get("tags", [])


def added_by_the_grader(cell) -> bool:
    """A cell of a rebuilt notebook that the grader put in (its parameters, its setup, this
    run's seed): neither the learner's nor the course's."""
    cell_id = cell.get("id", "")
    return cell_id in (PARAMETERS_ID, SETUP_ID) or cell_id.startswith(SEED_ID.format(""))


def is_manual(cell) -> bool:
    """Graded by a person: a graded answer cell, a graded markdown cell or a task."""
    meta = _nbgrader(cell)
    return bool(meta.get("task")) or (bool(meta.get("grade")) and not is_test(cell))


def visible_part(source: str) -> str:
    """A test cell's source without its hidden-tests region (what learners were given)."""
    lines, hiding = [], False
    for line in source.splitlines():
        if HIDDEN_BEGIN in line:
            hiding = True
        elif HIDDEN_END in line:
            hiding = False
        elif not hiding:
            lines.append(line)
    return "\n".join(lines)


def _strip_control_tags(metadata: dict) -> dict:
    metadata = copy.deepcopy(dict(metadata))
    tags = [t for t in metadata.get("tags", []) if t not in CONTROL_TAGS]
    if tags:
        metadata["tags"] = tags
    else:
        metadata.pop("tags", None)
    metadata.pop("papermill", None)
    return metadata


def _fresh(cell_type: str, source: str, metadata: dict, attachments=None):
    node = {"cell_type": cell_type, "source": source, "metadata": metadata}
    if cell_type == "code":
        node.update(outputs=[], execution_count=None)
    if attachments and cell_type in ("markdown", "raw"):
        node["attachments"] = copy.deepcopy(attachments)
    return nbformat.from_dict(node)


def _trusted(reference_cell):
    """A copy of a reference cell (read-only, test or a put-back answer stub)."""
    return _fresh(reference_cell.cell_type, reference_cell.source,
                  _strip_control_tags(reference_cell.metadata), reference_cell.get("attachments"))


def _answer(reference_cell, learner_cell):
    """The learner's source in the reference's cell type, with the reference's metadata."""
    source = learner_cell.get("source", "")
    if isinstance(source, list):
        source = "".join(source)
    return _fresh(reference_cell.cell_type, source, _strip_control_tags(reference_cell.metadata),
                  learner_cell.get("attachments"))


def _learners_own(cell):
    """A cell the learner added: kept, but with no metadata (so no tags) and no outputs."""
    cell_type = cell.get("cell_type")
    if cell_type not in ("code", "markdown", "raw"):
        return None
    source = cell.get("source", "")
    if isinstance(source, list):
        source = "".join(source)
    return _fresh(cell_type, source, {}, cell.get("attachments"))


def _source(cell) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def _graded_copies(cells: List[dict], ref_cells: Dict[str, object],
                   notes: List[str]) -> Dict[str, int]:
    """For each answer id that several cells carry (Jupyter copies a cell's metadata with
    it), the index of the copy to grade: the one the learner worked in, i.e. whose source
    differs from the released stub; of several, the last (nbgrader keeps the last too).
    The other copies the learner wrote in stay, as the learner's own cells; copies that
    still hold the stub are left out (they hold nothing of the learner's, and running
    them after the work would undo it)."""
    copies: Dict[str, List[int]] = {}
    for index, cell in enumerate(cells):
        gid = grade_id_of(cell)
        if gid in ref_cells and is_answer(ref_cells[gid]):
            copies.setdefault(gid, []).append(index)
    chosen = {}
    for gid, indices in copies.items():
        if len(indices) == 1:
            continue
        stub = ref_cells[gid].source.strip()
        worked = [i for i in indices if _source(cells[i]).strip() != stub]
        chosen[gid] = (worked or indices)[-1]
        notes.append(f"answer cell {gid!r} appears {len(indices)} times: graded copy "
                     f"{indices.index(chosen[gid]) + 1} of {len(indices)}"
                     + (", the one you wrote in" if len(worked) == 1 else
                        ", the last one you wrote in" if worked else "")
                     + ("; the other copies ran as cells of your own" if len(worked) > 1
                        else "; the other copies still held the given code and were left out"))
    return chosen


# Cell magics whose body is ordinary Python run in the namespace (for reading its names).
PYTHON_CELL_MAGICS = ("%%time", "%%timeit", "%%capture", "%%prun")


def _python(source: str):
    """The syntax tree of a cell's code as IPython runs it (magics and shell commands
    rewritten, the line of a cell magic whose body is Python dropped), or ``None``."""
    from IPython.core.inputtransformer2 import TransformerManager

    from autograder.pipeline.checks import parse
    lines = source.replace("\r\n", "\n").split("\n")
    if lines and lines[0].split(" ")[0].strip() in PYTHON_CELL_MAGICS:
        lines = lines[1:]
    try:
        return parse(TransformerManager().transform_cell("\n".join(lines)))
    except (SyntaxError, ValueError):
        return None


def top_level_names(source: str) -> Optional[Dict[str, str]]:
    """What a cell's code defines at top level: name -> how (``import`` plus the module
    for imports, ``define`` otherwise); ``None`` when it is not Python even after IPython's
    own rewriting of magics and shell commands (``%time``, ``!pip``)."""
    import ast

    from autograder.pipeline.checks import bound_names
    tree = _python(source)
    if tree is None:
        return None
    names: Dict[str, str] = {}
    for statement in tree.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[statement.name] = "define"
        elif isinstance(statement, ast.Import):
            for alias in statement.names:
                names[(alias.asname or alias.name).split(".")[0]] = (
                    f"import {alias.name}" if alias.asname else
                    f"import {alias.name.split('.')[0]}")
        elif isinstance(statement, ast.ImportFrom):
            for alias in statement.names:
                names[alias.asname or alias.name] = (
                    f"from {'.' * statement.level}{statement.module} import {alias.name}")
        else:
            for name in bound_names(statement):
                names.setdefault(name, "define")
    return names


def _statements(source: str) -> set:
    """The top-level statements of a test cell that do something (not imports or
    definitions), as syntax trees: what a copied test cell repeats."""
    import ast
    tree = _python(source)
    if tree is None:
        return set()
    return {ast.dump(s) for s in tree.body
            if not isinstance(s, (ast.Import, ast.ImportFrom, ast.FunctionDef,
                                  ast.AsyncFunctionDef, ast.ClassDef, ast.Pass))
            and not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))}


def _listing(names) -> str:
    names = sorted(names)
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _recreated_answers(cells: List[dict], own: List[tuple], found: Dict[str, object],
                       ref_cells: Dict[str, object], ref_order: List[str],
                       notes: List[str]) -> Dict[str, List[int]]:
    """For each answer cell the submission lacks: the indices (in ``cells``) of the
    learner's own cells to grade as that answer, when they stand in its place and define
    what it defines.

    ``own`` lists ``(index, cell)`` of the learner's own code cells. The place of a
    missing answer is between the nearest known cells around it in the assignment's
    order, where the submission has them; without any known cell nothing is taken
    (there is nothing to tell that place by). The cells taken must together define every
    name the released stub defines at top level, and none of the names the instructor's
    read-only and test cells define (their helpers) other than by the same import; a cell
    that repeats a statement of a test cell is a copied test and is never taken. Each
    answer is noted, taken or not.
    """
    import ast
    missing = [gid for gid in ref_order if gid not in found and is_answer(ref_cells[gid])]
    if not missing or not own:  # the usual submission: every answer cell in place
        return {}
    index_of = {id(cell): index for index, cell in enumerate(cells)}
    position = {gid: index_of[id(cell)] for gid, cell in found.items()}
    trusted: Dict[str, str] = {}
    test_statements: set = set()
    for gid in ref_order:
        ref = ref_cells[gid]
        if is_setup(ref):
            trusted.update(top_level_names(ref.source) or {})
        elif is_test(ref):
            test_statements |= _statements(ref.source)
            tree = _python(ref.source)
            trusted.update({s.name: "define" for s in (tree.body if tree else []) if isinstance(
                s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))})
    taken: Dict[str, List[int]] = {}
    used: set = set()
    for at, gid in enumerate(ref_order):
        if gid not in missing:
            continue
        wanted = set(top_level_names(ref_cells[gid].source) or {})
        before = [position[g] for g in ref_order[:at] if g in position]
        after = [position[g] for g in ref_order[at + 1:] if g in position]
        if not wanted or not (before or after):
            continue
        low = before[-1] if before else -1
        high = after[0] if after else len(cells)
        defining, defined = [], set()
        for index, cell in own:
            names = top_level_names(_source(cell)) or {}
            if low < index < high and index not in used and wanted & set(names):
                defining.append((index, names))
                defined |= set(names)
        if not defining:
            continue
        numbers = _listing(str(index + 1) for index, _ in defining)
        several = len(defining) > 1
        what = f"your cell{'s' if several else ''} {numbers} in its place"
        verb = (lambda word: word if several else word + "s")  # they define, it defines
        helpers = {name for _, names in defining for name, how in names.items()
                   if name in trusted and name not in wanted
                   and (how == "define" or how != trusted[name])}  # the same import is fine
        copied = any(_statements(_source(cells[index])) & test_statements
                     for index, _ in defining)
        if not wanted <= defined:
            notes.append(f"answer cell {gid!r} was missing: {what} {verb('define')} "
                         f"{_listing(defined & wanted)} but not {_listing(wanted - defined)}, "
                         "so it was graded as unanswered")
        elif helpers or copied:
            why = (f"also {verb('redefine')} {_listing(helpers)} of the given code" if helpers
                   else f"{verb('repeat')} the code of a test cell")
            notes.append(f"answer cell {gid!r} was missing: {what} {verb('define')} "
                         f"{_listing(wanted)} but {why}, so it was graded as unanswered")
        else:
            taken[gid] = [index for index, _ in defining]
            used.update(taken[gid])
            notes.append(f"answer cell {gid!r} was missing (its nbgrader metadata was gone): "
                         f"graded {what}, which {verb('define')} {_listing(wanted)}, the "
                         f"name{'s' if len(wanted) > 1 else ''} that cell asks for")
    return taken


def parameters_cell(device: str = CPU, profile: str = QUICK):
    source = ("# The run's device and profile; papermill injects the values used below this cell.\n"
              f"autograder_device = {device!r}\nautograder_profile = {profile!r}")
    return _fresh("code", source, {"tags": ["parameters"]})


SETUP_SOURCE = """\
# Set by the autograder before any of the notebook runs.
import os as _autograder_os
_autograder_os.environ["DLPERF_PROFILE"] = autograder_profile
if autograder_device == "cpu":
    _autograder_os.environ["CUDA_VISIBLE_DEVICES"] = ""  # this run judges CPU behaviour
del _autograder_os"""


def speed_tests_of(reference: nbformat.NotebookNode) -> Dict[str, SpeedTest]:
    """grade id -> the speed test each test cell of ``reference`` declares; raises
    :class:`~autograder.pipeline.speed.DeclarationError` for one that cannot be used, so the
    instructor hears of it before any submission is graded."""
    found = {}
    for cell in reference.cells:
        if is_test(cell):
            try:
                speed = declaration(cell.source)
            except DeclarationError as error:
                raise DeclarationError(f"test cell {grade_id_of(cell)!r}: {error}") from None
            if speed is not None:
                found[grade_id_of(cell)] = speed
    return found


def rebuild(reference: nbformat.NotebookNode, submitted: nbformat.NotebookNode, *,
            device: str = CPU, profile: str = QUICK, seed: int = 0) -> Rebuilt:
    """The notebook to run for ``submitted``, built on ``reference`` (the graded view)."""
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {PROFILES}, got {profile!r}")
    ref_cells: Dict[str, object] = {}
    ref_order: List[str] = []
    for cell in reference.cells:
        gid = grade_id_of(cell)
        if gid and gid not in ref_cells:
            ref_cells[gid] = cell
            ref_order.append(gid)

    notes: List[str] = []
    submitted_cells = [cell for cell in submitted.get("cells", []) if isinstance(cell, dict)]
    graded_copy = _graded_copies(submitted_cells, ref_cells, notes)
    # Each known cell once, in the assignment's order; a learner's own cell goes right
    # after the known cell it followed in the submission (None: before all of them).
    found: Dict[str, object] = {}
    own: List[tuple] = []  # (index in the submission, the known cell before it, the cell)
    previous: Optional[str] = None
    seen_order: List[str] = []
    for index, cell in enumerate(submitted_cells):
        gid = grade_id_of(cell)
        if gid in ref_cells and graded_copy.get(gid, index) == index and gid not in found:
            found[gid] = cell
            seen_order.append(gid)
            previous = gid
        elif gid in ref_cells and not is_answer(ref_cells[gid]):
            notes.append(f"dropped a duplicate of cell {gid!r}")
        elif gid in ref_cells and _source(cell).strip() == ref_cells[gid].source.strip():
            continue  # another copy of an answer, still the released stub: nothing of theirs
        else:  # the learner's own, or another copy of an answer they wrote in
            own.append((index, previous, cell))
    if seen_order != [gid for gid in ref_order if gid in found]:
        notes.append("the cells were not in the assignment's order: its order was restored "
                     "(cells of your own stay after the cell they followed)")
    recreated = _recreated_answers(
        submitted_cells, [(i, c) for i, _, c in own if c.get("cell_type") == "code"
                          and grade_id_of(c) not in ref_cells],
        found, ref_cells, ref_order, notes)
    taken = {index for indices in recreated.values() for index in indices}
    own_after: Dict[Optional[str], List[object]] = {}
    for index, after, cell in own:
        kept = _learners_own(cell) if index not in taken else None
        if kept is not None:
            own_after.setdefault(after, []).append(kept)

    body: List[tuple] = [(None, own) for own in own_after.get(None, [])]  # (grade_id, cell)
    for gid in ref_order:
        ref = ref_cells[gid]
        cell = found.get(gid)
        if cell is None and gid in recreated:  # the learner's own cells, in its place
            source = "\n\n".join(_source(submitted_cells[i]).strip("\n")
                                   for i in recreated[gid])
            body.append((gid, _answer(ref, {"source": source})))
        elif cell is None:
            if is_test(ref):
                notes.append(f"test cell {gid!r} was missing: the original was put back")
            elif is_answer(ref) and not any(note.startswith(f"answer cell {gid!r} was missing")
                                            for note in notes):
                notes.append(f"answer cell {gid!r} was missing: graded as unanswered")
            body.append((gid, _trusted(ref)))
        elif is_answer(ref):
            body.append((gid, _answer(ref, cell)))
        else:
            if is_test(ref):
                given = cell.get("source", "")
                given = "".join(given) if isinstance(given, list) else given
                if given.strip() not in (visible_part(ref.source).strip(), ref.source.strip()):
                    notes.append(f"test cell {gid!r} was edited: the original was used")
            body.append((gid, _trusted(ref)))
        body.extend((None, own) for own in own_after.get(gid, []))

    cells = [parameters_cell(device, profile), _fresh("code", SETUP_SOURCE, {})]
    cells[0]["id"], cells[1]["id"] = PARAMETERS_ID, SETUP_ID
    setup_code = "\n\n".join(ref.source for gid, ref in ref_cells.items()
                             if is_setup(ref) and not skipped_when_grading(ref))
    known = setup_names(setup_code)
    tests: List[TestCell] = []
    manual: List[ManualCell] = []
    answered: Dict[str, bool] = {}
    for number, (gid, cell) in enumerate(body):
        cell["id"] = f"cell-{number}"
        if gid is None:
            cells.append(cell)
            continue
        ref = ref_cells[gid]
        points = float(_nbgrader(ref).get("points", 0) or 0)
        if skipped_when_grading(ref):
            cell.metadata.setdefault("tags", []).append("skip-execution")
        if is_test(ref):
            gpu_only = gid.endswith(GPU_SUFFIX)
            skipped = gpu_only and device != "cuda"
            if skipped:
                cell.metadata.setdefault("tags", []).append("skip-execution")
            cell["id"] = f"test-{number}"
            speed = declaration(ref.source)
            if speed is not None:
                speed = replace(speed, clean_source=clean_source(setup_code, ref.source,
                                                                 speed.candidate))
            if speed is not None and device not in speed.points and not skipped:
                # No schedule for this device: its points are not at stake. (A GPU-only speed
                # test is skipped off CUDA already, and a tag may appear once only.)
                skipped = True
                cell.metadata.setdefault("tags", []).append("skip-execution")
            split = split_test(ref.source, known) if speed is None else None
            if split is not None:
                cell.source = probe_source(split)  # the checks stay with the grader
            tests.append(TestCell(gid, points, cell["id"], HIDDEN_BEGIN in ref.source,
                                  gpu_only, skipped, split.checks if split else None,
                                  visible_part(ref.source), speed))
        if is_setup(ref) and assigns_seed(ref.source):
            cells.append(cell)
            seed_cell = _fresh("code", f"{SEED_NAME} = {int(seed)}  # this run's test inputs", {})
            seed_cell["id"] = SEED_ID.format(number)
            cells.append(seed_cell)
            continue
        if is_answer(ref) or is_manual(ref):
            from nbgrader.utils import compute_checksum
            stub = _nbgrader(ref).get("checksum")
            answered[gid] = stub is None or compute_checksum(cell) != stub
            if is_manual(ref):
                manual.append(ManualCell(gid, points, answered[gid]))
        cells.append(cell)

    nb = new_notebook(cells=cells, metadata={"kernelspec": dict(KERNELSPEC),
                                             "language_info": {"name": "python"}})
    nbformat.validate(nb)
    return Rebuilt(notebook=nb, tests=tests, manual=manual, notes=notes, answered=answered,
                   setup_code=setup_code, seed=int(seed))
