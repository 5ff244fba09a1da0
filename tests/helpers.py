"""Reading what an executed notebook printed, for the page tests."""
from __future__ import annotations

import json
from pathlib import Path

import nbformat

EXECUTED = Path(__file__).resolve().parent.parent / "_build" / "jupyter_execute"


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
