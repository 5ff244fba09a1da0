"""Reading what an executed notebook printed, for the page tests."""
from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
EXECUTED = ROOT / "_build" / "jupyter_execute"


def page_text(nb: nbformat.NotebookNode) -> str:
    """Everything the page printed (stdout, stderr, text/plain results), joined."""
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                parts.append(out.get("text", ""))
            elif "data" in out and "text/plain" in out["data"]:
                parts.append(out["data"]["text/plain"])
    return "\n".join(parts)


def glued(nb: nbformat.NotebookNode, page: str = "") -> dict:
    """The values a page glued with ``myst_nb.glue``, as text/plain, by name.

    The book build moves glued values out of the notebook into
    ``_build/jupyter_execute/<page>.glue.json``; a notebook executed directly
    keeps them as outputs (under a prefixed MIME type when glued with
    ``display=False``). Both are read.
    """
    values = {}
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
    GPU tests do to exercise the branches a CPU-built book never takes."""
    import jupytext
    from nbclient import NotebookClient

    monkeypatch.setenv("DLPERF_PROFILE", "quick")
    monkeypatch.setenv("DLPERF_DATA", "synthetic")
    nb = jupytext.read(ROOT / "chapters" / f"{name}.md")
    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT / "chapters")}}).execute()
    return nb
