"""The chapter "A Performance Model" (chapters/performance-model.md).

The integration tests read the page as the book build executed it; the GPU test
executes it on CUDA, where the datasheet comparison and CUDA events run.
"""
import math
import re

import pytest
import torch

from tests.helpers import execute_chapter, figures, glued, number
from coursebook.executed import page_text

pytestmark = pytest.mark.integration

PAGE = "chapters/performance-model"


def check_page(nb, values):
    """What must hold on any device."""
    text = page_text(nb)
    assert "Run profile" in text
    assert figures(nb) >= 1
    # Datasheet ridge points, with their sources.
    for source in ["NVIDIA H100 datasheet", "NVIDIA H200 datasheet"]:
        assert source in text
    assert number(values, "h100_bf16_ridge") == pytest.approx(989.5 / 3.35, rel=1e-3)
    assert number(values, "h200_bf16_ridge") < number(values, "h100_bf16_ridge")
    # Counting: eager GELU runs 8 operations and moves 72 bytes per element, fused 8.
    assert number(values, "gelu_ops") == 8
    assert number(values, "gelu_eager_bytes_per_element") == 72
    assert number(values, "gelu_fused_bytes_per_element") == 8
    assert "tanh" in text
    # Ceilings and the ridge point agree with each other.
    bandwidth, peak = number(values, "bandwidth_gbs"), number(values, "peak_rate")
    assert bandwidth > 0 and peak > 0
    scale = 1e12 if values["unit_name"].strip("'") == "TFLOP/s" else 1e9
    # 2e-3: without myst-nb the three are printed to 4 significant digits each
    assert number(values, "ridge") == pytest.approx(peak * scale / (bandwidth * 1e9), rel=2e-3)
    # One roofline for the whole page, its ceilings measured by kernels it does not plot: the
    # triad for the bandwidth, a product larger than every plotted one for the compute peak.
    assert "roof_bandwidth_gbs" not in values and "roof_ridge" not in values
    assert number(values, "peak_n") > number(values, "large_n")
    assert "triad" in text
    # Every point is placed, on the side of the ridge its intensity says.
    for key in ["add", "add_new", "tanh", "gelu_eager", "gelu_compiled"]:
        assert number(values, f"{key}_share") > 0
        assert number(values, f"{key}_point_intensity") < number(values, "ridge")
    # The smallest product's few KiB live in a cache: the page must not call it memory-bound.
    assert number(values, "small_kib") == pytest.approx(3 * 4 * number(values, "small_n") ** 2 / 2**10)
    assert "memory-bound" not in values["small_side_verdict"]
    if values["small_cache_name"].strip("'") not in {"none", "too small"}:
        assert "does not bind" in values["small_cache_verdict"]
    assert number(values, "gelu_compiled_point_intensity") == pytest.approx(
        9 * number(values, "gelu_eager_point_intensity"), rel=1e-3)  # printed: 4 digits
    assert number(values, "large_intensity") > number(values, "small_intensity")
    # The timing section shows torch.utils.benchmark.Timer next to dlperf.time_it.
    assert "Timer, default (num_threads=1)" in text and "dlperf.time_it" in text
    assert number(values, "timer_ratio") > 0
    assert number(values, "event_fastest_ms") > 0
    return text


def test_page_counts_measures_and_places_operations(executed_page):
    nb = executed_page(PAGE)
    values = glued(nb, PAGE)
    text = check_page(nb, values)
    if not torch.cuda.is_available():  # the book is built on this machine
        assert "CUDA events exist only on a GPU" in values["timed_with"]
        assert "no datasheet ridge: a CPU" in text
        assert math.isnan(number(values, "ridge_ratio"))


@pytest.mark.gpu
def test_page_runs_on_the_gpu(monkeypatch):
    """Execute the page on CUDA (quick profile): datasheet comparison, bfloat16, CUDA events."""
    nb = execute_chapter("performance-model", monkeypatch, timeout=900)
    values = glued(nb)
    text = check_page(nb, values)
    assert re.search(r"\d+ GPUs?: ", text)  # page_setup's line names the GPUs it found
    assert values["unit_name"].strip("'") == "TFLOP/s"
    assert values["timed_with"].strip("'") == "CUDA events"
    assert "bfloat16" in text or "float16" in text
    from dlperf import hardware
    if hardware.gpu_spec(torch.cuda.get_device_name(0)) is not None:
        ratio = number(values, "ridge_ratio")
        assert 0.2 < ratio < 5  # measured ceilings, whatever their share of the datasheet's
        assert "datasheet" in values["ridge_verdict"]
        # A GPU's copy reaches a large share of its HBM bandwidth.
        spec = hardware.gpu_spec(torch.cuda.get_device_name(0))
        assert number(values, "bandwidth_gbs") > 0.5 * spec.bandwidth_gbs
    # Fusion pays on a GPU: the compiled GELU is faster than the eager one.
    assert number(values, "gelu_speedup") > 1
    assert "with the start event queued behind a product" in text


@pytest.mark.gpu
def test_cuda_events_include_the_launch_only_when_the_gpu_is_idle():
    """The page's claim: a start event recorded on an idle GPU is stamped at once, so the interval
    holds the launch of a tiny kernel; recorded behind queued work, it holds the kernel alone."""
    import statistics

    x, out = torch.randn(2**14, device="cuda"), torch.empty(2**14, device="cuda")
    m = torch.randn(4096, 4096, device="cuda")

    def interval(before):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        before()
        start.record()
        torch.add(x, x, out=out)
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    for _ in range(5):
        interval(lambda: m @ m)
    busy = statistics.median(interval(lambda: m @ m) for _ in range(50))
    idle = statistics.median(interval(torch.cuda.synchronize) for _ in range(50))
    assert idle > busy
