"""nbgrader configuration: the repository root is the course directory.

    solutions/<assignment>/<notebook>.ipynb   source step: instructor notebooks (solutions,
                                              visible and hidden tests, points per test cell)
    exercises/<assignment>/<notebook>.ipynb   release step: what learners get, written by
                                              `nbgrader generate_assignment <assignment> --force`
    submitted/<student>/<assignment>/         where collected submissions go
    autograded/, feedback/, gradebook.db      written by `nbgrader autograde` and friends

Run nbgrader from the repository root, e.g. `.venv/bin/nbgrader autograde benchmark`.
Grading notes for instructors: solutions/GRADING.md.
"""

c = get_config()  # noqa: F821 - traitlets defines get_config() when it loads this file

c.CourseDirectory.course_id = "dlperf-computational-performance"

# Where each nbgrader step lives (relative to the course root, the working directory).
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "exercises"
c.CourseDirectory.submitted_directory = "submitted"
c.CourseDirectory.autograded_directory = "autograded"
c.CourseDirectory.feedback_directory = "feedback"
# nbgrader's own list, plus the instructor's notes on equivalent mutants (python -m
# autograder mutants), which stay beside the solutions and out of every release.
c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback",
                            "equivalent_mutants.toml"]

# What learners see where a solution was: a stub that fails every test until it is replaced.
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}

# Seconds per cell when autograding. A cell takes a few seconds at most (importing torch is the
# slowest); the margin is for busy grading machines, not for slow submissions.
c.Execute.timeout = 300
