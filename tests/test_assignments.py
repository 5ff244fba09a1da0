"""The nbgrader assignments: solutions/ (source step) and exercises/ (release step).

Fast tests read the notebooks: the release is exactly what `nbgrader generate_assignment` makes of
the solutions, it holds no solution and no hidden test, and the solution notebooks follow the
conventions the grading relies on. Integration tests autograde real submissions with nbgrader: the
solutions get full marks, the unedited release gets zero, and the plausible wrong submissions of
tests/wrong_submissions/ that between them fail every test cell any of them fails (``covering``)
lose exactly the points they list (every one of them is graded so by the course's grader).
"""
from __future__ import annotations

import ast
import builtins
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import pytest
import torch

from autograder.pipeline.checks import SEED_NAME, bound_names, setup_names, split_test
from coursebook import assignments as course_assignments

from coursebook.cases import (ASSIGNMENTS, EXERCISES, HIDDEN, ROOT, SOLUTION_BLOCK, SOLUTIONS, WRONG,
                               WRONG_SUBMISSIONS,
                               answer_cells, expected_losses, grade_cells, load_wrong,
                               nbgrader_meta, release_notebook, solution_notebook, submission,
                               unjudged)


# ---------------------------------------------------------------------------------------------
# Helpers


def nbgrader_env() -> dict:
    # nbgrader creates its gradebook by running the `alembic` program it installs next to Python,
    # which it looks up on PATH.
    return dict(os.environ, PATH=str(Path(sys.executable).parent) + os.pathsep
                + os.environ.get("PATH", ""))


def run_nbgrader(course: Path, *args: str, timeout: int = 1200) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=course, env=nbgrader_env(),
                          capture_output=True, text=True, timeout=timeout)


def check(result: subprocess.CompletedProcess, what: str) -> None:
    assert result.returncode == 0, (f"{what} failed (exit {result.returncode}):\n"
                                    f"{result.stdout[-3000:]}\n{result.stderr[-6000:]}")


def new_course(path: Path) -> Path:
    """A throw-away nbgrader course: the repository's configuration and solutions."""
    path.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "nbgrader_config.py", path / "nbgrader_config.py")
    shutil.copytree(SOLUTIONS, path / "solutions")
    return path


def assert_no_outputs(nb, where: str) -> None:
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, (
                f"{where}: a code cell has stored outputs; notebooks are committed without them")


# ---------------------------------------------------------------------------------------------
# Fast tests: the notebooks as committed


def test_every_assignment_has_a_solution_and_a_release():
    # The manifest (assignments/assignments.toml) lists every assignment in solutions/; each has
    # its release, page, wrong submissions and chapters; _toc.yml and the grading workflow are
    # generated from it and up to date. Each problem says what to add or run.
    problems = course_assignments.problems(ROOT)
    assert not problems, "\n".join(problems)
    assert ASSIGNMENTS, "assignments/assignments.toml lists no assignment"
    released = {path.parent.name: path.stem for path in sorted(EXERCISES.glob("*/*.ipynb"))}
    assert released == ASSIGNMENTS, (
        f"exercises/ should hold the release of every assignment in solutions/; "
        f"solutions: {ASSIGNMENTS}, exercises: {released}")


def test_release_is_exactly_what_nbgrader_generates(tmp_path):
    course = new_course(tmp_path / "course")
    check(run_nbgrader(course, "generate_assignment", "*", "--force"),
          "nbgrader generate_assignment '*'")
    generated = sorted(p.relative_to(course / "exercises") for p in (course / "exercises").rglob("*")
                       if p.is_file())
    committed = sorted(p.relative_to(EXERCISES) for p in EXERCISES.rglob("*") if p.is_file())
    assert generated == committed, f"generated files {generated} but exercises/ holds {committed}"
    for relative in generated:
        fresh = nbformat.read(course / "exercises" / relative, as_version=4)
        stored = nbformat.read(EXERCISES / relative, as_version=4)
        assert fresh.metadata == stored.metadata, f"{relative}: notebook metadata differ"
        assert len(fresh.cells) == len(stored.cells), f"{relative}: different numbers of cells"
        for number, (a, b) in enumerate(zip(fresh.cells, stored.cells)):
            assert a == b, (f"exercises/{relative}, cell {number} is not what nbgrader generates "
                            f"from solutions/ (run `nbgrader generate_assignment "
                            f"{relative.parts[0]} --force`):\ngenerated {a}\ncommitted {b}")


@pytest.mark.parametrize("assignment", sorted(ASSIGNMENTS))
def test_release_holds_no_solution_and_no_hidden_test(assignment):
    release = release_notebook(assignment)
    assert_no_outputs(release, f"exercises/{assignment}")
    text = "\n".join(cell.source for cell in release.cells)
    for marker in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"):
        assert marker not in text, f"exercises/{assignment} contains '{marker}'"
    for grade_id, cell in answer_cells(release).items():
        assert "raise NotImplementedError()" in cell.source, (
            f"{grade_id}: the released answer cell should be a stub; it is:\n{cell.source}")
    # No line that only a hidden test or a solution has may appear in the release.
    source = solution_notebook(assignment)
    secret, public = [], []
    for cell in source.cells:
        for block in HIDDEN.findall(cell.source):
            secret += block.splitlines()[1:-1]
        for block in re.findall(r"### BEGIN SOLUTION\n(.*?)### END SOLUTION", cell.source, re.DOTALL):
            secret += block.splitlines()
        public += SOLUTION_BLOCK.sub("", HIDDEN.sub("", cell.source)).splitlines()
    public = {line.strip() for line in public}
    secret = {line.strip() for line in secret if len(line.strip()) > 12} - public
    assert secret, f"{assignment}: found no solution or hidden-test code to look for"
    released_lines = {line.strip() for line in text.splitlines()}
    leaked = sorted(secret & released_lines)
    assert not leaked, f"exercises/{assignment} leaks solution or hidden-test lines: {leaked}"


@pytest.mark.parametrize("assignment", sorted(ASSIGNMENTS))
def test_solution_notebook_follows_the_grading_conventions(assignment):
    nb = solution_notebook(assignment)
    where = f"solutions/{assignment}"
    assert_no_outputs(nb, where)
    ids = [nbgrader_meta(c)["grade_id"] for c in nb.cells if nbgrader_meta(c)]
    assert len(ids) == len(set(ids)), f"{where}: grade ids repeat: {ids}"
    everything = "\n".join(cell.source for cell in nb.cells)
    assert not re.search(r"^\s*(import|from)\s+(dlperf|d2l)\b", everything, re.MULTILINE), (
        f"{where} must stand alone: it may not import dlperf or d2l")
    tests = grade_cells(nb)
    assert tests and answer_cells(nb), f"{where}: no test cells or no answer cells"
    table = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    for grade_id, cell in tests.items():
        meta = nbgrader_meta(cell)
        assert meta.get("locked") and meta.get("points", 0) > 0, f"{grade_id}: locked, with points"
        # The grading table the learner reads lists every test cell with its points.
        row = re.search(rf"^\| `{grade_id}` .*\| (\d+) \|$", table, re.MULTILINE)
        assert row and int(row.group(1)) == meta["points"], (
            f"{where}: the grading table should list `{grade_id}` with {meta['points']} points")
        assert cell.source.count("### BEGIN HIDDEN TESTS") == cell.source.count(
            "### END HIDDEN TESTS") <= 1, f"{grade_id}: unbalanced hidden-test markers"
        tree = ast.parse(cell.source)
        # A bare assert fails with an empty AssertionError: every one must say what went wrong.
        bare = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Assert) and not node.msg]
        assert not bare, f"{grade_id}: asserts without a message on lines {bare}"
        # nbgrader reads a value left by a cell's last expression as partial credit.
        last = tree.body[-1]
        assert not (isinstance(last, ast.Expr) and not (
            isinstance(last.value, ast.Call) and getattr(last.value.func, "id", "") == "print")), (
            f"{grade_id}: the cell ends with an expression, which nbgrader would take as a score")
        if grade_id.endswith("_gpu"):
            assert "torch.cuda.is_available()" in cell.source and "SKIPPED" in cell.source, (
                f"{grade_id}: a GPU cell checks for CUDA and says SKIPPED without it")
        else:
            assert "torch.cuda._sleep" not in cell.source, f"{grade_id}: GPU work outside a _gpu cell"


@pytest.mark.parametrize("assignment", sorted(ASSIGNMENTS))
def test_test_cells_split_into_probe_and_checks(assignment):
    """Each test cell: a probe that runs the learner's code, `### CHECKS`, checks that judge it
    from the setup cells, TEST_SEED and the probe's variables alone (solutions/GRADING.md)."""
    nb = solution_notebook(assignment)
    where = f"solutions/{assignment}"
    setup = [c for c in nb.cells if c.cell_type == "code" and not nbgrader_meta(c).get("grade")
             and not nbgrader_meta(c).get("solution")]
    assert setup and re.search(r"^TEST_SEED = 0\b", setup[0].source, re.MULTILINE), (
        f"{where}: the first setup cell should set TEST_SEED = 0")
    # What the autograder itself counts as known to the checks (autograder.pipeline.checks).
    setup = setup_names("\n\n".join(c.source for c in setup))
    known = setup | set(dir(builtins)) | {SEED_NAME}
    learners = set()  # what the answer cells define at module level
    for cell in answer_cells(nb).values():
        for node in ast.parse(cell.source).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                learners.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.Import, ast.ImportFrom)):
                learners |= bound_names(node)
    for grade_id, cell in grade_cells(nb).items():
        lines = cell.source.splitlines()
        at = [i for i, line in enumerate(lines) if line == "### CHECKS"]
        assert len(at) == 1, f"{grade_id}: needs exactly one line '### CHECKS', has {len(at)}"
        hidden = [i for i, line in enumerate(lines) if "### BEGIN HIDDEN TESTS" in line
                  or "### END HIDDEN TESTS" in line]
        assert not hidden or hidden[0] < at[0] < hidden[-1], (
            f"{grade_id}: '### CHECKS' belongs between the hidden-test markers")
        split = split_test(cell.source, setup)
        probe = ast.parse(split.probe)
        asserts = [node.lineno for node in ast.walk(probe) if isinstance(node, ast.Assert)]
        assert not asserts, f"{grade_id}: the probe decides nothing; it asserts on lines {asserts}"
        checks = ast.parse(split.checks)
        used = {node.id for node in ast.walk(checks)
                if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)} - bound_names(checks)
        assert not used & learners, (
            f"{grade_id}: the checks use what the learner defines: {sorted(used & learners)}")
        shadowed = used & bound_names(probe) & (known - {SEED_NAME})
        assert not shadowed, (
            f"{grade_id}: the probe's {sorted(shadowed)} would not reach the checks: a setup cell or "
            "builtins use the same names")
        missing = set(split.reported) - bound_names(probe)
        assert not missing, f"{grade_id}: the checks read {sorted(missing)}, which the probe never sets"


# Calls that change or draw from state every test in a process shares: a test that makes one
# depends on what ran before it, and changes what runs after it.
GLOBAL_SETTERS = re.compile(
    r"^(torch\.(manual_seed|seed|set_\w+|use_deterministic_algorithms|random\.\w+"
    r"|cuda\.(manual_seed\w*|seed\w*|set_\w+))|random\.(seed|setstate)"
    r"|(np|numpy)\.random\.\w+|warnings\.(filterwarnings|simplefilter|resetwarnings)"
    r"|os\.(environ\.\w+|putenv|unsetenv|chdir)|sys\.setrecursionlimit|setattr)$")
GLOBAL_DRAWS = re.compile(
    r"^(torch\.(rand|randn|randint|randperm|rand_like|randn_like|randint_like|normal"
    r"|bernoulli|multinomial|poisson)|random\.(random|randint|randrange|choice|choices"
    r"|shuffle|sample|uniform|gauss))$")


def dotted(node: ast.AST) -> str:
    """``torch.cuda.manual_seed`` for the function of such a call; "" for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = dotted(node.value)
        return f"{inner}.{node.attr}" if inner else ""
    return ""


def global_state_calls(source: str) -> list:
    """(line, call) for each call in ``source`` that sets process-wide state, or draws
    random numbers from a global generator (no ``generator=`` of its own)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        name = dotted(node.func)
        own_generator = any(k.arg == "generator" for k in node.keywords)
        if GLOBAL_SETTERS.match(name) or (GLOBAL_DRAWS.match(name) and not own_generator):
            found.append((node.lineno, name))
    return found


def test_global_state_calls_are_found():
    source = ("torch.manual_seed(0)\ntorch.set_default_dtype(torch.float64)\n"
              "x = torch.randn(3)\ny = torch.randn(3, generator=gen)\n"
              "random.seed(1)\nrng = random.Random(TEST_SEED)\nrng.randint(1, 2)\n"
              "warnings.simplefilter('ignore')\nos.environ.setdefault('A', '1')\n")
    assert [name for _, name in global_state_calls(source)] == [
        "torch.manual_seed", "torch.set_default_dtype", "torch.randn", "random.seed",
        "warnings.simplefilter", "os.environ.setdefault"]


@pytest.mark.parametrize("assignment", sorted(ASSIGNMENTS))
def test_test_cells_leave_process_wide_state_alone(assignment):
    """The checks of many submissions must not see each other: a test cell (probe, checks)
    and the setup cells the checks run on use generators of their own (torch.Generator,
    random.Random) and set nothing process-wide (solutions/GRADING.md)."""
    nb = solution_notebook(assignment)
    setup = [c for c in nb.cells if c.cell_type == "code" and not nbgrader_meta(c).get("grade")
             and not nbgrader_meta(c).get("solution")]
    cells = {**grade_cells(nb), **{f"setup cell {i}": c for i, c in enumerate(setup)}}
    for name, cell in cells.items():
        calls = global_state_calls(cell.source)
        assert not calls, (f"solutions/{assignment}, {name}: process-wide state at (line, call) "
                           f"{calls}; use torch.Generator().manual_seed(TEST_SEED) or "
                           "random.Random(TEST_SEED) and pass it along")


@pytest.mark.parametrize("path", WRONG, ids=[f"{p.parent.name}/{p.stem}" for p in WRONG])
def test_wrong_submission_file_is_well_formed(path):
    case = load_wrong(path)
    assert case.get("assignment") == path.parent.name, f"{path}: assignment must name its folder"
    assert case.get("mistake", "").strip(), f"{path}: say what the mistake is"
    nb = solution_notebook(case["assignment"])
    answers, tests = answer_cells(nb), grade_cells(nb)
    assert case.get("answers") and set(case["answers"]) <= set(answers), (
        f"{path}: [answers] must name answer cells among {sorted(answers)}")
    for table in ("loses", "loses_with_gpu", "loses_without_gpu"):
        for grade_id, points in case.get(table, {}).items():
            assert grade_id in tests, f"{path}: [{table}] names {grade_id}, not a test cell"
    for cuda in (False, True):
        losses = expected_losses(case, cuda)
        assert losses, f"{path}: a wrong submission must lose something"
        for grade_id, points in losses.items():
            assert 0 < points <= nbgrader_meta(tests[grade_id])["points"], (
                f"{path}: cannot lose {points} points on {grade_id}")


def test_wrong_submissions_cover_every_assignment():
    covered = {load_wrong(path)["assignment"] for path in WRONG}
    assert covered == set(ASSIGNMENTS), f"wrong submissions cover {covered}, not all of {ASSIGNMENTS}"


# ---------------------------------------------------------------------------------------------
# Integration tests: autograde with nbgrader


def covering(paths) -> list:
    """Wrong submissions among ``paths`` that between them lose points on every test cell that
    any of them loses on (with or without a GPU), chosen greedily, most new cells first.

    nbgrader's own ``autograde`` grades these, so every hidden test's failing path runs under
    nbgrader at least once; the exact losses of every wrong submission are the course's
    grader's test (tests/test_autograder_assignments.py), which runs the same cells. Grading
    all of them here took half of this file's time (a fresh kernel and PyTorch import each).
    """
    cells = {path: set(expected_losses(case, False)) | set(expected_losses(case, True))
             for path, case in ((path, load_wrong(path)) for path in paths)}
    chosen, left = [], set().union(*cells.values())
    while left:
        best = max(paths, key=lambda path: len(cells[path] & left))  # the first of the best
        chosen.append(best)
        left -= cells[best]
    return sorted(chosen)


NO_SYNCHRONIZE = WRONG_SUBMISSIONS / "benchmark" / "no_synchronize.toml"
NBGRADED_WRONG = sorted({path for assignment in ASSIGNMENTS
                         for path in covering([p for p in WRONG if p.parent.name == assignment])}
                        | {NO_SYNCHRONIZE})  # and the one the GPU test below reads


class Graded(dict):
    """{assignment: {student: {grade_id: (score, max_score)}}}, with each course directory."""

    def __init__(self, scores: dict, courses: dict):
        super().__init__(scores)
        self.courses = courses


@pytest.fixture(scope="session")
def graded(tmp_path_factory) -> Graded:
    """Autograde, per assignment, the solution, the unedited release and the wrong submissions
    of NBGRADED_WRONG.

    The assignments are graded as many at a time as there are cores, each in a course directory
    (and gradebook) of its own: more at once only waits longer for the CPU, and a kernel that
    waits a minute to start fails nbgrader's run. Where nbgrader is not installed (the offline GPU machines: scripts/gpu-run grades
    the same cases there with the course's own grader), the tests that need it are skipped.
    """
    pytest.importorskip("nbgrader", reason="nbgrader is not installed here")
    from nbgrader.api import Gradebook

    base = tmp_path_factory.mktemp("nbgrader")
    courses = {}
    # Every course's release generated at the same time (each run mostly starts nbgrader).
    with ThreadPoolExecutor(max_workers=len(ASSIGNMENTS)) as pool:
        generated = {assignment: pool.submit(run_nbgrader, new_course(base / assignment),
                                             "generate_assignment", assignment, "--force")
                     for assignment in ASSIGNMENTS}
    for assignment, done in generated.items():
        check(done.result(), f"nbgrader generate_assignment {assignment}")
    for assignment, notebook in ASSIGNMENTS.items():
        course = courses[assignment] = base / assignment
        students = {"solution": solution_notebook(assignment),
                    "unedited": nbformat.read(course / "exercises" / assignment / f"{notebook}.ipynb",
                                              as_version=4)}
        for path in NBGRADED_WRONG:
            case = load_wrong(path)
            if case["assignment"] == assignment:
                students[case["student"]] = submission(assignment, case["answers"])
        for student, nb in students.items():
            folder = course / "submitted" / student / assignment
            folder.mkdir(parents=True)
            nbformat.write(nb, folder / f"{notebook}.ipynb")
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        runs = {assignment: pool.submit(
            subprocess.run, [sys.executable, "-m", "nbgrader", "autograde", assignment, "--force"],
            cwd=courses[assignment], env=nbgrader_env(), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, timeout=1800) for assignment in ASSIGNMENTS}
    scores = {}
    for assignment, run in runs.items():
        done = run.result()
        assert done.returncode == 0, (
            f"nbgrader autograde {assignment} failed:\n{done.stdout[-6000:]}")
        notebook = ASSIGNMENTS[assignment]
        with Gradebook(f"sqlite:///{courses[assignment] / 'gradebook.db'}") as gradebook:
            scores[assignment] = {
                student.id: {grade.name: (grade.score, grade.max_score)
                             for grade in gradebook.find_submission_notebook(
                                 notebook, assignment, student.id).grades}
                for student in gradebook.students}
    return Graded(scores, courses)


def autograded_notebook(graded, assignment: str, student: str):
    path = (graded.courses[assignment] / "autograded" / student / assignment
            / f"{ASSIGNMENTS[assignment]}.ipynb")
    return nbformat.read(path, as_version=4)


def describe(scores: dict) -> str:
    return "\n".join(f"  {grade_id}: {score:g} of {top:g}" for grade_id, (score, top) in scores.items())


@pytest.mark.integration
@pytest.mark.parametrize("assignment", sorted(ASSIGNMENTS))
def test_solution_gets_full_marks(graded, assignment):
    scores = graded[assignment]["solution"]
    assert set(scores) == set(grade_cells(solution_notebook(assignment))), scores
    lost = {k: v for k, v in scores.items() if v[0] != v[1]}
    assert not lost, f"the solution of {assignment} lost points:\n{describe(lost)}"
    nb = autograded_notebook(graded, assignment, "solution")
    for grade_id, cell in grade_cells(nb).items():
        printed = "".join(out.get("text", "") for out in cell.outputs)
        assert not any(out.output_type == "error" or out.get("name") == "stderr"
                       for out in cell.outputs), f"{grade_id}: error or stderr output"
        if grade_id.endswith("_gpu"):
            # Without CUDA a GPU cell says it skipped its GPU part; with CUDA it must not skip.
            assert ("SKIPPED" in printed) == (not torch.cuda.is_available()), (
                f"{grade_id} printed {printed!r}")


@pytest.mark.integration
@pytest.mark.parametrize("assignment", sorted(ASSIGNMENTS))
def test_unedited_release_scores_zero(graded, assignment):
    scores = graded[assignment]["unedited"]
    earned = {k: v for k, v in scores.items() if v[0] != 0}
    assert not earned, f"the unedited release of {assignment} earned points:\n{describe(earned)}"
    assert sum(top for _, top in scores.values()) > 0


@pytest.mark.integration
@pytest.mark.parametrize("path", NBGRADED_WRONG,
                         ids=[f"{p.parent.name}/{p.stem}" for p in NBGRADED_WRONG])
def test_wrong_submission_loses_exactly_its_points(graded, path):
    case = load_wrong(path)
    left_out = unjudged(case)
    scores = {grade_id: points for grade_id, points in graded[case["assignment"]][case["student"]].items()
              if grade_id not in left_out}
    losses = expected_losses(case, torch.cuda.is_available())
    expected = {grade_id: (top - losses.get(grade_id, 0), top) for grade_id, (_, top) in scores.items()}
    assert scores == expected, (
        f"{case['name']} ({case['mistake'].strip()})\nexpected:\n{describe(expected)}\n"
        f"got:\n{describe(scores)}")


@pytest.mark.integration
@pytest.mark.gpu
def test_timer_without_synchronize_fails_on_a_gpu(graded):
    scores = graded["benchmark"][load_wrong(NO_SYNCHRONIZE)["student"]]
    assert scores["benchmark_gpu"][0] == 0, (
        f"a Benchmark that never synchronizes should fail the GPU test; it scored {scores}")
    assert graded["benchmark"]["solution"]["benchmark_gpu"][0] == 2
