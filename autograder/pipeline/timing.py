"""Timing a speed test (:mod:`.speed`) from outside the learner's kernel.

The learner's code runs in the kernel being timed, so nothing that kernel reports about time
is believed. What decides is measured by the grader:

* **wall time on the grader's clock**, from sending a request to the kernel's reply: the
  kernel cannot change it, and everything the request made the kernel do is in it;
* **the CPU time of the kernel's cgroup** (every thread and process it started), read
  before and after each request: on a CPU, what the timed calls are measured by (other
  programs on the machine lengthen the wall time, not this), beside the wall time;
* **the cgroup frozen** between the learner's turns: no thread or process of the kernel can
  work while the baseline is timed or while the grader compares outputs.

Each round draws fresh inputs from new seeds (no output can be reused) and times ``calls``
calls of the candidate in the learner's kernel and of the baseline in a *clean kernel* (the
same sandbox and cgroup limits, a fresh working directory, only the speed test's own code run
in it), one after the other, in alternating order. On a CPU the clean kernel draws the inputs
into a file, and each kernel maps its own copy of it at the start of its timed request (one
header parsed and a view per tensor; the pages are read when the calls first touch them): a
hooked random generator in the learner's kernel never sees the inputs drawn, and a hooked
loader works inside the timed request, so no request of the learner's kernel but the timed one
runs while inputs are known. On CUDA an untimed request first clears the L2 cache (writing more
memory than it holds; its time is audited against the clean kernel's, see ``Audit``) and the
inputs are drawn inside the timed request (a GPU draws them in microseconds). Every timed
request ends by writing all its outputs' bytes to a file (from the device: the copy waits for
the device's work), so an output computed lazily is computed inside the timed request; the
clean kernel compares the learner's file with the expected outputs (its own, or its ``check``
function's), every element of every call, within the test's tolerances. A thread or process
left computing after the reply leaves the written outputs wrong, and is frozen with the kernel
while the clean kernel runs.
(CPU time used just after the reply tells nothing: OpenMP's threads spin for a while after a
parallel operation, in every kernel.)

One speed test is timed at a time on a machine (a lock file), so two gradings at once do
not time each other's load; the rest of their grading goes on, but not on the timed kernels'
CPUs: where the cgroups have a ``cpuset``, the two timed kernels get ``TIMING_CPUS`` of the
machine's CPUs to themselves and every other grading's kernels the rest
(:mod:`autograder.sandbox.cpus`); both run that many threads, whatever ``--jobs`` is.
"""
from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Awaitable, Callable, Dict, List, Optional, Tuple

from autograder.pipeline.checks import decode
from autograder.pipeline.speed import SpeedTest, Speedup, t999
from autograder.protocol import EVIDENCE_MIME, EVIDENCE_MODULE
from autograder.sandbox.cgroups import ResourceGroup
from autograder.sandbox.cpus import TimingCpus

# On CUDA, the learner's untimed request before the timed one (clearing the L2 cache) against
# the clean kernel's same request (CPU time and wall time). One round is refused if they took
# more than its timed calls, half the clean kernel's time and 10 ms besides (a blatant move of
# work); over the counted rounds, the extra per round beyond 15 % of the timed calls and half
# the clean kernel's own (two kernels differ a little, steadily: a learner's kernel has more in
# it) must not be positive with 99.9 % confidence (a one-sided paired t-test: honest rounds
# scatter both ways, moved work shifts them all); while the test leans that way without being
# sure, timing goes on.
ROUND_SLACK, CLEAN_SHARE, TIMED_SHARE = 0.010, 0.5, 0.15
SUSPICIOUS = 2.0  # a t statistic above this keeps the rounds going (within the budget)
# Every output of a round is compared with the clean kernel's, after the learner's kernel wrote
# them inside its timed request: a lazily computed output (its code patched into the writing)
# is computed there, timed.
REQUEST_TIMEOUT = 60.0  # seconds for any one request of the protocol
LOCK_NAME = "autograder-timing.lock"


@dataclass
class SpeedRun:
    """The speed tests of one notebook's run, and how to start a clean kernel for them."""
    tests: Dict[str, SpeedTest]  # by the id of the rebuilt notebook's cell
    device: str
    seed: int
    group: Optional[ResourceGroup]  # the learner's kernel's cgroup
    exchange: Path  # a folder the learner's kernel reads at the same path (its inputs)
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


class TimedKernel:
    """One kernel as the timing drives it: its client, and its cgroup if it has one."""

    def __init__(self, client, group: Optional[ResourceGroup], exchange: Path, interrupt=None,
                 freeze_between: bool = False, on_close=None):
        self.client, self.group, self.interrupt = client, group, interrupt
        self.exchange = exchange  # a folder the kernel reads and writes at the same path
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

    async def request(self, code: str, timeout: float = REQUEST_TIMEOUT) -> Reply:
        """Run ``code``: its reply, wall time and CPU time; the kernel is held still after."""
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
        self.hold()
        cpu = replied - before if before is not None and replied is not None else None
        status = reply.get("content", {}).get("status")
        error = errors[0] if errors else ("" if status == "ok" else f"the kernel answered {status!r}")
        return Reply(status == "ok", wall, cpu, error, reports)


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


def _draw(test: SpeedTest, seeds: List[int]) -> str:
    return (f"__autograder_args = [(lambda a: a if type(a) is tuple else (a,))({test.inputs}(s))"
            f" for s in {seeds!r}]")


def _evidence(function: str) -> str:
    return f"__import__({EVIDENCE_MODULE!r}, fromlist=[{function!r}]).{function}"


def _calls_code(function: str, device: str, test: SpeedTest, seeds: List[int],
                outputs: Path, inputs: Optional[Path]) -> str:
    """Calls of ``function`` on the first ``len(seeds)`` inputs of the round (on a CPU, mapped
    from the file the clean kernel wrote; on CUDA, drawn on the device: microseconds either
    way), then every output's bytes written to ``outputs`` (from the device: the copy waits
    for its work). Timed, except for the expected outputs of a ``check`` function."""
    if device == "cuda":
        arguments = _draw(test, seeds)
    else:
        arguments = f"__autograder_args = {_evidence('load_inputs')}({str(inputs)!r})"
    call = f"__autograder_outs = [{function}(*a) for a in __autograder_args[:{len(seeds)}]]"
    dump = f"{_evidence('dump_outputs')}(__autograder_outs, {str(outputs)!r})"
    return f"{arguments}\n{call}\n{dump}"


class Audit:
    """The untimed work of the learner's kernel against the clean kernel's, by measure."""

    def __init__(self, device: str):
        self.measures = ["CPU"] + (["wall-clock"] if device == "cuda" else [])
        self.extra: Dict[str, List[float]] = {name: [] for name in self.measures}
        self.timed: List[float] = []

    def add(self, mine: List[Reply], theirs: List[Reply], timed: float,
            counted: bool = True) -> None:
        """One round's untimed requests; raise SpeedProblem for a blatant move of work."""
        for name in self.measures:
            pick = (lambda r: r.cpu) if name == "CPU" else (lambda r: r.wall)
            values = [pick(r) for r in mine + theirs]
            if any(v is None for v in values):
                continue
            learner, clean = sum(values[:len(mine)]), sum(values[len(mine):])
            if learner - clean > timed + CLEAN_SHARE * clean + ROUND_SLACK:
                raise SpeedProblem(
                    f"your kernel worked outside the timed calls: in one round it used "
                    f"{learner * 1e3:.1f} ms of {name} time in the requests around them, the "
                    f"clean kernel {clean * 1e3:.1f} ms for the same, and your timed calls "
                    f"took {timed * 1e3:.1f} ms")
            if counted:
                self.extra[name].append(learner - clean - TIMED_SHARE * timed
                                        - CLEAN_SHARE * clean)
        if counted:
            self.timed.append(timed)

    def _t(self, name: str) -> float:
        """The t statistic of the rounds' extra work (positive: more than allowed)."""
        extra = self.extra[name]
        if len(extra) < 2:
            return 0.0
        mean = statistics.fmean(extra)
        sd = statistics.stdev(extra, mean)
        if sd == 0:
            return math.inf if mean > 0 else -math.inf if mean < 0 else 0.0
        return mean / (sd / math.sqrt(len(extra)))

    def undecided(self) -> bool:
        """Whether more rounds are needed to tell: the extra work leans positive but is not
        yet significant (honest rounds rarely lean this far; moved work keeps growing)."""
        return any(SUSPICIOUS < self._t(name) <= t999(len(self.extra[name]) - 1)
                   for name in self.measures)

    def check_totals(self) -> None:
        for name, extra in self.extra.items():
            if len(extra) < 2:
                continue
            if self._t(name) > t999(len(extra) - 1):
                mean, timed = statistics.fmean(extra), statistics.fmean(self.timed)
                raise SpeedProblem(
                    f"your kernel worked outside the timed calls: over {len(extra)} rounds it "
                    f"used {mean * 1e3:.1f} ms more {name} time per round than the clean kernel "
                    f"in the requests around them (beyond what two kernels differ by), where "
                    f"your timed calls took {timed * 1e3:.1f} ms")


@dataclass
class Turn:
    seconds: float           # the timed request, per call
    before: Optional[Reply]  # on CUDA, the untimed request before it (clearing the L2 cache)
    outputs: Path            # the file the timed request wrote the outputs to


async def _turn(kernel: TimedKernel, test: SpeedTest, function: str, seeds: List[int],
                device: str, inputs: Optional[Path], number: int, who: str,
                measured_by: str) -> Turn:
    """One kernel's turn: on CUDA an untimed request that clears the L2 cache, then the timed
    one: the inputs, the calls, and their outputs written."""
    fail = SetupProblem if who == "clean" else SpeedProblem
    before = None
    if device == "cuda":
        before = await kernel.request(L2_FLUSH)
        if not before.ok:
            raise fail(f"clearing the cache failed: {before.error}")
    outputs = kernel.exchange / f"outputs-{number}.bin"
    timed = await kernel.request(_calls_code(function, device, test, seeds, outputs, inputs))
    if not timed.ok:
        raise fail(f"{'the baseline' if who == 'clean' else function} failed: {timed.error}")
    spent = timed.cpu if measured_by == "cpu" else timed.wall
    return Turn(spent / len(seeds), before, outputs)


def clock(device: str, *kernels: TimedKernel) -> str:
    """What a timed request is measured by: on a CPU, the CPU time of the kernel's cgroup,
    which other programs sharing the CPU do not inflate (their slices would, on the wall
    clock, and more for short calls than for long ones); on CUDA, the wall clock, since
    the work is the device's. Without a cgroup, the wall clock (and no points: see judge)."""
    return "cpu" if device != "cuda" and all(k.watched for k in kernels) else "wall"


async def _expected(clean: TimedKernel, test: SpeedTest, device: str, seeds: List[int],
                    inputs: Optional[Path], number: int) -> Path:
    """With a ``check`` function: its outputs for every call of the round, computed in the
    clean kernel, untimed (the baseline is timed on the first calls only)."""
    expected = clean.exchange / f"expected-{number}.bin"
    reply = await clean.request(_calls_code(test.check, device, test, seeds, expected, inputs))
    if not reply.ok:
        raise SetupProblem(f"the check function failed: {reply.error}")
    return expected


async def _compare(clean: TimedKernel, learner: Turn, expected: Path, test: SpeedTest,
                   number: int) -> None:
    """The clean kernel compares the learner's outputs with the expected ones (its own),
    call by call; raise SpeedProblem if they differ (or the learner's file is not what the
    timed request writes)."""
    if not learner.outputs.is_file():
        raise SpeedProblem("the timed calls' outputs were not written (tampering?)")
    limit = 2 * expected.stat().st_size + 2**20
    if learner.outputs.stat().st_size > limit:
        raise SpeedProblem("the timed calls' outputs were far larger than the baseline's")
    theirs = clean.exchange / f"learner-outputs-{number}.bin"
    shutil.copyfile(learner.outputs, theirs)
    try:
        verdict = await clean.request(
            f"__import__({EVIDENCE_MODULE!r}, fromlist=['emit_comparison']).emit_comparison("
            f"{str(theirs)!r}, {str(expected)!r}, {test.rtol!r}, {test.atol!r})")
    finally:
        theirs.unlink(missing_ok=True)
    if not verdict.ok or len(verdict.reports) != 1:
        raise SetupProblem(f"comparing the outputs failed: {verdict.error or 'no verdict'}")
    problem = decode(json.loads(verdict.reports[0])["values"]["problem"])
    if problem:
        raise SpeedProblem(f"a timed call gave a wrong result: {problem}")


async def _inputs(clean: TimedKernel, learner: TimedKernel, test: SpeedTest, seeds: List[int],
                  number: int) -> Tuple[Path, Path]:
    """On a CPU: the clean kernel draws one round's inputs into a file of its folder, and the
    grader copies it into the learner's; each kernel maps its own copy inside its timed
    request (the learner's cannot change what the clean kernel reads). Drawing them in the
    learner's kernel would let a hooked random generator compute the answers while drawing,
    untimed; mapping them in an untimed request would let a hooked loader do the same."""
    name = f"inputs-{number}.bin"
    drawn = await clean.request(f"{_draw(test, seeds)}\n"
                                f"{_evidence('dump_inputs')}(__autograder_args, "
                                f"{str(clean.exchange / name)!r})")
    if not drawn.ok:
        raise SetupProblem(f"drawing the inputs failed: {drawn.error}")
    copy = learner.exchange / name
    shutil.copyfile(clean.exchange / name, copy)
    os.chmod(copy, 0o644)
    return clean.exchange / name, copy


WARM_UP = (1, 4)  # the calls of the rounds before the counted ones (the first wakes the code
#                   up; the time of the second sets the calls a counted round needs)
SETTLING = 1  # rounds more, uncounted, at those calls: the first round that keeps so many
#               outputs at once takes new memory from the system (page faults), later ones
#               reuse it
UNCOUNTED = len(WARM_UP) + SETTLING


def _calls_for(test: SpeedTest, warm_up: Dict[int, float], most: int) -> int:
    """Calls per counted round, from the last warm-up round's time per call (the request's
    own time included: an overestimate, so fast functions get the most calls every time, and
    the time per call measured does not move with a noisy estimate), so that a round's calls
    take ``round_seconds`` or more."""
    many = WARM_UP[-1]
    per_call = max(warm_up[many] / many, 1e-6)
    return max(1, min(most, math.ceil(test.round_seconds / per_call)))


async def _rounds(test: SpeedTest, device: str, seed: int, learner: TimedKernel,
                  clean: TimedKernel, speedup: Speedup) -> Tuple[int, int]:
    """Time rounds until the speedup is precise enough or the budget is spent; return the
    calls per counted round of the candidate and of the baseline. Raises SpeedProblem for a
    wrong output or untimed work.

    Each round draws inputs for the candidate's calls; the baseline is timed on the first of
    them. With a ``check`` function, the baseline's calls are as many as make its round last
    ``round_seconds`` (a slow baseline, a Python loop say, need not run 64 times a round) and
    the check computes the expected outputs of every call; without one, the baseline runs
    every call and its outputs are the expected ones."""
    budget_end = time.perf_counter() + test.seconds
    audit, warm_up = Audit(device), {"learner": {}, "clean": {}}
    calls, number = WARM_UP[0], 0
    counts = {"learner": calls, "clean": calls}
    measured_by = clock(device, learner, clean)
    while True:
        seeds = round_seeds(seed, number, counts["learner"])
        files = {"clean": None, "learner": None}
        if device != "cuda":
            files["clean"], files["learner"] = await _inputs(clean, learner, test, seeds, number)
        order = [("learner", learner, test.candidate), ("clean", clean, test.baseline)]
        if number % 2:
            order.reverse()
        turns: Dict[str, Turn] = {}
        expected = None
        try:
            for who, kernel, function in order:
                turns[who] = await _turn(kernel, test, function, seeds[:counts[who]], device,
                                         files[who], number, who, measured_by)
            mine, theirs = turns["learner"], turns["clean"]
            expected = (await _expected(clean, test, device, seeds, files["clean"], number)
                        if test.check else theirs.outputs)
            await _compare(clean, mine, expected, test, number)
        finally:
            for path in [*files.values(), expected, *(t.outputs for t in turns.values())]:
                if path is not None:
                    path.unlink(missing_ok=True)
        if device == "cuda":
            audit.add([mine.before], [theirs.before], mine.seconds * counts["learner"],
                      counted=number >= UNCOUNTED)
        if number < len(WARM_UP):  # not counted: they set the calls per round
            for who in warm_up:
                warm_up[who][counts[who]] = turns[who].seconds * counts[who]
            if number + 1 < len(WARM_UP):
                counts = dict.fromkeys(counts, WARM_UP[number + 1])
            else:
                calls = _calls_for(test, warm_up["learner"], test.max_calls)
                counts = {"learner": calls,
                          "clean": _calls_for(test, warm_up["clean"], calls) if test.check
                          else calls}
        elif number >= UNCOUNTED:
            speedup.add(mine.seconds, theirs.seconds)
        number += 1
        if speedup.rounds >= test.max_rounds or (speedup.rounds >= test.rounds
                                                 and speedup.precise(test.precision)
                                                 and not audit.undecided()):
            break
        # At the budget's end, an audit that leans towards work moved out of the timed calls
        # without being sure may take up to the budget again to decide.
        over = time.perf_counter() - budget_end
        if over >= 0 and speedup.rounds >= 2 and (over >= test.seconds or not audit.undecided()):
            break
        if time.perf_counter() >= budget_end + test.seconds:
            raise SpeedProblem(f"two rounds did not fit in {2 * test.seconds:g} s")
    audit.check_totals()
    return counts["learner"], counts["clean"]


# The timed kernels' threads, whatever --jobs gave each kernel: the speedup then does not
# depend on how many gradings run at once, and with the timed kernels alone on as many CPUs
# (autograder.sandbox.cpus), no thread waits for a CPU another one holds.
TIMING_CPUS = 1
RESTORE_THREADS = ("__import__('torch').set_num_threads(__autograder_threads)\n"
                   "del __autograder_threads")


async def _set_threads(clean: TimedKernel, learner: TimedKernel) -> None:
    await clean.request(f"__import__('torch').set_num_threads({TIMING_CPUS})")
    # The learner's kernel gets its own count back afterwards, for the cells after this one.
    await learner.request("__autograder_threads = __import__('torch').get_num_threads()\n"
                          f"__import__('torch').set_num_threads({TIMING_CPUS})")


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
    speedup, calls, baseline_calls = Speedup(), 0, 0
    try:
        clean = await start_clean()
        prepared = await clean.request(cell_source)
        if not prepared.ok:
            raise SetupProblem(f"the speed test's cell failed in a clean kernel: {prepared.error}")
        waiting = time.perf_counter()
        async with MachineLock(lock_folder):
            result["waited"] = round(time.perf_counter() - waiting, 3)
            learner.hold()
            with TimingCpus([k.group.cpuset_folder if k.group else None
                             for k in (learner, clean)], TIMING_CPUS, lock_folder) as cpus:
                result["cpus"] = cpus.cpus or None
                result["clock"] = clock(device, learner, clean)
                await _set_threads(clean, learner)
                try:
                    calls, baseline_calls = await _rounds(test, device, seed, learner, clean,
                                                          speedup)
                finally:  # briefly: a kernel stuck in the learner's code stays stuck
                    await learner.request(RESTORE_THREADS, timeout=5.0)
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
                      calls=calls, baseline_calls=baseline_calls,
                      candidate_seconds=candidate_s, baseline_seconds=baseline_s,
                      precise=speedup.precise(test.precision),
                      per_round=[[round(c, 7), round(b, 7)] for c, b in speedup.pairs])
    result["seconds"] = round(time.perf_counter() - started, 3)
    return result
