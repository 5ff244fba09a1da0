"""Speed tests: a test cell whose points depend on how much faster the learner's function is
than the instructor's baseline, timed where the learner's code cannot reach the clock.

The instructor declares one in a hidden test cell of the source notebook, beside the code it
names (the grader reads the declaration from the instructor's notebook only, never from a
submission)::

    ### BEGIN HIDDEN TESTS
    def slow_softmax(x): ...            # the baseline: usually the code the learner started from
    def softmax_inputs(seed): ...       # fresh arguments for one call, drawn from ``seed``
    SPEED_TEST = {
        "candidate": "softmax",         # the learner's function, by name
        "baseline": "slow_softmax",
        "inputs": "softmax_inputs",
        "points": {"cpu": [1.0, 3.0], "cuda": [1.0, 8.0]},  # speedup worth no points, all points
        "rtol": 1e-5, "atol": 1e-6,     # every timed output against the baseline's, same inputs
    }
    ### END HIDDEN TESTS

The cell must be self-contained (it imports what its functions need): the grader runs it
alone in a clean kernel to time the baseline. ``nbgrader autograde`` cannot time anything; it
runs the cell as a plain test.

This module is the arithmetic: reading the declaration, the speedup's interval from paired
timings, when to stop timing, and the points a speedup earns. The measuring itself is in
:mod:`autograder.pipeline.timing`.
"""
from __future__ import annotations

import ast
import math
import statistics
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from autograder.pipeline.checks import parse

DECLARATION = "SPEED_TEST"
DEVICES = ("cpu", "cuda")
REQUIRED = ("candidate", "baseline", "inputs", "points")
NAMES = ("check",)  # optional: a function of the cell that gives the expected outputs
DEFAULTS = {
    "rtol": 1e-5,       # torch.testing.assert_close's tolerances for float32
    "atol": 1e-6,
    "seconds": 8.0,     # timing budget per speed test, warm-up included
    "rounds": 5,        # at least this many timed rounds of each function
    "max_rounds": 60,
    "precision": 0.05,  # stop once the speedup's 95 % interval is within +-5 %
    "round_seconds": 0.1,   # each round's calls take about this long at least (a request's
    #                         millisecond or two of messaging stays small beside them)
    "max_calls": 64,    # calls per round at most (each keeps its inputs and output)
    "step": 1.0,        # points are awarded in steps of this many (stable under noise)
}
NUMBERS = ("rtol", "atol", "seconds", "precision", "round_seconds", "step")
COUNTS = ("rounds", "max_rounds", "max_calls")


class DeclarationError(Exception):
    """A speed test declared so that it cannot be used: the instructor's to fix (not a
    ValueError, which the pipeline takes for an unreadable submission)."""


@dataclass(frozen=True)
class SpeedTest:
    """One speed test as the instructor declared it."""
    candidate: str
    baseline: str
    inputs: str
    points: Dict[str, Tuple[float, float]]  # device -> (speedup for none, for all points)
    rtol: float = DEFAULTS["rtol"]
    atol: float = DEFAULTS["atol"]
    seconds: float = DEFAULTS["seconds"]
    rounds: int = DEFAULTS["rounds"]
    max_rounds: int = DEFAULTS["max_rounds"]
    precision: float = DEFAULTS["precision"]
    round_seconds: float = DEFAULTS["round_seconds"]
    max_calls: int = DEFAULTS["max_calls"]
    step: float = DEFAULTS["step"]
    check: str = ""  # a function giving the expected outputs ("": the baseline's)
    clean_source: str = ""  # what the clean kernel runs (see clean_source())

    def to_dict(self) -> dict:
        return {**{k: getattr(self, k) for k in (*REQUIRED, *NAMES, *NUMBERS, *COUNTS)},
                "points": {d: list(p) for d, p in self.points.items()}}

    @classmethod
    def from_dict(cls, data: dict) -> "SpeedTest":
        return cls(**{**data, "points": {d: tuple(p) for d, p in data["points"].items()}})


def declaration(source: str) -> Optional[SpeedTest]:
    """The speed test a test cell's source declares, or None if it declares none.

    Raises DeclarationError, naming what is wrong, for a declaration that cannot be used: the
    instructor learns it when the assignment is prepared, not from a learner's grade."""
    try:
        tree = parse(source)  # one thread at a time: CPython 3.11's parser is not thread-safe
    except SyntaxError:
        return None
    found = [node for node in tree.body if isinstance(node, ast.Assign)
             and any(isinstance(t, ast.Name) and t.id == DECLARATION for t in node.targets)]
    if not found:
        return None
    if len(found) > 1:
        raise DeclarationError(f"{DECLARATION} is assigned {len(found)} times in one cell")
    try:
        data = ast.literal_eval(found[0].value)
    except ValueError as error:
        raise DeclarationError(f"{DECLARATION} must be a literal dict ({error})") from None
    if not isinstance(data, dict):
        raise DeclarationError(f"{DECLARATION} must be a dict, not {type(data).__name__}")
    missing = [k for k in REQUIRED if k not in data]
    unknown = sorted(set(data) - set(REQUIRED) - set(DEFAULTS) - set(NAMES))
    if missing or unknown:
        raise DeclarationError(f"{DECLARATION}: " + "; ".join(
            ([f"missing {', '.join(missing)}"] if missing else [])
            + ([f"unknown {', '.join(unknown)}"] if unknown else [])))
    defined = {node.name for node in tree.body
               if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    defined |= {t.id for node in tree.body if isinstance(node, ast.Assign)
                for t in node.targets if isinstance(t, ast.Name)}
    named = [key for key in ("candidate", "baseline", "inputs", *NAMES) if key in data]
    for key in named:
        if not isinstance(data[key], str) or not data[key].isidentifier():
            raise DeclarationError(f"{DECLARATION}[{key!r}] must name a function")
    for key in named[1:]:
        if data[key] not in defined:
            raise DeclarationError(f"{DECLARATION}[{key!r}]: {data[key]!r} is not defined in the "
                             "cell (it must be self-contained)")
    points = data["points"]
    if not isinstance(points, dict) or not points or set(points) - set(DEVICES):
        raise DeclarationError(f"{DECLARATION}['points'] maps devices ({', '.join(DEVICES)}) to "
                         "[speedup for no points, speedup for all]")
    schedule = {}
    for device, pair in points.items():
        if (not isinstance(pair, (list, tuple)) or len(pair) != 2
                or not all(isinstance(v, (int, float)) for v in pair)
                or not 0 < pair[0] < pair[1]):
            raise DeclarationError(f"{DECLARATION}['points'][{device!r}] must be [low, high] "
                             f"speedups with 0 < low < high, not {pair!r}")
        schedule[device] = (float(pair[0]), float(pair[1]))
    options = {}
    for key in NUMBERS:
        if key in data:
            if not isinstance(data[key], (int, float)) or not data[key] > 0:
                raise DeclarationError(f"{DECLARATION}[{key!r}] must be a positive number")
            options[key] = float(data[key])
    for key in COUNTS:
        if key in data:
            if not isinstance(data[key], int) or data[key] < 1:
                raise DeclarationError(f"{DECLARATION}[{key!r}] must be a positive integer")
            options[key] = data[key]
    test = SpeedTest(candidate=data["candidate"], baseline=data["baseline"],
                     inputs=data["inputs"], points=schedule, check=data.get("check", ""),
                     **options)
    if test.max_rounds < test.rounds:
        raise DeclarationError(f"{DECLARATION}: max_rounds is below rounds")
    return test


def clean_source(setup_code: str, source: str, candidate: str) -> str:
    """What a clean kernel runs before timing the baseline: the notebook's setup cells, then
    every top-level statement of the speed test's cell that does not mention the candidate
    (its imports, the baseline, the inputs, their constants, the declaration; not the
    asserts that call the learner's function)."""
    tree = parse(source)
    lines = source.splitlines()
    kept = []
    for node in tree.body:
        if any(isinstance(n, ast.Name) and n.id == candidate for n in ast.walk(node)):
            continue
        kept.append("\n".join(lines[node.lineno - 1:node.end_lineno]))
    return "\n\n".join(part for part in (setup_code, *kept) if part.strip())


# Student's t, 97.5th percentile, by degrees of freedom (then 1.96 in the limit).
_T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def t975(df: int) -> float:
    if df < 1:
        return math.inf
    if df <= len(_T975):
        return _T975[df - 1]
    return 1.960 + 2.4 / df  # within 0.003 of the exact value beyond 30


# ... and its 99.9th percentile (a one-sided test at 0.1 %), by the degrees of freedom at
# which it is tabulated; between them the next lower one is used (a little stricter).
_T999 = {1: 318.3, 2: 22.33, 3: 10.21, 4: 7.173, 5: 5.893, 6: 5.208, 7: 4.785, 8: 4.501,
         9: 4.297, 10: 4.144, 12: 3.930, 15: 3.733, 20: 3.552, 25: 3.450, 30: 3.385, 40: 3.307,
         60: 3.232, 120: 3.160}


def t999(df: int) -> float:
    if df < 1:
        return math.inf
    return _T999[max(k for k in _T999 if k <= df)]


TRIM = 0.2  # the share of rounds left out at each end of the speedup's mean


@dataclass
class Speedup:
    """The speedup from paired rounds: per round, the baseline's seconds per call over the
    candidate's, timed one after the other on the same inputs."""
    pairs: List[Tuple[float, float]] = field(default_factory=list)  # (candidate, baseline) s/call

    def add(self, candidate: float, baseline: float) -> None:
        if candidate <= 0 or baseline <= 0:
            raise ValueError("a timed call took no time: the clock cannot have been read")
        self.pairs.append((candidate, baseline))

    @property
    def _logs(self) -> List[float]:
        return [math.log(b / c) for c, b in self.pairs]

    @property
    def rounds(self) -> int:
        return len(self.pairs)

    def interval(self) -> Tuple[float, float, float]:
        """(low, centre, high): the 95 % interval of the speedup and its centre, from the
        rounds' log ratios: their 20 % trimmed mean, with Yuen's interval (the winsorised
        spread), so that a round another program slowed moves neither much. The interval is
        symmetric in log space: its centre is a geometric mean of the ratios."""
        logs = sorted(self._logs)
        if not logs:
            raise ValueError("no round was timed")
        n = len(logs)
        cut = int(TRIM * n)
        kept = logs[cut:n - cut]
        centre = statistics.fmean(kept)
        if len(kept) < 2:
            return (0.0, math.exp(centre), math.inf)
        winsorised = [kept[0]] * cut + kept + [kept[-1]] * cut
        error = statistics.stdev(winsorised) / ((1 - 2 * cut / n) * math.sqrt(n))
        half = t975(len(kept) - 1) * error
        return (math.exp(centre - half), math.exp(centre), math.exp(centre + half))

    def precise(self, precision: float) -> bool:
        """Whether the interval lies within ``precision`` (a fraction) of its centre."""
        if len(self.pairs) < 2:
            return False
        low, centre, high = self.interval()
        return high <= centre * (1 + precision) and low >= centre / (1 + precision)

    def seconds(self) -> Tuple[float, float]:
        """The median seconds per call of the candidate and of the baseline."""
        return (statistics.median(c for c, _ in self.pairs),
                statistics.median(b for _, b in self.pairs))


def points_for(speedup: float, schedule: Tuple[float, float], points: float,
               step: float = DEFAULTS["step"]) -> float:
    """The points a speedup earns: none at ``schedule[0]`` or below, all at ``schedule[1]``
    or above, linear between, rounded down to a multiple of ``step`` (so that a speedup
    measured a little differently each time rarely changes the grade)."""
    low, high = schedule
    fraction = min(1.0, max(0.0, (speedup - low) / (high - low)))
    earned = fraction * points
    if fraction < 1.0 and step > 0:
        earned = math.floor(earned / step + 1e-9) * step
    return round(min(earned, points), 6)


def timed_to_the_end(speed) -> bool:
    """Whether a speed test's measurement (``extra_data``'s ``speed``) has a speedup: it was
    timed to the end, with no ``problem`` and no ``setup`` failure."""
    return (isinstance(speed, dict) and "speedup" in speed and not speed.get("problem")
            and not speed.get("setup"))


def ranked_speedup(speed) -> Optional[float]:
    """The speedup a leaderboard may show: one timed to the end on a machine that could
    verify it (else None)."""
    if not timed_to_the_end(speed) or not speed.get("verified"):
        return None
    return float(speed["speedup"])
