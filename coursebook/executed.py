"""What an executed notebook printed, read the same way by the page tests and ``scripts/gpu-run``."""
from __future__ import annotations

import nbformat


def outputs(cell) -> list:
    """The cell's outputs, with consecutive pieces of one stream joined: a kernel can send one
    printed line in two messages (``print`` writes its arguments, then the newline), and only
    some front ends merge them."""
    merged = []
    for out in cell.get("outputs", []):
        if (out.get("output_type") == "stream" and merged
                and merged[-1].get("output_type") == "stream"
                and merged[-1].get("name") == out.get("name")):
            merged[-1] = {**merged[-1], "text": merged[-1].get("text", "") + out.get("text", "")}
        else:
            merged.append(out)
    return merged


def page_text(nb: nbformat.NotebookNode) -> str:
    """Everything the page printed (stdout, stderr, text/plain results), joined."""
    parts = []
    for cell in nb.cells:
        for out in outputs(cell):
            if out.get("output_type") == "stream":
                parts.append(out.get("text", ""))
            elif "data" in out and "text/plain" in out["data"]:
                parts.append(out["data"]["text/plain"])
    return "\n".join(parts)
