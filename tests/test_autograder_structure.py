"""The autograder's shape: its folders are its architecture, and the imports keep to it.

Each subpackage may import only the parts the table below allows (the layering), no module
takes part in an import cycle, the kernel's side of the sandbox and the grader's side share
nothing but :mod:`autograder.protocol` (which names the targets the grader starts), and each limit has one home. Imports are read with
``ast``, inside functions too; a ``"module:function"`` string (a target a spawner starts)
or a module's dotted name in a string (one to preload) counts as an import of its module.
"""
from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

from tests.documentation import documentation

PACKAGE = Path(__file__).resolve().parent.parent / "autograder"
TARGET = re.compile(r"^autograder(\.\w+)+(:\w+)?$")  # a target, or a module named to import

# Part -> the parts it may import (besides itself). A part is a subpackage or a top-level
# module. The trust boundary: nothing imports `kernel` (the protocol names its targets), and
# `kernel` imports only `protocol` and `options`.
ALLOWED = {
    "options": set(),
    "layout": set(),
    "feedback": set(),
    "protocol": {"options"},
    "kernel": {"protocol", "options"},
    "sandbox": {"protocol", "options", "layout"},
    "pipeline": {"sandbox", "protocol", "options", "layout"},
    "runners": {"pipeline", "sandbox", "protocol", "options", "layout"},
    "service": {"runners", "pipeline", "options", "layout", "feedback"},
    "commands": {"runners", "pipeline", "sandbox", "service", "options", "layout", "feedback"},
    "__init__": {"options", "runners", "pipeline"},
    "__main__": {"commands"},
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 2 else parts)


def part_of(module: str) -> str:
    """``autograder.pipeline.grade`` -> ``pipeline``; ``autograder`` -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imports_of(path: Path, targets: bool = True) -> dict:
    """The autograder modules ``path`` imports: module -> first line that does. With
    ``targets``, a target string counts as an import, but for those the protocol declares
    (it names the targets; it does not import them)."""
    targets = targets and module_name(path) != "autograder.protocol"
    found = {}
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "autograder":
                names = [f"autograder.{alias.name}" for alias in node.names]
            else:
                names = [node.module]
        elif isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{path}: relative import; the package imports absolutely")
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif targets and isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and TARGET.match(node.value):
            names = [node.value.split(":")[0]]
        for name in names:
            if name == "autograder" or name.startswith("autograder."):
                found.setdefault(name, node.lineno)
    found.pop(module_name(path), None)
    return found


def modules() -> dict:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))
            if not path.name.endswith(".example.py")}


def test_every_part_is_in_the_table():
    assert {part_of(name) for name in modules()} == set(ALLOWED)


def test_the_guide_shows_the_table():
    """The guide's "The grader, folder by folder": one row per part, with what it may import."""
    text = documentation("guide/layout.md")
    table = text[text.index("## The grader, folder by folder"):]
    table = table[:table.index("\n\n", table.index("| part |"))]
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        match = re.fullmatch(r"`(\w+)(?:\.py|/)`", cells[0])
        if match:
            rows[match[1]] = set(re.findall(r"`(\w+)`", cells[-1]))
    assert rows == {part: allowed for part, allowed in ALLOWED.items()
                    if not part.startswith("__")}


@pytest.mark.parametrize("part", sorted(ALLOWED))
def test_a_part_imports_only_what_the_table_allows(part):
    wrong = []
    for name, path in modules().items():
        if part_of(name) != part:
            continue
        for imported, line in imports_of(path).items():
            other = part_of(imported)
            if other != part and other not in ALLOWED[part]:
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {imported}")
    assert not wrong, f"{part} may import only {sorted(ALLOWED[part])}:\n" + "\n".join(wrong)


def test_the_grader_names_the_kernels_side_only_through_the_protocol():
    """Both directions of the trust boundary, whatever the table says."""
    for name, path in modules().items():
        kernel_side = part_of(name) == "kernel"
        for imported in imports_of(path):
            if kernel_side:
                assert part_of(imported) in {"kernel", "protocol", "options"}, (name, imported)
            else:
                assert part_of(imported) != "kernel", (name, imported)


def test_the_protocols_targets_exist():
    from autograder import protocol
    for target in protocol.TARGETS:
        module, _, function = target.partition(":")
        assert callable(getattr(importlib.import_module(module), function)), target
    assert importlib.import_module(protocol.EVIDENCE_MODULE).MIME == protocol.EVIDENCE_MIME


def test_no_import_cycle():
    edges = {name: set(imports_of(path, targets=False)) & set(modules())
             for name, path in modules().items()}
    state, cycles = {}, []

    def visit(name, trail):
        state[name] = "open"
        for other in sorted(edges[name]):
            if state.get(other) == "open":
                cycles.append(trail[trail.index(other):] + [other])
            elif other not in state:
                visit(other, trail + [other])
        state[name] = "done"

    for name in sorted(edges):
        if name not in state:
            visit(name, [name])
    assert not cycles, cycles


def test_the_process_layer_knows_nothing_of_grading():
    edges = {name: set(imports_of(path)) for name, path in modules().items()}
    assert edges["autograder.sandbox.spawn"] <= {"autograder.options"}
    assert edges["autograder.sandbox.forkserver"] <= {"autograder.sandbox.spawn"}
    assert edges["autograder.sandbox.imports"] <= {"autograder.protocol"}
    assert edges["autograder.options"] == set()


def test_limits_are_not_written_twice():
    """Limits live in options.py: no other module writes the old literals."""
    for path in PACKAGE.rglob("*.py"):
        if path.name == "options.py":
            continue
        text = path.read_text()
        assert not re.search(r"\b\d+ \* (GiB|MiB)|\b1024 \*\* [23]", text), path.name
        for literal in ("start_timeout=60", '("auto", "cpu", "cuda")', '"quick", "full"',
                        '("fork", "fresh")', "WORKERS_TIMEOUT = ", "START_MARGIN = ",
                        "RETRIES = "):
            assert literal not in text, (path.name, literal)


def test_both_runners_implement_the_runner_protocol():
    from autograder.runners.cluster import Cluster
    from autograder.runners.local import LocalRunner, Runner
    wanted = {name for name in vars(Runner) if not name.startswith("_")}
    assert wanted == {"describe", "threads", "prepare", "resolve", "grade", "close"}
    for runner in (LocalRunner, Cluster):
        assert all(callable(getattr(runner, name, None)) for name in wanted), runner
        assert hasattr(runner, "__enter__") and hasattr(runner, "__exit__")
