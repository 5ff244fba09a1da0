"""The submission service (``python -m autograder serve``): learners sign in, hand in a
notebook and read its feedback; instructors see every grade.

``config`` reads the course's ``roster.toml`` and ``service.toml``; ``db`` is its SQLite store
(tokens, browsers' sessions, uploads, the fair queue); ``auth`` signs people in (the
service's own tokens, or JupyterHub's); ``queue`` grades uploads on a runner through the one
pipeline (:mod:`autograder.pipeline.grade`); ``pages`` are its Tornado pages and ``app`` puts them
together.
"""
