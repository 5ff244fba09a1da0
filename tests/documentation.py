"""The course's documentation as the tests read it: one place that finds a page's text.

Tests that check what the documentation says (a command, a default, a table) read it with
:func:`documentation`, naming the page where the text lives: ``README.md``, a page of the
instructor guide (``guide/grader.md``) or another page of the book
(``assignments/handing-in.md``). A page that neither the README is nor either edition of the
book shows is refused, so a test cannot keep checking text that no reader sees any more.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator, Set

import yaml

ROOT = Path(__file__).resolve().parent.parent
README = "README.md"


def _files(entries) -> Iterator[str]:
    for entry in entries or ():
        if "file" in entry:
            yield entry["file"]
        yield from _files(entry.get("sections"))


def book_pages() -> Set[str]:
    """Every page of the student edition (``_toc.yml``) and of what the instructor edition adds
    (``_instructor.yml``), as paths with their ``.md`` suffix."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    additions = yaml.safe_load((ROOT / "_instructor.yml").read_text())
    names = {toc["root"]}
    for part in toc.get("parts", []) + additions.get("parts", []):
        names.update(_files(part.get("chapters")))
    return {f"{name}.md" for name in names if (ROOT / f"{name}.md").is_file()}


def documentation(page: str) -> str:
    """The text of ``page`` (a path from the repository's root), which readers must be shown."""
    if page != README and page not in book_pages():
        raise AssertionError(f"{page} is neither the README nor a page of the book: "
                             "a test checks text that no reader is shown")
    return (ROOT / page).read_text()


def one_line(text: str) -> str:
    """``text`` with every run of white space (line breaks and continuation lines included)
    made one space, for finding a sentence or a command that the page wraps."""
    return " ".join(text.replace("\\\n", " ").split())
