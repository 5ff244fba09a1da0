"""The page chapters/utilization-memory (Model FLOPs Utilisation and Memory in Practice), as the
book build executed it, and on a GPU.

The FLOP counts and the FP8 ranges are facts (they hold on any machine); the measured times,
rates and ratios must be consistent with each other and with the counts; the GPU test runs
the page on CUDA, where the allocator section measures something.
"""
import math
import re

import pytest
import torch

from tests.helpers import execute_chapter, figures, glued, number
from coursebook.executed import page_text

pytestmark = pytest.mark.integration

PAGE = "chapters/utilization-memory"


@pytest.fixture(scope="module")
def page(page_outputs):
    return page_outputs(PAGE)


def test_page_names_its_device_and_draws_its_figures(page):
    nb, text, _ = page
    assert "Run profile" in text and "device:" in text
    assert figures(nb) >= 2  # the attention share over lengths, the overlap condition


def test_counted_flops_follow_the_rule_exactly(page):
    _, text, values = page
    depth, width, length = (number(values, k) for k in ("depth", "width", "length"))
    n_matmul, vocab = number(values, "n_matmul"), number(values, "vocab")
    assert n_matmul == depth * 12 * width**2 + width * vocab
    assert number(values, "dense_flops_per_token") == 6 * n_matmul
    assert number(values, "attention_flops_per_token") == 12 * depth * length * width
    assert number(values, "flops_per_token") == number(values, "rule_flops_per_token")
    assert number(values, "forward_flops_per_token") * 3 == number(values, "flops_per_token")
    assert number(values, "attention_share_pct") == pytest.approx(
        100 * number(values, "attention_flops_per_token") / number(values, "flops_per_token"))
    assert number(values, "step_gflop") * 1e9 == pytest.approx(
        number(values, "flops_per_token") * number(values, "step_tokens"))
    assert number(values, "n_params") > n_matmul  # embeddings, biases and norms besides
    assert number(values, "count_rule_gap") == 0
    assert values["count_rule_verdict"].strip("'").startswith("the count and the rule agree exactly")


def test_the_meta_device_counts_a_gpt2_shape(page):
    _, text, values = page
    assert number(values, "meta_max_rule_gap") == 0
    assert values["meta_rule_verdict"].strip("'") == "agreed exactly"
    # GPT-2 small's layer shape with an untied head: 12 blocks of 12 d^2, and the head d V
    blocks, head = 12 * 12 * 768**2, 768 * 50257
    assert (f"{blocks + head:,} weights in matrix products, {head:,} (31%) of them in the "
            f"head;\n{blocks:,} without it") in text
    assert number(values, "gpt2_head_millions") == pytest.approx(head / 1e6)
    assert number(values, "gpt2_head_pct") == pytest.approx(100 * head / (blocks + head))
    assert "(0.0, " not in text  # the axis limits are not printed
    # the share grows with the length: s / (6d) per unit of 6N, for the blocks alone
    assert 0 < number(values, "meta_share_short") < number(values, "meta_share_long") < 100


def test_mfu_is_computed_from_the_pages_own_numbers(page):
    _, text, values = page
    tokens_per_s = number(values, "tokens_per_s")
    assert tokens_per_s == pytest.approx(number(values, "step_tokens")
                                         / (number(values, "step_ms") / 1e3))
    assert number(values, "step_gflops") == pytest.approx(
        tokens_per_s * number(values, "flops_per_token") / 1e9)
    assert number(values, "matmul_share") == pytest.approx(
        100 * number(values, "step_gflops") / number(values, "matmul_gflops"))
    sentence = values["mfu_sentence"]
    mfu = number(values, "page_mfu_pct")
    if "no peak is known" in sentence:
        assert math.isnan(mfu)
    else:
        assert f"{mfu:.1f}%" in sentence and mfu > 0
    assert 0 < number(values, "backward_ms") < number(values, "step_ms")


def test_checkpointing_recomputes_as_counted_and_saves_memory(page):
    _, text, values = page
    assert "checkpointed and plain gradients agree" in text
    assert number(values, "hfu_flops_ratio") == pytest.approx(number(values, "hfu_expected_ratio"),
                                                              rel=1e-9)
    assert 1 < number(values, "hfu_flops_ratio") < 4 / 3  # less than a whole forward pass more
    assert number(values, "ckpt_saved_ratio") < 0.5
    assert number(values, "ckpt_peak_ratio") < 1
    assert number(values, "ckpt_time_ratio") > 0
    # one series of rounds times both passes; the band is at least 10%, wider if the runs vary
    assert number(values, "ckpt_band_pct") == pytest.approx(max(10.0, number(values, "ckpt_spread_pct")))


def test_the_overlap_condition_uses_the_measured_numbers(page):
    _, text, values = page
    world = number(values, "ar_world")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert values["ar_backend"].strip("'") == ("nccl" if gpus >= 2 else "gloo")
    alpha, beta = number(values, "alpha_us") * 1e-6, number(values, "beta_gbs") * 1e9
    grad_bytes = number(values, "grad_mib") * 2**20
    assert grad_bytes == 4 * number(values, "n_params")
    model_s = 2 * (world - 1) * alpha + 2 * (world - 1) / world * grad_bytes / beta
    assert number(values, "allreduce_ms") == pytest.approx(model_s * 1e3, rel=1e-6)
    assert number(values, "measured_allreduce_ms") > 0
    # at the break-even tokens the backward pass lasts exactly as long as the allreduce
    backward_per_token_s = number(values, "backward_ms_again") / number(values, "step_tokens")
    assert number(values, "break_even_tokens") * backward_per_token_s == pytest.approx(
        number(values, "allreduce_ms"), rel=1e-6)
    assert number(values, "backward_ms_again") == number(values, "backward_ms")


def test_the_gpu_cluster_table_follows_the_formula(page):
    _, _, values = page
    rate = 0.40 * number(values, "h100_bf16_tflops") * 1e12
    assert number(values, "nvlink_tokens") == pytest.approx(7 / 8 * 2 * rate / (2 * 450e9))
    assert number(values, "ib_tokens") == pytest.approx(63 / 64 * 2 * rate / (2 * 50e9))


def test_the_allocator_section_measures_only_on_a_gpu(page):
    _, text, values = page
    if torch.cuda.is_available():
        assert "reserved / allocated" in text
        assert number(values, "default_ratio") >= 1 and number(values, "expandable_ratio") >= 1
        assert number(values, "last_new_segments") >= 0
        assert "segments obtained from CUDA in steps 1, 2 and 3" in text
    else:
        assert "no GPU on this run" in text
        assert values["allocator_sentence"].strip("'") == "the page ran on a CPU"
        assert math.isnan(number(values, "default_ratio"))
        assert number(values, "last_new_segments") == -1


def test_fp8_ranges_rounding_and_scaling(page):
    _, text, values = page
    assert values["finfo_agrees"] == "True"
    assert number(values, "e4m3_of_third") == 0.34375  # 1/3 to 3 mantissa bits: 11/32
    assert number(values, "e4m3_of_tiny") == 0
    assert number(values, "fp8_zero_scaled") < number(values, "fp8_zero_unscaled")
    assert 0 < number(values, "fp8_error_scaled") <= 2**-4
    # in the normal range, rounding to 3 mantissa bits costs at most half a gap: 2^-4
    assert 0 < number(values, "fp8_max_error_normal") <= 2**-4
    assert 0 < number(values, "fp8_normal_scaled") <= 100
    if number(values, "fp8_zero_unscaled") > 50:
        assert number(values, "fp8_median_unscaled") == 1
    inf_cast = number(values, "e4m3_of_inf")  # saturated or NaN, by PyTorch version
    assert inf_cast == 448 or math.isnan(inf_cast)


@pytest.mark.gpu
def test_page_runs_on_the_gpu(monkeypatch):
    """Execute the page on CUDA (quick profile): bfloat16 MFU against the datasheet, the
    allocator's snapshot and the expandable_segments comparison."""
    nb = execute_chapter("utilization-memory", monkeypatch, timeout=600)
    text, values = page_text(nb), glued(nb)
    assert re.search(r"\d+ GPUs?: ", text)
    assert "peak for bfloat16" in text
    assert "segments" in values["allocator_sentence"]
    assert "reserved / allocated" in text
    assert "TFLOP/s" in values["step_rate_text"] and "GFLOP/s" not in values["mfu_sentence"]
    assert number(values, "hfu_flops_ratio") == pytest.approx(number(values, "hfu_expected_ratio"),
                                                              rel=1e-9)
    if "datasheet" in values["mfu_sentence"]:
        assert 0 < number(values, "page_mfu_pct") < 100
