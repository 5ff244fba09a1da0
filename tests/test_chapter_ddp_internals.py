"""The page chapters/ddp-internals (Inside DDP, and Sharding), as the book build executed it.

The GPU test runs the page itself on CUDA, where it uses NCCL across two or more GPUs
(gloo on CPU processes otherwise) and traces kernels instead of CPU threads.
"""

import re

import pytest
import torch

from tests.helpers import execute_chapter, figures, glued, number
from coursebook.executed import page_text

pytestmark = pytest.mark.integration

PAGE = "chapters/ddp-internals"


@pytest.fixture(scope="module")
def page(page_outputs):
    return page_outputs(PAGE)


def test_page_runs_two_processes_and_draws_its_figures(page):
    nb, text, values = page
    assert "Run profile" in text
    assert figures(nb) >= 2  # the timeline and the bucket sweep
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert values["backend"].strip("'") == ("nccl" if gpus >= 2 else "gloo")
    assert number(values, "world_size") >= 2


def test_buckets_are_predicted_exactly(page):
    _, text, values = page
    assert number(values, "bucket_matches") == number(values, "bucket_settings") == 2
    assert "prediction equals what DDP did: False" not in text
    assert number(values, "trace_buckets") > 1


def test_the_trace_measures_overlap_consistently(page):
    _, _, values = page
    comm, overlapped = number(values, "comm_ms"), number(values, "overlapped_ms")
    assert comm > 0 and number(values, "backward_ms") > 0
    assert 0 <= overlapped <= comm + 1e-9
    assert number(values, "overlap_share") == pytest.approx(100 * overlapped / comm, rel=1e-6)
    assert number(values, "exposed_ms") == pytest.approx(comm - overlapped, abs=1e-6)


def test_no_sync_saves_allreduces_and_keeps_the_gradients(page):
    _, text, values = page
    assert "assert_close passed for both ways" in text
    k = number(values, "accum_k")
    assert number(values, "allreduces_every") == k * number(values, "allreduces_nosync")
    assert number(values, "allreduces_nosync") == number(values, "trace_buckets")  # said so
    assert number(values, "allreduces_saved") == (k - 1) * number(values, "allreduces_nosync")
    assert number(values, "accum_diff") < 1e-4
    assert number(values, "nosync_ratio") == pytest.approx(
        number(values, "every_ms") / number(values, "nosync_ms"), rel=1e-6)


def test_sweep_covers_one_and_many_buckets(page):
    _, _, values = page
    assert number(values, "sweep_spread") >= 1
    assert number(values, "fastest_buckets") >= 1


def test_sharding_holds_what_zero_predicts(page):
    _, _, values = page
    n = number(values, "world_size")
    assert number(values, "zero3_8") == 2 and number(values, "zero1_8") == 5.5
    assert number(values, "ddp_bytes_param") == pytest.approx(16, abs=0.01)
    # what the page says the bytes beyond 16 per parameter are: Adam's float32 step counters
    assert number(values, "ddp_extra_bytes") == 4 * number(values, "param_tensors")
    # ZeRO-1 splits whole tensors, so one process may hold a little more than 1/n
    assert number(values, "zero1_bytes_param") >= number(values, "zero1_predicted") - 0.01
    assert number(values, "zero1_bytes_param") < 16
    assert number(values, "fsdp_bytes_param") == pytest.approx(16 / n, abs=0.05)
    assert number(values, "fsdp_params_share") == pytest.approx(100 / n, abs=1)
    assert number(values, "zero_max_diff") < 1e-5 and number(values, "fsdp_max_diff") < 1e-5


def test_peaks_exceed_what_is_kept_between_steps(page):
    """Sharding divides what a process keeps between steps; its peak within a step is more:
    all-gathered parameters, unreduced gradients, activations (not "1/n in everything")."""
    _, text, values = page
    assert "peak bytes per parameter" in text
    assert number(values, "ddp_peak_bpp") > 16  # parameters, gradients, Adam, DDP's buckets
    assert number(values, "fsdp_peak_bpp") > number(values, "fsdp_predicted")
    assert number(values, "fsdp_peak_bpp") > number(values, "fsdp_bytes_param")
    assert number(values, "fsdp_peak_bpp") < number(values, "ddp_peak_bpp")


def test_zero_redundancy_traffic_is_allreduce_plus_broadcast(page):
    """What ZeroRedundancyOptimizer sends is DDP's allreduce plus a broadcast, 3(n-1)/n, not
    the 2(n-1)/n of the ideal ZeRO-1."""
    _, _, values = page
    n = number(values, "world_size")
    assert number(values, "zero_redundancy_sent") == pytest.approx(3 * (n - 1) / n, rel=1e-3)
    assert number(values, "zero_redundancy_sent") > number(values, "zero1_ideal_sent")
    assert number(values, "zero1_ideal_sent") == pytest.approx(2 * (n - 1) / n)
    assert number(values, "ddp_sent") == pytest.approx(2 * (n - 1) / n, rel=1e-3)
    assert number(values, "fsdp_sent") == pytest.approx(3 * (n - 1) / n, rel=1e-3)


@pytest.mark.gpu
def test_page_runs_on_the_gpu(monkeypatch):
    """Execute the page on CUDA (quick profile): NCCL with 2+ GPUs, kernels in the trace."""
    nb = execute_chapter("ddp-internals", monkeypatch, timeout=900)
    text, values = page_text(nb), glued(nb)
    assert re.search(r"\d+ GPUs?: ", text)  # page_setup's line names the GPUs it found
    assert number(values, "bucket_matches") == number(values, "bucket_settings")
    assert "assert_close passed for both ways" in text
    if torch.cuda.device_count() >= 2:
        assert values["backend"].strip("'") == "nccl"
        assert "backend nccl on cuda" in text
        assert number(values, "comm_ms") > 0  # NCCL kernels were found in the trace
        assert number(values, "fsdp_params_share") == pytest.approx(
            100 / number(values, "world_size"), abs=1)
