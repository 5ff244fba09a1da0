"""dlperf.utilization: FLOP counts, the utilisation and overlap arithmetic, the allocator's
summaries and the small float formats."""
import math

import pytest
import torch
from torch import nn

from dlperf import distributed, utilization


def tiny(vocab=64, width=32, depth=2, heads=4, length=16, seed=0):
    torch.manual_seed(seed)
    return utilization.TinyGPT(vocab, width, depth, heads, length)


def test_matmul_parameters_are_the_linear_weights_only():
    model = tiny()
    width, vocab, depth = 32, 64, 2
    # per block: qkv 3d^2, proj d^2, up 4d^2, down 4d^2; the head d V; no embeddings or biases
    assert utilization.matmul_parameters(model) == depth * 12 * width**2 + width * vocab
    assert utilization.matmul_parameters(nn.Sequential(nn.Embedding(10, 4), nn.LayerNorm(4))) == 0


@pytest.mark.parametrize("length", [8, 16])
def test_counted_flops_are_six_n_plus_palm_attention_term(length):
    model = tiny(length=16)
    tokens = torch.randint(0, 64, (3, length + 1))
    forward = utilization.count_flops(lambda: utilization.lm_loss(model, tokens))
    step = utilization.count_flops(lambda: utilization.lm_loss(model, tokens).backward())
    rule = utilization.transformer_flops_per_token(utilization.matmul_parameters(model), 2, 32,
                                                   length)
    assert rule["total"] == rule["dense"] + rule["attention"]
    assert step == rule["total"] * 3 * length
    assert forward * 3 == step  # backward costs twice the forward


def test_counting_on_the_meta_device_needs_no_data():
    with torch.device("meta"):
        model = tiny(vocab=1000, width=64, depth=3, heads=4, length=256)
        tokens = torch.zeros(2, 257, dtype=torch.long)
        step = utilization.count_flops(lambda: utilization.lm_loss(model, tokens).backward())
    rule = utilization.transformer_flops_per_token(utilization.matmul_parameters(model), 3, 64, 256)
    assert step == rule["total"] * 2 * 256


def test_checkpointing_keeps_gradients_and_recomputes_all_but_the_last_product():
    model = tiny()
    tokens = torch.randint(0, 64, (2, 17))

    def grads_and_flops():
        model.zero_grad(set_to_none=True)
        flops = utilization.count_flops(lambda: utilization.lm_loss(model, tokens).backward())
        return [p.grad.clone() for p in model.parameters()], flops

    plain, plain_flops = grads_and_flops()
    model.checkpoint_blocks = True
    ckpt, ckpt_flops = grads_and_flops()
    torch.testing.assert_close(ckpt, plain)
    width, depth, length, vocab = 32, 2, 16, 64
    n_blocks = utilization.matmul_parameters(model) - vocab * width
    # early stopping: the down projection (4 d^2 weights) of each block is not recomputed
    recomputed = 2 * (n_blocks - depth * 4 * width**2) + 4 * depth * length * width
    assert ckpt_flops - plain_flops == recomputed * 2 * length


def test_attention_rejects_a_width_that_heads_do_not_divide():
    with pytest.raises(ValueError):
        utilization.Attention(30, 4)


def test_attention_is_causal():
    torch.manual_seed(0)
    attention = utilization.Attention(16, 2)
    x = torch.randn(1, 6, 16)
    changed = x.clone()
    changed[0, 4:] += 1.0  # the future of positions 0..3
    torch.testing.assert_close(attention(x)[0, :4], attention(changed)[0, :4])
    assert not torch.allclose(attention(x)[0, 4:], attention(changed)[0, 4:])


def test_interleaved_times_run_the_candidates_in_turn():
    calls = []
    times = utilization.interleaved_times({"a": lambda: calls.append("a"),
                                           "b": lambda: calls.append("b")}, repeat=3, warmup=1)
    assert calls == ["a", "b"] + ["a", "b"] * 3  # warm-ups, then three rounds
    assert {name: len(runs) for name, runs in times.items()} == {"a": 3, "b": 3}
    assert all(t >= 0 for runs in times.values() for t in runs)


def test_fastest_spread_is_the_second_fastest_over_the_fastest():
    assert utilization.fastest_spread([3.0, 1.0, 1.5, 2.0]) == pytest.approx(0.5)
    assert utilization.fastest_spread([2.0]) == 0.0


def test_mfu_is_model_flops_per_second_over_peak():
    assert utilization.mfu(1000.0, 6e9, 1.2e13) == pytest.approx(0.5)


def test_ring_model_of_the_parameter_server_page():
    assert utilization.ring_allreduce_seconds(1, 1e9, 1e-5, 1e9) == 0.0
    # n = 4: 6 steps of latency, 1.5 m / beta
    assert utilization.ring_allreduce_seconds(4, 4e6, 1e-5, 1e9) == pytest.approx(6e-5 + 6e-3)


def test_fit_recovers_alpha_and_beta_from_exact_times():
    alpha, beta, n = 40e-6, 3e9, 2
    sizes = [1e3, 1e5, 1e6, 1e7]
    times = [utilization.ring_allreduce_seconds(n, m, alpha, beta) for m in sizes]
    fitted_alpha, fitted_beta = utilization.fit_alpha_beta(n, sizes, times)
    assert fitted_alpha == pytest.approx(alpha, rel=1e-6)
    assert fitted_beta == pytest.approx(beta, rel=1e-6)


def test_a_negative_alpha_is_clipped_and_beta_fitted_again():
    import numpy as np

    n, beta = 2, 2e9
    sizes = np.array([1e5, 1e6, 1e7])
    # times that a line through the origin misses by a negative intercept: the joint fit's
    # alpha is below zero
    times = np.array([utilization.ring_allreduce_seconds(n, m, 0.0, beta) for m in sizes]) - 2e-5
    fitted_alpha, fitted_beta = utilization.fit_alpha_beta(n, sizes, times)
    assert fitted_alpha == 0.0
    column = (2 * (n - 1) / n * sizes) / times  # the bandwidth column, in relative errors

    def relative_residual(b):
        return float((((column / b) - 1) ** 2).sum())

    # the refitted beta is the best one with alpha = 0: better than its neighbours and than the
    # beta that went with the negative alpha of the joint fit
    features = np.stack([np.full_like(sizes, 2 * (n - 1)), 2 * (n - 1) / n * sizes], axis=1)
    (joint_alpha, joint_inverse_beta), *_ = np.linalg.lstsq(features / times[:, None],
                                                            np.ones_like(times), rcond=None)
    assert joint_alpha < 0
    best = relative_residual(fitted_beta)
    assert best < relative_residual(1 / joint_inverse_beta)
    assert best <= min(relative_residual(fitted_beta * 1.001), relative_residual(fitted_beta / 1.001))


def test_the_break_even_points_make_both_sides_equal():
    n, grad_bytes, alpha, beta = 8, 4e8, 5e-6, 5e10
    allreduce = utilization.ring_allreduce_seconds(n, grad_bytes, alpha, beta)
    per_token, rate = 4e8, 2e14  # backward FLOPs per token, FLOP/s
    tokens = utilization.min_tokens_to_hide(allreduce, per_token, rate)
    assert tokens * per_token / rate == pytest.approx(allreduce)
    backward = 0.01
    needed = utilization.bandwidth_to_hide(n, grad_bytes, backward, alpha)
    assert utilization.ring_allreduce_seconds(n, grad_bytes, alpha, needed) == pytest.approx(backward)
    assert utilization.bandwidth_to_hide(n, grad_bytes, 1e-6, alpha) == math.inf  # latency alone
    assert utilization.bandwidth_to_hide(1, grad_bytes, backward) == 0.0


def test_without_latency_the_tokens_to_hide_do_not_depend_on_the_model_size():
    n, rate, beta = 8, 4e14, 4.5e11
    for params in (1e8, 7e9, 7e10):
        allreduce = utilization.ring_allreduce_seconds(n, 2 * params, 0.0, beta)  # bfloat16 grads
        tokens = utilization.min_tokens_to_hide(allreduce, 4 * params, rate)
        assert tokens == pytest.approx((n - 1) / n * 2 * rate / (2 * beta))


def test_allreduce_timing_job_times_gloo_between_two_processes():
    records = distributed.run_workers(utilization.allreduce_timing_job, 2,
                                      args=([16, 4096], 2), backend="gloo", timeout=120)
    assert records[1] is None
    assert [r["bytes"] for r in records[0]] == [64, 16384]
    assert all(r["min_s"] > 0 for r in records[0])


SNAPSHOT = {  # the layout of torch.cuda.memory._snapshot(), made up for the test
    "segments": [
        {"total_size": 2097152, "blocks": [
            {"size": 1048576, "state": "active_allocated"},
            {"size": 524288, "state": "inactive"},
            {"size": 524288, "state": "active_allocated"}]},
        {"total_size": 20971520, "blocks": [
            {"size": 8388608, "state": "active_pending_free"},
            {"size": 12582912, "state": "inactive"}]},
    ],
    "device_traces": [[{"action": "alloc"}, {"action": "free_requested"}, {"action": "alloc"}]],
}


def test_snapshot_summary_reads_segments_and_blocks():
    summary = utilization.snapshot_summary(SNAPSHOT)
    assert summary["segments"] == 2 and summary["blocks"] == 5
    assert summary["reserved"] == 2097152 + 20971520
    assert summary["allocated"] == 1048576 + 524288
    assert summary["cached_free"] == summary["reserved"] - summary["allocated"]
    assert summary["free_blocks"] == 3 and summary["largest_free"] == 12582912
    assert summary["events"] == 3
    assert utilization.snapshot_summary({})["reserved"] == 0


def test_probe_sizes_are_seeded_multiples_of_256():
    sizes = utilization.probe_sizes(20, seed=3)
    assert sizes == utilization.probe_sizes(20, seed=3)
    assert len(sizes) == 20 and all(s % 256 == 0 and 256 <= s <= 16384 for s in sizes)
    assert len(set(sizes)) > 1


def test_probe_sizes_come_in_the_order_asked_for():
    drawn = utilization.probe_sizes(20, seed=3)
    assert utilization.probe_sizes(20, seed=3, order="growing") == sorted(drawn)
    assert utilization.probe_sizes(20, seed=3, order="shrinking") == sorted(drawn, reverse=True)
    with pytest.raises(ValueError):
        utilization.probe_sizes(20, order="sideways")
    with pytest.raises(ValueError):
        utilization.allocator_probe(order="sideways")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU answer")
def test_the_allocator_probe_says_so_without_a_gpu():
    assert utilization.allocator_probe() == {"cuda": False}
    assert utilization.allocator_probe_in_subprocess("expandable_segments:True") == {"cuda": False}
    assert utilization.allocator_probe_in_subprocess(None, steps=4, order="growing") == {"cuda": False}


@pytest.mark.gpu
def test_the_allocator_probe_measures_both_settings_on_a_gpu():
    default = utilization.allocator_probe_in_subprocess(None, steps=10)
    expandable = utilization.allocator_probe_in_subprocess("expandable_segments:True", steps=10)
    assert default["cuda"] and expandable["cuda"]
    assert default["setting"] == "" and expandable["setting"] == "expandable_segments:True"
    growing = utilization.allocator_probe_in_subprocess(None, steps=10, order="growing")
    assert growing["order"] == "growing" and default["order"] == "random"
    for probe in (default, expandable, growing):
        assert probe["peak_reserved"] >= probe["peak_allocated"] > 0


@pytest.mark.gpu
def test_a_real_snapshot_is_summarised():
    torch.cuda.memory._record_memory_history(max_entries=1000)
    try:
        x = torch.randn(1024, 1024, device="cuda")
        y = x @ x
        del x
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    summary = utilization.snapshot_summary(snapshot)
    assert summary["allocated"] >= y.numel() * 4
    assert summary["reserved"] >= summary["allocated"] and summary["events"] > 0


@pytest.mark.parametrize("fmt, dtype", [(utilization.E4M3, torch.float8_e4m3fn),
                                        (utilization.E5M2, torch.float8_e5m2)])
def test_fp8_ranges_follow_from_the_bit_layouts(fmt, dtype):
    info = torch.finfo(dtype)
    assert fmt.bits == info.bits == 8
    assert fmt.max == info.max and fmt.smallest_normal == info.tiny and fmt.eps == info.eps
    smallest = torch.tensor(fmt.smallest_subnormal).to(dtype).float().item()
    assert smallest == fmt.smallest_subnormal
    assert torch.tensor(fmt.smallest_subnormal / 4).to(dtype).float().item() == 0.0


def test_the_layout_rule_covers_the_sixteen_bit_formats():
    float16 = utilization.FloatFormat("float16", 5, 10, 15, ieee=True)
    bfloat16 = utilization.FloatFormat("bfloat16", 8, 7, 127, ieee=True)
    for fmt, dtype in [(float16, torch.float16), (bfloat16, torch.bfloat16)]:
        info = torch.finfo(dtype)
        assert (fmt.max, fmt.smallest_normal, fmt.eps) == (info.max, info.tiny, info.eps)


def test_scaling_maps_the_largest_value_onto_the_format_maximum():
    x = torch.tensor([1e-5, 3e-4, -2e-3])
    scale = utilization.amax_scale(x, utilization.E4M3.max)
    assert float((x * scale).abs().max()) == pytest.approx(448.0)
    back = utilization.scaled_roundtrip(x, torch.float8_e4m3fn, scale)
    assert torch.all(((back - x).abs() / x.abs()) <= 2**-4)
    unscaled = utilization.scaled_roundtrip(x, torch.float8_e4m3fn)
    assert torch.all(unscaled[:2] == 0)  # below half the smallest subnormal, 2^-10, unscaled
