"""The page chapters/parallel-layout and its planner, dlperf.planner.

The planner against what it claims to reproduce: the Megatron-LM paper's parameter counts
and FLOPs formula, the ZeRO paper's memory example, Korthikanti et al.'s activations, and
a model it can count exactly (TinyGPT). Its search: a layout that cannot run is refused
with the reason, and the front it lists is ordered. Its small run on two processes, and the
page as the book built it (its verdicts are in tests/test_book_claims.py).
"""
import math

import pytest

from dlperf import distributed
from dlperf import planner as pl
from dlperf.memory import parameter_count
from dlperf.utilization import TinyGPT
from tests.helpers import number

# Narayanan et al. 2021, table 1: billions, heads, width, layers, t, p, GPUs, batch, TFLOP/s
MEGATRON = [(1.7, 24, 2304, 24, 1, 1, 32, 512, 137), (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
            (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148),
            (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163)]


def selene(gpus, **changes):
    described = dict(gpus_per_node=8, memory=80e9, peak_flops=312e12, intra_node=300e9,
                     inter_node=25e9)
    return pl.Cluster("Selene", gpus=gpus, **{**described, **changes})


@pytest.mark.parametrize("row", MEGATRON, ids=[f"{row[0]}B" for row in MEGATRON])
def test_the_published_runs_count_and_stay_below_the_bound(row):
    billions, heads, width, layers, tp, pp, gpus, batch, achieved = row
    model = pl.Transformer("gpt", layers, width, heads, seq=2048, vocab=51200)
    assert model.parameters / 1e9 == pytest.approx(billions, abs=0.05)
    s, h, V = 2048, width, 51200  # eq. 3, per token: with recomputation, and without
    assert model.flops_per_token(recompute=True) == pytest.approx(
        96 * layers * h * h * (1 + s / (6 * h) + V / (16 * layers * h)))
    assert model.flops_per_token() == pytest.approx(
        72 * layers * h * h * (1 + s / (6 * h) + V / (12 * layers * h)))
    layout = pl.Layout(dp=gpus // (tp * pp), tp=tp, pp=pp, recompute=True)
    result = pl.estimate(model, layout, selene(gpus), batch)
    assert result.fits
    bound = model.flops_per_token(True) * batch * s / result.time["total"] / gpus / 1e12
    assert achieved < bound < 312


def test_zero_stages_give_the_papers_example():
    gb = [pl.state_bytes(7.5e9, 64, stage, pl.MIXED_ADAM) / 1e9 for stage in range(4)]
    assert gb == pytest.approx([120, 31.4, 16.6, 1.9], abs=0.05)


def test_activations_are_korthikantis_with_sequence_parallelism():
    model = pl.Transformer("gpt-3", 96, 12288, 96, seq=2048, vocab=51200)
    sbh = 2048 * 12288
    per_layer = pl.activation_bytes(model, pl.Layout(tp=8))
    assert per_layer == 34 * sbh / 8  # fused attention: no 5as/h term
    assert pl.activation_bytes(model, pl.Layout(tp=8, recompute=True)) == 2 * sbh / 8
    moe = pl.Transformer("moe", 2, 64, 4, seq=16, vocab=10, experts=4, top_k=2)
    assert pl.activation_bytes(moe, pl.Layout()) == (15 + 2 * 19) * 16 * 64


def test_a_model_it_can_build_is_counted_exactly():
    shape = pl.Transformer("tiny", layers=2, width=32, heads=4, seq=16, vocab=50,
                           tied_embeddings=False)
    built = TinyGPT(shape.vocab, shape.width, shape.layers, shape.heads, shape.seq)
    assert parameter_count(built) == shape.parameters + 2 * shape.width  # + the final norm


def test_experts_spread_over_expert_parallel_ranks():
    moe = pl.Transformer("moe", 4, 256, 8, seq=128, vocab=100, experts=8, top_k=2)
    assert moe.active_parameters < moe.parameters
    assert moe.parameters - moe.active_parameters == pytest.approx(4 * 8 * 256**2 * 6)
    cluster = pl.Cluster("c", 8, 8, 80e9, 1e12, 1e11, 1e10)
    spread = pl.memory_per_gpu(moe, pl.Layout(dp=8, ep=8), batch=8)
    kept = pl.memory_per_gpu(moe, pl.Layout(dp=8), batch=8)
    assert spread["states"] < kept["states"]
    assert pl.step_time(moe, pl.Layout(dp=8, ep=8), cluster, 8)["experts"] > 0
    assert pl.step_time(moe, pl.Layout(dp=8), cluster, 8)["experts"] == 0


def test_a_layout_that_cannot_run_says_why():
    model = pl.Transformer("gpt", 24, 2304, 24, seq=2048, vocab=51200)
    with pytest.raises(ValueError, match="24 layers cannot fill pp = 32"):
        pl.estimate(model, pl.Layout(pp=32), selene(32), 512)
    with pytest.raises(ValueError, match="cannot make 4 virtual stages"):
        pl.estimate(model, pl.Layout(dp=4, pp=8, virtual_stages=4), selene(32), 512)
    with pytest.raises(ValueError, match="the cluster has 32"):
        pl.estimate(model, pl.Layout(dp=16), selene(32), 512)
    with pytest.raises(ValueError, match="micro-batches of 3"):
        pl.estimate(model, pl.Layout(dp=32, micro_batch=3), selene(32), 512)


def test_the_plan_is_a_front_fastest_first():
    model = pl.Transformer("gpt", 40, 6144, 48, seq=2048, vocab=51200)
    every = pl.plan(model, selene(256), 1024, top=None, pareto=False)
    front = pl.plan(model, selene(256), 1024, top=None)
    assert 0 < len(front) < len(every)
    assert front["step s"].is_monotonic_increasing
    assert front["GB per GPU"].is_monotonic_decreasing
    assert (every["GB per GPU"] <= 80 * 0.9).all() and (every.tp <= 8).all()
    assert front.iloc[0]["step s"] == every.iloc[0]["step s"]
    # a slower network never makes the best step shorter
    slow = pl.plan(model, selene(256, inter_node=5e9), 1024, top=1)
    assert slow.iloc[0]["step s"] >= front.iloc[0]["step s"]
    # a model that fits nowhere gives an empty plan, not an error
    tiny = pl.Cluster("small GPUs", 8, 8, 1e9, 1e12, 1e11, 1e10)
    assert pl.plan(model, tiny, 64).empty


def test_the_small_run_measures_what_the_page_compares():
    config = {"model": {"vocab": 64, "width": 32, "layers": 1, "heads": 2, "seq": 16},
              "batch": 2, "repeat": 2, "numels": [2**10, 2**14], "bucket_mib": 1.0}
    runs = distributed.run_workers(pl.small_run_job, 2, args=(config,))
    assert [r["rank"] for r in runs] == [0, 1]
    parameters = runs[0]["parameters"]
    assert all(r["adam_bytes"] == 8 * parameters for r in runs)  # momentum and variance
    assert sum(r["zero_bytes"] for r in runs) == 8 * parameters  # ZeRO-1 splits them
    assert all(0 < r["zero_bytes"] < 8 * parameters for r in runs)
    assert all(r["alone_s"] > 0 and r["ddp_s"] > 0 for r in runs)
    assert [a["bytes"] for a in runs[0]["allreduce"]] == [4 * 2**10, 4 * 2**14]


@pytest.mark.integration
def test_the_page_reproduces_the_published_counts(page_outputs):
    nb, text, values = page_outputs("chapters/parallel-layout")
    assert number(values, "zero_gap_gb") < 0.05
    assert number(values, "megatron_count_gap") < 0.06
    assert number(values, "megatron_memory_max") < 80
    assert number(values, "plan_146b_fits") > 0
    assert not math.isnan(number(values, "plan_65b_best_mfu"))
    assert "layouts fit" in text and "M parameters as the planner counts them" in text


def test_grouped_query_and_gated_models_count_their_own_matrices():
    llama = pl.Transformer("Llama 3 405B", 126, 16384, 128, seq=8192, vocab=128000,
                           tied_embeddings=False, kv_heads=8, ffn=53248, gated=True,
                           learned_positions=False)
    h = 16384
    block = 2 * h * h + 2 * h * h / 16 + 3 * h * 53248 + 13 * h
    assert llama.parameters == 126 * block + 2 * 128000 * h
    assert 405e9 < llama.parameters < 407e9  # "405B" in the paper
    # fewer key and value heads: their 4 of attention's 11 sbh shrink 16-fold; the
    # gated MLP's hidden 16 sbh grow with its size and by 3/2
    sbh = 8192 * h
    expected = 4 + 7 + 4 / 16 + 3 + 16 * 53248 / (4 * h) * 1.5
    assert pl.activation_bytes(llama, pl.Layout()) == pytest.approx(expected * sbh)
    # interleaving divides the bubble by the virtual stages, and sends across v times
    # as many stage boundaries
    cluster = pl.Cluster("H100s", 8192, 8, 80e9, 989e12, 450e9, 50e9)
    plain = pl.step_time(llama, pl.Layout(dp=64, tp=8, pp=16), cluster, 2048)
    chunked = pl.step_time(llama, pl.Layout(dp=64, tp=8, pp=16, virtual_stages=8),
                           cluster, 2048)
    assert chunked["pipeline p2p"] == pytest.approx(8 * plain["pipeline p2p"])
    hops = chunked["pipeline p2p"] - plain["pipeline p2p"]
    stage_growth = 1 + hops / (plain["total"] - plain["bubble"] - plain["data"])
    assert chunked["bubble"] == pytest.approx(plain["bubble"] / 8 * stage_growth)
