"""The Profiling chapter: operator tables, a trace drawn from its JSON, hidden syncs.

The integration tests read the page as the book build executed it; the GPU test
executes the page on CUDA, where the kernel counts and the synchronizations exist.
"""
import ast
import re

import pytest
import torch

from tests.helpers import execute_chapter, figures, glued, number
from coursebook.executed import page_text

pytestmark = pytest.mark.integration

PAGE = "chapters/profiling"


def word(values, name):
    return values[name].strip("'\"")


def test_page_prints_both_operator_tables(executed_page):
    text = page_text(executed_page(PAGE))
    assert "Run profile" in text
    for title in ("eager step, 5 profiled steps", "compiled step, 5 profiled steps"):
        assert title in text
    assert text.count("Self CPU time total") == 2  # the footer of each key_averages table
    assert "## Call CompiledFxGraph" in text  # compiled graphs show up as rows of their own
    assert "aten::mm" in text


def test_counts_show_what_the_compiled_step_replaced(page_outputs):
    nb, text, values = page_outputs(PAGE)
    assert number(values, "compiled_aten_calls") < number(values, "eager_aten_calls")
    assert int(values["compiled_distinct_ops"]) < int(values["eager_distinct_ops"])
    assert int(values["replaced_count"]) > 0
    assert number(values, "graph_calls") == 2  # one forward and one backward graph per step
    assert "aten::gelu" in text.split("no longer calls:")[1].split("ATen operators both")[0]
    assert number(values, "compile_s") > 0


def test_wrapper_rows_named_in_the_text_are_in_the_printed_table(page_outputs):
    """The text names only wrapper rows of compiled code that its printed table shows."""
    nb, text, values = page_outputs(PAGE)
    compiled_table = text.split("compiled step, 5 profiled steps")[1].split("Self CPU time total")[0]
    names = ast.literal_eval(values["wrapper_names"])  # glued as text, e.g. "['CompiledFunction']"
    assert isinstance(names, list)
    for name in names:
        assert name in compiled_table
    if "TorchDynamo Cache Lookup" not in compiled_table:
        assert "TorchDynamo Cache Lookup" not in word(values, "wrapper_rows")


def test_trace_is_read_back_faithfully(page_outputs):
    nb, text, values = page_outputs(PAGE)
    assert number(values, "self_gap_pct") <= 1.0  # trace and table agree on self times
    assert number(values, "forward_self_ms") < number(values, "forward_total_ms")
    assert re.search(r"eager\.json: \d+ kB, \d+ events", text)
    assert "traces written: " in text
    assert figures(nb) >= 1  # the timeline drawn from the trace
    assert number(values, "eager_profiled_ms") > 0 and number(values, "compiled_profiled_ms") > 0


def test_sync_finder_runs_on_every_machine(page_outputs):
    nb, text, values = page_outputs(PAGE)
    if not torch.cuda.is_available():  # the book was built on this machine
        assert "no CUDA: nothing to detect" in text
        assert int(values["sync_calls_total"]) == 0
    assert "torch.nonzero(v > 0)" in text and "v[v > 0]" in text


@pytest.mark.gpu
def test_page_runs_on_the_gpu(monkeypatch):
    """Execute the page on CUDA (quick profile): kernels, device-time tables and real syncs."""
    nb = execute_chapter("profiling", monkeypatch, timeout=900)
    text, values = page_text(nb), glued(nb)
    assert re.search(r"\d+ GPUs?: ", text)  # page_setup's line names the GPUs it found
    assert "self_device_time_total" in text  # the tables were sorted by GPU time
    assert re.search(r"stream \d+", text)  # a lane for a CUDA stream in the trace
    assert word(values, "kernel_sentence").startswith("each eager step launched")
    answer = word(values, "sync_answer")
    assert answer.startswith("it flagged")
    flagged = set(answer.split(": ", 1)[1].split("; "))
    assert {"v.sum().item()", "torch.nonzero(v > 0)", "v[v > 0]"} <= flagged
    assert "v.sum()" not in flagged  # a reduction's output shape is known: it stays queued
    assert "host.to(dev, non_blocking=True)" not in flagged  # pinned memory: queued, no wait
    assert int(values["sync_calls_total"]) > 0
    assert int(values["item_waits"]) > 0  # .item() makes a blocking copy: it waits
    assert int(values["pinned_copy_waits"]) == 0  # a cudaMemcpyAsync from pinned memory does not
    assert word(values, "sync_verdict").startswith("found ")
