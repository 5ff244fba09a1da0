"""Reading what an executed notebook printed, for the page tests."""
from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from coursebook.executed import outputs

ROOT = Path(__file__).resolve().parent.parent


def checkout_env(**extra: str) -> dict:
    """This process's environment with this checkout first on ``PYTHONPATH``, this Python's
    folder first on ``PATH`` (nbgrader runs ``alembic`` from it) and ``extra`` added. What
    was on either stays after it (on a lent GPU machine, the kit's packages: nbgrader,
    papermill), so that a command a test starts imports what the test does."""
    def first(value: str, name: str) -> str:
        return os.pathsep.join(p for p in (value, os.environ.get(name, "")) if p)
    return {**os.environ, "PYTHONPATH": first(str(ROOT), "PYTHONPATH"),
            "PATH": first(str(Path(sys.executable).parent), "PATH"), **extra}


def autograder(*args, cwd=ROOT, env=None, timeout=600) -> subprocess.CompletedProcess:
    """``python -m autograder ARGS`` as its user runs it (this checkout on the path, ``env``
    added to the environment), to completion: its exit status and output."""
    environment = checkout_env()
    environment.update(env or {})
    return subprocess.run([sys.executable, "-m", "autograder", *map(str, args)], cwd=cwd,
                          env=environment, capture_output=True, text=True, timeout=timeout)


def python312():
    """A Python 3.12 interpreter of this machine that runs, or None (the GPU kit's stand-in and
    the Gradescope image's install are for Python 3.12, whatever runs the tests)."""
    candidates = [shutil.which("python3.12"), *sorted(glob.glob(
        os.path.expanduser("~/.pyenv/versions/3.12*/bin/python3.12"))), "/usr/bin/python3.12"]
    for candidate in filter(None, candidates):
        try:
            done = subprocess.run([candidate, "--version"], capture_output=True, text=True,
                                  timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0 and done.stdout.startswith("Python 3.12"):
            return candidate
    return None


EXECUTED = ROOT / "_build" / "jupyter_execute"


# dlperf.pages.glue's line without myst-nb: the name, a colon, the value as shown.
_PRINTED_GLUE = re.compile(r"^([A-Za-z_]\w*): (.*)$", re.MULTILINE)


def glued(nb: nbformat.NotebookNode, page: str = "") -> dict:
    """The values a page glued with ``myst_nb.glue``, as text/plain, by name.

    The book build moves glued values out of the notebook into
    ``_build/jupyter_execute/<page>.glue.json``; a notebook executed directly
    keeps them as outputs (under a prefixed MIME type when glued with
    ``display=False``). Where myst-nb is not installed (a plain Jupyter, the GPU kit),
    ``dlperf.pages.glue`` prints ``name: value`` lines instead. All three are read; a value
    myst-nb kept wins over a printed line of the same name.
    """
    values = {}
    for cell in nb.cells:
        for out in outputs(cell):
            if out.get("output_type") == "stream":
                values.update(_PRINTED_GLUE.findall(out.get("text", "")))
    glue_file = EXECUTED / f"{page}.glue.json"
    if page and glue_file.exists():
        for name, output in json.loads(glue_file.read_text()).items():
            values[name] = output["data"]["text/plain"]
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            scrapbook = out.get("metadata", {}).get("scrapbook", {})
            key = scrapbook.get("mime_prefix", "") + "text/plain"
            if "name" in scrapbook and key in out.get("data", {}):
                values[scrapbook["name"]] = out["data"][key]
    return values


def number(values: dict, name: str) -> float:
    """A glued number, from its text/plain form (``1.5``, ``'1.5'`` or ``np.float64(1.5)``)."""
    assert name in values, f"the page did not glue {name!r}; it glued {sorted(values)}"
    text = values[name].strip("'\"")
    wrapped = re.fullmatch(r"np\.float\d+\((.*)\)", text)
    return float(wrapped.group(1) if wrapped else text)


def figures(nb: nbformat.NotebookNode) -> int:
    """How many figures (SVG or PNG outputs) the page drew."""
    return sum("image/svg+xml" in out.get("data", {}) or "image/png" in out.get("data", {})
               for cell in nb.cells for out in cell.get("outputs", []))


def execute_chapter(name: str, monkeypatch, timeout: int = 900) -> nbformat.NotebookNode:
    """Run ``chapters/<name>.md`` from top to bottom here (quick profile, synthetic data), as the
    GPU tests do to exercise the branches a CPU-built book never takes. Under
    ``scripts/gpu-run``, which has just executed every chapter on the GPU, the notebook it
    wrote to ``$DLPERF_EXECUTED_CHAPTERS`` is read instead of running the page again."""
    import jupytext
    from nbclient import NotebookClient

    executed = os.environ.get("DLPERF_EXECUTED_CHAPTERS")
    if executed:  # scripts/gpu-run has just executed every chapter on this GPU: read it
        path = Path(executed) / f"{name}.ipynb"
        if not path.exists():
            pytest.fail(f"{name} was not executed by this run ({path} is missing)")
        return nbformat.read(path, as_version=4)
    monkeypatch.setenv("DLPERF_PROFILE", "quick")
    monkeypatch.setenv("DLPERF_DATA", "synthetic")
    nb = jupytext.read(ROOT / "chapters" / f"{name}.md")
    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT / "chapters")}}).execute()
    return nb


# What a reader should never meet in a page's output: the machine's own paths, object reprs,
# warnings and log lines. Each pattern is named by what it catches.
_UNREADABLE = {
    "an object repr": re.compile(r"<[^<>\n]* at 0x[0-9a-fA-F]+>"),
    "a temporary path": re.compile(r"(?<![\w.])/tmp/|/var/folders/|\\Temp\\"),
    "a path into the virtual environment": re.compile(r"\.venv\b|site-packages"),
    "a path of this checkout": re.compile(re.escape(str(ROOT))),
    "a warning": re.compile(r"\b\w*Warning\b:|^\s*warnings\.warn", re.MULTILINE),
    "a log line": re.compile(r"^(\[rank\d+\]:)?(\[?[WIEF]\d{4} \d\d:\d\d|(WARNING|INFO|DEBUG|ERROR)"
                             r"(:|\s+\[))", re.MULTILINE),
    "a traceback": re.compile(r"Traceback \(most recent call last\)"),
    "a plural in parentheses": re.compile(r"\w\(s\)"),
    # A cell whose last line returns a tensor or a matplotlib artist shows its repr.
    "a tensor's repr": re.compile(r"\btensor\(.*grad_fn=<"),
    "a plot object's repr": re.compile(r"^\[?(Text|Annotation|Line2D)\(", re.MULTILINE),
    # ax.set_ylim / set_xlim return the new limits, a pair of floats, shown if last in a cell
    "a pair of axis limits": re.compile(r"^\((?:np\.float\d+\()?-?[\d.]+(?:e[-+]?\d+)?\)?, "
                                        r"(?:np\.float\d+\()?-?[\d.]+(?:e[-+]?\d+)?\)?\)$",
                                        re.MULTILINE),
}
HIDDEN = {"remove-cell", "remove-input"}
VERDICT_NAME = re.compile(r"_(verdict|balance|margin)$")


def readability_problems(nb: nbformat.NotebookNode, page: str = "") -> list:
    """What keeps an executed page from reading like a book: unreadable output (see
    ``_UNREADABLE``), anything on stderr, ``glue`` calls in code the reader sees, and verdicts
    with asides in parentheses instead of a plain sentence. Empty when the page reads cleanly."""
    problems = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        where = f"cell {index}"
        hidden = HIDDEN & set(cell.get("metadata", {}).get("tags", []))
        if not hidden and re.search(r"\bglue\(", cell.source):
            problems.append(f"{where}: calls glue in code the reader sees (tag the cell remove-cell)")
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream" and out.get("name") == "stderr":
                problems.append(f"{where}: writes to stderr: {out.get('text', '')[:200]!r}")
            texts = [out.get("text", "")] + [out.get("data", {}).get("text/plain", "")]
            for text in texts:
                text = "".join(text) if isinstance(text, list) else text
                for what, pattern in _UNREADABLE.items():
                    found = pattern.search(text)
                    if found:
                        start = max(0, found.start() - 60)
                        problems.append(f"{where}: prints {what}: {text[start:found.end() + 60]!r}")
    for name, text in glued(nb, page).items():
        if VERDICT_NAME.search(name) and " (" in text:
            problems.append(f"verdict {name} has an aside in parentheses: {text}")
    return problems
