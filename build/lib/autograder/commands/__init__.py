"""What users type: ``cli`` (``python -m autograder``), ``check`` (a learner's own run of the
pipeline), ``submit`` (the learner's client of the service), ``gradescope`` (the zip and
what it runs per submission) and ``mutants`` (mutation analysis for instructors)."""
