"""Grade nbgrader submissions with papermill: a pipeline of small steps.

``layout`` (find submissions and the instructor's notebooks) -> ``rebuild`` (the
notebook to run, from trusted parts plus the learner's answers) -> ``execute``
(papermill, one kernel process per submission, time limits) -> ``judge`` (each test
cell on its own) -> ``report`` (grades.csv, Gradescope results, executed notebooks)
and ``gradebook`` (nbgrader's database). ``grade`` strings them together for one
submission (:func:`autograder.grade.grade_submission`) or many; ``kernels`` starts
the kernels; ``check`` is the learner's own test run; ``cli`` is ``python -m autograder``.
"""
from .grade import GradeOptions, SubmissionResult, grade_all, grade_submission

__all__ = ["GradeOptions", "SubmissionResult", "grade_all", "grade_submission"]
