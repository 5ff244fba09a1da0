"""What a chapter's code needs from the book around it, and works without it.

The book is built with myst-nb, whose ``glue`` keeps a value a cell computed so that the
page's text can quote it (``{glue:text}`name```). The same chapter also runs as a plain
notebook (Colab, Binder, a learner's Jupyter) where myst-nb is not installed: there
:func:`glue` prints the value instead, so every cell runs as shown and the reader still
sees the number the sentence refers to.
"""
from __future__ import annotations

from numbers import Real


def _shown(value) -> str:
    if isinstance(value, Real) and not isinstance(value, (bool, int)):
        return f"{float(value):.4g}"
    return str(value)


def glue(name: str, value, display: bool = False) -> None:
    """Keep ``value`` for the page's text as ``name`` (myst-nb), or print it where the
    notebook runs without myst-nb."""
    try:
        from myst_nb import glue as myst_glue
    except ImportError:
        print(f"{name}: {_shown(value)}")
        return
    myst_glue(name, value, display=display)
