"""Timing that tells the truth about asynchronous devices.

``Benchmark`` is the course's reference version of the context manager that
learners write in the ``Benchmark`` assignment. ``time_it`` and ``compare``
do what every page's timed comparison needs: warm-ups, repeats, a device
synchronize before each clock reading, and medians side by side.
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


def compare(candidates: Dict[str, Callable[[], object]], *, repeat: int = 5,
            warmup: int = 1, device: Optional[torch.device] = None) -> pd.DataFrame:
    """Time each candidate in turn and tabulate medians; the first one is the baseline.

    ``speedup`` above 1 means faster than the baseline, below 1 slower.
    """
    if not candidates:
        raise ValueError("compare() needs at least one candidate")
    rows = {name: time_it(fn, repeat=repeat, warmup=warmup, device=device)
            for name, fn in candidates.items()}
    return timing_table(rows)


def timing_table(times: Dict[str, List[float]]) -> pd.DataFrame:
    """A table of medians (ms), minima (ms) and speedup against the first row."""
    baseline = statistics.median(next(iter(times.values())))
    table = pd.DataFrame({
        "median (ms)": {k: statistics.median(v) * 1e3 for k, v in times.items()},
        "min (ms)": {k: min(v) * 1e3 for k, v in times.items()},
        "runs": {k: len(v) for k, v in times.items()},
    })
    table["speedup"] = baseline * 1e3 / table["median (ms)"]
    return table.round({"median (ms)": 3, "min (ms)": 3, "speedup": 2})
