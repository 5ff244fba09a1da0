"""The course's packages import each other only as the guide's layout page allows.

``dlperf`` is what the chapters import and learners install, so it stands alone; the grader
stands alone too (it runs learners' notebooks, which bring their own imports); the book's build
and the course's tooling (``coursebook``: the assignments' cases, the accidents) may use the
chapters' helpers; the GPU kit's scripts and the benchmarks use coursebook; the tests may
import anything, and nothing imports them.
Imports are read with ``ast`` (inside functions too), and so are the targets the grader starts
processes by name (``"package.module:function"`` strings).
"""
from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Folder -> the course's own packages its Python files may import (besides themselves).
ALLOWED = {
    "dlperf": set(),
    "autograder": set(),
    "coursebook": {"dlperf"},
    "scripts": {"coursebook"},     # gpu-run grades the cases of coursebook.cases
    "benchmarks": {"autograder", "dlperf", "coursebook"},  # the grader on the cases; dlperf's Benchmark
    "tests": {"dlperf", "autograder", "coursebook", "scripts", "benchmarks"},
}
OURS = set(ALLOWED)
SCRIPTS = {path.stem for path in (ROOT / "scripts").glob("*.py")}  # imported from scripts/ by name
TARGET = re.compile(r"^([A-Za-z_]\w*)(\.\w+)*:\w+$")  # "autograder.kernel.process:main"


def imported(path: Path) -> dict:
    """The course's own packages that ``path`` imports: package -> first line that does."""
    found = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and TARGET.match(node.value):
            names = [node.value]
        for name in names:
            top = name.split(".")[0].split(":")[0]
            top = "scripts" if top in SCRIPTS else top
            if top in OURS:
                found.setdefault(top, node.lineno)
    return found


def python_files(folder: str) -> list:
    return sorted(path for path in (ROOT / folder).rglob("*.py")
                  if not {"wrong_submissions", "autograder_fixtures"} & set(path.parts))


@pytest.mark.parametrize("folder", sorted(ALLOWED))
def test_imports_follow_the_table(folder):
    files = python_files(folder)
    assert files, f"{folder}/ holds no Python file"
    wrong = [f"{path.relative_to(ROOT)}:{line} imports {package}"
             for path in files for package, line in imported(path).items()
             if package != folder and package not in ALLOWED[folder]]
    assert not wrong, (f"{folder} may import only {sorted(ALLOWED[folder]) or 'none'} of the course's "
                       "packages (guide/layout.md):\n" + "\n".join(wrong))


def test_nothing_but_the_tests_imports_the_tests():
    """What the benchmarks and the GPU kit share with the tests lives in coursebook."""
    users = {folder for folder, allowed in ALLOWED.items() if "tests" in allowed}
    assert users == set()


def test_the_chapters_import_only_dlperf():
    """A chapter runs on Colab and Binder, where only dlperf is installed."""
    statement = re.compile(r"^\s*(?:import|from)\s+([A-Za-z_]\w*)", re.MULTILINE)
    wrong, cells = [], 0
    for page in sorted((ROOT / "chapters").glob("*.md")):
        for block in re.findall(r"^```\{code-cell\}.*?\n(.*?)^```", page.read_text(), re.S | re.M):
            cells += 1
            wrong += [f"{page.name} imports {name}" for name in statement.findall(block)
                      if name in OURS - {"dlperf"}]
    assert cells > 0, "found no code cell in chapters/*.md"
    assert not wrong, wrong


def test_the_detector_sees_every_kind_of_import(tmp_path):
    source = tmp_path / "sample.py"
    source.write_text("import dlperf.ddp\n\ndef f():\n    from tests.helpers import ROOT\n"
                      "    from . import sibling\n    return 'autograder.kernel.process:main'\n"
                      "import gpu_run\nimport torch\n")
    assert imported(source) == {"dlperf": 1, "tests": 4, "autograder": 6, "scripts": 7}


# What the packages need from outside the course: dlperf's dependencies are pyproject.toml's
# (tests/test_book_notebooks.py checks them); coursebook, which pyproject.toml does not ship,
# lists its own in coursebook/requirements.txt.
IMPORT_NAMES = {"yaml": "pyyaml", "myst_nb": "myst-nb", "jupyter_cache": "jupyter-cache",
                "jupyter_book": "jupyter-book"}


def requirement_names(lines) -> set:
    return {re.split(r"[<>=!~\[ ;]", line.strip(), maxsplit=1)[0].lower() for line in lines
            if line.strip() and not line.lstrip().startswith(("#", "-"))}


def test_coursebook_declares_what_it_imports():
    declared = requirement_names((ROOT / "coursebook" / "requirements.txt").read_text().splitlines())
    dlperf = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    declared |= requirement_names(dlperf)  # coursebook may use dlperf, which brings these
    needed = set()
    for path in python_files("coursebook"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                needed.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                needed.add(node.module.split(".")[0])
    third_party = {IMPORT_NAMES.get(name, name).lower() for name in needed
                   if name not in sys.stdlib_module_names and name not in OURS}
    missing = third_party - declared
    assert not missing, f"coursebook imports {sorted(missing)}; add them to coursebook/requirements.txt"


def test_pip_install_ships_only_what_learners_run():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = pyproject["tool"]["setuptools"]["packages"]
    assert "dlperf" in packages
    # setuptools ships only the packages listed: every folder of the grader but the service
    found = {".".join(path.parent.relative_to(ROOT).parts)
             for name in ("dlperf", "autograder") for path in (ROOT / name).rglob("__init__.py")}
    assert found - {"autograder.service"} == set(packages), sorted(found ^ set(packages))
    assert not {"coursebook", "tests", "scripts", "benchmarks"} & set(packages), packages
    assert "book" not in pyproject["project"].get("optional-dependencies", {}), (
        "the book's build is coursebook/, which pip does not install: its needs are "
        "coursebook/requirements.txt")
