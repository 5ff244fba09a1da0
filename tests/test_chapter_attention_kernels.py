"""The page chapters/attention-kernels, as the book build ran it, and on a GPU.

The counts (bytes of a score matrix, graphs and breaks of a traced function) hold on any
machine; the measured memory must grow as the page says it does, and its numbers must agree
with each other; the GPU test runs the page on CUDA, where the fused kernels and CUDA graphs
exist.
"""
import re

import pytest
import torch

from tests.helpers import execute_chapter, figures, glued, number
from coursebook.executed import page_text

pytestmark = pytest.mark.integration

PAGE = "chapters/attention-kernels"


@pytest.fixture(scope="module")
def page(page_outputs):
    return page_outputs(PAGE)


def table_rows(text, header):
    """The rows of the first table printed after ``header``: (first cell, numbers) pairs."""
    rows = []
    for line in text[text.index(header):].splitlines()[1:]:
        cells = line.split()
        if cells and all(re.fullmatch(r"[\d.e+-]+", c) for c in cells):
            rows.append((cells[0], [float(c) for c in cells[1:]]))
        elif rows:  # the first line after the table
            break
    return rows


def test_page_names_its_device_and_draws_figures(page):
    nb, text, _ = page
    assert "Run profile" in text and "device:" in text
    assert figures(nb) >= 2  # the memory sweep and the time per operation


def test_every_version_of_attention_gives_the_same_output(page):
    _, text, values = page
    assert "naive and SDPA outputs agree" in text
    assert "the blockwise output agrees with the naive one" in text
    # float32 rounding (the book builds on a CPU), not a different function
    assert number(values, "fp32_eps") == pytest.approx(2.0 ** -23)
    assert 0 <= number(values, "sdpa_diff") < 1e-5
    assert 0 <= number(values, "blockwise_diff") < 1e-5
    # bfloat16 inputs, float32 running sums: the result's own rounding, about 2**-9 of it
    assert "bfloat16 inputs: the blockwise output is within" in text
    assert 0 <= number(values, "blockwise16_diff") < 2 ** -7


def test_the_score_matrix_is_counted_and_dominates_the_naive_peak(page):
    _, _, values = page
    heads, seq = number(values, "heads"), number(values, "seq_last")
    element = 2 if values["on_gpu"] == "True" else 4  # bfloat16 on a GPU, float32 on a CPU
    assert number(values, "score_mib_last") == pytest.approx(heads * seq * seq * element / 2**20)
    assert number(values, "block_scores_kib") == pytest.approx(heads * number(values, "block") ** 2
                                                              * 4 / 2**10)
    # the scores and the softmax's output, of the same size, are alive together; little else
    assert 1.9 <= number(values, "naive_over_scores") <= 2.5
    assert number(values, "naive_over_sdpa") > 10


def test_training_keeps_one_score_matrix_or_one_row_each(page):
    _, text, values = page
    assert "saved for the backward pass" in text
    assert number(values, "naive_saved_over_scores") == pytest.approx(1)  # the probabilities
    if values["on_gpu"] != "True":  # the CPU flash kernel: the output row and its logsumexp
        assert number(values, "row_output_bytes") == 4 * number(values, "head_dim")
        assert number(values, "row_extra_bytes") == pytest.approx(4)
    assert number(values, "sdpa_saved_row_bytes") == pytest.approx(
        number(values, "row_output_bytes") + number(values, "row_extra_bytes"))
    assert number(values, "saved_ratio") > 10


def test_memory_grows_as_the_page_says(page):
    _, text, values = page
    assert number(values, "naive_exponent") > 1.75  # the square, with a small linear part
    assert number(values, "sdpa_exponent") < 1.25
    assert number(values, "blockwise_exponent") < 1.25
    printed = re.search(r"growth exponents \(slope on log-log axes\): naive ([\d.]+), "
                        r"SDPA ([\d.]+), blockwise ([\d.]+)", text)
    for found, name in zip(printed.groups(), ("naive", "sdpa", "blockwise")):
        assert float(found) == pytest.approx(number(values, f"{name}_exponent"), abs=0.006)
    assert values["naive_growth_verdict"].strip("'") == ("grew about as the square of the "
                                                         "sequence length")


def test_the_backends_table_names_every_backend(page):
    _, text, values = page
    for name in ("MATH", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION"):
        assert re.search(rf"^  {name}: (ran|refused)", text, re.M), name
    ran = values["backends_ran"].strip("'").split(" and ")
    assert "MATH" in ran
    assert len(ran) == number(values, "backends_ran_count")
    assert len(re.findall(r"^  \w+: ran;", text, re.M)) == len(ran)
    assert number(values, "flash_speedup") > 0
    on_gpu = values["on_gpu"] == "True"
    assert ("SDPA's order of preference on this GPU:" in text) == on_gpu
    # a CPU run states no GPU result as one; the refusals name a reason, not a C++ line
    assert values["flash_outlook"].strip("'\"").startswith("This run had no GPU") != on_gpu
    assert "Triggered internally" not in text
    if values["on_gpu"] != "True":  # PyTorch's CPU flash kernel; the others are CUDA kernels
        assert ran == ["MATH", "FLASH_ATTENTION"]


def test_the_fixed_cost_per_operation_is_measured(page):
    _, text, values = page
    assert number(values, "overhead_us") > 0
    assert number(values, "small_ratio") == pytest.approx(
        number(values, "mid_us") / number(values, "overhead_us"), rel=1e-6)
    assert number(values, "large_ratio") == pytest.approx(
        number(values, "large_us") / number(values, "overhead_us"), rel=1e-6)
    # a tensor 262,144 times as large cannot cost less than the one-element floor
    assert number(values, "large_ratio") > 1
    rows = table_rows(text, "a chain of 100 elementwise operations")
    assert [int(size) for size, _ in rows][:5] == [1, 64, 1024, 16384, 262144]
    assert rows[0][1][0] == pytest.approx(number(values, "overhead_us"), abs=1e-4)
    for size, (per_op_us, per_element_ns) in rows:  # the two columns say the same thing
        assert per_element_ns == pytest.approx(per_op_us * 1e3 / int(size), rel=1e-3, abs=1e-4)
    # what an H100 could compute in the time of this run's floor, from the datasheet's peak
    assert number(values, "h100_gflop_in_floor") == pytest.approx(
        number(values, "h100_bf16_tflops") * 1e3 * number(values, "overhead_us") * 1e-6)
    # ... and the text's, for the GPU the run used where the datasheet table knows it
    assert number(values, "floor_gpu_gflop") == pytest.approx(
        number(values, "floor_gpu_bf16_tflops") * 1e3 * number(values, "overhead_us") * 1e-6)
    # the dashed proportional line, and the sentence about it, only where the largest
    # size rose above the floor (on an H200 all of 1 to 4M elements took 11.4-11.8 µs)
    drawn = number(values, "large_ratio") > 2
    assert ("no size rose clearly above the fixed cost" in text) != drawn
    assert ("dashed line" in values["proportional_sentence"]) == drawn


def test_graph_breaks_are_counted_and_fullgraph_refuses_them(page):
    nb, text, values = page
    assert number(values, "print_graphs") == 2 and number(values, "print_breaks") == 1
    assert number(values, "item_graphs") == 2
    assert number(values, "clean_graphs") == 1
    assert "print" in values["print_reason"] or "builtin" in values["print_reason"]
    assert "print" in values["print_explanation"] or values["print_explanation"] == "'none given'"
    assert "calls in graphs" in text
    assert "item" in values["item_reason"]
    assert values["fullgraph_outcome"].strip("'") == "raised Unsupported"
    assert "the clean step compiled whole with fullgraph=True" in text
    assert number(values, "reordered_graphs") == 1  # print moved after the graph
    assert "print as a reorderable logging function: graphs 1, graph breaks 0" in text
    # explain runs the function (one print each time); fullgraph=True stops before running it
    assert text.count("mean activation") == 2


def test_recompilations_are_caught_with_their_guards(page):
    _, text, values = page
    assert number(values, "calls_count") == 4 and number(values, "input_changes") == 3
    default, dynamic = number(values, "recompiles_default"), number(values, "recompiles_dynamic")
    # the dtype change always recompiles, and dynamic=True never recompiles more than the default
    assert 1 <= dynamic <= default <= 3
    assert "dtype mismatch" in values["default_guards"]
    assert "dtype mismatch" in values["dynamic_guards"]
    assert "size mismatch" not in values["dynamic_guards"]  # sizes were symbols from the start
    assert f"default: 4 calls; recompilations: {default:.0f}" in text
    assert number(values, "recompile_limit") >= 1
    # a changing float becomes a symbol at its first recompilation, as sizes do
    assert number(values, "float_calls") == 5
    assert number(values, "float_recompiles") == 1
    assert "a float argument, 5 values: recompilations: 1" in text


def test_cpu_run_says_it_recorded_no_graph(page):
    _, text, values = page
    if values["on_gpu"] == "True":
        pytest.skip("this build ran on a GPU")
    assert "no CUDA device on this run" in text
    assert values["graph_verdict"].strip("'") == ("this run had no GPU, so it recorded and "
                                                  "replayed no graph")


@pytest.mark.gpu
def test_page_runs_on_the_gpu(monkeypatch):
    """Execute the page on CUDA (quick profile): fused bfloat16 kernels and a CUDA graph."""
    nb = execute_chapter("attention-kernels", monkeypatch, timeout=600)
    text, values = page_text(nb), glued(nb)
    assert re.search(r"\d+ GPUs?: ", text)  # page_setup's line names the GPUs it found
    assert values["on_gpu"] == "True"
    assert "the replay gives the eager result" in text
    assert number(values, "graph_speedup") > 0
    ran = values["backends_ran"].strip("'").split(" and ")
    assert "MATH" in ran
    if torch.cuda.get_device_capability() >= (8, 0):  # flash and memory-efficient on Ampere+
        assert "FLASH_ATTENTION" in ran and "EFFICIENT_ATTENTION" in ran
    assert number(values, "naive_exponent") > 1.75
    assert number(values, "sdpa_exponent") < 1.25
