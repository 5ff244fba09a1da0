"""Reading what an executed notebook printed, for the page tests."""
from __future__ import annotations

import nbformat


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


def glued(nb: nbformat.NotebookNode) -> dict:
    """The values a page glued with myst_nb.glue, as text/plain, by name."""
    values = {}
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            name = out.get("metadata", {}).get("scrapbook", {}).get("name")
            if name and "text/plain" in out.get("data", {}):
                values[name] = out["data"]["text/plain"]
    return values
