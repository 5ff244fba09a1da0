"""Which installed modules a set of notebooks imports (what a fork server should preload).

The files are read as plain JSON (no nbformat) and this module imports only the standard
library, so ``python -m autograder`` can start its fork server before its own slow imports.
"""
from __future__ import annotations

import ast
import importlib.util
import json
from pathlib import Path
from typing import Iterable, List

from autograder.protocol import KERNEL_IMPORTS, TARGETS

# Worth preloading for any kernel: what every Python kernel imports at start-up.
KERNEL_MODULES = (
    "ipykernel.kernelapp", "ipykernel.ipkernel", "ipykernel.zmqshell", "ipykernel.debugger",
    "IPython.core.interactiveshell", "IPython.core.completer", "IPython.core.history",
    "IPython.core.debugger", "matplotlib_inline.backend_inline", "comm",
    "jupyter_client.session", "tornado.ioloop", "psutil", "pydoc", "mimetypes", "faulthandler",
    "sqlite3",
)


# The grader's own targets (kernel, checks, probes) and what a kernel imports of the package:
# imported once in the server, not in every child.
TARGET_MODULES = tuple(dict.fromkeys(
    [target.partition(":")[0] for target in TARGETS] + list(KERNEL_IMPORTS)))


def kernel_preload(notebooks: Iterable[Path]) -> List[str]:
    """What a fork server for kernels running these notebooks should import."""
    return [*KERNEL_MODULES, *TARGET_MODULES, *notebook_imports(notebooks)]


def imported_modules(sources: Iterable[str]) -> List[str]:
    """Top-level modules that the given code imports (IPython magics and shell lines ignored)."""
    names: List[str] = []
    for source in sources:
        lines = [line for line in source.splitlines()
                 if not line.lstrip().startswith(("%", "!"))]
        try:
            tree = ast.parse("\n".join(lines))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found = [node.module.split(".")[0]]
            else:
                continue
            names.extend(name for name in found if name not in names)
    return names


# Never preloaded, though a notebook imports them: modules whose import reads settings that the
# notebook itself chooses before importing them. Triton reads TRITON_INTERPRET (run kernels in its
# interpreter, on the CPU) when it is imported; the course's Triton notebooks set it when PyTorch
# finds no CUDA GPU, so a Triton imported beforehand by the fork server would run no kernel there
# ("Cannot call @triton.jit'd outside of the scope of a kernel").
NOT_PRELOADED = frozenset({"triton"})


def notebook_imports(paths: Iterable[Path]) -> List[str]:
    """Installed modules that the code cells of these notebooks import (but NOT_PRELOADED)."""
    code = []
    for path in paths:
        try:
            nb = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            continue
        for cell in nb.get("cells", []):
            if isinstance(cell, dict) and cell.get("cell_type") == "code":
                source = cell.get("source", "")
                code.append("".join(source) if isinstance(source, list) else str(source))
    return importable(name for name in imported_modules(code) if name not in NOT_PRELOADED)


def importable(names: Iterable[str]) -> List[str]:
    """The names that are installed modules (so a fork server can import them)."""
    found = []
    for name in names:
        try:
            if importlib.util.find_spec(name) is not None:
                found.append(name)
        except (ImportError, ValueError):
            pass
    return found
