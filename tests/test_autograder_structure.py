"""The autograder's shape: its modules import each other without a cycle, the process layer
knows nothing of grading, and each limit has one home."""
from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "autograder"


def imports_of(path: Path) -> set:
    """The autograder modules a module imports, at top level or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:
                if node.module:
                    found.add(node.module.split(".")[0])
                else:
                    found.update(alias.name for alias in node.names)
            elif node.level == 0 and (node.module or "").startswith("autograder."):
                found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found.update(alias.name.split(".")[1] for alias in node.names
                         if alias.name.startswith("autograder."))
    return found - {path.stem}


def graph() -> dict:
    modules = {path.stem: path for path in PACKAGE.glob("*.py")}
    return {name: imports_of(path) & set(modules) for name, path in modules.items()}


def test_no_import_cycle():
    edges, state, cycles = graph(), {}, []

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
    edges = graph()
    assert edges["spawn"] == set()
    assert edges["forkserver"] == {"spawn"}
    assert edges["imports"] == set()
    assert edges["options"] <= {"spawn"}


def test_the_kernel_side_of_the_sandbox_imports_no_grader_side():
    edges = graph()
    for inside in ("confine", "audit", "kernel_process"):
        assert not edges[inside] & {"cgroups", "processes", "grade", "execute", "checks"}, inside


def test_limits_are_not_written_twice():
    """Limits live in options.py: no other module writes the old literals."""
    for path in PACKAGE.glob("*.py"):
        if path.name == "options.py":
            continue
        text = path.read_text()
        assert not re.search(r"\b\d+ \* (GiB|MiB)|\b1024 \*\* [23]", text), path.name
        for literal in ("start_timeout=60", '("auto", "cpu", "cuda")', '"quick", "full"',
                        "WORKERS_TIMEOUT = ", "START_MARGIN = ", "RETRIES = "):
            assert literal not in text, (path.name, literal)


def test_both_runners_implement_the_runner_protocol():
    from autograder.cluster import Cluster
    from autograder.grade import LocalRunner, Runner
    wanted = {name for name in vars(Runner) if not name.startswith("_")}
    assert wanted == {"describe", "threads", "prepare", "resolve", "grade", "close"}
    for runner in (LocalRunner, Cluster):
        assert all(callable(getattr(runner, name, None)) for name in wanted), runner
        assert hasattr(runner, "__enter__") and hasattr(runner, "__exit__")
