"""``python -m autograder``: see :mod:`autograder.commands.cli`."""
import sys

from autograder.commands.cli import main

if __name__ == "__main__":
    sys.exit(main())
