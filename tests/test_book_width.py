"""What a reader sees fits a laptop's page: 88 columns, so that nothing scrolls sideways.

* Every line of a code cell the chapters show (all but ``remove-cell`` and
  ``remove-input`` cells; ``hide-input`` cells are shown on a click and count), and every
  line of the library code they show with ``literalinclude``, fits in 88 columns
  (fast: read from the sources).
* Every line a chapter prints, as text (stdout, stderr, a result shown as text/plain), fits
  too, but for the few kinds of output listed in ``WIDE_OUTPUT``, each with its reason
  (integration: read from the built book). Tables shown as HTML are the browser's to fit.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "chapters").glob("*.md"))
WIDTH = 88
HIDDEN = {"remove-cell", "remove-input"}

_CELL = re.compile(r"^```\{code-cell\}")
_OPTION = re.compile(r"^:([\w-]+):\s*(.*)$")
_INCLUDE = re.compile(r"^```\{literalinclude\}\s+(\S+)\n((?::[\w-]+:.*\n)*)```", re.MULTILINE)


def _tags(text: str) -> set:
    found = re.search(r"\[(.*)\]", text)
    return {t.strip().strip("'\"") for t in found.group(1).split(",")} if found else set()


def code_cells(path: Path):
    """``(line number of the cell's first code line, tags, code lines)`` for each code cell."""
    lines = path.read_text().splitlines()
    cells, i = [], 0
    while i < len(lines):
        if not _CELL.match(lines[i]):
            i += 1
            continue
        i += 1
        tags = set()
        if i < len(lines) and lines[i].strip() == "---":  # YAML options
            i += 1
            while lines[i].strip() != "---":
                if lines[i].strip().startswith("tags:"):
                    tags = _tags(lines[i])
                i += 1
            i += 1
        while i < len(lines) and _OPTION.match(lines[i]):
            name, value = _OPTION.match(lines[i]).groups()
            if name == "tags":
                tags = _tags(value)
            i += 1
        start = i
        while lines[i].rstrip() != "```":
            i += 1
        cells.append((start + 1, tags, lines[start:i]))
        i += 1
    return cells


def included_code(path: Path):
    """``(file, first line number, lines as shown)`` for each ``literalinclude`` of ``path``."""
    shown = []
    for found in _INCLUDE.finditer(path.read_text()):
        source = (path.parent / found.group(1)).resolve()
        options = dict(_OPTION.match(line).groups() for line in found.group(2).splitlines())
        lines = source.read_text().splitlines()
        if "pyobject" in options:
            node = ast.parse("\n".join(lines))
            for name in options["pyobject"].split("."):  # Sphinx's Class.method form too
                node = next(n for n in node.body if isinstance(
                    n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == name)
            first = node.decorator_list[0].lineno if node.decorator_list else node.lineno
            last = node.end_lineno
        else:
            assert "start-after" in options and "end-before" in options, options
            first = next(n for n, line in enumerate(lines, 1) if options["start-after"] in line) + 1
            last = next(n for n, line in enumerate(lines, 1)
                        if n >= first and options["end-before"] in line) - 1
        dedent = int(options.get("dedent", 0))
        shown.append((source, first, [line[dedent:] for line in lines[first - 1:last]]))
    return shown


def test_code_the_chapters_show_fits_88_columns():
    too_wide = []
    for path in CHAPTERS:
        for start, tags, lines in code_cells(path):
            if tags & HIDDEN:
                continue
            too_wide += [f"{path.relative_to(ROOT)}:{start + k}: {len(line)} columns: {line}"
                         for k, line in enumerate(lines) if len(line) > WIDTH]
    assert not too_wide, "code cells a reader sees run past 88 columns:\n" + "\n".join(too_wide)


def test_library_code_the_chapters_include_fits_88_columns():
    too_wide = set()
    for path in CHAPTERS:
        for source, first, lines in included_code(path):
            too_wide |= {f"{source.relative_to(ROOT)}:{first + k}: {len(line)} columns: {line}"
                         for k, line in enumerate(lines) if len(line) > WIDTH}
    assert not too_wide, ("code the chapters literalinclude runs past 88 columns:\n"
                          + "\n".join(sorted(too_wide)))


def test_the_parsers_find_what_the_chapters_hold():
    """The cell and include readers above see every cell and include (no silent skip)."""
    for path in CHAPTERS:
        text = path.read_text()
        assert len(code_cells(path)) == text.count("```{code-cell}"), path.name
        assert len(included_code(path)) == text.count("```{literalinclude}"), path.name
    assert any(tags & HIDDEN for path in CHAPTERS for _, tags, _ in code_cells(path))


# Output that is wider than 88 columns on purpose, by page: what it is and why it stays.
WIDE_OUTPUT = {
    # A reference's URL cannot be broken and stay a URL a reader can copy.
    "a URL": re.compile(r"https?://\S{20,}"),
    # torch.profiler's table: its columns are fixed by PyTorch; the page shows it as printed.
    "torch.profiler's table": re.compile(r"^(-{20,}  -{6,}|.{20,}  (Self CPU|\s*[\d.]+%)\s)"),
    # Code PyTorch generated (an FX graph, an exported program), shown as PyTorch prints it.
    "code PyTorch generated": re.compile(
        r"^\s*(%\w+ : \[num_users=|def forward\(self, |\w+ = torch\.ops\.aten\.)"),
}


def wide_lines(nb) -> list:
    """``(cell index, line)`` for each printed line wider than 88 columns, but for
    ``WIDE_OUTPUT``."""
    from coursebook.executed import outputs

    found = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        for out in outputs(cell):
            data = out.get("data", {})
            if out.get("output_type") == "stream":
                text = out.get("text", "")
            elif "text/plain" in data and "text/html" not in data \
                    and not any(kind.startswith("image/") for kind in data):
                text = data["text/plain"]
            else:
                continue
            text = "".join(text) if isinstance(text, list) else text
            found += [(index, line) for line in text.splitlines() if len(line) > WIDTH
                      and not any(p.search(line) for p in WIDE_OUTPUT.values())]
    return found


@pytest.mark.integration
@pytest.mark.parametrize("page", [p.stem for p in CHAPTERS])
def test_what_a_chapter_prints_fits_88_columns(executed_page, page):
    too_wide = [f"cell {index}: {len(line)} columns: {line}"
                for index, line in wide_lines(executed_page(f"chapters/{page}"))]
    assert not too_wide, (f"chapters/{page} prints lines past 88 columns:\n"
                          + "\n".join(too_wide))


def test_chapters_hold_no_control_characters():
    # A tab in a chapter is usually a lost backslash: "\t" written from Python turned
    # the \text of a formula into a tab and "ext".
    found = [f"{path.relative_to(ROOT)}:{number}" for path in CHAPTERS
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if re.search(r"[\x00-\x08\x0b-\x1f\x7f]", line)]
    assert not found, "control characters in: " + ", ".join(found)
