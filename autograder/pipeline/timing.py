"""Timing a speed test (:mod:`.speed`) from outside the learner's kernel.

The learner's code runs in the kernel being timed, so nothing that kernel reports about time
is believed. What decides is measured by the grader:

* **wall time on the grader's clock**, from sending a request to the kernel's reply: the
  kernel cannot change it, and everything the request made the kernel do is in it;
* **the CPU time of the kernel's cgroup** (every thread and process it started), read
  before and after each request;
* **the cgroup frozen** between the learner's turns: no thread or process of the kernel can
  work while the baseline is timed or while the grader compares outputs.

Each round draws fresh inputs from a new seed (no output can be reused), times ``calls``
calls of the candidate in the learner's kernel and of the baseline in a *clean kernel* (the
same sandbox and cgroup limits, a fresh working directory, only the speed test's own cell
run in it), one after the other, in alternating order. After each timed request the
kernel reports each output's shape, dtype, sum, sum of magnitudes and values at positions
drawn only then; they must match the clean kernel's for the same seeds, every call of
every round. On a CPU the inputs are drawn and the outputs reported in requests of their
own, untimed, and the learner's kernel may not use much more CPU time in them than the
clean kernel does for the same requests: work done there instead of in the timed call is
caught. On CUDA an untimed request first clears the L2 cache (writing more memory than it holds),
the inputs are drawn inside the timed request (a GPU draws them in microseconds) and the
timed request ends by synchronising; the report, which copies from the device, may not take
much longer than the clean kernel's, so work left queued on the device is caught.

One speed test is timed at a time on a machine (a lock file), so two gradings at once do
not time each other's load; the rest of their grading goes on.
"""
from __future__ import annotations

import asyncio
import json
import math
import os
import secrets
import tempfile
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Dict, List, Optional

from autograder.pipeline.checks import decode
from autograder.pipeline.speed import SpeedTest, Speedup
from autograder.protocol import EVIDENCE_MIME, EVIDENCE_MODULE
from autograder.sandbox.cgroups import ResourceGroup

# The learner's untimed requests may use more CPU (on CUDA, also wall) time than the clean
# kernel's same requests by at most a share of the learner's timed calls' time, plus a few
# milliseconds: in any one round (generous: one round's times are noisy), and over all
# rounds together (tight: the noise averages out), so work moved out of the timed calls can
# gain a submission little.
ROUND_AUDIT, TOTAL_AUDIT, AUDIT_SLACK = 0.5, 0.15, 0.005
CHECKED_CALLS = 4  # outputs of each round compared with the clean kernel's, picked afterwards
# After the timed calls return, the kernel is watched this long; using more CPU time than the
# clean kernel did in that moment, plus the slack, means work was left running.
SETTLE, SETTLE_SLACK = 0.005, 0.002
REQUEST_TIMEOUT = 60.0  # seconds for any one request of the protocol
LOCK_NAME = "autograder-timing.lock"


@dataclass
class SpeedRun:
    """The speed tests of one notebook's run, and how to start a clean kernel for them."""
    tests: Dict[str, SpeedTest]  # by the id of the rebuilt notebook's cell
    device: str
    seed: int
    group: Optional[ResourceGroup]  # the learner's kernel's cgroup
    start_clean: Callable[[], Awaitable["TimedKernel"]]
    results: Dict[str, dict] = field(default_factory=dict)  # by cell id, what measure() found


class SpeedProblem(Exception):
    """Why a submission gets no speed points (said to the learner)."""


class SetupProblem(Exception):
    """The speed test itself could not run in a clean kernel (the instructor's to fix)."""


@dataclass
class Reply:
    ok: bool
    wall: float                  # seconds on the grader's clock, request sent to reply
    cpu: Optional[float]         # CPU seconds of the kernel's cgroup meanwhile (None: unknown)
    error: str = ""
    reports: List[str] = field(default_factory=list)  # evidence outputs (JSON text)
    after: Optional[float] = None  # CPU seconds it used in the moment after it replied


class TimedKernel:
    """One kernel as the timing drives it: its client, and its cgroup if it has one."""

    def __init__(self, client, group: Optional[ResourceGroup], interrupt=None,
                 freeze_between: bool = False, on_close=None):
        self.client, self.group, self.interrupt = client, group, interrupt
        self.freeze_between = freeze_between and group is not None and group.can_freeze
        self.on_close = on_close

    async def close(self) -> None:
        if self.on_close is not None:
            await _maybe_await(self.on_close())

    @property
    def watched(self) -> bool:
        """Whether its CPU time is counted and it can be kept still between requests."""
        return (self.group is not None and self.group.can_freeze
                and self.group.cpu_seconds() is not None)

    def hold(self) -> None:
        if self.freeze_between:
            self.group.freeze(True)

    def release(self) -> None:
        if self.group is not None and self.group.can_freeze:
            self.group.freeze(False)

    async def request(self, code: str, timeout: float = REQUEST_TIMEOUT,
                      settle: float = 0.0) -> Reply:
        """Run ``code``; with ``settle``, also count the CPU time the kernel uses in the
        ``settle`` seconds after it replied (an idle kernel uses next to none)."""
        reports: List[str] = []
        errors: List[str] = []

        def hook(message: dict) -> None:
            kind, content = message.get("msg_type"), message.get("content", {})
            if kind in ("display_data", "execute_result"):
                data = content.get("data", {})
                if EVIDENCE_MIME in data:
                    value = data[EVIDENCE_MIME]
                    reports.append(value if isinstance(value, str) else json.dumps(value))
            elif kind == "error":
                errors.append(f"{content.get('ename', 'Error')}: {content.get('evalue', '')}")

        before = self.group.cpu_seconds() if self.group is not None else None
        self.release()
        start = time.perf_counter()
        try:
            reply = await self.client.execute_interactive(
                code, store_history=False, allow_stdin=False, stop_on_error=False,
                timeout=timeout, output_hook=hook)
        except TimeoutError:
            wall = time.perf_counter() - start
            if self.interrupt is not None:
                await _maybe_await(self.interrupt())
            return Reply(False, wall, None, f"it ran longer than {timeout:g} s")
        wall = time.perf_counter() - start
        replied = self.group.cpu_seconds() if self.group is not None else None
        settled = None
        if settle and replied is not None:
            await asyncio.sleep(settle)
            settled = self.group.cpu_seconds() - replied
        self.hold()
        cpu = replied - before if before is not None and replied is not None else None
        status = reply.get("content", {}).get("status")
        error = errors[0] if errors else ("" if status == "ok" else f"the kernel answered {status!r}")
        return Reply(status == "ok", wall, cpu, error, reports, settled)


async def _maybe_await(value):
    if asyncio.iscoroutine(value) or isinstance(value, asyncio.Future):
        return await value
    return value


class MachineLock:
    """One speed test timed at a time on this machine (an advisory lock on a file)."""

    def __init__(self, folder: Optional[str] = None):
        self.path = os.path.join(folder or tempfile.gettempdir(), LOCK_NAME)
        self.handle = None

    async def __aenter__(self):
        import fcntl
        self.handle = open(self.path, "a")
        await asyncio.to_thread(fcntl.flock, self.handle.fileno(), fcntl.LOCK_EX)
        return self

    async def __aexit__(self, *exc):
        import fcntl
        fcntl.flock(self.handle.fileno(), fcntl.LOCK_UN)
        self.handle.close()


def round_seeds(seed: int, round_number: int, calls: int) -> List[int]:
    """The input seeds of one round: new for every call of every round of a submission."""
    import hashlib
    return [int.from_bytes(hashlib.sha256(f"{seed}:{round_number}:{n}".encode()).digest()[:4],
                           "big") % 2**31 for n in range(calls)]


# On CUDA, before each timed request: overwrite more memory than any GPU's L2 cache holds
# (an H100's is 50 MiB), so no call finds the previous round's data there.
L2_FLUSH = ("__import__('torch').empty(256 * 2**20, dtype=__import__('torch').int8, "
            "device='cuda').zero_()\n__import__('torch').cuda.synchronize()")


def _code(test: SpeedTest, function: str, seeds: List[int], device: str) -> Dict[str, str]:
    """The requests of one turn: the untimed one before (on a CPU, drawing the inputs; on
    CUDA, clearing the L2 cache), the timed calls, then the report."""
    draw = (f"__autograder_args = [(lambda a: a if type(a) is tuple else (a,))({test.inputs}(s))"
            f" for s in {seeds!r}]")
    call = f"__autograder_outs = [{function}(*a) for a in __autograder_args]"
    if device == "cuda":
        return {"draw": L2_FLUSH,
                "call": f"{draw}\n{call}\n__import__('torch').cuda.synchronize()"}
    return {"draw": draw, "call": call}


def _report(picks: List[int], sample_seed: int) -> str:
    return (f"__import__({EVIDENCE_MODULE!r}, fromlist=['emit_speed'])"
            f".emit_speed([__autograder_outs[i] for i in {picks!r}], {sample_seed})")


def _summaries(reply: Reply) -> list:
    if len(reply.reports) != 1:
        raise SpeedProblem("the outputs were reported "
                           f"{'more than once' if reply.reports else 'not at all'} (tampering?)")
    data = json.loads(reply.reports[0])
    if "error" in data:
        raise SpeedProblem(f"the outputs could not be reported: {data['error']}")
    return decode(data["values"]["summary"])


def _close(got, want, test: SpeedTest, where: str = "the output") -> Optional[str]:
    """None if ``got`` matches ``want`` within the test's tolerances, else what differs."""
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            return f"{where} has a different structure"
        for n, (g, w) in enumerate(zip(got, want)):
            problem = _close(g, w, test, f"{where}[{n}]")
            if problem:
                return problem
        return None
    if isinstance(want, dict):
        if not isinstance(got, dict) or set(got) != set(want):
            return f"{where} is not a plain tensor"
        if got["dtype"] != want["dtype"] or got["shape"] != want["shape"]:
            return (f"{where} is {got['dtype']} {tuple(got['shape'])}, expected "
                    f"{want['dtype']} {tuple(want['shape'])}")
        if got["at"] != want["at"]:
            return f"{where} was sampled at other positions (tampering?)"
        for position, g, w in zip(want["at"], got["values"], want["values"]):
            if not _near(g, w, test.rtol, test.atol):
                return f"{where} differs at flat index {position}: {g!r}, expected {w!r}"
        count = math.prod(want["shape"]) if want["shape"] else 1
        scale = test.atol * count + test.rtol * abs(want["abs"])
        for key in ("sum", "abs"):
            if not _near(got[key], want[key], 0.0, scale):
                return f"{where} differs elsewhere: its {key} is {got[key]!r}, expected {want[key]!r}"
        return None
    if isinstance(want, (int, float)) and not isinstance(want, bool):
        return None if (isinstance(got, (int, float)) and _near(got, want, test.rtol, test.atol)) \
            else f"{where} is {got!r}, expected {want!r}"
    return f"{where} is not a tensor, a number or a tuple of them"


def _near(got, want, rtol: float, atol: float) -> bool:
    if not isinstance(got, (int, float)) or not isinstance(want, (int, float)):
        return False
    if math.isnan(want):
        return math.isnan(got)
    return abs(got - want) <= atol + rtol * abs(want)


class Audit:
    """The untimed work of the learner's kernel against the clean kernel's, by measure."""

    def __init__(self, device: str):
        self.measures = ["CPU"] + (["wall-clock"] if device == "cuda" else [])
        self.totals = {name: [0.0, 0.0] for name in self.measures}  # learner, clean
        self.timed = 0.0

    def add(self, mine: List[Reply], theirs: List[Reply], timed: float) -> None:
        """One round's untimed requests; raise SpeedProblem if they were far apart."""
        self.timed += timed
        for name in self.measures:
            pick = (lambda r: r.cpu) if name == "CPU" else (lambda r: r.wall)
            values = [pick(r) for r in mine + theirs]
            if any(v is None for v in values):
                continue
            learner, clean = sum(values[:len(mine)]), sum(values[len(mine):])
            self.totals[name][0] += learner
            self.totals[name][1] += clean
            self._check(name, learner, clean, timed, ROUND_AUDIT, "in one round")

    def check_totals(self) -> None:
        for name, (learner, clean) in self.totals.items():
            self._check(name, learner, clean, self.timed, TOTAL_AUDIT, "over all rounds")

    @staticmethod
    def _check(name, learner, clean, timed, share, when) -> None:
        if learner - clean > share * timed + AUDIT_SLACK:
            raise SpeedProblem(
                f"your kernel worked outside the timed calls: {when}, it used "
                f"{learner * 1e3:.1f} ms of {name} time in the requests around the timed calls, "
                f"the clean kernel {clean * 1e3:.1f} ms for the same, and your timed calls "
                f"took {timed * 1e3:.1f} ms")


@dataclass
class Turn:
    seconds: float       # the timed request, per call
    summaries: list
    draw: Optional[Reply]
    report: Reply
    after: Optional[float]  # CPU seconds used in the moment after the timed calls returned


async def _turn(kernel: TimedKernel, test: SpeedTest, function: str, seeds: List[int],
                device: str, picks: List[int], sample_seed: int, who: str) -> Turn:
    code = _code(test, function, seeds, device)
    draw = None
    if code["draw"]:
        draw = await kernel.request(code["draw"])
        if not draw.ok:
            raise (SetupProblem if who == "clean" else SpeedProblem)(
                f"{'clearing the cache' if device == 'cuda' else 'drawing the inputs'} failed: "
                f"{draw.error}")
    timed = await kernel.request(code["call"], settle=SETTLE)
    if not timed.ok:
        raise (SetupProblem if who == "clean" else SpeedProblem)(
            f"{'the baseline' if who == 'clean' else function} failed: {timed.error}")
    report = await kernel.request(_report(picks, sample_seed))
    if not report.ok:
        raise (SetupProblem if who == "clean" else SpeedProblem)(
            f"reporting the outputs failed: {report.error}")
    return Turn(timed.wall / len(seeds), _summaries(report), draw, report, timed.after)


WARM_UP = (1, 4)  # the calls of the rounds before the counted ones: from their times, the
#                   time of one call without the request's own (the slope), hence the calls
#                   a counted round needs


async def _rounds(test: SpeedTest, device: str, seed: int, learner: TimedKernel,
                  clean: TimedKernel, speedup: Speedup) -> int:
    """Time rounds until the speedup is precise enough or the budget is spent; return the
    calls per counted round. Raises SpeedProblem for a wrong output or untimed work."""
    budget_end = time.perf_counter() + test.seconds
    audit, warm_up = Audit(device), {}
    calls, number = WARM_UP[0], 0
    while True:
        seeds = round_seeds(seed, number, calls)
        picks = sorted(secrets.SystemRandom().sample(range(calls), min(CHECKED_CALLS, calls)))
        sample_seed = secrets.randbelow(2**31)
        order = [("learner", learner, test.candidate), ("clean", clean, test.baseline)]
        if number % 2:
            order.reverse()
        turns = {}
        for who, kernel, function in order:
            turns[who] = await _turn(kernel, test, function, seeds, device, picks, sample_seed,
                                     who)
        mine, theirs = turns["learner"], turns["clean"]
        if (mine.after is not None and theirs.after is not None
                and mine.after - theirs.after > SETTLE_SLACK):
            raise SpeedProblem(
                f"work went on after your function returned: your kernel used "
                f"{mine.after * 1e3:.1f} ms of CPU time in the {SETTLE * 1e3:g} ms after the "
                f"timed calls returned (a thread or process left computing?)")
        problem = _close(mine.summaries, theirs.summaries, test)
        if problem:
            raise SpeedProblem(f"a timed call gave a wrong result: {problem}")
        audit.add([r for r in (mine.draw, mine.report) if r is not None],
                  [r for r in (theirs.draw, theirs.report) if r is not None],
                  mine.seconds * calls)
        if number < len(WARM_UP):  # not counted: they set the calls per round
            warm_up[calls] = mine.seconds * calls
            if number + 1 < len(WARM_UP):
                calls = WARM_UP[number + 1]
            else:
                few, many = WARM_UP
                per_call = max((warm_up[many] - warm_up[few]) / (many - few),
                               warm_up[many] / many / 10, 1e-6)
                calls = max(1, min(test.max_calls, math.ceil(test.round_seconds / per_call)))
        else:
            speedup.add(mine.seconds, theirs.seconds)
        number += 1
        if speedup.rounds >= test.max_rounds or (speedup.rounds >= test.rounds
                                                 and speedup.precise(test.precision)):
            break
        if time.perf_counter() >= budget_end and speedup.rounds >= 2:
            break
        if time.perf_counter() >= budget_end + test.seconds:
            raise SpeedProblem(f"two rounds did not fit in {2 * test.seconds:g} s")
    audit.check_totals()
    return calls


async def measure(test: SpeedTest, device: str, seed: int, learner: TimedKernel,
                  start_clean: Callable[[], Awaitable[TimedKernel]], cell_source: str,
                  lock_folder: Optional[str] = None) -> dict:
    """Time ``test``: the learner's kernel (the cell has run there) against a clean one.

    Returns what :func:`autograder.pipeline.judge.judge_test` reads: the speedup and its
    interval, the seconds per call, the rounds, and ``problem`` if no speed points can be
    given (or ``setup`` if the test itself failed in the clean kernel)."""
    started = time.perf_counter()
    result: Dict[str, object] = {"device": device, "verified": learner.watched}
    clean: Optional[TimedKernel] = None
    speedup, calls = Speedup(), 0
    try:
        clean = await start_clean()
        prepared = await clean.request(cell_source)
        if not prepared.ok:
            raise SetupProblem(f"the speed test's cell failed in a clean kernel: {prepared.error}")
        async with MachineLock(lock_folder):
            learner.hold()
            calls = await _rounds(test, device, seed, learner, clean, speedup)
    except SpeedProblem as problem:
        result["problem"] = str(problem)
    except SetupProblem as problem:
        result["setup"] = str(problem)
    finally:
        learner.release()
        if clean is not None:
            await clean.close()
    if speedup.rounds and "problem" not in result and "setup" not in result:
        low, centre, high = speedup.interval()
        candidate_s, baseline_s = speedup.seconds()
        result.update(speedup=centre, low=low, high=high, rounds=speedup.rounds,
                      calls=calls, candidate_seconds=candidate_s, baseline_seconds=baseline_s,
                      precise=speedup.precise(test.precision))
    result["seconds"] = round(time.perf_counter() - started, 3)
    return result
