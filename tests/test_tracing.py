"""dlperf.tracing: reading Chrome traces back into spans, lanes and summaries."""
import json

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from dlperf import tracing


def synthetic_trace():
    """A hand-made trace: one CPU thread with nesting, one GPU stream, and the noise around it."""
    meta = [
        {"ph": "M", "name": "process_name", "pid": 7, "tid": 0, "args": {"name": "python"}},
        {"ph": "M", "name": "process_labels", "pid": 7, "tid": 0, "args": {"labels": "CPU"}},
        {"ph": "M", "name": "thread_name", "pid": 7, "tid": 7, "args": {"name": "thread 7 (python)"}},
        {"ph": "M", "name": "process_labels", "pid": 0, "tid": 0, "args": {"labels": "GPU 0"}},
        {"ph": "M", "name": "thread_name", "pid": 0, "tid": 3, "args": {"name": "stream 3 "}},
    ]
    x = lambda name, cat, pid, tid, ts, dur: {"ph": "X", "name": name, "cat": cat, "pid": pid,
                                              "tid": tid, "ts": ts, "dur": dur}
    events = [
        x("ProfilerStep#1", "user_annotation", 7, 7, 100.0, 100.0),
        x("forward", "user_annotation", 7, 7, 105.0, 60.0),
        x("aten::linear", "cpu_op", 7, 7, 110.0, 30.0),
        x("aten::addmm", "cpu_op", 7, 7, 112.0, 25.0),
        x("aten::relu", "cpu_op", 7, 7, 145.0, 10.0),
        x("cudaStreamSynchronize", "cuda_runtime", 7, 7, 170.0, 20.0),
        x("gemm_kernel", "kernel", 0, 3, 150.0, 30.0),
        x("late_kernel", "kernel", 0, 3, 195.0, 30.0),  # runs past the step's end
        x("PyTorch Profiler (0)", "Trace", "Spans", "PyTorch Profiler", 90.0, 200.0),
        {"ph": "s", "name": "flow", "pid": 7, "tid": 7, "ts": 112.0, "id": 1},
        {"ph": "i", "name": "marker", "pid": "", "tid": "", "ts": 120.0, "s": "g"},
    ]
    return {"traceEvents": meta + events}


def by_name(spans):
    return {s.name: s for s in spans}


def test_reads_complete_events_into_named_lanes():
    spans = tracing.read_trace(synthetic_trace())
    names = by_name(spans)
    assert "PyTorch Profiler (0)" not in names  # the profiler's window is not an event
    assert len(spans) == 8
    assert names["aten::addmm"].lane == "CPU · thread 7 (python)"
    assert names["gemm_kernel"].lane == "GPU 0 · stream 3"
    assert tracing.lanes(spans) == ["CPU · thread 7 (python)", "GPU 0 · stream 3"]
    assert names["aten::relu"].end == pytest.approx(155.0)


def test_nesting_depth_and_self_time():
    names = by_name(tracing.read_trace(synthetic_trace()))
    assert [names[n].depth for n in ("ProfilerStep#1", "forward", "aten::linear", "aten::addmm")] == [0, 1, 2, 3]
    assert names["aten::relu"].depth == 2
    assert names["cudaStreamSynchronize"].depth == 1
    assert names["forward"].self_time == pytest.approx(60 - 30 - 10)
    assert names["aten::linear"].self_time == pytest.approx(5.0)
    assert names["ProfilerStep#1"].self_time == pytest.approx(100 - 60 - 20)
    assert names["gemm_kernel"].depth == 0 and names["gemm_kernel"].self_time == 30.0


def test_within_summarize_counts_and_syncs():
    spans = tracing.read_trace(synthetic_trace())
    step = tracing.steps(spans)[0]
    inside = {s.name for s in tracing.within(spans, step)}
    assert "gemm_kernel" in inside and "late_kernel" not in inside
    table = tracing.summarize(spans, prefix="aten::")
    assert list(table.index) == ["aten::addmm", "aten::relu", "aten::linear"]  # by self time
    assert table.loc["aten::linear", "total (µs)"] == pytest.approx(30.0)
    assert tracing.summarize(spans, prefix="aten::", per=2).loc["aten::addmm", "calls"] == 0.5
    assert tracing.counts(spans, prefix="aten::") == {"aten::linear": 1, "aten::addmm": 1, "aten::relu": 1}
    assert tracing.counts(spans, prefix="aten::", leaves_only=True) == {"aten::addmm": 1, "aten::relu": 1}
    assert [s.name for s in tracing.sync_spans(spans)] == ["cudaStreamSynchronize"]


def test_timeline_rows_levels_and_labels():
    spans = tracing.read_trace(synthetic_trace())
    rows = tracing.timeline(spans, origin=100.0, max_depth=1, unit="us", char_share=0.001)
    lanes = list(dict.fromkeys(lane for lane, *_ in rows))
    assert lanes == ["CPU · thread 7 (python), level 0", "CPU · thread 7 (python), level 1",
                     "GPU 0 · stream 3, level 0"]
    assert ("CPU · thread 7 (python), level 1", 5.0, 65.0, "forward") in rows
    assert not any(label == "linear" for *_, label in rows)  # depth 2 is left out
    crowded = tracing.timeline(spans, max_depth=3, char_share=0.1)
    assert {label for *_, label in crowded} == {""}  # text that does not fit is dropped
    assert tracing.timeline([], max_depth=2) == []


def test_overlapping_siblings_do_not_nest():
    spans = [tracing.Span("a", "cpu_op", "L", 0.0, 10.0), tracing.Span("b", "cpu_op", "L", 5.0, 10.0)]
    assert [s.depth for s in tracing.nest(spans)] == [0, 0]


def test_reads_a_real_profiler_trace_from_a_file(tmp_path):
    x = torch.randn(32, 32)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function("my label"):
            torch.relu(x @ x)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    assert "traceEvents" in json.loads(path.read_text())
    spans = tracing.read_trace(path)
    names = by_name(spans)
    assert names["my label"].depth < names["aten::relu"].depth
    table = tracing.summarize(spans, prefix="aten::")
    events = {e.key: e for e in prof.key_averages()}
    for op in ("aten::mm", "aten::relu"):
        assert table.loc[op, "self (µs)"] == pytest.approx(events[op].self_cpu_time_total, rel=0.01, abs=1)
    assert tracing.sync_spans(spans) == []  # nothing waits for a GPU on the CPU


def test_only_copies_into_pageable_memory_count_as_waits():
    """A cudaMemcpyAsync waits only when it copies from the device into pageable memory;
    one from pinned memory (non_blocking=True) just queues the copy."""
    meta = [{"ph": "M", "name": "thread_name", "pid": 7, "tid": 7, "args": {"name": "python"}},
            {"ph": "M", "name": "thread_name", "pid": 0, "tid": 3, "args": {"name": "stream 3"}}]

    def x(name, cat, pid, tid, ts, dur, correlation):
        return {"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": tid, "ts": ts,
                "dur": dur, "args": {"correlation": correlation}}

    events = [x("cudaMemcpyAsync", "cuda_runtime", 7, 7, 10.0, 2.0, 1),  # pinned -> device
              x("Memcpy HtoD (Pinned -> Device)", "gpu_memcpy", 0, 3, 40.0, 5.0, 1),
              x("cudaMemcpyAsync", "cuda_runtime", 7, 7, 20.0, 60.0, 2),  # device -> pageable
              x("Memcpy DtoH (Device -> Pageable)", "gpu_memcpy", 0, 3, 75.0, 4.0, 2),
              x("cudaMemcpyAsync", "cuda_runtime", 7, 7, 90.0, 2.0, 3),  # device -> pinned
              x("Memcpy DtoH (Device -> Pinned)", "gpu_memcpy", 0, 3, 95.0, 4.0, 3),
              x("cudaStreamSynchronize", "cuda_runtime", 7, 7, 93.0, 8.0, 4)]
    spans = tracing.read_trace({"traceEvents": meta + events})
    waits = tracing.sync_spans(spans)
    assert [(s.name, s.correlation) for s in waits] == [("cudaMemcpyAsync", 2),
                                                       ("cudaStreamSynchronize", 4)]
    on_cpu = [s for s in spans if s.cat == "cuda_runtime"]  # a slice without the GPU's copies
    assert len(tracing.sync_spans(on_cpu, everything=spans)) == 2
    assert [s.name for s in tracing.sync_spans(on_cpu)] == ["cudaStreamSynchronize"]
