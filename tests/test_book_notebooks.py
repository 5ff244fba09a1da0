"""What readers take away from the built book: the notebooks the launch buttons open, and
what the student edition must not give away.

* Each published chapter notebook (``_sources/<page>.ipynb``, what Colab and Binder open)
  holds every code block its HTML page shows. That it runs from top to bottom where
  ``import myst_nb`` fails and no file of the repository is at hand, as in Colab, is shown by
  the one run of each chapter after the book build: ``scripts/gpu-run --notebooks`` on the
  lowest PyTorch (tests/test_gpu_kit.py).
* No page or notebook of the student edition holds the body of a solution function of
  ``solutions/`` (normalised code lines, so a reformatted copy is caught too).
"""
from __future__ import annotations

import html as html_lib
import re
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pytest

from tests.test_book import markdown_notebooks, site_texts

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.integration


class _CodeBlocks(HTMLParser):
    """The code a page shows: every ``<pre>`` in a highlighted block that is not a cell's
    output."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack, self.blocks, self._current = [], [], None

    def handle_starttag(self, tag, attrs):
        classes = (dict(attrs).get("class") or "").split()
        self.stack.append((tag, classes))
        if tag == "pre" and not any("cell_output" in c for _, c in self.stack) \
                and any("highlight" in c for _, c in self.stack):
            self._current = []

    def handle_endtag(self, tag):
        while self.stack:
            opened, _ = self.stack.pop()
            if opened == tag:
                break
        if tag == "pre" and self._current is not None:
            self.blocks.append("".join(self._current))
            self._current = None

    def handle_data(self, data):
        if self._current is not None:
            self._current.append(data)


def code_lines(text: str) -> list:
    """Lines of code with their spacing collapsed, blank lines dropped."""
    return [" ".join(line.split()) for line in text.splitlines() if line.strip()]


def shown_code(page: Path) -> list:
    parser = _CodeBlocks()
    parser.feed(page.read_text())
    return [block for block in parser.blocks if block.strip()]


def notebook_code(nb) -> str:
    """Everything a notebook shows as code: code cells and fenced blocks of markdown cells."""
    return "\n".join(code_lines("\n".join(cell.source for cell in nb.cells)))


@pytest.mark.parametrize("name", markdown_notebooks())
def test_published_notebook_holds_every_code_block_of_its_page(built_book, name):
    published = nbformat.read(built_book.html / "_sources" / f"{name}.ipynb", as_version=4)
    held = notebook_code(published)
    blocks = shown_code(built_book.html / f"{name}.html")
    assert blocks, f"{name}: no code found on the page"
    for block in blocks:
        for line in code_lines(html_lib.unescape(block)):
            assert line in held, f"{name}: the page shows {line!r}, the notebook does not"
    raw = "\n".join(cell.source for cell in published.cells if cell.cell_type == "markdown")
    assert "{literalinclude}" not in raw and "{glue:text}" not in raw, name


# --- solutions stay out of the student edition ------------------------------------------------

SOLUTION = re.compile(r"### BEGIN SOLUTION\n(.*?)### END SOLUTION", re.S)


def solution_bodies() -> dict:
    """``{"<assignment>: <first line>": [normalised lines]}`` for every solution block whose
    lines the released notebook does not have (so a stub's ``raise NotImplementedError``
    never counts)."""
    bodies = {}
    for solution in sorted((ROOT / "solutions").glob("*/*.ipynb")):
        released = nbformat.read(ROOT / "exercises" / solution.relative_to(ROOT / "solutions"),
                                 as_version=4)
        known = set(code_lines("\n".join(cell.source for cell in released.cells)))
        for cell in nbformat.read(solution, as_version=4).cells:
            for block in SOLUTION.findall(cell.source):
                lines = [line for line in code_lines(block)
                         if len(line) >= 16 and not line.startswith("#") and line not in known]
                if lines:
                    bodies[f"{solution.parent.name}: {lines[0]}"] = lines
    return bodies


def test_solution_bodies_are_found():
    bodies = solution_bodies()
    assert {key.split(":")[0] for key in bodies} == {
        path.parent.name for path in (ROOT / "solutions").glob("*/*.ipynb")}


def test_no_page_or_notebook_of_the_student_book_holds_a_solution_body(built_book):
    bodies = solution_bodies()
    for path, text in site_texts(built_book.html):
        if path.suffix not in (".html", ".ipynb"):
            continue
        present = set(code_lines(text))
        for what, lines in bodies.items():
            found = [line for line in lines if line in present]
            # Two lines of one solution, or a lone line of a one-line solution, give it away.
            assert len(found) < min(2, len(lines)), (
                f"{path.relative_to(built_book.html)} holds the solution of {what}: {found}")


def test_the_solution_check_finds_a_copied_solution(tmp_path):
    what, lines = next(iter(solution_bodies().items()))
    page = "<pre>" + "\n".join("    " + line for line in lines) + "</pre>"
    present = set(code_lines(html_lib.unescape(re.sub(r"<[^>]+>", "", page))))
    assert len([line for line in lines if line in present]) >= min(2, len(lines)), what


def test_binder_installs_what_dlperf_declares(built_book):
    import tomllib

    from coursebook.sphinxext import requirement_name
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    binder = (built_book.html / "binder" / "requirements.txt").read_text()
    for requirement in declared:
        name = requirement_name(requirement)
        assert re.search(rf"^{re.escape(name)}\b", binder, re.M | re.I), name


# The names under which packages are imported (the book's build is coursebook/, not dlperf).
IMPORT_NAMES = {"PIL": "Pillow", "yaml": "pyyaml", "matplotlib_inline": "matplotlib-inline"}


def test_dlperf_declares_what_it_imports():
    import ast
    import sys
    import tomllib

    from coursebook.sphinxext import requirement_name
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {requirement_name(r).lower() for r in project["dependencies"]}
    needed = set()
    for module in (ROOT / "dlperf").glob("*.py"):
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.Import):
                needed.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                needed.add(node.module.split(".")[0])
    third_party = {name for name in needed
                   if name not in sys.stdlib_module_names and name not in ("dlperf", "myst_nb")}
    missing = {IMPORT_NAMES.get(name, name).lower() for name in third_party} - declared
    assert not missing, f"dlperf imports {sorted(missing)} but pyproject.toml does not declare them"


def test_self_contained_writes_in_each_include_and_each_glued_value():
    from sphinx.config import Config

    from coursebook.sphinxext import self_contained
    cell = nbformat.v4.new_markdown_cell(
        "Measured {glue:text}`ratio:.2f` on {glue:text}`where`.\n\n"
        "```{literalinclude} ../dlperf/pages.py\n:language: python\n:pyobject: glue\n```\n\n"
        "```{literalinclude} ../dlperf/pages.py\n:language: python\n:pyobject: _shown\n```\n")
    glued = {"ratio": {"data": {"text/plain": "1.23456"}},
             "where": {"data": {"text/plain": "'CPU: x'"}}}
    nb = self_contained(nbformat.v4.new_notebook(cells=[cell]), ROOT / "chapters", glued,
                        Config({}, {}))
    text = nb.cells[0].source
    assert text.startswith("Measured 1.23 on CPU: x.")
    assert text.index("def glue(") < text.index("def _shown(")  # both, each in its place
    assert "{literalinclude}" not in text and "{glue:text}" not in text
