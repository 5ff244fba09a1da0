"""Timing that tells the truth about asynchronous devices.

``Benchmark`` is the course's reference version of the context manager that
learners write in the ``Benchmark`` assignment. ``time_it`` and ``compare``
do what every page's timed comparison needs: warm-ups, repeats, a device
synchronize before each clock reading, and the medians and the fastest runs side
by side (the pages judge by the fastest runs, the least disturbed on a shared
machine; :func:`timing_table`).
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


def time_it(fn: Callable[[], object], *, repeat: int = 5, warmup: int = 1,
            device: Optional[torch.device] = None) -> List[float]:
    """Seconds for each of ``repeat`` calls of ``fn``, after ``warmup`` untimed calls."""
    if repeat < 1:
        raise ValueError(f"repeat must be at least 1, got {repeat}")
    for _ in range(warmup):
        fn()
    synchronize(device)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return times


def interleaved_times(candidates: Dict[str, Callable[[], object]], repeat: int,
                      device: Optional[torch.device] = None,
                      warmup: int = 1) -> Dict[str, List[float]]:
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
            times[name] += time_it(fn, repeat=1, warmup=0, device=device)
    return times


def compare(candidates: Dict[str, Callable[[], object]], *, repeat: int = 5,
            warmup: int = 1, device: Optional[torch.device] = None) -> pd.DataFrame:
    """Time the candidates side by side (:func:`interleaved_times`) and tabulate them; the
    first one is the baseline."""
    if not candidates:
        raise ValueError("compare() needs at least one candidate")
    return timing_table(interleaved_times(candidates, repeat, device=device, warmup=warmup))


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
