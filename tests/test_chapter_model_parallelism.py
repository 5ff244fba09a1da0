"""The page chapters/model-parallelism (Beyond Data Parallelism), as the book build executed it.

The collectives counted must be those the formulas assume (and under a ring would send exactly
what the formulas give), every split must compute what the unsplit model does, and the measured
pipeline numbers must agree with each other. The GPU test runs the
page itself on CUDA, where its processes talk over NCCL (four GPUs for the mesh, two for the
pipeline).
"""
import re

import pytest
import torch

from tests.helpers import execute_chapter, figures, glued, number
from coursebook.executed import page_text

pytestmark = pytest.mark.integration

PAGE = "chapters/model-parallelism"


@pytest.fixture(scope="module")
def page(page_outputs):
    return page_outputs(PAGE)


def _gpus():
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def test_page_runs_its_processes_and_draws_the_schedules(page):
    nb, text, values = page
    assert "Run profile" in text
    assert figures(nb) >= 2  # the simulated schedules and the measured ones
    assert values["backend"].strip("'") == ("nccl" if _gpus() >= 4 else "gloo")
    assert values["pipe_backend"].strip("'") == ("nccl" if _gpus() >= 2 else "gloo")
    assert number(values, "world_size") == 4


def test_activation_arithmetic_follows_korthikanti(page):
    _, text, values = page
    assert number(values, "act_model_gb") == pytest.approx(96 * number(values, "act_layer_gb"))
    assert (number(values, "act_sp8_gb") < number(values, "act_tp8_gb")
            < number(values, "act_model_gb"))
    assert "2.8 TB" in text
    # without the attention matrices one sequence still needs more than a GPU's 80 GB
    assert 80 < number(values, "act_flash_gb") < number(values, "act_model_gb")
    assert (number(values, "act_sp8_flash_gb") < number(values, "act_tp8_flash_gb")
            < number(values, "act_flash_gb"))


def test_tensor_parallel_traffic_is_the_formula(page):
    _, _, values = page
    n = number(values, "world_size")
    activations = number(values, "tokens") * number(values, "width")
    assert number(values, "tp_formula") == pytest.approx(2 * (n - 1) / n * activations)
    assert number(values, "tp_ring_sent") == pytest.approx(number(values, "tp_formula"))
    assert number(values, "tp_count_gap") == 0 and number(values, "tp_rank_mismatches") == 0
    assert values["tp_one_allreduce"] == "True"
    assert number(values, "tp_max_diff") < 1e-5
    assert number(values, "tp_weight_share") == pytest.approx(100 / n)


def test_sequence_parallelism_moves_as_much_and_keeps_less(page):
    _, text, values = page
    assert number(values, "sp_sent") == number(values, "tp_formula")
    assert number(values, "sp_gap") == 0
    assert number(values, "sp_max_diff") < 1e-5
    assert 0 < number(values, "sp_saved_share") < 100
    assert 0 < number(values, "tp_saved_share") < 100
    activations = number(values, "tokens") * number(values, "width")
    assert values["sp_collectives"].strip("'") == (
        f"1 all-gather of {activations:,.0f} elements, "
        f"1 reduce-scatter of {activations:,.0f} elements")
    assert f"1 allreduce of {activations:,.0f} elements" in text


def test_ring_attention_is_attention_and_sends_the_formula(page):
    _, _, values = page
    n = number(values, "world_size")
    assert number(values, "ring_formula") == pytest.approx(
        2 * (n - 1) / n * number(values, "seq") * number(values, "head_dim"))
    assert number(values, "ring_gap") == 0 and number(values, "ring_steps") == n - 1
    assert number(values, "ring_max_diff") < 1e-5


def test_pipeline_numbers_agree_with_each_other(page):
    _, _, values = page
    p, m = number(values, "stages"), number(values, "micro")
    assert number(values, "bubble_gap") < 1e-9
    assert number(values, "pipe_formula") == pytest.approx(100 * (p - 1) / (m + p - 1))
    assert number(values, "pipe_grad_diff") < 1e-5
    assert number(values, "gpipe_flight") == m and number(values, "ofob_flight") == p
    idle = {key: number(values, f"{key}_idle") for key in ("gpipe", "ofob")}
    sim = {key: number(values, f"{key}_sim") for key in ("gpipe", "ofob")}
    for key in idle:
        assert 0 < idle[key] < 100 and 0 < sim[key] < 100
        # stage times were measured, so the simulator's bubble is at least the formula's
        assert sim[key] >= number(values, "pipe_formula") - 1e-6
    # the signed gap of the schedule farthest from its prediction
    assert number(values, "pipe_sim_gap") == pytest.approx(
        max((idle[k] - sim[k] for k in idle), key=abs), rel=1e-6)
    assert number(values, "same_time_ratio") == pytest.approx(
        number(values, "gpipe_same_ms") / number(values, "ofob_same_ms"), rel=1e-6)
    assert number(values, "pipe_formula_gap") == pytest.approx(
        max(idle.values()) - number(values, "pipe_formula"), rel=1e-6)
    assert number(values, "pipe_time_ratio") == pytest.approx(
        number(values, "gpipe_ms") / number(values, "ofob_ms"), rel=1e-6)
    assert number(values, "peak_ratio") == pytest.approx(
        number(values, "gpipe_peak") / number(values, "ofob_peak"), rel=1e-6)


def test_the_mesh_splits_two_ways_and_matches_pytorch(page):
    _, text, values = page
    assert number(values, "mesh_diff") < 1e-5
    assert number(values, "mesh_dp_elements") == number(values, "mesh_grad_elements")
    assert number(values, "mesh_tp_sent") == number(values, "mesh_tp_formula")
    # two allreduces (forward, backward) of the activations, each in a group of two
    assert number(values, "mesh_tp_elements") == 2 * number(values, "tokens") * number(
        values, "width")
    assert number(values, "torch_tp_mismatches") == 0 and number(values, "torch_tp_diff") < 1e-5
    assert number(values, "hsdp_share") == 50
    assert re.search(r"0\s+\(0, 0\)\s+\[0, 1\]\s+\[0, 2\]", text)  # rank 0's row of the mesh
    # rank 0: tensor parallelism and HSDP's sharding in its row, the rest in its column
    assert values["mesh_tp_group"].strip("'") == "[0, 1]"
    assert values["mesh_dp_group"].strip("'") == "[0, 2]"
    assert values["hsdp_gather_group"].strip("'") == "[0, 1]"
    assert values["hsdp_allreduce_group"].strip("'") == "[0, 2]"
    assert number(values, "hsdp_gather_elements") == 2 * number(values, "hsdp_allreduce_elements")
    assert number(values, "flight_ratio") == (number(values, "gpipe_flight")
                                              / number(values, "ofob_flight"))


@pytest.mark.gpu
def test_page_runs_on_gpus(monkeypatch):
    """Execute the page with CUDA (quick profile): NCCL where there are enough GPUs."""
    nb = execute_chapter("model-parallelism", monkeypatch, timeout=900)
    text, values = page_text(nb), glued(nb)
    gpus = torch.cuda.device_count()
    assert values["backend"].strip("'") == ("nccl" if gpus >= 4 else "gloo")
    assert values["pipe_backend"].strip("'") == ("nccl" if gpus >= 2 else "gloo")
    assert number(values, "tp_count_gap") == 0 and number(values, "ring_gap") == 0
    assert number(values, "tp_max_diff") < 1e-3 and number(values, "pipe_grad_diff") < 1e-3
    assert number(values, "torch_tp_mismatches") == 0
    assert f"{number(values, 'stages'):.0f} stages over" in text
    assert "GPU(s)" not in text  # one GPU is one GPU: the mesh line says 'one GPU is too few'
    if gpus == 1:
        assert "this machine's one GPU is too few for the 2 x 2 mesh" in text
