"""The page chapters/mixture-of-experts and its helpers, dlperf.moe.

The helpers: the sparse layer computes what the dense reference computes; the capacity
drops exactly each expert's overflow, later choices first; the Switch loss is alpha for
an even load and grows with imbalance; the expert-parallel layer, in two gloo processes,
gives the single-process layer's outputs and gradients and sends the bytes its routing
predicts; bad configurations fail with a clear error. The page, as the book built it:
the same checks, Mixtral's counts, and the numbers its verdicts rest on (the verdicts
themselves are in tests/test_book_claims.py).
"""
import math

import pytest
import torch

from dlperf import distributed, moe
from tests.helpers import number

PAGE = "chapters/mixture-of-experts"


def _layer(seed=0, **overrides):
    torch.manual_seed(seed)
    settings = dict(width=16, hidden=24, experts=4, top_k=2, capacity_factor=1.0)
    settings.update(overrides)
    return moe.MoELayer(**settings)


@pytest.mark.parametrize("top_k, factor", [(1, 1.0), (2, 1.0), (2, 0.5), (3, 4.0)])
def test_the_sparse_layer_computes_the_dense_reference(top_k, factor):
    layer = _layer(top_k=top_k, capacity_factor=factor)
    x = torch.randn(3, 20, 16)
    sparse = layer(x)
    assert sparse.shape == x.shape
    torch.testing.assert_close(sparse, moe.dense_reference(layer, x))
    # gradients flow to the router through the gates, and to every expert that was used
    sparse.square().sum().backward()
    assert layer.router.weight.grad.abs().sum() > 0
    used = layer.last_routing.experts[layer.last_routing.kept].unique().tolist()
    for index in used:
        assert layer.experts[index].up.weight.grad.abs().sum() > 0


def test_the_output_is_the_gate_weighted_sum_of_the_chosen_experts():
    layer = _layer(capacity_factor=10.0)  # nothing dropped
    x = torch.randn(5, 16)
    with torch.no_grad():
        out = layer(x)
        routing = layer.last_routing
        for t in range(5):
            expected = sum(routing.gates[t, j] * layer.experts[routing.experts[t, j]](x[t])
                           for j in range(2))
            torch.testing.assert_close(out[t], expected)
    assert routing.kept.all()
    torch.testing.assert_close(routing.gates, routing.probs.topk(2, dim=-1).values)


def test_capacity_is_the_formula():
    assert moe.expert_capacity(100, 8, 2, 1.0) == 25
    assert moe.expert_capacity(100, 8, 2, 1.25) == math.ceil(1.25 * 100 * 2 / 8) == 32
    assert moe.expert_capacity(10, 4, 1, 0.5) == 2  # ceil(1.25)
    with pytest.raises(ValueError, match="capacity_factor"):
        moe.expert_capacity(10, 4, 1, 0.0)


def test_capacity_drops_exactly_the_overflow_and_first_choices_go_first():
    # Six tokens that all prefer expert 0, then expert 1: capacity 3 of each.
    logits = torch.tensor([[3.0, 2.0, 0.0, 0.0]] * 6)
    routing = moe.route(logits, top_k=2, capacity=3)
    assert routing.load.tolist() == [6, 6, 0, 0]
    # tokens 0-2 keep both choices; 3-5 lose both: all first choices queue first
    assert routing.kept.tolist() == [[True, True]] * 3 + [[False, False]] * 3
    assert (~routing.kept).sum() == moe.dropped_by_overflow(routing.load, 3) == 6
    assert routing.dropped_fraction == pytest.approx(0.5)
    # A token whose choices are all dropped leaves the layer as zero.
    layer = _layer(width=4, hidden=8, experts=4)
    out = moe.apply_experts(torch.randn(6, 4), routing, layer.experts)
    assert torch.equal(out[3:], torch.zeros(3, 4)) and out[:3].abs().sum() > 0


@pytest.mark.parametrize("seed", range(5))
def test_random_routing_drops_exactly_the_overflow(seed):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(200, 8, generator=generator) + torch.linspace(2, 0, 8)
    capacity = moe.expert_capacity(200, 8, 2, 1.0)
    routing = moe.route(logits, 2, capacity)
    kept_per_expert = torch.bincount(routing.experts[routing.kept], minlength=8)
    assert torch.equal(kept_per_expert, routing.load.clamp(max=capacity))
    assert int((~routing.kept).sum()) == moe.dropped_by_overflow(routing.load, capacity)


def test_the_switch_loss_is_alpha_for_an_even_load_and_more_for_a_skewed_one():
    experts, tokens = 4, 8
    # every expert gets two tokens and every probability is 1/E: f_i = P_i = 1/E
    even = moe.Routing(probs=torch.full((tokens, experts), 1 / experts),
                       experts=torch.arange(tokens).remainder(experts)[:, None],
                       gates=torch.full((tokens, 1), 1 / experts),
                       kept=torch.ones(tokens, 1, dtype=torch.bool), capacity=2)
    assert float(moe.load_balancing_loss(even, alpha=0.01)) == pytest.approx(0.01)
    assert float(moe.load_balancing_loss(even, alpha=1.0)) == pytest.approx(1.0)
    # everything to expert 0, with all the probability there: E * 1 * 1 = E
    skewed = moe.Routing(probs=torch.eye(experts)[[0] * tokens],
                         experts=torch.zeros(tokens, 1, dtype=torch.long),
                         gates=torch.ones(tokens, 1),
                         kept=torch.ones(tokens, 1, dtype=torch.bool), capacity=2)
    assert float(moe.load_balancing_loss(skewed, alpha=0.5)) == pytest.approx(0.5 * experts)
    layer = _layer(aux_alpha=0.1)
    layer(torch.randn(32, 16))
    assert layer.aux_loss.requires_grad and layer.aux_loss.item() >= 0.1 - 1e-6


def test_the_balance_loss_evens_out_a_skewed_router():
    x, y, offset = moe.clustered_task(512, 16, clusters=4)
    runs = {}
    for alpha in (0.0, 0.1):
        layer = _layer(aux_alpha=alpha, capacity_factor=1.25)
        moe.skew_router(layer, offset)
        runs[alpha] = moe.train_with_balance(layer, x, y, steps=60)[-1]
    assert runs[0.1]["busiest over mean"] < runs[0.0]["busiest over mean"]
    assert runs[0.1]["dropped"] < runs[0.0]["dropped"]


def test_mixtral_counts_come_out_at_the_published_sizes():
    counts = moe.moe_transformer_parameters(width=4096, layers=32, hidden=14336,
                                            experts=8, top_k=2, heads=32, kv_heads=8,
                                            head_dim=128, vocab=32000)
    assert counts["total"] == pytest.approx(46.7e9, rel=0.005)
    assert counts["active"] == pytest.approx(12.9e9, rel=0.005)
    # the FLOPs of one MoE layer: two experts' worth and the router
    assert moe.mlp_flops_per_token(4096, 14336, 8, 2, gated=True) == (
        2 * 2 * 3 * 4096 * 14336 + 2 * 4096 * 8)
    assert moe.mlp_flops_per_token(64, 256) == 2 * 2 * 64 * 256


def test_a_layer_counts_its_parameters_like_the_formula():
    layer = _layer(experts=4, hidden=24, width=16)
    per_expert = 16 * 24 + 24 + 24 * 16 + 16  # two linear layers with biases
    assert sum(p.numel() for p in layer.parameters()) == 4 * per_expert + 16 * 4


def test_bad_settings_fail_clearly():
    with pytest.raises(ValueError, match="top_k"):
        moe.MoELayer(8, 8, experts=4, top_k=5)
    # raised in the workers, and reported by the launcher with the worker's traceback
    with pytest.raises(Exception, match="cannot be shared evenly") as raised:
        distributed.run_workers(_uneven_job, 2, timeout=60)
    assert "ValueError: 3 experts cannot be shared evenly over 2 processes" in str(
        raised.value)


def _uneven_job(rank, world_size):
    moe.ExpertParallelMoE(moe.MoELayer(8, 8, experts=3, top_k=1))


def test_expert_parallel_layer_is_the_single_process_layer():
    config = dict(width=16, hidden=24, experts=4, top_k=2, capacity_factor=1.0,
                  tokens=40, seed=3)
    results = distributed.run_workers(moe.expert_parallel_check, 2, args=(config,),
                                      timeout=120)
    for check in results:
        assert check["output_diff"] < 1e-5 and check["grad_diff"] < 1e-5
        sent = [entry["bytes sent"] for entry in check["log"]]
        assert [entry["phase"] for entry in check["log"]] == ["forward"] * 2 + ["backward"] * 2
        # own tokens out to the other rank's experts: the dispatch, and the combine's gradient
        own = check["rows"]["sent"] * check["row_bytes"]
        assert sent[0] == sent[2] == own
        assert check["row_bytes"] == 16 * 4
    # what one rank sends back is what the other sent it
    first, second = ([e["bytes sent"] for e in r["log"]] for r in results)
    assert first[1] == second[0] and second[1] == first[0]


def test_alpha_beta_fit_recovers_its_parameters():
    sizes = [2**p for p in range(10, 24, 2)]
    seconds = [moe.all_to_all_seconds(m, 4, 50e-6, 2e9) for m in sizes]
    latency, bandwidth = moe.fit_alpha_beta([3 * m / 4 for m in sizes], seconds)
    assert latency == pytest.approx(50e-6) and bandwidth == pytest.approx(2e9)


@pytest.mark.integration
def test_the_page_checks_its_layers_and_counts_mixtral(page_outputs):
    nb, text, values = page_outputs(PAGE)
    assert "Run profile" in text
    assert number(values, "match_diff") < 1e-5
    assert number(values, "ep_out_diff") < 1e-5 and number(values, "ep_grad_diff") < 1e-5
    assert number(values, "ep_bytes_gap") == 0
    assert number(values, "ep_world") == 4
    assert number(values, "mixtral_total_b") == pytest.approx(46.7, rel=0.005)
    assert number(values, "mixtral_active_b") == pytest.approx(12.9, rel=0.005)
    assert "4 CPU processes over gloo" in text


@pytest.mark.integration
def test_the_page_skews_and_balances(page_outputs):
    _, _, values = page_outputs(PAGE)
    # the skewed router overflows more than the random one at the same capacity
    assert number(values, "skew_drop_1") > number(values, "even_drop_1")
    assert number(values, "aux_skewed") > number(values, "aux_even") >= 1.0 - 1e-6
    for key in ("none", "small", "large"):
        assert 0 <= number(values, f"{key}_dropped_last") <= 100
        assert number(values, f"{key}_busiest_last") >= 1
    # training starts from the skewed router at a capacity factor of 1.25
    assert number(values, "first_dropped") == pytest.approx(
        number(values, "skew_drop_125"), abs=0.5)


@pytest.mark.integration
def test_the_page_fits_the_all_to_all_and_labels_the_estimate(page_outputs):
    _, text, values = page_outputs(PAGE)
    for n in (2, 4):
        assert number(values, f"a2a_beta_{n}_gbs") > 0
    assert number(values, "gpu_buffer_mib") == 64
    assert number(values, "ib_over_nvlink") == pytest.approx(9.0)  # 450 / 50, by ports
    assert "assumed 40% of peak" in text
