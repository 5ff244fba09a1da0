"""Interval algebra on ``(start, end)`` pairs: union, covered length, intersection, difference.

One implementation for every page that asks "how much time (or memory) do these pieces
cover?": :mod:`dlperf.ddp` measures how much of the allreduce time a backward pass hid
(spans of a profiler trace, :func:`dlperf.ddp.overlap_stats`), and :mod:`dlperf.memory` counts
the bytes of a storage that saved tensors span, each shared byte once. Plain Python, no
dependencies, so any module (and any worker process) imports it at no cost. Integer
intervals give integer lengths.
"""
from __future__ import annotations

from typing import Iterable, List, Tuple, Union

Number = Union[int, float]
Interval = Tuple[Number, Number]


def union(intervals: Iterable[Interval], gap: Number = 0) -> List[Interval]:
    """Sorted, disjoint intervals covering the same points; pieces at most ``gap`` apart merge."""
    merged: List[List[Number]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1] + gap:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def total(intervals: Iterable[Interval]) -> Number:
    """The length the intervals cover, overlaps counted once."""
    return sum(e - s for s, e in union(intervals))


def intersection(a: Iterable[Interval], b: Iterable[Interval]) -> Number:
    """The length covered by both sets of intervals."""
    a, b = union(a), union(b)
    i = j = 0
    shared = 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        shared += max(0, end - start)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return shared


def subtract(a: Iterable[Interval], b: Iterable[Interval]) -> List[Interval]:
    """The parts of intervals ``a`` that no interval of ``b`` covers."""
    pieces = []
    holes = union(b)
    for start, end in union(a):
        for hole_start, hole_end in holes:
            if hole_end <= start or hole_start >= end:
                continue
            if hole_start > start:
                pieces.append((start, hole_start))
            start = max(start, hole_end)
        if end > start:
            pieces.append((start, end))
    return pieces
