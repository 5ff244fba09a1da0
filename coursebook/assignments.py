"""The course's assignments, listed once: ``assignments/assignments.toml``.

Everything that needs the list of assignments reads it from that manifest, or is generated from
it, or is checked against it:

* **read** at build time: the index page's table and the grading guide's two tables (the
  ``assignments-table`` and ``wrong-submissions-table`` directives of :mod:`coursebook.sphinxext`,
  made by :func:`table` and :func:`mistakes_table`); the instructor edition's solution pages
  (:func:`coursebook.book.instructor_sources` appends :func:`solution_pages`); the tests
  (``coursebook/cases.py``) and ``scripts/gpu-run`` through them;
* **generated** into committed files that their tools read without Python: the "Assignments" part
  of ``_toc.yml`` (Jupyter Book reads it as it is) and the choices of the grading workflow
  (``.github/workflows/grade.yml``: GitHub reads it from the repository). ``python -m
  coursebook.assignments`` rewrites those parts, and so does ``python -m coursebook`` (``make
  book``) before it builds;
* **checked**: :func:`problems` names what a listed assignment lacks (its notebook, release, page,
  wrong submissions, chapters) and what ``solutions/`` holds that the manifest does not list, and
  :func:`sync` with ``write=False`` names the generated files that are out of date;
  ``tests/test_assignments.py`` fails with those messages.

So a new assignment is its notebook in ``solutions/`` (its release in ``exercises/`` is made by
``nbgrader generate_assignment``), its page ``assignments/<name>.md``, its wrong submissions in
``tests/wrong_submissions/<name>/`` and one line of the manifest. Points are not in the
manifest: they are the sum of the solution notebook's test cells.

Standard library only: ``scripts/gpu-run`` reads the manifest (through the tests' helpers) on
machines that have little else.
"""
from __future__ import annotations

import json
import re
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = Path("assignments") / "assignments.toml"
TOC = Path("_toc.yml")
WORKFLOW = Path(".github") / "workflows" / "grade.yml"
WRONG_SUBMISSIONS = Path("tests") / "wrong_submissions"
COMMAND = "python -m coursebook.assignments"
TOC_CAPTION = "Assignments"
FIELDS = {"name", "writes", "chapters", "notebook"}


@dataclass(frozen=True)
class Assignment:
    """One line of the manifest."""

    name: str                    # folder in solutions/ and exercises/; page assignments/<name>.md
    writes: str                  # what learners write (MyST Markdown, for the tables)
    chapters: tuple = ()         # the chapters it goes with, as chapters/<name>.md
    notebook: str = ""           # the notebook's name without .ipynb (default: the name)

    @property
    def stem(self) -> str:
        return self.notebook or self.name

    @property
    def solution(self) -> Path:
        return Path("solutions") / self.name / f"{self.stem}.ipynb"

    @property
    def release(self) -> Path:
        return Path("exercises") / self.name / f"{self.stem}.ipynb"

    @property
    def page(self) -> Path:
        return Path("assignments") / f"{self.name}.md"


def load(root: Path = ROOT) -> List[Assignment]:
    """The assignments of the manifest, in its order (the book's order)."""
    path = Path(root) / MANIFEST
    with open(path, "rb") as handle:
        data = tomllib.load(handle)
    found = []
    for number, entry in enumerate(data.get("assignments", []), 1):
        unknown = set(entry) - FIELDS
        if unknown or not {"name", "writes"} <= set(entry):
            raise ValueError(f"{MANIFEST}, assignment {number}: needs name and writes, may have "
                             f"chapters and notebook; got {sorted(entry)}")
        found.append(Assignment(name=entry["name"], writes=entry["writes"].strip(),
                                chapters=tuple(entry.get("chapters", ())),
                                notebook=entry.get("notebook", "")))
    names = [a.name for a in found]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"{MANIFEST} lists {repeated} more than once")
    return found


def notebooks(root: Path = ROOT) -> Dict[str, str]:
    """assignment -> its notebook's name (without ``.ipynb``), in the manifest's order."""
    return {a.name: a.stem for a in load(root)}


def points(assignment: Assignment, root: Path = ROOT) -> float:
    """The points of the assignment: those of its solution notebook's test cells."""
    nb = json.loads((Path(root) / assignment.solution).read_text())
    total = 0.0
    for cell in nb.get("cells", []):
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if meta.get("grade") and not meta.get("solution"):
            total += float(meta.get("points", 0))
    return total


def solution_pages(root: Path = ROOT) -> List[str]:
    """The instructor edition's solution pages, one per assignment, in the manifest's order."""
    return [str(a.solution.with_suffix("")) for a in load(root)]


# --- the tables of the book's pages ----------------------------------------------------------

COLUMNS = {"assignment": "assignment", "page": "assignment", "notebook": "notebook",
           "writes": "you write", "learners": "learners write", "chapters": "goes with",
           "points": "points"}


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _plain(text: str) -> str:
    """Plain text (a wrong submission's ``mistake``) as a table cell that Markdown leaves as it is."""
    return re.sub(r"([\\`*_<>\[\]{}|#])", r"\\\1", " ".join(text.split()))


def _doc(docname: str) -> str:
    return "{doc}" + f"`/{docname}`"


def table(root: Path = ROOT, columns: Sequence[str] = ("page", "writes", "chapters", "points")) -> str:
    """A MyST Markdown table of the assignments, one row each, with the given columns.

    ``page`` links the assignment's page, ``assignment`` names it as code, ``notebook`` is its
    solution's path in ``solutions/``, ``writes``/``learners`` what learners write,
    ``chapters`` links the chapters it goes with, ``points`` the points of its notebook.
    """
    unknown = [c for c in columns if c not in COLUMNS]
    if unknown:
        raise ValueError(f"unknown column(s) {unknown}; the columns are {sorted(COLUMNS)}")
    lines = ["| " + " | ".join(COLUMNS[c] for c in columns) + " |",
             "| " + " | ".join("---" for _ in columns) + " |"]
    for a in load(root):
        cells = {"page": _doc(a.page.with_suffix("").as_posix()), "assignment": f"`{a.name}`",
                 "notebook": f"`{a.name}/{a.stem}.ipynb`", "writes": a.writes,
                 "learners": a.writes, "points": f"{points(a, root):g}",
                 "chapters": ", ".join(_doc(f"chapters/{c}") for c in a.chapters)}
        lines.append("| " + " | ".join(_cell(cells[c]) for c in columns) + " |")
    return "\n".join(lines) + "\n"


def wrong_submissions(root: Path = ROOT) -> Dict[str, List[dict]]:
    """assignment -> its wrong submissions (``tests/wrong_submissions/<name>/*.toml``), by file name."""
    found = {}
    for a in load(root):
        cases = []
        for path in sorted((Path(root) / WRONG_SUBMISSIONS / a.name).glob("*.toml")):
            with open(path, "rb") as handle:
                cases.append({"name": path.stem, **tomllib.load(handle)})
        found[a.name] = cases
    return found


def _losses(table_: dict) -> str:
    return ", ".join(f"`{grade_id}` {points:g}" for grade_id, points in table_.items())


def mistakes_table(root: Path = ROOT) -> str:
    """A MyST Markdown table of every wrong submission: its assignment, mistake and lost points."""
    lines = ["| assignment | mistake | loses |", "| --- | --- | --- |"]
    for name, cases in wrong_submissions(root).items():
        for case in cases:
            lost = [_losses(case.get("loses", {}))]
            if case.get("loses_with_gpu"):
                lost.append(f"(+ {_losses(case['loses_with_gpu'])} on a GPU)")
            if case.get("loses_without_gpu"):
                lost.append(f"(+ {_losses(case['loses_without_gpu'])} without a GPU)")
            lines.append(f"| {name} | {_plain(case.get('mistake', ''))} | "
                         f"{_cell(' '.join(part for part in lost if part))} |")
    return "\n".join(lines) + "\n"


# --- generated parts of committed files ------------------------------------------------------

def toc_part(root: Path = ROOT) -> str:
    """The "Assignments" part of ``_toc.yml``: the index page, the page on handing in, then each
    assignment's page and its notebook."""
    lines = [f"  - caption: {TOC_CAPTION}   # generated from {MANIFEST} by {COMMAND}",
             "    chapters:", "      - file: assignments/index", "      - file: assignments/handing-in"]
    for a in load(root):
        lines += [f"      - file: {a.page.with_suffix('').as_posix()}", "        sections:",
                  f"          - file: {a.release.with_suffix('').as_posix()}"]
    return "\n".join(lines) + "\n"


def workflow_options(root: Path = ROOT) -> str:
    """The ``options:`` of the grading workflow's ``assignment`` choice."""
    lines = [f"        options:   # generated from {MANIFEST} by {COMMAND}"]
    lines += [f"          - {a.name}" for a in load(root)]
    return "\n".join(lines) + "\n"


TOC_PART = re.compile(rf"^  - caption: {TOC_CAPTION}\b.*\n(?:(?!  - ).*\n)*", re.MULTILINE)
OPTIONS = re.compile(r"^        options:.*\n(?:          - .*\n)*", re.MULTILINE)


def _replace(text: str, pattern: re.Pattern, new: str, where: str) -> str:
    matches = list(pattern.finditer(text))
    if len(matches) != 1:
        raise ValueError(f"{where}: expected one part to generate ({pattern.pattern!r}), "
                         f"found {len(matches)}")
    return text[:matches[0].start()] + new + text[matches[0].end():]


def generated(root: Path = ROOT) -> Dict[Path, str]:
    """path (relative to ``root``) -> what the file holds with its generated part up to date."""
    root = Path(root)
    return {
        TOC: _replace((root / TOC).read_text(), TOC_PART, toc_part(root), str(TOC)),
        WORKFLOW: _replace((root / WORKFLOW).read_text(), OPTIONS, workflow_options(root),
                           str(WORKFLOW)),
    }


def sync(root: Path = ROOT, write: bool = True) -> List[Path]:
    """The generated files that disagree with the manifest; with ``write``, rewritten so they agree."""
    stale = []
    for path, text in generated(root).items():
        if (Path(root) / path).read_text() != text:
            stale.append(path)
            if write:
                (Path(root) / path).write_text(text)
    return stale


# --- checks ----------------------------------------------------------------------------------

def problems(root: Path = ROOT) -> List[str]:
    """What disagrees with the manifest, each as a sentence that says what to add or run."""
    root = Path(root)
    found = []
    listed = load(root)
    names = {a.name for a in listed}
    for folder in sorted(p for p in (root / "solutions").iterdir() if p.is_dir()):
        if list(folder.glob("*.ipynb")) and folder.name not in names:
            found.append(f"solutions/{folder.name} is an assignment that {MANIFEST} does not list: "
                         f'add a line {{ name = "{folder.name}", writes = "...", chapters = [...] }}')
    for a in listed:
        where = f"{MANIFEST} lists {a.name!r}, but"
        if not (root / a.solution).is_file():
            found.append(f"{where} {a.solution} does not exist")
        if not (root / a.release).is_file():
            found.append(f"{where} its release {a.release} does not exist: run "
                         f"`nbgrader generate_assignment {a.name} --force`")
        if not (root / a.page).is_file():
            found.append(f"{where} its page {a.page} does not exist (see assignments/benchmark.md)")
        if not list((root / WRONG_SUBMISSIONS / a.name).glob("*.toml")):
            found.append(f"{where} {WRONG_SUBMISSIONS / a.name} holds no wrong submission (.toml)")
        for chapter in a.chapters:
            if not (root / "chapters" / f"{chapter}.md").is_file():
                found.append(f"{where} the chapter it goes with, chapters/{chapter}.md, does not exist")
    for path in sync(root, write=False):
        found.append(f"{path} does not list the assignments of {MANIFEST}: run `{COMMAND}` "
                     "(or `make book`) and commit it")
    return found


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    if argv[:1] == ["--check"]:
        found = problems()
        print("\n".join(found) if found else f"==> Everything agrees with {MANIFEST}")
        return 1 if found else 0
    changed = sync()
    print(f"==> Updated from {MANIFEST}: {', '.join(map(str, changed))}" if changed else
          f"==> {TOC} and {WORKFLOW} already list the assignments of {MANIFEST}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
