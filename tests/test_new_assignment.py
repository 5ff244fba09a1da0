"""A fifth assignment is its notebook, its page, its wrong submissions and one manifest line.

In a temporary copy of the course, a toy assignment (``toy``: learners write ``double``; one
autograded test cell) is added exactly that way, and every tool that lists the assignments picks it
up: the manifest's checks, ``nbgrader generate_assignment`` (its release), the generated
``_toc.yml`` and grading workflow, the instructor edition's table of contents, the index page's
and grading guide's tables, the tests' list of assignments, and ``python -m autograder grade``,
which gives its solution full marks and its wrong submission exactly the loss it lists.
No book is built: the functions that make the book's entries are called directly.
"""
from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

from coursebook import assignments as course
from coursebook import book
from coursebook.cases import answer_cells, counted, expected_losses, load_wrong
from tests.helpers import checkout_env

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.integration

# What a copy of the course needs for these tools (the notebooks are small; no .venv, no _build).
COPIED = ["nbgrader_config.py", "_config.yml", "_toc.yml", "_instructor.yml", "assignments",
          "chapters", "solutions", "exercises", "tests/wrong_submissions", ".github/workflows"]
LINE = '  { name = "toy", writes = "`double`", chapters = ["hybridize"] },\n'


def nbgrader_cell(cell, **meta):
    cell.metadata["nbgrader"] = {"schema_version": 3, "task": False, "locked": True,
                                 "solution": False, "grade": False, **meta}
    return cell


def toy_solution() -> nbformat.NotebookNode:
    cells = nbformat.v4
    nb = cells.new_notebook(metadata={
        "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
        "language_info": {"name": "python", "pygments_lexer": "ipython3"}})
    nb.cells = [
        cells.new_markdown_cell("# Assignment: `double`\n\n| test | points |\n| --- | --- |\n"
                                "| `toy_double` | 2 |"),
        nbgrader_cell(cells.new_code_cell("TEST_SEED = 0"), grade_id="toy_setup"),
        nbgrader_cell(cells.new_code_cell(
            "def double(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION"),
            grade_id="toy_answer", locked=False, solution=True),
        nbgrader_cell(cells.new_code_cell(
            "result = double(21)\n### CHECKS\n"
            "assert result == 42, f'double(21) should be 42, got {result!r}'"),
            grade_id="toy_double", grade=True, points=2),
    ]
    return nb


def add_toy_assignment(root: Path) -> None:
    """The four things a new assignment is: notebook, page, wrong submission, manifest line."""
    (root / "solutions" / "toy").mkdir()
    nbformat.write(toy_solution(), str(root / "solutions" / "toy" / "toy.ipynb"))
    (root / "assignments" / "toy.md").write_text(
        "# Assignment: `double`\n\n```{launch-links} exercises/toy/toy.ipynb\n```\n")
    (root / "tests" / "wrong_submissions" / "toy").mkdir()
    (root / "tests" / "wrong_submissions" / "toy" / "adds_two.toml").write_text(
        'assignment = "toy"\nmistake = "Adds two instead of doubling."\n\n[answers]\n'
        "toy_answer = '''\ndef double(x):\n    return x + 2\n'''\n\n[loses]\ntoy_double = 2\n")
    manifest = root / course.MANIFEST
    text = manifest.read_text()
    end = text.rindex("]")
    manifest.write_text(text[:end] + LINE + text[end:])


def run(root: Path, *command: str) -> subprocess.CompletedProcess:
    env = checkout_env()
    done = subprocess.run([sys.executable, "-m", *command], cwd=root, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (f"{' '.join(command)} failed ({done.returncode}):\n"
                                  f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


@pytest.fixture
def toy_course(tmp_path) -> Path:
    root = tmp_path / "course"
    for name in COPIED:
        source, target = ROOT / name, root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target)
        else:
            shutil.copy(source, target)
    assert course.problems(root) == [], "the copy of the course should agree with its manifest"
    add_toy_assignment(root)
    return root


def test_a_fifth_assignment_is_picked_up_by_every_tool(toy_course):
    root = toy_course
    # Before its release is made and the generated files are updated, the checks say what to do.
    before = "\n".join(course.problems(root))
    assert "nbgrader generate_assignment toy --force" in before, before
    assert f"_toc.yml does not list the assignments of {course.MANIFEST}" in before, before
    assert "grade.yml does not list the assignments" in before, before

    # nbgrader releases it.
    run(root, "nbgrader", "generate_assignment", "toy", "--force")
    release = nbformat.read(str(root / "exercises" / "toy" / "toy.ipynb"), as_version=4)
    assert "raise NotImplementedError()" in answer_cells(release)["toy_answer"].source
    assert "2 * x" not in "\n".join(cell.source for cell in release.cells)

    # make book (python -m coursebook) updates the generated files; then nothing disagrees.
    assert set(course.sync(root)) == {course.TOC, course.WORKFLOW}
    assert course.problems(root) == []
    toc = yaml.safe_load((root / "_toc.yml").read_text())
    part = next(p for p in toc["parts"] if p["caption"] == "Assignments")
    assert part["chapters"][-1] == {"file": "assignments/toy",
                                    "sections": [{"file": "exercises/toy/toy"}]}
    assert [e["file"] for e in part["chapters"][:2]] == ["assignments/index",
                                                         "assignments/handing-in"]
    assert [e["file"] for e in part["chapters"][2:-1]] == [
        f"assignments/{name}" for name in course.notebooks(ROOT)], "the others stay, in order"
    workflow = yaml.safe_load((root / course.WORKFLOW).read_text())
    choice = workflow[True]["workflow_dispatch"]["inputs"]["assignment"]  # YAML reads `on:` as True
    assert choice["options"] == [*course.notebooks(ROOT), "toy"]

    # The instructor edition shows its solution.
    _, instructor_toc = book.instructor_sources(root)
    pages = [entry["file"] for part in yaml.safe_load(instructor_toc.read_text())["parts"]
             for entry in part.get("chapters", [])]
    assert pages[-1] == "solutions/toy/toy" and "solutions/GRADING" in pages

    # The index page's table and the grading guide's tables have a row for it.
    index = course.table(root)
    assert "| {doc}`/assignments/toy` | `double` | {doc}`/chapters/hybridize` | 2 |" in index, index
    guide = course.table(root, ["assignment", "notebook", "learners", "points"])
    assert "| `toy` | `toy/toy.ipynb` | `double` | 2 |" in guide, guide
    assert "| toy | Adds two instead of doubling. | `toy_double` 2 |" in course.mistakes_table(root)

    # The tests list it (coursebook/cases.py reads the same manifest).
    assert course.notebooks(root)["toy"] == "toy"

    # The course's grader gives the solution full marks and the wrong submission its listed loss.
    case = load_wrong(root / "tests" / "wrong_submissions" / "toy" / "adds_two.toml")
    wrong = nbformat.read(str(root / "exercises" / "toy" / "toy.ipynb"), as_version=4)
    for grade_id, cell in answer_cells(wrong).items():
        cell.source = case["answers"][grade_id].strip("\n")
    for student, nb in {"solution": toy_solution(), case["student"]: wrong}.items():
        folder = root / "submitted" / student / "toy"
        folder.mkdir(parents=True)
        nbformat.write(nb, str(folder / "toy.ipynb"))
    run(root, "autograder", "grade", "submitted", "--assignment", "toy", "--course", str(root),
        "--out", "graded", "--device", "cpu", "--no-progress")
    with (root / "graded" / "grades.csv").open() as handle:
        grades = {row["student_id"]: row for row in csv.DictReader(handle)}
    assert {s: (float(r["score"]), float(r["max_score"]), r["status"]) for s, r in grades.items()} == {
        "solution": (2.0, 2.0, "graded"), case["student"]: (0.0, 2.0, "graded")}, grades
    results = json.loads((root / "graded" / case["student"] / "toy" / "toy.results.json").read_text())
    lost = {name: top - score for name, (score, top) in counted(results).items() if score != top}
    assert lost == expected_losses(case, cuda=False)
