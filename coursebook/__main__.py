"""``python -m coursebook [--instructor]``: build the book (see :mod:`coursebook.book`)."""
import sys

from .book import main

sys.exit(main())
