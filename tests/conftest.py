"""Shared test set-up: no network, GPU marks, and the executed book pages."""
from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest

# No test may need the network: Fashion-MNIST is always the synthetic set here,
# written under a data root of the test run's own.
os.environ["DLPERF_DATA"] = "synthetic"
os.environ.setdefault("DLPERF_DATA_DIR", str(Path(__file__).resolve().parent.parent
                                              / "_build" / "test-data"))

ROOT = Path(__file__).resolve().parent.parent
EXECUTED = ROOT / "_build" / "jupyter_execute"


# Fixtures that build the book or execute notebooks: a test that asks for one is an integration
# test whether or not its module says so, so `make check` (-m "not integration") never builds.
SLOW_FIXTURES = {"built_book", "executed_page", "page_outputs", "instructor_book"}


@pytest.hookimpl(tryfirst=True)  # before -m deselects, so the added marks count
def pytest_collection_modifyitems(config, items):
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)
    import torch
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; none on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def built_book():
    """Build the real book once per test session (as `make book` does) and return the result."""
    from coursebook import book
    result = book.build(echo=False)
    assert result.ok, (f"book build failed (exit {result.returncode})\n"
                       f"{result.log[-6000:]}\n{result.reports()}")
    return result


@pytest.fixture(scope="session")
def instructor_book(built_book):
    """The instructor edition, built once per test session after the student book (so every
    chapter is in the cache), as `make instructor-book` does."""
    from coursebook import book
    result = book.build_instructor(echo=False)
    assert result.ok, f"{result.log[-6000:]}\n{result.broken_links}\n{result.reports()}"
    return result


@pytest.fixture(scope="session")
def executed_page(built_book):
    """``executed_page('chapters/hybridize')``: that page with the outputs the book build gave it."""
    def load(name: str) -> nbformat.NotebookNode:
        path = EXECUTED / f"{name}.ipynb"
        assert path.exists(), f"{path} was not produced by the book build; is {name} in _toc.yml?"
        return with_outputs(nbformat.read(path, as_version=4))
    return load


@pytest.fixture(scope="session")
def page_outputs(executed_page):
    """``page_outputs('chapters/hybridize')``: that page as built, what it printed, what it glued."""
    from tests.helpers import glued
    from coursebook.executed import page_text

    def load(name: str):
        nb = executed_page(name)
        return nb, page_text(nb), glued(nb, name)
    return load


def with_outputs(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The notebook with its outputs, also when the build took them from its cache.

    On a cache hit myst-nb renders the cached outputs but writes the notebook to
    _build/jupyter_execute *without* them, so they are read back from the cache.
    """
    if any(cell.get("outputs") for cell in nb.cells if cell.cell_type == "code"):
        return nb
    from jupyter_cache import get_cache
    _, merged = get_cache(ROOT / "_build" / ".jupyter_cache").merge_match_into_notebook(nb)
    return merged


@pytest.fixture(scope="session")
def course_run(tmp_path_factory):
    """Every real assignment's cases graded once, by the guide's nbgrader steps
    (tests/course_run.py); the tests that need the grader's verdict read it from here."""
    pytest.importorskip("nbgrader", reason="nbgrader is not installed here")
    from tests.course_run import instructor_steps
    return instructor_steps(tmp_path_factory.mktemp("course"))


class AccidentRows:
    """``accident_rows(assignment)``: every accident of coursebook/accidents.py handed in for that
    assignment and graded by ``python -m autograder grade`` (once per session): student
    (the accident's name) -> its row of grades.csv. ``accident_rows.of(assignments)``: the
    same for several, those not graded yet graded two assignments (two commands) at a time."""

    def __init__(self, tmp_path_factory):
        self.tmp_path_factory, self.graded = tmp_path_factory, {}

    def __call__(self, assignment: str) -> dict:
        return self.of([assignment])[assignment]

    def of(self, assignments) -> dict:
        from concurrent.futures import ThreadPoolExecutor

        from coursebook.accidents import grade_all
        missing = [a for a in assignments if a not in self.graded]
        folders = [self.tmp_path_factory.mktemp(f"accidents-{a}") for a in missing]
        with ThreadPoolExecutor(max_workers=2) as pool:
            self.graded.update(zip(missing, pool.map(grade_all, folders, missing)))
        return {assignment: self.graded[assignment] for assignment in assignments}


@pytest.fixture(scope="session")
def accident_rows(tmp_path_factory):
    """An :class:`AccidentRows`, one per session."""
    return AccidentRows(tmp_path_factory)


@pytest.fixture(scope="module")
def browser():
    """A headless Chromium (tests/browser.py) for the browser tests; skipped where none can be
    found or installed."""
    from tests.browser import Chromium, find_chromium

    binary, why = find_chromium(install=True)
    if binary is None:
        pytest.skip(f"no Chromium for the browser test: {why}")
    chromium = Chromium(binary)
    yield chromium
    chromium.close()
