"""Put the scores into nbgrader's gradebook, so nbgrader's own tools work on them.

With the scores in the gradebook (``sqlite:///gradebook.db`` by default, any SQLAlchemy
URL), ``nbgrader export`` writes them out, formgrader shows them for manual grading,
and ``nbgrader generate_feedback --CourseDirectory.autograded_directory=OUT`` turns the
executed notebooks into feedback.

Each test cell's score is its ``auto_score``, as nbgrader's autograder would store it.
Where a person has to decide, the grade is flagged ``needs_manual_grade``: written
answers, and GPU-only tests skipped on a CPU run (they were not run, so they are
neither failed nor passed). A score a person has already entered is kept.

If the assignment is not in the gradebook yet (``nbgrader generate_assignment`` not run
against this database), it is recorded from the instructor's notebooks with nbgrader's
own ``SaveCells``, exactly as ``generate_assignment`` would.
"""
from __future__ import annotations

import contextlib
import warnings
from pathlib import Path
from typing import Dict

from autograder.pipeline.result import INVALID, SubmissionResult
from autograder.pipeline.judge import MANUAL, SKIPPED
from autograder.layout import SourceNotebook

DEFAULT_DB_URL = "sqlite:///gradebook.db"


def _alembic_head() -> str:
    """The schema version nbgrader stamps a new gradebook with, found in-process.

    nbgrader finds it by running the ``alembic`` command, which costs an interpreter
    start and fails where the virtualenv's bin/ is not on PATH.
    """
    import nbgrader
    from alembic.config import Config
    from alembic.script import ScriptDirectory
    config = Config()
    config.set_main_option("script_location", str(Path(nbgrader.__file__).parent / "alembic"))
    return ScriptDirectory.from_config(config).get_current_head()


@contextlib.contextmanager
def _in_process_alembic():
    import nbgrader.api
    original = nbgrader.api.get_alembic_version
    nbgrader.api.get_alembic_version = _alembic_head
    try:
        yield
    finally:
        nbgrader.api.get_alembic_version = original


def db_url(value: str) -> str:
    """A SQLAlchemy URL; a plain path means an SQLite file there."""
    if "://" in value:
        return value
    return f"sqlite:///{Path(value).resolve()}"


class GradebookWriter:
    """Record results into an nbgrader gradebook (one instance per grading run)."""

    def __init__(self, url: str = DEFAULT_DB_URL, course_id: str = ""):
        from nbgrader.api import Gradebook
        self.url = db_url(url)
        self.course_id = course_id
        with _in_process_alembic():
            self.gradebook = Gradebook(self.url, course_id)

    def close(self) -> None:
        self.gradebook.close()

    def __enter__(self) -> "GradebookWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def register_assignment(self, assignment: str, sources: Dict[str, SourceNotebook]) -> None:
        """Make sure the assignment and its notebooks' cells are in the gradebook."""
        from nbgrader.api import MissingEntry
        from nbgrader.preprocessors import SaveCells
        gb = self.gradebook
        gb.update_or_create_assignment(assignment)
        for name, source in sources.items():
            try:
                gb.find_notebook(name, assignment)
                continue  # recorded by generate_assignment (or an earlier run): keep it
            except MissingEntry:
                pass
            resources = {"nbgrader": {"db_url": self.url, "assignment": assignment,
                                      "notebook": name}}
            SaveCells().preprocess(source.graded_view, resources)
        gb.db.expire_all()  # SaveCells wrote through its own session

    def record(self, result: SubmissionResult) -> None:
        """Store one submission's scores (creating the student and submission as needed)."""
        from nbgrader.api import MissingEntry
        gb = self.gradebook
        sub = result.submission
        gb.update_or_create_student(sub.student_id)
        stamp = sub.timestamp()
        with warnings.catch_warnings():
            # nbgrader's add_submission trips SQLAlchemy 2's autoflush warnings; harmless
            warnings.simplefilter("ignore", category=Warning)
            if stamp is not None:
                gb.update_or_create_submission(sub.assignment, sub.student_id, timestamp=stamp)
            else:
                gb.update_or_create_submission(sub.assignment, sub.student_id)
        try:
            notebook = gb.find_submission_notebook(sub.notebook, sub.assignment, sub.student_id)
        except MissingEntry:
            return  # a notebook the assignment does not have: nothing to record it under
        self._store(notebook, result)
        gb.db.commit()

    @staticmethod
    def _store(notebook, result: SubmissionResult) -> None:
        by_id = {t.grade_id: t for t in result.tests}
        for grade in notebook.grades:
            test = by_id.get(grade.name)
            if result.status == INVALID or test is None:
                # not submitted or unreadable: zero, as nbgrader does for a missing notebook
                grade.auto_score, grade.needs_manual_grade = 0.0, False
            elif test.outcome == MANUAL:
                answered = result.answered.get(grade.name, True)
                grade.auto_score = None if answered else 0.0
                grade.needs_manual_grade = answered
            elif test.outcome == SKIPPED:
                grade.auto_score, grade.needs_manual_grade = None, True
            else:
                grade.auto_score = test.score
                grade.needs_manual_grade = grade.manual_score is not None
        for comment in notebook.comments:
            answered = result.answered.get(comment.name)
            comment.auto_comment = "No response." if answered is False else None
