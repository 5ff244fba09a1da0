"""The one pipeline that grades one notebook, a module per step.

``rebuild`` (the notebook to run: trusted cells plus the learner's answers) -> ``execute``
(papermill, a sandboxed kernel) -> ``checks_process`` (the instructor's checks, in a process
of their own, on the evidence the kernel printed; ``checks``) -> ``judge`` (each test cell
on its own); ``grade`` strings them together (:func:`autograder.pipeline.grade.grade_submission`)
and ``result`` is what comes out. ``report`` and ``gradebook`` write what the runners
return: grades.csv, Gradescope's results, nbgrader's database.
"""
