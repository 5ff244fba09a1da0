"""Grade nbgrader submissions with papermill, in sandboxed kernels.

The package's folders are its architecture:

- :mod:`autograder.pipeline`: the one pipeline that grades one notebook
  (:func:`autograder.pipeline.grade.grade_submission`: rebuild, execute, trusted checks,
  judge), its :class:`~autograder.pipeline.result.SubmissionResult`, and the reports and
  the gradebook written from results;
- :mod:`autograder.sandbox`: the grader's side of the sandbox (spawners, the policy it
  writes for a kernel, cgroups, the kernel's working directory);
- :mod:`autograder.kernel`: the kernel's side, code that runs in a learner's kernel process;
  it shares only :mod:`autograder.protocol` with the grader;
- :mod:`autograder.runners`: where many submissions run (this machine, a Dask cluster);
- :mod:`autograder.service`: the submission service (``serve``) and its pages;
- :mod:`autograder.commands`: what users type (``python -m autograder``);
- :mod:`autograder.options` (every option, declared once), :mod:`autograder.layout` (the
  course's files), :mod:`autograder.feedback` (how a test reads to a learner).
"""
__all__ = ["GradeOptions", "LocalRunner", "SubmissionResult", "grade_submission"]
_HOMES = {"GradeOptions": "autograder.options", "LocalRunner": "autograder.runners.local",
          "SubmissionResult": "autograder.pipeline.result",
          "grade_submission": "autograder.pipeline.grade"}


def __getattr__(name: str):
    # Imported on first use: `python -m autograder` starts its fork server before
    # paying for nbformat, papermill and friends.
    if name in _HOMES:
        import importlib
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'autograder' has no attribute {name!r}")
