"""The trusted side of a test: checks that run where the learner's code cannot reach.

Every autograded test cell of the instructor's notebook has one line ``### CHECKS``:

* above it, the *probe* calls the learner's functions on test inputs and keeps what
  they gave in variables; it runs in the learner's kernel and ends by reporting those
  variables as plain data (:mod:`autograder.kernel.evidence`);
* below it, the *checks*: ``assert`` statements on those values. The grader runs them
  here, in its own process, in a fresh namespace holding only the instructor's
  read-only setup cells, the run's ``TEST_SEED`` and the decoded values. Nothing the
  learner wrote (a patched ``torch.equal``, a redefined ``print``, an object that equals
  everything, a trace hook) exists here.

In Jupyter and under ``nbgrader autograde`` the cell simply runs top to bottom.

The checks compute what they expect from literals and the seed themselves, never from
inputs the probe reports, so a kernel that lies about both inputs and outputs gains
nothing. What the probe observes about *how* the code ran (the order of calls, the
transfers it made) comes from the kernel and could be forged by code that studies the
grader; the instructor guide's threat model (guide/threat-model.md) says so.
"""
from __future__ import annotations

import ast
import builtins
import functools
import io
import json
import re
import threading
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from autograder.protocol import EVIDENCE_MIME as MIME, EVIDENCE_MODULE

MARKER = "### CHECKS"
SEED_NAME = "TEST_SEED"
HIDDEN_MARKERS = re.compile(r"^\s*### (BEGIN|END) HIDDEN TESTS\s*$")


_PARSING = threading.Lock()


def parse(source: str) -> ast.Module:
    """``ast.parse``, one thread at a time.

    CPython 3.11 keeps the recursion depth of its parse-tree-to-Python-objects conversion
    in interpreter-wide state: two grading threads parsing at once could fail with
    ``SystemError: AST constructor recursion depth mismatch`` (seen at ``--jobs 4``).
    """
    with _PARSING:
        return ast.parse(source)


@dataclass(frozen=True)
class SplitTest:
    probe: str               # runs in the learner's kernel
    checks: str              # runs here
    reported: Tuple[str, ...]  # the probe's variables the checks read


@dataclass(frozen=True)
class CheckOutcome:
    passed: bool
    message: str             # the failure (``AssertionError: ...``), or ""
    printed: str             # what the checks printed
    credit: Optional[float] = None  # a partial score, when the checks end with a number


def bound_names(tree: ast.AST) -> set:
    """Names a piece of code binds anywhere (assignments, imports, defs, loop targets)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return names


@functools.lru_cache(maxsize=64)  # the same instructor's code for every submission
def setup_names(setup_code: str) -> frozenset:
    """Names the setup cells define at top level (not their functions' locals)."""
    try:
        tree = parse(setup_code)
    except SyntaxError:
        return frozenset()
    names = set()
    for statement in tree.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(statement.name)
        else:
            names |= bound_names(statement)
    return frozenset(names)


def split_test(source: str, setup: Iterable[str] = ()) -> Optional[SplitTest]:
    """Split a test cell's source at ``### CHECKS`` (``None`` when it has no such line)."""
    return _split_test(source, frozenset(setup))


@functools.lru_cache(maxsize=256)  # the same instructor's cells for every submission
def _split_test(source: str, setup: frozenset) -> Optional[SplitTest]:
    lines = source.splitlines()
    at = [i for i, line in enumerate(lines) if line.strip() == MARKER]
    if len(at) != 1:
        return None
    probe = "\n".join(lines[:at[0]])
    checks = "\n".join(line for line in lines[at[0] + 1:] if not HIDDEN_MARKERS.match(line))
    tree = parse(checks)
    loaded = {node.id for node in ast.walk(tree)
              if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
    known = bound_names(tree) | set(setup) | set(dir(builtins)) | {SEED_NAME}
    return SplitTest(probe=probe, checks=checks, reported=tuple(sorted(loaded - known)))


def probe_source(split: SplitTest) -> str:
    """The probe as the kernel runs it: the instructor's lines, then the report."""
    names = ", ".join(repr(n) for n in split.reported) + ("," if len(split.reported) == 1 else "")
    return (f"{split.probe}\n"
            f"__import__({EVIDENCE_MODULE!r}, fromlist=['emit']).emit(globals(), ({names}))")


@functools.lru_cache(maxsize=256)
def assigns_seed(source: str) -> bool:
    try:
        return SEED_NAME in bound_names(parse(source))
    except SyntaxError:
        return False


# --------------------------------------------------------------------------------------
# Decoding what the kernel reported
# --------------------------------------------------------------------------------------

class Opaque:
    """What an object that is not plain data becomes: it equals nothing."""

    def __init__(self, what: str):
        self.what = what

    def __eq__(self, other):
        return False

    def __ne__(self, other):
        return True

    __hash__ = None

    def __bool__(self):
        return False

    def __repr__(self):
        return f"<{self.what} (not plain data)>"


class ForeignException(Exception):
    """A reported exception of a type that is not one of Python's built-in ones."""


def _float(value):
    if isinstance(value, dict) and "__float__" in value:
        return float(value["__float__"])
    return value


def decode(data):
    """Python values from :func:`autograder.kernel.evidence.encode`'s output (plain types only)."""
    if isinstance(data, list):
        return [decode(item) for item in data]
    if not isinstance(data, dict):
        return data
    if "__float__" in data:
        return _float(data)
    if "__tuple__" in data:
        return tuple(decode(item) for item in data["__tuple__"])
    if "__dict__" in data:
        return {str(k): decode(v) for k, v in data["__dict__"].items()}
    if "__exception__" in data:
        info = data["__exception__"]
        kind = getattr(builtins, str(info.get("type")), None)
        args = [decode(a) for a in info.get("args", [])]
        if isinstance(kind, type) and issubclass(kind, BaseException):
            try:
                return kind(*args)
            except Exception:
                pass
        return ForeignException(*args)
    if "__dtype__" in data or "__device__" in data or "__tensor__" in data:
        import torch
        if "__dtype__" in data:
            dtype = getattr(torch, str(data["__dtype__"]), None)
            return dtype if isinstance(dtype, torch.dtype) else Opaque("dtype")
        if "__device__" in data:
            return torch.device(str(data["__device__"]))
        info = data["__tensor__"]
        dtype = getattr(torch, str(info.get("dtype")), None)
        shape = [int(n) for n in info.get("shape", [])]
        if not isinstance(dtype, torch.dtype):
            return Opaque("tensor")
        if info.get("meta"):
            return torch.empty(shape, dtype=dtype, device="meta")
        values = [_float(v) for v in info.get("values", [])]
        return torch.tensor(values, dtype=dtype).reshape(shape)
    if "__opaque__" in data:
        return Opaque(str(data["__opaque__"]))
    return Opaque("unknown")


def evidence_of(cell) -> Tuple[List[str], Optional[str]]:
    """The evidence outputs of an executed test cell, and an error if it is not usable."""
    reports = [o.get("data", {}).get(MIME) for o in cell.get("outputs", [])
               if o.get("output_type") in ("display_data", "execute_result")
               and MIME in o.get("data", {})]
    reports = [r if isinstance(r, str) else json.dumps(r) for r in reports]
    if len(reports) > 1:
        return reports, "the test reported its results more than once (tampering?)"
    return reports, None


# --------------------------------------------------------------------------------------
# Running the checks
# --------------------------------------------------------------------------------------

class TrustedChecks:
    """The instructor's setup code, executed once; checks then run on copies of it."""

    def __init__(self, setup_code: str, seed: int):
        self.seed = seed
        self.base: Dict[str, object] = {"__name__": "__checks__", "__builtins__": builtins}
        output = io.StringIO()
        self.base["print"] = _printer(output)
        exec(compile(setup_code, "<setup cells>", "exec"), self.base)
        self.base[SEED_NAME] = seed

    def run(self, checks: str, report: str) -> CheckOutcome:
        printed = io.StringIO()
        try:
            data = json.loads(report)
        except ValueError:
            return CheckOutcome(False, "the test's results could not be read", "")
        if "error" in data:
            return CheckOutcome(False, str(data["error"]), "")
        namespace = dict(self.base)
        namespace["print"] = _printer(printed)
        try:
            values = {str(k): decode(v) for k, v in dict(data.get("values", {})).items()}
        except Exception as error:
            return CheckOutcome(False, f"the test's results could not be read: {error}", "")
        namespace.update(values)
        try:
            tree = parse(checks)
            last = tree.body[-1] if tree.body and isinstance(tree.body[-1], ast.Expr) else None
            if last is not None:
                tree.body = tree.body[:-1]
            exec(compile(tree, "<checks>", "exec"), namespace)
            value = eval(compile(ast.Expression(last.value), "<checks>", "eval"), namespace) \
                if last is not None else None
        except Exception as error:
            message = f"{type(error).__name__}: {error}".rstrip(": ") if str(error) \
                else type(error).__name__
            return CheckOutcome(False, message, printed.getvalue())
        credit = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
            else None
        return CheckOutcome(True, "", printed.getvalue(), credit)


def _printer(stream):
    def captured_print(*args, sep=" ", end="\n", file=None, flush=False):
        stream.write(sep.join(str(a) for a in args) + end)
    return captured_print


def run_checks(setup_code: str, seed: int,
               tests: Sequence[Tuple[str, str, Optional[str]]]) -> Dict[str, CheckOutcome]:
    """Outcomes by grade id for ``(grade_id, checks, report)``, in this process; a missing
    report is skipped. Graders use :func:`autograder.pipeline.checks_process.run_checks_isolated`."""
    trusted = TrustedChecks(setup_code, seed)
    return {grade_id: trusted.run(checks, report)
            for grade_id, checks, report in tests if report is not None}


# --------------------------------------------------------------------------------------
# The checks process (started by autograder.pipeline.checks_process, target serve_request)
# --------------------------------------------------------------------------------------

class _ChecksTimeout(BaseException):
    """Raised in the checks process when one test's checks run past their time."""


def serve_request(request_path: str, result_path: str) -> None:
    """In the checks process: run the request's setup, then each test's checks, and
    append one JSON line per outcome to ``result_path`` as soon as it is known, so a
    crash or a hang costs only the test that caused it."""
    import signal
    with open(request_path) as handle:
        request = json.load(handle)
    limit = float(request["timeout"])

    def on_alarm(signum, frame):
        raise _ChecksTimeout()

    with open(result_path, "a") as out:
        def write(line: dict) -> None:
            out.write(json.dumps(line) + "\n")
            out.flush()

        try:
            trusted = TrustedChecks(request["setup_code"], int(request["seed"]))
        except BaseException as error:  # noqa: BLE001 - reported to the grader
            write({"setup_error": f"{type(error).__name__}: {error}"})
            return
        write({"setup": "ok"})
        signal.signal(signal.SIGALRM, on_alarm)
        for grade_id, checks, report in request["tests"]:
            try:
                signal.setitimer(signal.ITIMER_REAL, limit)
                outcome = trusted.run(checks, report)
            except _ChecksTimeout:
                outcome = CheckOutcome(False, f"TimeoutError: the checks of this test ran "
                                       f"longer than {limit:g} s and were stopped", "")
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            write({"grade_id": grade_id, "passed": outcome.passed, "message": outcome.message,
                   "printed": outcome.printed, "credit": outcome.credit})
