"""The real book build: every page executes without error, and the cache makes rebuilds free.

Also what readers get from it: no broken internal link, launch links that lead to
notebooks the build or the repository provides, a status page made from the
build's own records, and two editions, of which only the instructor's contains
solutions and hidden tests.
"""
import html as html_lib
import json
import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

import nbformat
import pytest
import yaml

from coursebook import book, status
from coursebook.cases import ASSIGNMENTS
from tests.helpers import readability_problems

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
    pages = executable_pages()
    assert pages, "the toc lists no executable page"
    for name in pages:
        nb = executed_page(name)
        outputs = [out for cell in nb.cells for out in cell.get("outputs", [])]
        assert outputs, f"{name}: no outputs at all; was it executed?"
        for out in outputs:
            assert out.get("output_type") != "error", f"{name}: {out.get('ename')}: {out.get('evalue')}"
            assert "Traceback (most recent call last)" not in out.get("text", ""), name


def executable_pages():
    return [name for name in toc_files() if (ROOT / f"{name}.md").exists()
            and (ROOT / f"{name}.md").read_text().startswith("---\njupytext")]


@pytest.mark.parametrize("name", [name for name in executable_pages() if name.startswith("chapters/")])
def test_page_reads_like_a_book(executed_page, name):
    """No warnings, logs, machine paths or object reprs in what a page prints, no glue call in
    the code a reader sees, and every verdict a plain sentence."""
    problems = readability_problems(executed_page(name), name)
    assert not problems, f"{name}:\n" + "\n".join(problems)


def test_the_readability_check_finds_what_it_forbids():
    def page(source, text, tags=(), stream="stdout"):
        cell = nbformat.v4.new_code_cell(source, metadata={"tags": list(tags)})
        cell.outputs = [nbformat.v4.new_output("stream", name=stream, text=text)]
        return nbformat.v4.new_notebook(cells=[cell])

    assert readability_problems(page("x = 1", "took 2.6 times as long\n")) == []
    assert readability_problems(page("print(t)", "the pair (0.5, 2.0) was fastest\n")) == []
    assert readability_problems(page("glue('a', 1)", "", tags=["remove-cell"])) == []
    for source, text, stream in [
            ("glue('a', 1)", "", "stdout"),
            ("print(f)", "<function f at 0x7f3a2b1c>", "stdout"),
            ("print(path)", "saved to /tmp/dlperf-export-x1y2/model.pt2", "stdout"),
            ("import x", "/work/main/.venv/lib/python3.11/site-packages/x.py:3", "stdout"),
            ("f()", "UserWarning: TypedStorage is deprecated", "stdout"),
            ("f()", "[W1124 10:00:00.1 ProcessGroupGloo.cpp:12] Warning: x", "stdout"),
            ("f()", "anything at all", "stderr"),
            ("print(n)", "1 distinct checksum(s)", "stdout"),
            ("step()", "tensor(2.3917, grad_fn=<CompiledFunctionBackward>)", "stdout"),
            ("ax.annotate('all 8 jobs submitted', (0.1, 0.5))",
             "Text(0.12183199999071803, 0.5, 'all 8 jobs submitted')", "stdout"),
            ("ax.set_ylim(bottom=0)", "(0.0, 74.16289164742616)", "stdout"),
            ("ax.set_xlim(1e-3, 2)", "(np.float64(0.001), np.float64(2.0))", "stdout")]:
        assert readability_problems(page(source, text, stream=stream)), (source, text)
    verdict = nbformat.v4.new_code_cell("", metadata={"tags": ["remove-cell"]})
    verdict.outputs = [nbformat.v4.new_output(
        "display_data", data={"application/papermill.record/text/plain": "'faster (within 10%)'"},
        metadata={"scrapbook": {"name": "gelu_verdict", "mime_prefix": "application/papermill.record/"}})]
    assert readability_problems(nbformat.v4.new_notebook(cells=[verdict]))


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


def test_no_internal_link_of_the_built_book_is_broken(built_book):
    assert built_book.broken_links == [], "\n".join(built_book.broken_links)


def test_the_link_checker_finds_broken_links_and_anchors(tmp_path):
    (tmp_path / "a.html").write_text('<p id="here"><a href="b.html#nowhere">b</a> <a href="#here">me</a>'
                                     '<img src="missing.png"> <a href="https://example.org/">web</a></p>')
    (tmp_path / "b.html").write_text('<a href="a.html#here">a</a> <a href="c/">c</a>')
    assert book.broken_links(tmp_path) == ["a.html -> b.html#nowhere (no such anchor)",
                                           "a.html -> missing.png", "b.html -> c/"]


# --- launch buttons -------------------------------------------------------------------------

REPO = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]
GITHUB = urlsplit(REPO["url"]).path.strip("/")


def markdown_notebooks():
    return [name for name in toc_files() if (ROOT / f"{name}.md").exists()
            and (ROOT / f"{name}.md").read_text().startswith("---\njupytext")]


def launch_targets(page: Path):
    """``{"Colab": (branch, path), "Binder": (branch, path)}`` from a built page's launch buttons."""
    text = page.read_text()
    targets = {}
    for url in re.findall(r'href="(https://colab\.research\.google\.com/[^"]+)"', text):
        branch, path = re.fullmatch(rf"https://colab\.research\.google\.com/github/{GITHUB}/blob/([^/]+)/(.+)",
                                    html_lib.unescape(url)).groups()
        targets["Colab"] = (branch, path)
    for url in re.findall(r'href="(https://mybinder\.org/[^"]+)"', text):
        branch, path = re.fullmatch(rf"https://mybinder\.org/v2/gh/{GITHUB}/([^?]+)\?urlpath=lab/tree/(.+)",
                                    unquote(html_lib.unescape(url))).groups()
        targets["Binder"] = (branch, path)
    return targets


def provided(built_book, branch: str, path: str) -> Path:
    """Where the file a launch link opens comes from: the repository (main) or the published site."""
    if branch == REPO["branch"]:
        return ROOT / path
    assert branch == "gh-pages", f"launch link to an unknown branch {branch}"
    return built_book.html / path  # .github/workflows/book.yml publishes _build/html there


def test_chapters_open_in_colab_and_binder_with_their_own_notebook(built_book):
    for name in markdown_notebooks():
        targets = launch_targets(built_book.html / f"{name}.html")
        assert set(targets) == {"Colab", "Binder"}, f"{name}: launch buttons {targets}"
        for service, (branch, path) in targets.items():
            assert path == f"_sources/{name}.ipynb", f"{name}: {service} opens {path}"
            notebook = provided(built_book, branch, path)
            assert notebook.is_file(), f"{name}: {service} opens {path}, which the build does not provide"
        nb = nbformat.read(notebook, as_version=4)
        assert "dlperf" in nb.cells[0].source and "%pip install" in nb.cells[0].source, name
        source = [cell.source for cell in nb.cells[1:]]
        assert "dlperf.page_setup()" in "".join(source), f"{name}: not the chapter's notebook"
        assert any(cell.get("outputs") for cell in nb.cells if cell.cell_type == "code"), \
            f"{name}: the published notebook has no outputs"
        assert f'href="{"../" * name.count("/")}_sources/{name}.ipynb"' in \
            (built_book.html / f"{name}.html").read_text(), f"{name}: no download button for the .ipynb"
    assert (built_book.html / "binder" / "requirements.txt").is_file()


def test_assignment_pages_link_the_student_notebook(built_book):
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    assignments = [entry for part in toc["parts"] for entry in part["chapters"] if entry.get("sections")]
    assert len(assignments) == len(ASSIGNMENTS)
    for entry in assignments:
        notebook = entry["sections"][0]["file"]
        assert notebook.startswith("exercises/"), entry
        for page in (entry["file"], notebook):
            targets = launch_targets(built_book.html / f"{page}.html")
            assert set(targets) == {"Colab", "Binder"}, page
            for branch, path in targets.values():
                assert (branch, path) == (REPO["branch"], f"{notebook}.ipynb"), page
                assert provided(built_book, branch, path).is_file()
        downloads = re.findall(r'href="([^"]*_downloads/[^"]+\.ipynb)"',
                               (built_book.html / f"{entry['file']}.html").read_text())
        assert downloads, f"{entry['file']}: no download link"
        downloaded = (built_book.html / entry["file"]).parent / downloads[0]
        assert downloaded.read_bytes() == (ROOT / f"{notebook}.ipynb").read_bytes()


# --- status page ----------------------------------------------------------------------------

def test_status_page_shows_every_chapter_as_this_build_ran_it(built_book, executed_page):
    import torch
    runs = {run["page"]: run for run in json.loads((built_book.html / "status.json").read_text())["runs"]}
    assert set(runs) == set(markdown_notebooks())
    page = html_lib.unescape(re.sub(r"<[^>]+>", " ", (built_book.html / "status.html").read_text()))
    page = re.sub(r"\s+", " ", page)
    for name, run in runs.items():
        first_output = next(out["text"] for cell in executed_page(name).cells
                            for out in cell.get("outputs", []) if "Run profile" in out.get("text", ""))
        assert run["torch"] in first_output and run["hardware"] in first_output, (name, run)
        assert run["succeeded"] and run["seconds"] > 0 and run["ran_at"], run
        row = f"{run['title']} {run['profile']} {run['hardware']} {run['torch']} {run['python']} {run['seconds']} s"
        assert row in page, f"status page lacks {row!r}"
    assert {run["torch"] for run in runs.values()} <= {torch.__version__}
    assert "Measured on GPUs" in page


def test_gpu_runs_file_is_valid_and_merging_replaces_the_same_machine():
    recorded = json.loads((ROOT / "status" / "gpu-runs.json").read_text())["runs"]
    for run in recorded:
        assert {"page", "hardware", "profile", "torch", "seconds", "ran_at"} <= set(run), run
        assert (ROOT / f"{run['page']}.md").exists(), run["page"]
    old = {"page": "chapters/hardware", "hardware": "1 GPU: NVIDIA H100 80GB HBM3 (cuda:0)", "profile": "full (GPU)",
           "seconds": 9.0, "ran_at": "2026-01-01T00:00:00+00:00", "succeeded": True}
    new = {**old, "seconds": 8.0, "ran_at": "2026-02-01T00:00:00+00:00"}
    other = {**old, "hardware": "2 GPUs: NVIDIA A100-SXM4-80GB (cuda:0)"}
    assert status.merge_runs([old, other], [new]) == [new, other]  # sorted by page, then hardware
    assert status.gpu_runs([new, {**new, "hardware": "CPU: AMD EPYC"}]) == [new]


# --- the two editions -----------------------------------------------------------------------

def site_texts(folder: Path):
    """``{path: text}`` for every text file of a built site: HTML as the reader sees it, notebooks' cells."""
    for path in sorted(folder.rglob("*")):
        if not path.is_file():
            continue
        if path.suffix == ".html":
            text = html_lib.unescape(re.sub(r"<[^>]+>", "", path.read_text(errors="ignore")))
        elif path.suffix == ".ipynb":
            text = "\n".join(cell.source for cell in nbformat.read(path, as_version=4).cells)
        elif path.suffix in {".md", ".txt", ".js", ".json"}:
            text = path.read_text(errors="ignore")
        else:
            continue
        yield path, text


def instructor_only_lines():
    """For each solution notebook, the longest line of code of its solution and of its hidden
    tests that the student notebook does not have."""
    lines = {}
    for solution in sorted((ROOT / "solutions").glob("*/*.ipynb")):
        student = (ROOT / "exercises" / solution.relative_to(ROOT / "solutions")).read_text()
        student = "\n".join(c.source for c in nbformat.reads(student, as_version=4).cells)
        for begin, end in (("BEGIN SOLUTION", "END SOLUTION"), ("BEGIN HIDDEN TESTS", "END HIDDEN TESTS")):
            candidates = []
            for cell in nbformat.read(solution, as_version=4).cells:
                for block in re.findall(rf"{begin}\n(.*?){end}", cell.source, re.S):
                    candidates += [line.strip() for line in block.splitlines()
                                   if len(line.strip()) > 20 and line.strip() not in student]
            assert candidates, f"{solution}: no {begin} block"
            code = [line for line in candidates if not line.startswith("#")]  # code before comments
            lines[f"{solution.parent.name} {begin}"] = max(code or candidates, key=len)
    return lines


def test_student_book_has_no_line_of_a_solution_or_hidden_test(built_book):
    secrets = instructor_only_lines()
    for path, text in site_texts(built_book.html):
        for what, line in secrets.items():
            assert line not in text, f"{path.relative_to(built_book.html)} contains {what}: {line!r}"


def test_instructor_edition_adds_solutions_and_grading_guide_without_executing(instructor_book):
    assert instructor_book.executed == [], f"the instructor edition executed {instructor_book.executed}"
    assert instructor_book.seconds < 120, f"the instructor edition took {instructor_book.seconds:.0f} s"
    assert instructor_book.broken_links == []
    texts = dict(site_texts(instructor_book.html))
    solutions = {path: text for path, text in texts.items() if "solutions" in path.parts}
    everything = "\n".join(solutions.values())
    for marker in INSTRUCTOR_ONLY:
        assert marker in everything, marker
    for what, line in instructor_only_lines().items():
        name = what.split()[0]
        page = instructor_book.html / "solutions" / name / f"{name}.html"
        assert line in texts[page], f"the instructor edition lacks {what}: {line!r}"
    assert "Grading notes for instructors" in texts[instructor_book.html / "solutions" / "GRADING.html"]
    for name in toc_files():  # and everything the student book has
        assert (instructor_book.html / f"{name}.html").exists(), name


PLAIN_TEXT = re.compile(r"[A-Za-z ,.;]{30,}")  # no markup, quotes or dashes the HTML rewrites


def guide_lines():
    """For each page of the instructor guide (``_instructor.yml``), its longest run of plain
    prose within a line, which its built page shows as it stands."""
    additions = yaml.safe_load((ROOT / "_instructor.yml").read_text())
    guide = next(part for part in additions["parts"] if part["caption"] == "Instructor guide")
    lines = {}
    for entry in guide["chapters"]:
        text = (ROOT / f"{entry['file']}.md").read_text()
        plain = [run.strip() for line in text.splitlines() if not line.startswith(("#", "|"))
                 for run in PLAIN_TEXT.findall(line)]
        assert plain, f"{entry['file']}: no line of plain prose"
        lines[entry["file"]] = max(plain, key=len)
    return lines


def test_instructor_edition_shows_the_guide(instructor_book):
    texts = dict(site_texts(instructor_book.html))
    for name, line in guide_lines().items():
        page = instructor_book.html / f"{name}.html"
        assert page in texts, f"the instructor edition lacks {name}"
        assert line in texts[page], f"{name}.html lacks its line {line!r}"


def test_student_edition_shows_no_page_of_the_guide(built_book):
    assert not (built_book.html / "guide").exists()
    assert not (built_book.html / "_sources" / "guide").exists()
    lines = guide_lines()
    for path, text in site_texts(built_book.html):
        for name, line in lines.items():
            assert line not in text, f"{path.relative_to(built_book.html)} shows {name}: {line!r}"
