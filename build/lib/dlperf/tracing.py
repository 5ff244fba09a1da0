"""Reading a profiler trace back into Python: spans, lanes, nesting and summaries.

``torch.profiler`` writes its traces in the Chrome trace-event format (the JSON that
Perfetto and chrome://tracing open). A page that wants to *draw* a trace, count what a
step launched or check a claim against the profiler's own table needs the same few
steps: keep the complete ("X") events, name the lane each one ran on (a CPU thread or
a GPU stream, from the trace's metadata), work out which events sit inside which, and
add up self and total times. This module does those steps and nothing else, with the
standard library and pandas.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import pandas as pd

# Runtime calls that make the CPU wait for the GPU whatever they copy: the three
# synchronizations, and cudaMemcpy, the synchronous copy.
SYNC_CALLS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize",
              "cudaMemcpy")
# An asynchronous copy makes the CPU wait only in one case: from the device into pageable
# host memory, it returns once the copy is done (CUDA Runtime API, "API synchronization
# behavior"). From or into pinned memory (``tensor.pin_memory()``, ``non_blocking=True``)
# it only queues the copy. Which case a call was, its device-side copy says by its name:
# "Memcpy DtoH (Device -> Pageable)", found through the ``correlation`` they share.
COPY_CALLS = ("cudaMemcpyAsync",)

# Categories of events that do not belong on a lane of their own: the profiler's
# overall window ("Trace") and the arrows linking launches to kernels (flow events).
_SKIPPED = {"Trace"}


@dataclass(frozen=True)
class Span:
    """One complete event of a trace: what ran (``name``), on which lane, when (µs)."""

    name: str
    cat: str
    lane: str
    start: float  # µs, on the trace's clock
    dur: float  # µs
    depth: int = 0  # how many spans on the same lane enclose this one
    self_time: float = 0.0  # µs of ``dur`` not spent in spans nested directly inside
    correlation: Optional[int] = None  # links a runtime call to the kernel or copy it queued

    @property
    def end(self) -> float:
        return self.start + self.dur


def load(trace: Union[str, Path, Mapping]) -> dict:
    """The trace as a dict, from a path to a JSON file or a dict already loaded."""
    if isinstance(trace, Mapping):
        return dict(trace)
    return json.loads(Path(trace).read_text())


def lane_names(events: Iterable[Mapping]) -> Dict[Tuple[object, object], str]:
    """Readable lane names from the metadata ("M") events: ``(pid, tid) -> name``.

    A lane is a thread of the process ("CPU · thread 4242 (python)") or a stream of a
    GPU ("GPU 0 · stream 7"), whichever the trace's metadata says the pair stands for.
    """
    process, labels, threads = {}, {}, {}
    for event in events:
        if event.get("ph") != "M":
            continue
        args = event.get("args", {})
        if event.get("name") == "process_name":
            process[event.get("pid")] = str(args.get("name", ""))
        elif event.get("name") == "process_labels":
            labels[event.get("pid")] = str(args.get("labels", ""))
        elif event.get("name") == "thread_name":
            threads[(event.get("pid"), event.get("tid"))] = str(args.get("name", "")).strip()
    names = {}
    for (pid, tid), thread in threads.items():
        owner = labels.get(pid) or process.get(pid) or f"process {pid}"
        names[(pid, tid)] = f"{owner} · {thread or f'thread {tid}'}"
    return names


def nest(spans: Sequence[Span], tolerance: float = 0.01) -> List[Span]:
    """The spans with ``depth`` and ``self_time`` filled in, sorted by lane and start.

    On one lane an event lies inside another when it starts and ends within it (the
    profiler rounds timestamps, hence a ``tolerance`` in µs). Self time is what a span
    spent outside its direct children: the column "Self CPU" of the profiler's table.
    """
    ordered = sorted(spans, key=lambda s: (s.lane, s.start, -s.dur))
    depth: Dict[int, int] = {}
    child_time: Dict[int, float] = {i: 0.0 for i in range(len(ordered))}
    stack: List[int] = []
    lane = None
    for i, span in enumerate(ordered):
        if span.lane != lane:
            stack, lane = [], span.lane
        while stack and ordered[stack[-1]].end <= span.start + tolerance:
            stack.pop()
        while stack and span.end > ordered[stack[-1]].end + tolerance:
            stack.pop()  # overlaps its neighbour without nesting: treat as a sibling
        depth[i] = len(stack)
        if stack:
            child_time[stack[-1]] += span.dur
        stack.append(i)
    return [replace(span, depth=depth[i], self_time=max(span.dur - child_time[i], 0.0))
            for i, span in enumerate(ordered)]


def read_trace(trace: Union[str, Path, Mapping]) -> List[Span]:
    """Every complete ("X") event of a Chrome trace as a nested :class:`Span`.

    ``trace`` is the path ``export_chrome_trace`` wrote, or its JSON as a dict.
    """
    data = load(trace)
    events = data.get("traceEvents", [])
    names = lane_names(events)
    spans = []
    for event in events:
        if event.get("ph") != "X" or event.get("cat") in _SKIPPED:
            continue
        key = (event.get("pid"), event.get("tid"))
        lane = names.get(key) or f"process {key[0]} · thread {key[1]}"
        correlation = (event.get("args") or {}).get("correlation")
        spans.append(Span(name=str(event.get("name", "")), cat=str(event.get("cat", "")),
                          lane=lane, start=float(event["ts"]), dur=float(event.get("dur", 0.0)),
                          correlation=correlation if isinstance(correlation, int) else None))
    return nest(spans)


def lanes(spans: Iterable[Span]) -> List[str]:
    """The lanes of the spans: CPU threads first, then GPU streams, each in trace order."""
    seen = list(dict.fromkeys(span.lane for span in spans))
    return sorted(seen, key=lambda lane: (lane.startswith("GPU"), seen.index(lane)))


def within(spans: Sequence[Span], outer: Span) -> List[Span]:
    """The spans (on any lane) that start and end inside ``outer``'s time window.

    With ``outer`` one ``ProfilerStep#n`` span this cuts one training step out of a trace.
    GPU work launched at the very end of a step can run after its window closes.
    """
    return [s for s in spans if s.start >= outer.start and s.end <= outer.end + 0.01]


def named(spans: Iterable[Span], prefix: str) -> List[Span]:
    """The spans whose name starts with ``prefix`` (``"ProfilerStep#"``, ``"aten::"``)."""
    return [s for s in spans if s.name.startswith(prefix)]


def summarize(spans: Iterable[Span], *, prefix: str = "", per: int = 1) -> pd.DataFrame:
    """One row per name: calls, total and self time (µs), sorted by self time.

    The same columns as ``prof.key_averages().table()``, recomputed from the trace;
    ``per`` divides the calls and times (e.g. by the number of profiled steps).
    """
    rows: Dict[str, List[float]] = {}
    for span in spans:
        if not span.name.startswith(prefix):
            continue
        row = rows.setdefault(span.name, [0, 0.0, 0.0])
        row[0] += 1
        row[1] += span.dur
        row[2] += span.self_time
    table = pd.DataFrame.from_dict(rows, orient="index",
                                   columns=["calls", "total (µs)", "self (µs)"])
    table.index.name = "name"
    table[["calls", "total (µs)", "self (µs)"]] = table[["calls", "total (µs)", "self (µs)"]] / per
    return table.sort_values("self (µs)", ascending=False)


def counts(spans: Iterable[Span], *, prefix: str = "", leaves_only: bool = False) -> Counter:
    """How many spans of each name (those starting with ``prefix``).

    ``leaves_only`` keeps spans with no span of the same prefix nested in them: for
    ATen operators, the ones that did the work rather than called another operator.
    """
    chosen = [s for s in spans if s.name.startswith(prefix)]
    if not leaves_only:
        return Counter(s.name for s in chosen)
    ordered = sorted(chosen, key=lambda s: (s.lane, s.start, -s.dur))
    leaves = Counter()
    for i, span in enumerate(ordered):
        following = ordered[i + 1] if i + 1 < len(ordered) else None
        has_child = (following is not None and following.lane == span.lane
                     and following.start < span.end and following.depth > span.depth)
        if not has_child:
            leaves[span.name] += 1
    return leaves


def waits_for_copy(call: Span, copies: Mapping[int, Span]) -> bool:
    """Whether an asynchronous copy call made the CPU wait: its device-side copy (in
    ``copies``, by correlation id) went from the device into pageable host memory."""
    copy = copies.get(call.correlation) if call.correlation is not None else None
    return copy is not None and "DtoH" in copy.name and "Pageable" in copy.name


def sync_spans(spans: Iterable[Span], calls: Sequence[str] = SYNC_CALLS,
               everything: Optional[Iterable[Span]] = None) -> List[Span]:
    """The CUDA runtime calls in which the CPU waited for the GPU (none in a CPU trace).

    Those named in ``calls`` always wait; a ``cudaMemcpyAsync`` waits only when it copied
    from the device into pageable host memory (:func:`waits_for_copy`). The device-side
    copies are looked up in ``everything`` (default: ``spans``), so that a slice of a
    trace can be checked against the whole of it.
    """
    spans = list(spans)
    copies = {s.correlation: s for s in (spans if everything is None else everything)
              if s.cat == "gpu_memcpy" and s.correlation is not None}
    return [s for s in spans if s.name in calls
            or (s.name in COPY_CALLS and waits_for_copy(s, copies))]


def steps(spans: Iterable[Span]) -> List[Span]:
    """The ``ProfilerStep#n`` spans: one per step a scheduled profiler recorded."""
    return [s for s in spans if s.name.startswith("ProfilerStep#") and s.cat != "gpu_user_annotation"]


def timeline(spans: Iterable[Span], *, origin: Optional[float] = None, max_depth: int = 2,
             axis_width: Optional[float] = None, char_share: float = 0.012, unit: str = "ms",
             strip: Sequence[str] = ("aten::", "autograd::engine::evaluate_function: ")
             ) -> List[Tuple[str, float, float, str]]:
    """``(lane, start, end, label)`` tuples for :func:`dlperf.plot_timeline`.

    Nested spans go one row below their parent, as Perfetto stacks them, down to
    ``max_depth``. A span keeps its label only where the text fits: each character
    needs ``char_share`` of ``axis_width`` (µs; default: the spans' own extent), so
    short spans stay unlabelled slivers instead of overprinting their neighbours.
    Times start at ``origin`` (default: the earliest span), in ``unit`` ("ms" or "us").
    """
    spans = [s for s in spans if s.depth <= max_depth]
    if not spans:
        return []
    scale = {"ms": 1e-3, "us": 1.0}[unit]
    origin = min(s.start for s in spans) if origin is None else origin
    width = axis_width if axis_width is not None else max(s.end for s in spans) - origin
    order = lanes(spans)
    rows = []
    for span in sorted(spans, key=lambda s: (order.index(s.lane), s.depth, s.start)):
        label = span.name
        for prefix in strip:
            label = label[len(prefix):] if label.startswith(prefix) else label
        if span.dur < (len(label) + 2) * char_share * width:
            label = ""
        lane = span.lane if max_depth == 0 else f"{span.lane}, level {span.depth}"
        rows.append((lane, (span.start - origin) * scale, (span.end - origin) * scale, label))
    return rows
