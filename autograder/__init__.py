"""Grade nbgrader submissions with papermill: a pipeline of small steps.

``layout`` (find submissions and the instructor's notebooks) -> ``rebuild`` (the
notebook to run, from trusted parts plus the learner's answers) -> ``execute``
(papermill, one kernel process per submission, time limits) -> ``judge`` (each test
cell on its own) -> ``report`` (grades.csv, Gradescope results, executed notebooks)
and ``gradebook`` (nbgrader's database). ``grade`` strings them together for one
submission (:func:`autograder.grade.grade_submission`, the one pipeline, under the one
:class:`~autograder.options.GradeOptions`); a runner grades many (``grade.LocalRunner``
here, ``cluster.Cluster`` on Dask, both a ``grade.Runner``), and each owns the run's
``spawn.Spawner``, which starts every process (kernel, checks, CUDA probe) by naming its
target; ``check`` is the learner's own run of the same pipeline; ``cli`` is
``python -m autograder``.
"""
__all__ = ["GradeOptions", "LocalRunner", "SubmissionResult", "grade_submission"]


def __getattr__(name: str):
    # Imported on first use: `python -m autograder` starts its fork server before
    # paying for nbformat, papermill and friends.
    if name in __all__:
        from . import grade
        return getattr(grade, name)
    raise AttributeError(f"module 'autograder' has no attribute {name!r}")
