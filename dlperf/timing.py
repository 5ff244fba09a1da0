"""Timing that tells the truth about asynchronous devices.

``Benchmark`` is the course's reference version of the context manager that
learners write in the ``Benchmark`` assignment. ``time_it`` and ``compare``
do what every page's timed comparison needs: warm-ups, repeats, a device
synchronize before each clock reading (on a GPU, its own clock, CUDA events, from
a cold L2 cache), and the medians and the fastest runs side by side (the pages
judge by the fastest runs, the least disturbed on a shared machine;
:func:`timing_table`).
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, Dict, List, Optional

import pandas as pd
import torch

from .accelerators import synchronize


class Benchmark:
    """Time a block: ``with Benchmark('matmul'): ...`` prints ``matmul: 0.1234 sec``.

    Queued GPU work is waited for before the clock starts and before it stops
    (d2l's version only reads the clock, so on a GPU it times the queueing).
    The measured seconds stay in ``.elapsed``; exceptions pass through.
    """

    def __init__(self, description: str = "Done", device: Optional[torch.device] = None,
                 clock: Callable[[], float] = time.perf_counter):
        self.description = description
        self.device = device
        self.clock = clock
        self.elapsed: Optional[float] = None

    def __enter__(self) -> "Benchmark":
        synchronize(self.device)
        self._start = self.clock()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        synchronize(self.device)
        self.elapsed = self.clock() - self._start
        print(f"{self.description}: {self.elapsed:.4f} sec")
        return False  # never swallow the block's exception


# Read before each timed call on a GPU: twice the L2 cache, so that none of the previous call's
# data is left there. Read, not written: a write would leave the L2 full of dirty lines, whose
# write-back to memory the timed call would pay for. One buffer per device, made on first use.
_L2_FLUSH: Dict[torch.device, torch.Tensor] = {}

# Queued on a GPU before each timed call: a kernel that spins this many clock cycles (0.5 ms
# at 2 GHz) and touches no memory, longer than the host takes to record an event and launch
# a call. Without it, a call that finds its data in the L2 finishes the untimed call before
# the host has launched the timed one, and the interval holds the launch: the first GPU run
# (H200) measured a warm read of half the L2 at 32 us, twice the cold one.
SPIN_CYCLES = 1_000_000


def flush_l2(device) -> None:
    """Queue a read of twice the L2 cache of the CUDA ``device``, so that the next kernel finds
    none of its data there (a no-op on other devices)."""
    device = torch.device(device)
    if device.type != "cuda":
        return
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device not in _L2_FLUSH:
        l2_bytes = torch.cuda.get_device_properties(device).L2_cache_size
        _L2_FLUSH[device] = torch.zeros(2 * max(l2_bytes, 2**20), dtype=torch.int8,
                                        device=device)
    _L2_FLUSH[device].max()  # one pass over the buffer, reading it


def time_it(fn: Callable[[], object], *, repeat: int = 5, warmup: int = 1,
            device: Optional[torch.device] = None,
            cold_l2: bool = True) -> List[float]:
    """Seconds for each of ``repeat`` calls of ``fn``, after ``warmup`` untimed calls.

    On a CPU (or with ``device`` None) the host's clock times each call, the device
    synchronized before it stops. On a CUDA ``device`` the GPU's own clock does: CUDA events
    recorded on the current stream before and after each call (performance-model, "CUDA
    events"). Before each start event, with ``cold_l2`` (the default), a read of twice the L2
    cache is queued, so that the call finds none of its data there, as in a program that does
    other work between calls; without it, an untimed call of ``fn``, which leaves its data in
    the L2. Then a spin of the GPU's clock that touches no memory (:data:`SPIN_CYCLES`) keeps
    the GPU busy while the host records the event and launches ``fn``, so that the interval
    holds ``fn``'s GPU time without the launch. A ``fn``
    that waits for the GPU itself (``.item()``, a synchronize) leaves the GPU idle, and its
    interval then includes the host's work too.
    """
    if repeat < 1:
        raise ValueError(f"repeat must be at least 1, got {repeat}")
    for _ in range(warmup):
        fn()
    synchronize(device)
    on_gpu = device is not None and torch.device(device).type == "cuda"
    times = []
    for _ in range(repeat):
        if on_gpu:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            if cold_l2:
                flush_l2(device)
            else:
                fn()
            torch.cuda._sleep(SPIN_CYCLES)  # busy while the host launches fn
            start.record()
            fn()
            end.record()
            end.synchronize()  # the second stamp, and so all work queued before it
            times.append(start.elapsed_time(end) / 1e3)  # elapsed_time is in ms
            continue
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return times


def interleaved_times(candidates: Dict[str, Callable[[], object]], repeat: int,
                      device: Optional[torch.device] = None,
                      warmup: int = 1, cold_l2: bool = True) -> Dict[str, List[float]]:
    """Seconds of each run of every candidate: ``warmup`` untimed calls of each, then
    ``repeat`` rounds in each of which every candidate runs once, in turn, so that load from
    other programs hits all of them alike rather than one whole series. The runs come back
    raw, so that their spread can be read as well as :func:`timing_table`'s summary."""
    for fn in candidates.values():
        for _ in range(warmup):
            fn()
    times: Dict[str, List[float]] = {name: [] for name in candidates}
    for _ in range(repeat):
        for name, fn in candidates.items():
            times[name] += time_it(fn, repeat=1, warmup=0, device=device, cold_l2=cold_l2)
    return times


def compare(candidates: Dict[str, Callable[[], object]], *, repeat: int = 5,
            warmup: int = 1, device: Optional[torch.device] = None,
            cold_l2: bool = True) -> pd.DataFrame:
    """Time the candidates side by side (:func:`interleaved_times`) and tabulate them; the
    first one is the baseline. On a GPU, ``cold_l2`` as for :func:`time_it`."""
    if not candidates:
        raise ValueError("compare() needs at least one candidate")
    return timing_table(interleaved_times(candidates, repeat, device=device, warmup=warmup,
                                          cold_l2=cold_l2))


def timing_table(times: Dict[str, List[float]]) -> pd.DataFrame:
    """Medians and minima (ms) of each row, and its speedup against the first row.

    ``speedup`` compares medians; ``speedup (fastest runs)`` compares minima, the
    least disturbed runs, which is the fairer estimate on a busy shared machine.
    Above 1 means faster than the first row, below 1 slower.
    """
    baseline = statistics.median(next(iter(times.values())))
    table = pd.DataFrame({
        "median (ms)": {k: statistics.median(v) * 1e3 for k, v in times.items()},
        "min (ms)": {k: min(v) * 1e3 for k, v in times.items()},
        "runs": {k: len(v) for k, v in times.items()},
    })
    table["speedup"] = baseline * 1e3 / table["median (ms)"]
    table["speedup (fastest runs)"] = table["min (ms)"].iloc[0] / table["min (ms)"]
    return table.round({"median (ms)": 3, "min (ms)": 3, "speedup": 2,
                        "speedup (fastest runs)": 2})
