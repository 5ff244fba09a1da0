"""Check one chapter without building the book: ``python -m tests.check_page hybridize``.

Runs ``chapters/<name>.md`` from top to bottom (quick profile, synthetic data, as the book
build on a CPU does), then applies what the book tests apply to it: the readability rules
(:func:`tests.helpers.readability_problems`) and every verdict rule and counted fact of
``tests/test_book_claims.py`` for that page. What it cannot check without the built book is
whether each verdict appears in the rendered HTML; ``make test`` does that.

For everyday work on a page; the tests remain the judge. ``--save FILE`` keeps the executed
notebook to read its outputs.
"""
from __future__ import annotations

import argparse
import os
import sys

import nbformat


def execute(name: str, timeout: int = 900) -> nbformat.NotebookNode:
    import jupytext
    from nbclient import NotebookClient

    from tests.helpers import ROOT

    os.environ.setdefault("DLPERF_PROFILE", "quick")
    os.environ.setdefault("DLPERF_DATA", "synthetic")
    nb = jupytext.read(ROOT / "chapters" / f"{name}.md")
    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT / "chapters")}}).execute()
    return nb


def problems(nb: nbformat.NotebookNode, name: str) -> list:
    from tests.helpers import glued, readability_problems
    from tests.test_book_claims import CLAIMS, FACTS, value

    page = f"chapters/{name}"
    found = readability_problems(nb)
    values = {key: value(text) for key, text in glued(nb).items()}
    for claim_page, verdict, rule, prefix in CLAIMS:
        if claim_page != page:
            continue
        try:
            expected = rule(values)
        except KeyError as missing:
            found.append(f"{verdict}: the page glued no {missing}")
            continue
        said = values.get(verdict)
        if said is None or not (said.startswith(expected) if prefix else said == expected):
            found.append(f"{verdict}: the page says {said!r}; its numbers give {expected!r}")
    for fact_page, fact, rule in FACTS:
        if fact_page == page and values.get(fact) != rule({}):
            if not isinstance(values.get(fact), (int, float)) or abs(values[fact] - rule({})) > 1e-9:
                found.append(f"{fact}: the page says {values.get(fact)!r}, the count is {rule({})!r}")
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", help="a chapter's file name without .md, e.g. hybridize")
    parser.add_argument("--save", help="write the executed notebook here")
    args = parser.parse_args(argv)
    nb = execute(args.name)
    if args.save:
        nbformat.write(nb, args.save)
    found = problems(nb, args.name)
    for line in found:
        print(line)
    print(f"{args.name}: {len(found)} problems found" if found else f"{args.name}: reads cleanly, "
          "and every verdict and counted fact agrees with its numbers")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
