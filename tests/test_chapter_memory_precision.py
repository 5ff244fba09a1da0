"""The page chapters/memory-precision, as the book build ran it, and on a GPU.

The counted bytes are facts of the formats (they hold on any machine); the
measured ones must be consistent with each other; the GPU test runs the page on
CUDA, where the allocator statistics and the GPU-only claims exist.
"""
import ast
import re

import pytest
import torch

from tests.helpers import execute_chapter, figures, glued, number
from coursebook.executed import page_text

pytestmark = pytest.mark.integration

PAGE = "chapters/memory-precision"


@pytest.fixture(scope="module")
def page(page_outputs):
    return page_outputs(PAGE)


def test_page_names_its_device_and_draws_figures(page):
    nb, text, _ = page
    assert "Run profile" in text and "device:" in text
    assert figures(nb) >= 2


def test_the_device_peak_is_weighed_only_where_there_is_one(page):
    _, text, values = page
    if "no peak to show" in values["peak_summary"]:  # a CPU run
        assert values["peak_verdict"].strip("'").startswith("this run had no GPU")


def test_model_states_are_counted_per_parameter(page):
    _, text, values = page
    assert "Adam state before the first step: 0 tensors, 0 bytes" in text  # Adam's state is lazy
    assert number(values, "fp32_param_bpp") == pytest.approx(4)
    assert number(values, "fp32_grad_bpp") == pytest.approx(4)
    assert number(values, "fp32_adam_bpp") == pytest.approx(8)
    # one 4-byte step counter per parameter tensor (weight and bias of 3 layers per block)
    assert number(values, "fp32_step_bytes") == 4 * number(values, "n_param_tensors")
    assert number(values, "n_param_tensors") == 6 * number(values, "depth")
    assert 16 <= number(values, "fp32_bytes_per_param") < 16.01


def test_mixed_precision_adam_is_sixteen_bytes_too(page):
    _, _, values = page
    assert number(values, "mixed_param_bpp") == pytest.approx(2)
    assert number(values, "mixed_grad_bpp") == pytest.approx(2)
    assert number(values, "mixed_master_bpp") == pytest.approx(4)
    assert number(values, "mixed_adam_bpp") == pytest.approx(8)
    assert values["states_verdict"].strip("'") == "the same"
    assert number(values, "zero_example_gb") == pytest.approx(24, rel=0.01)  # ZeRO's 1.5B example


def test_activations_are_linear_in_the_tokens(page):
    _, text, values = page
    width = number(values, "width")
    # a block saves 10 numbers per token and dimension, and 2 per token (layer norm statistics)
    assert number(values, "per_token_block_numbers") == pytest.approx(10 + 2 / width)
    assert number(values, "ln_stat_numbers") == pytest.approx(2 / width)
    line = next(l for l in text.splitlines() if l.startswith("activation bytes per token:"))
    per_token = ast.literal_eval(line.split(":", 1)[1].strip())  # a printed list of ints
    assert len(set(per_token)) == 1
    assert number(values, "activation_mib") > 0 and number(values, "crossing_tokens") > 0


def test_autocast_saves_less_and_stays_close(page):
    _, text, values = page
    assert 0.5 <= number(values, "act_ratio") < 1
    assert number(values, "autocast_speedup") > 0
    assert number(values, "output_error") > 0  # bfloat16 did change the numbers
    assert number(values, "output_error") < 0.05 and number(values, "grad_error") < 0.05
    assert number(values, "bf16_eps") == 2.0 ** -7
    line = next(l for l in text.splitlines() if l.startswith("bytes saved under autocast:"))
    assert " in bfloat16" in line and " in float32" in line  # the saved bytes by type


def test_tf32_setting_is_restored_and_measured(page):
    _, text, values = page
    assert "precision left at 'highest'" in text
    assert number(values, "tf32_speedup") > 0
    if not torch.cuda.is_available():  # no TF32 on a CPU: the same arithmetic both times
        assert values["tf32_same_verdict"].strip("'") == "identical"


def test_accumulation_and_checkpointing_keep_the_gradient(page):
    _, text, values = page
    assert "all 4 ways of splitting the batch passed torch.testing.assert_close" in text
    assert "checkpointed and plain gradients agree" in text
    assert number(values, "accum_largest_diff") < 1e-4
    assert number(values, "accum_rel_diff") == pytest.approx(
        number(values, "accum_largest_diff") / number(values, "grad_scale"), rel=1e-6)
    assert number(values, "accum_memory_ratio") == pytest.approx(1 / number(values, "k_max"),
                                                                rel=0.05)
    assert number(values, "ckpt_memory_ratio") < 0.5
    assert number(values, "accum_time_ratio") > 0 and number(values, "ckpt_time_ratio") > 0


@pytest.mark.gpu
def test_page_runs_on_the_gpu(monkeypatch):
    """Execute the page on CUDA (quick profile): allocator peaks, TF32 and bf16 tensor cores."""
    nb = execute_chapter("memory-precision", monkeypatch, timeout=600)
    text, values = page_text(nb), glued(nb)
    assert re.search(r"\d+ GPUs?: ", text)  # page_setup's line names the GPUs it found
    assert "were allocated before the step" in values["peak_summary"]
    # Whether the peak lies above or below the counted activations and gradients is measured, not
    # expected: the sentence names the side the ratio it prints lies on.
    verdict = values["peak_verdict"].strip("'")
    ratio = float(re.search(r"([\d.]+) times", verdict).group(1))
    side = "above" if ratio > 1.02 else "below" if ratio < 0.98 else "within 2%"
    assert side in verdict
    assert "device peak above baseline (MiB)" in text
    assert values["states_verdict"].strip("'") == "the same"
    assert 0.5 <= number(values, "act_ratio") < 1
    assert "precision left at 'highest'" in text
    if torch.cuda.get_device_capability() >= (8, 0):  # Ampere and newer have TF32 and bf16 cores
        assert values["tf32_same_verdict"].strip("'") == "different"
        assert number(values, "tf32_error_high") > number(values, "tf32_error_highest")
