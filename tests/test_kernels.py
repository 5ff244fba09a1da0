"""dlperf.kernels: attention three ways, operation chains and CUDA graphs, and reading Dynamo."""
import math

import pytest
import torch
from torch.nn import functional as F

from dlperf import kernels, memory


def qkv(seq=48, heads=2, dim=16, seed=0, dtype=torch.float32, device="cpu"):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(1, heads, seq, dim, generator=generator).to(device, dtype)
            for _ in range(3)]


def test_naive_attention_is_the_formula_row_by_row():
    q, k, v = qkv(seq=5, heads=1, dim=3)
    out = kernels.naive_attention(q, k, v)
    # one query at a time, with plain Python sums: softmax(q.k / sqrt(d)) weights of the values
    for i in range(5):
        scores = [float(q[0, 0, i] @ k[0, 0, j]) / math.sqrt(3) for j in range(5)]
        top = max(scores)
        weights = [math.exp(s - top) for s in scores]
        expected = sum(w * v[0, 0, j] for j, w in enumerate(weights)) / sum(weights)
        torch.testing.assert_close(out[0, 0, i], expected)


def test_naive_attention_matches_pytorchs_sdpa():
    q, k, v = qkv()
    torch.testing.assert_close(kernels.naive_attention(q, k, v),
                               F.scaled_dot_product_attention(q, k, v))


@pytest.mark.parametrize("block", [1, 7, 16, 48, 100])
def test_blockwise_attention_equals_naive_for_any_block(block):
    """Blocks that divide the sequence, blocks that do not, one block, a block larger than it."""
    q, k, v = qkv(seq=48)
    torch.testing.assert_close(kernels.blockwise_attention(q, k, v, block=block),
                               kernels.naive_attention(q, k, v))


def test_blockwise_attention_survives_scores_that_would_overflow_exp():
    # scores near 1000: exp overflows float32 unless the running maximum is subtracted
    q, k, v = qkv(seq=32)
    q, k = q * 40, k * 40
    out = kernels.blockwise_attention(q, k, v, block=8)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, kernels.naive_attention(q, k, v))


def test_blockwise_attention_handles_queries_and_keys_of_different_lengths():
    q, _, _ = qkv(seq=20, seed=1)
    _, k, v = qkv(seq=36, seed=2)
    torch.testing.assert_close(kernels.blockwise_attention(q, k, v, block=8),
                               kernels.naive_attention(q, k, v))


def test_blockwise_attention_keeps_float32_statistics_for_bfloat16_inputs():
    """Its running sums are float32, as FlashAttention's are: the bfloat16 result is the float32
    one rounded once (within bfloat16's half-step, 2**-9 of the largest output), where sums
    kept in bfloat16 would drift over 32 blocks."""
    q, k, v = qkv(seq=512, heads=1, dim=16, dtype=torch.bfloat16)
    out = kernels.blockwise_attention(q, k, v, block=16)
    assert out.dtype == torch.bfloat16
    exact = kernels.naive_attention(q.float(), k.float(), v.float())
    assert (out.float() - exact).abs().max() <= 2 ** -8 * exact.abs().max()


def test_blockwise_attention_rejects_an_empty_block():
    q, k, v = qkv(seq=8)
    with pytest.raises(ValueError):
        kernels.blockwise_attention(q, k, v, block=0)


def test_score_bytes_counts_one_matrix_per_head():
    assert kernels.score_bytes(2, 4, 128) == 2 * 4 * 128 * 128 * 4
    assert kernels.score_bytes(1, 1, 10, torch.bfloat16) == 200


def test_growth_exponent_recovers_powers():
    sizes = [256, 512, 1024, 2048]
    assert kernels.growth_exponent(sizes, [3 * s for s in sizes]) == pytest.approx(1)
    assert kernels.growth_exponent(sizes, [s * s / 7 for s in sizes]) == pytest.approx(2)
    assert kernels.growth_exponent(sizes, [5.0] * 4) == pytest.approx(0)
    with pytest.raises(ValueError):
        kernels.growth_exponent([1], [1])


def test_naive_attention_memory_grows_with_the_square_and_blockwise_does_not():
    """What the page measures, on the CPU: the profiler's allocations during one call."""
    peaks = {"naive": [], "blockwise": []}
    sizes = [128, 256, 512]
    for seq in sizes:
        q, k, v = qkv(seq=seq, heads=2, dim=16)
        for name, fn in [("naive", kernels.naive_attention),
                         ("blockwise", lambda q, k, v: kernels.blockwise_attention(q, k, v, 32))]:
            with torch.no_grad(), memory.AllocationPeak() as peak:
                fn(q, k, v)
            peaks[name].append(peak.peak_bytes)
    # the scores and their softmax are both alive at the peak: at least one score matrix
    assert all(p >= kernels.score_bytes(1, 2, s) for p, s in zip(peaks["naive"], sizes))
    assert kernels.growth_exponent(sizes, peaks["naive"]) > 1.75
    assert kernels.growth_exponent(sizes, peaks["blockwise"]) < 1.25


def test_sdpa_backends_says_which_ran_and_why_the_others_did_not():
    q, k, v = qkv()
    reference = kernels.naive_attention(q, k, v)
    found = kernels.sdpa_backends(q, k, v, reference=reference)
    assert list(found) == list(kernels.BACKENDS)
    assert found["MATH"]["ran"] and found["MATH"]["why"] == ""  # math runs everywhere
    assert found["MATH"]["max_diff"] < 1e-5
    for name, entry in found.items():
        assert entry["ran"] or entry["why"], f"{name} refused without a reason"
    if not torch.cuda.is_available():  # these two are CUDA kernels
        assert not found["EFFICIENT_ATTENTION"]["ran"]
        assert not found["CUDNN_ATTENTION"]["ran"]


# What PyTorch's CUDA backend selection warned when only the flash kernel was allowed and the
# inputs were float32 (the format of torch 2.x's sdp_utils.cpp; the source paths shortened).
CUDA_WARNINGS = [
    "Memory efficient kernel not used because: (Triggered internally at sdp_utils.cpp:900.)",
    "Memory Efficient attention has been runtime disabled. (Triggered internally at "
    "sdp_utils_cpp.h:550.)",
    "Flash attention kernel not used because: (Triggered internally at sdp_utils.cpp:902.)",
    "Expected query, key and value to all be of dtype: {Half, BFloat16}. Got Query dtype: "
    "float, Key dtype: float, and Value dtype: float instead. (Triggered internally at "
    "sdp_utils_cpp.h:110.)",
    "cuDNN attention kernel not used because: (Triggered internally at sdp_utils.cpp:904.)",
    "cuDNN attention has been runtime disabled. (Triggered internally at sdp_utils.cpp:600.)",
]


def test_refusal_reason_reads_the_requested_backends_own_warnings():
    why = kernels.refusal_reason("FLASH_ATTENTION", CUDA_WARNINGS,
                                 "No available kernel. Aborting execution.")
    assert why == ("Expected query, key and value to all be of dtype: {Half, BFloat16}. Got "
                   "Query dtype: float, Key dtype: float, and Value dtype: float instead.")
    assert kernels.refusal_reason("EFFICIENT_ATTENTION", CUDA_WARNINGS) == (
        "Memory Efficient attention has been runtime disabled.")
    assert kernels.refusal_reason("CUDNN_ATTENTION", CUDA_WARNINGS) == (
        "cuDNN attention has been runtime disabled.")
    # several failed checks under one header are joined; no section at all gives the error
    two = CUDA_WARNINGS[2:4] + ["Flash attention requires a head dimension of at most 256."]
    assert kernels.refusal_reason("FLASH_ATTENTION", two).count("; ") == 1
    assert kernels.refusal_reason("CUDNN_ATTENTION", [], "No viable backend.\nmore") == (
        "No viable backend.")


def test_op_chain_alternates_halving_and_adding_a_quarter():
    x = torch.tensor([4.0, -2.0])
    torch.testing.assert_close(kernels.op_chain(x, 0), x)
    torch.testing.assert_close(kernels.op_chain(x, 3), (x * 0.5 + 0.25) * 0.5)
    # bounded: the fixed point of x -> x/2 + 1/4 is 1/2
    assert kernels.op_chain(torch.tensor([1e6]), 200).item() == pytest.approx(0.5)


def test_cuda_graphed_refuses_a_cpu_tensor():
    with pytest.raises(ValueError, match="CUDA"):
        kernels.cuda_graphed(lambda t: t * 2, torch.ones(3))


@pytest.mark.gpu
def test_cuda_graph_replay_gives_the_eager_result_for_new_inputs():
    x = torch.randn(1024, device="cuda")
    replay = kernels.cuda_graphed(lambda t: kernels.op_chain(t, 20), x)
    for seed in range(3):
        y = torch.randn(1024, device="cuda", generator=torch.Generator("cuda").manual_seed(seed))
        torch.testing.assert_close(replay(y), kernels.op_chain(y, 20))


def test_explain_counts_graphs_and_break_reasons():
    def printing(x):
        y = torch.sin(x)
        print("inside")
        return torch.cos(y)

    def clean(x):
        return torch.cos(torch.sin(x))

    def methods(x):
        return torch.sin(x).sum() + x.mean()  # sin and add are functions; sum, mean methods

    broken = kernels.explain(printing, torch.randn(4))
    assert broken["graphs"] == 2 and broken["breaks"] == 1
    assert len(broken["reasons"]) == 1 and broken["reasons"][0]
    assert "\n" not in broken["reasons"][0]
    assert len(broken["explanations"]) == 1 and "\n" not in broken["explanations"][0]
    assert kernels._explanation("Reason\n  Explanation: why it broke\n  Hint: x") == (
        "why it broke")
    assert kernels._explanation("Reason alone") == ""
    whole = kernels.explain(clean, torch.randn(4))
    assert whole == {"graphs": 1, "breaks": 0, "ops": 2, "reasons": [], "explanations": []}
    assert kernels.explain(methods, torch.randn(4))["ops"] == 4


def test_recompile_log_collects_the_failed_guards(capsys):
    import torch._dynamo

    def f(x):
        return torch.tanh(x) * 2

    torch._dynamo.reset()
    compiled = torch.compile(f, backend="eager")
    with kernels.RecompileLog() as log:
        compiled(torch.randn(4))
        compiled(torch.randn(4))  # same shape and dtype: no recompilation
        compiled(torch.randn(4, dtype=torch.float64))
    assert log.recompiles == 1
    assert len(log.guard_failures) == 1 and "dtype" in log.guard_failures[0]
    assert "Recompiling" in log.messages[0]
    assert capsys.readouterr().err == ""  # collected, not printed
    compiled(torch.randn(4, dtype=torch.float16))  # after the block: nothing more collected
    assert log.recompiles == 1
    torch._dynamo.reset()


def test_recompile_log_keeps_only_guards_and_leaves_other_log_settings(capsys):
    """A float argument's guard ("a == 1.0") comes with "- User stack trace:" lines, which are
    not guards; the log settings made before the block survive it."""
    import torch._dynamo
    from torch._logging import _internal

    def f(x, a):
        return torch.tanh(x) * a

    torch._dynamo.reset()
    torch._logging.set_logs(graph_code=True)
    try:
        compiled = torch.compile(f, backend="eager")
        with kernels.RecompileLog() as log:
            for a in (1.0, 2.0, 3.0):  # the second float recompiles, with the float a symbol
                compiled(torch.randn(4), a)
        assert log.recompiles == 1
        assert log.guard_failures == ["a == 1.0"]
        assert all(not g.startswith("User stack") for g in log.guard_failures)
        assert _internal.log_state.is_artifact_enabled("graph_code")
        assert not _internal.log_state.is_artifact_enabled("recompiles")
    finally:
        torch._logging.set_logs()
        torch._dynamo.reset()
    capsys.readouterr()
