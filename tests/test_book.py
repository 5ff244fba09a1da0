"""The real book build: every page executes without error, and the cache makes rebuilds free."""
from pathlib import Path

import pytest
import yaml

from dlperf import book

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.integration

# Strings that only instructor material contains (nbgrader's solution and hidden-test markers).
INSTRUCTOR_ONLY = ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS")


def toc_files():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]]
    for part in toc.get("parts", []):
        files += [entry["file"] for entry in part.get("chapters", [])]
    return files


def test_every_page_of_the_toc_is_built(built_book):
    html = built_book.html
    assert (html / "index.html").exists()
    for name in toc_files():
        assert (html / f"{name}.html").exists(), f"{name} is in _toc.yml but was not built"


def test_no_page_has_error_output(executed_page):
    pages = [name for name in toc_files() if (ROOT / f"{name}.md").exists()
             and (ROOT / f"{name}.md").read_text().startswith("---\njupytext")]
    assert pages, "the toc lists no executable page"
    for name in pages:
        nb = executed_page(name)
        outputs = [out for cell in nb.cells for out in cell.get("outputs", [])]
        assert outputs, f"{name}: no outputs at all; was it executed?"
        for out in outputs:
            assert out.get("output_type") != "error", f"{name}: {out.get('ename')}: {out.get('evalue')}"
            assert "Traceback (most recent call last)" not in out.get("text", ""), name


def test_student_book_has_no_solution_or_hidden_test(built_book):
    assert not (built_book.html / "solutions").exists()
    for page in built_book.html.rglob("*"):
        if page.suffix in {".html", ".ipynb", ".md", ".txt", ".js"} and page.is_file():
            text = page.read_text(errors="ignore")
            for marker in INSTRUCTOR_ONLY:
                assert marker not in text, f"{page.relative_to(built_book.html)} contains {marker!r}"


def test_second_build_executes_nothing_and_is_fast(built_book):
    again = book.build(echo=False)
    assert again.ok, again.log[-3000:]
    assert again.executed == [], f"re-executed despite the cache: {again.executed}"
    assert again.seconds < 60, f"a cached rebuild took {again.seconds:.0f} s"
