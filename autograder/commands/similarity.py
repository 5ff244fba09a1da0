"""``python -m autograder similarity ASSIGNMENT``: the pairs of learners whose answers are
most alike, over nbgrader's submitted folder or the service's uploads (the comparing is
:mod:`autograder.service.similarity`'s, as on the service's instructor page)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import List

from autograder.layout import Course

SUBMITTED_DIRECTORY = "submitted"  # nbgrader's default CourseDirectory.submitted_directory


def submitted_directory(course: Course) -> Path:
    """Where nbgrader collects the course's submissions (``nbgrader_config.py`` may say)."""
    settings = (course.config or {}).get("CourseDirectory", {}) or {}
    return course.root / settings.get("submitted_directory", SUBMITTED_DIRECTORY)


def uploaded(db: Path, course: Course, assignment: str, sources: dict) -> List:
    """The latest upload of each learner in the service's database ``db``: the roster's
    learners or, on a JupyterHub (no roster), everyone who handed in, as the page takes."""
    from autograder.service import similarity
    from autograder.service.config import ROSTER, read_roster
    from autograder.service.db import Store
    if not db.is_file():
        raise FileNotFoundError(f"{db} is not a file: give the database `serve` uses "
                                "(its --db, or service.db in the course)")
    store = Store(db)
    if (course.root / ROSTER).is_file():
        learners = [p.id for p in read_roster(course.root).values() if not p.instructor]
    else:
        learners = sorted({row.student for row in store.rows()})
    return similarity.uploaded_handins(store, assignment, sources, learners)


def run_similarity(args: argparse.Namespace, course: Course) -> int:
    try:
        import copydetect  # noqa: F401 - the matching is its
        from autograder.service import similarity
    except ModuleNotFoundError as error:  # an installed package: no service, no copydetect
        print(f"error: {error.name} is not installed: run `python -m autograder similarity` "
              "from a checkout of the course, with its requirements.txt installed (see "
              "guide/similarity.md)", file=sys.stderr)
        return 2
    try:
        sources = course.source_notebooks(args.assignment)
        if args.db is not None:
            handins = uploaded(args.db, course, args.assignment, sources)
            source = f"each learner's latest upload in {args.db}"
        else:
            submitted = args.submitted or submitted_directory(course)
            handins = similarity.submitted_handins(submitted, args.assignment, sources)
            source = f"the notebooks in {submitted}"
        given = similarity.given_code(sources, args.given)
    except (FileNotFoundError, ValueError) as error:  # also a bad roster, a later database
        print(f"error: {error}", file=sys.stderr)
        return 2
    report = similarity.compare(args.assignment, handins, given, shown=args.top)
    print(similarity.table(report))
    if args.json is not None:
        args.json.write_text(json.dumps(report.as_dict(), indent=1) + "\n")
        print(f"Wrote {args.json}")
    if args.html is not None:
        from autograder.service.pages import similarity_file
        args.html.write_text(similarity_file(report, source))
        print(f"Wrote {args.html}")
    return 0

