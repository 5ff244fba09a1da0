"""The page chapters/inference and its helpers, dlperf.inference.

The helpers: generation with the KV cache gives the tokens that recomputing every position
gives, for multi-head, grouped-query and multi-query attention; the cache holds the bytes the
formula counts; int8 weights stay close to the float32 layer. The page, as the book built it:
the same checks, the published configurations' cache sizes, and its verdicts (in
tests/test_book_claims.py).
"""
import pytest
import torch
from torch import nn

from dlperf.inference import (DecoderShape, Int8Linear, KVCache, TinyDecoder, generate,
                              kv_cache_bytes, quantize_weights, weight_bytes)
from tests.helpers import number

SMALL = DecoderShape(vocab=64, width=32, layers=2, heads=4, kv_heads=4, max_len=64)


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_the_cache_changes_the_work_not_the_tokens(kv_heads):
    torch.manual_seed(0)
    model = TinyDecoder(DecoderShape(**{**SMALL.__dict__, "kv_heads": kv_heads})).eval()
    prompt = torch.randint(0, SMALL.vocab, (3, 9))
    cached, recomputed = generate(model, prompt, 7), generate(model, prompt, 7, use_cache=False)
    assert cached.shape == (3, 16) and torch.equal(cached[:, :9], prompt)
    assert torch.equal(cached, recomputed)


def test_a_decode_step_sees_what_a_full_pass_sees():
    # The logits of the last position: from the cache after a prefill, and from the whole sequence.
    torch.manual_seed(1)
    model = TinyDecoder(DecoderShape(**{**SMALL.__dict__, "kv_heads": 2})).eval()
    tokens = torch.randint(0, SMALL.vocab, (2, 12))
    cache = model.new_cache(2, 12)
    with torch.no_grad():
        model(tokens[:, :11], 0, cache)
        step = model(tokens[:, 11:], 11, cache)[:, -1]
        full = model(tokens)[:, -1]
    torch.testing.assert_close(step, full)
    assert cache.length == 12


def test_the_cache_holds_what_the_formula_counts():
    cache = KVCache(layers=3, batch=2, kv_heads=5, max_len=7, head_dim=8, dtype=torch.float16)
    assert cache.nbytes == kv_cache_bytes(3, 5, 8, tokens=7, batch=2, bytes_per_value=2)
    assert kv_cache_bytes(32, 32, 128, tokens=1) == 512 * 2**10  # Llama 2 7B, 16-bit
    with pytest.raises(ValueError, match="holds 7 positions"):
        cache.extend(0, torch.zeros(2, 5, 8, 8), torch.zeros(2, 5, 8, 8), start=0)


def test_heads_must_share_kv_heads_evenly():
    with pytest.raises(ValueError, match="evenly"):
        TinyDecoder(DecoderShape(**{**SMALL.__dict__, "kv_heads": 3}))


def test_int8_weights_are_a_quarter_and_close():
    torch.manual_seed(2)
    linear = nn.Linear(64, 48)
    quantized = Int8Linear(linear)
    assert quantized.weight.dtype == torch.int8 and quantized.weight.shape == (48, 64)
    x = torch.randn(5, 3, 64)
    # One rounding step of the largest weight of a row, at most half a scale per weight.
    bound = (x.abs().sum(-1, keepdim=True) * quantized.scale / 2).max()
    assert (quantized(x) - linear(x)).abs().max() <= bound + 1e-5
    model = TinyDecoder(SMALL)
    before = weight_bytes(model)
    quantize_weights(model)
    assert not any(type(m) is nn.Linear for m in model.modules())
    assert weight_bytes(model) < before / 2


@pytest.mark.integration
def test_the_page_counts_the_cache_and_the_published_models(page_outputs):
    nb, text, values = page_outputs("chapters/inference")
    assert "greedy tokens with and without the cache agree: True" in text
    assert values["cache_formula_holds"] == "True"
    assert number(values, "llama2_kib") == 512 and number(values, "llama3_kib") == 128
    assert number(values, "llama2_batch_gib") == 32 and number(values, "llama3_batch_gib") == 8
    assert number(values, "cache_factor") > 2  # the weights do not fit in a cache
    assert 0 < number(values, "same_choice") <= 100
