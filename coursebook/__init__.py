"""coursebook: the tools that build the course's book, kept apart from the lessons.

``dlperf`` is what the chapters import and what learners install (Colab, Binder: ``pip
install`` from git); this package is what the course team runs from a checkout of the
repository, and ``pyproject.toml`` does not ship it. Its modules:

* :mod:`coursebook.book`: the build (``python -m coursebook``, ``make book``; ``--instructor``
  for the instructor edition, ``make instructor-book``) and its check of the built HTML's links;
* :mod:`coursebook.sphinxext`: the book's Sphinx extension (launch links, published chapter
  notebooks, the status page), loaded by ``_config.yml``'s ``sphinx.local_extensions``;
* :mod:`coursebook.status`: the chapters' GPU runs for the status page (``python -m
  coursebook.status record``, ``make gpu-status``; ``scripts/gpu_run.py`` records them too);
* :mod:`coursebook.assignments`: the course's assignments as ``assignments/assignments.yml``
  lists them, and everything made from that list (table of contents, index page, instructor
  edition, the grading workflow's choices).

Run it from the repository's root (``python -m coursebook``): it is found there because the
working directory is on ``sys.path``. Building it needs what ``requirements.txt`` pins; the
packages it imports beyond ``dlperf``'s are in ``coursebook/requirements.txt``.
"""
