"""The page chapters/inference and its helpers, dlperf.inference.

The helpers: generation with the KV cache gives the tokens that recomputing every position
gives, for multi-head, grouped-query and multi-query attention; the cache holds the bytes the
formula counts; int8 weights stay close to the float32 layer; greedy speculative decoding
gives plain greedy decoding's tokens, whatever the draft and k, and leaves each cache as long
as what it kept; paged reservation counts whole blocks. The page, as the book built it:
the same checks, the published configurations' cache sizes, and its verdicts (in
tests/test_book_claims.py).
"""
import copy

import pytest
import torch
from torch import nn

from dlperf.inference import (DecoderShape, Int8Linear, KVCache, TinyDecoder, generate,
                              kv_cache_bytes, kv_reservation, quantize_weights,
                              shallow_draft, speculative_generate, weight_bytes)
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


@pytest.mark.parametrize("k", [1, 2, 3, 5, 8])
def test_speculation_returns_the_tokens_of_greedy_decoding(k):
    torch.manual_seed(3)
    target = TinyDecoder(DecoderShape(**{**SMALL.__dict__, "kv_heads": 2})).eval()
    prompt = torch.randint(0, SMALL.vocab, (1, 6))
    greedy = generate(target, prompt, 20)
    drafts = {"the target itself": target,  # every draft accepted
              "its int8 copy": quantize_weights(copy.deepcopy(target)),
              "its first block": shallow_draft(target, 1),
              "an unrelated model": TinyDecoder(SMALL).eval()}  # hardly any accepted
    for name, draft in drafts.items():
        tokens, stats = speculative_generate(target, draft, prompt, 20, k)
        assert torch.equal(tokens, greedy), name
        assert stats.accepted <= stats.checked <= stats.drafted == k * stats.target_passes
        assert stats.produced == stats.accepted + stats.target_passes >= 19
    _, stats = speculative_generate(target, target, prompt, 20, k)
    assert stats.acceptance == 1 and stats.tokens_per_pass == k + 1


def test_rollback_leaves_each_cache_as_long_as_what_it_kept(monkeypatch):
    torch.manual_seed(4)
    target = TinyDecoder(SMALL).eval()
    draft = quantize_weights(copy.deepcopy(target))
    after = []  # each rollback's length and the cache's length right after it
    rollback = KVCache.rollback

    def record(cache, length):
        rollback(cache, length)
        after.append((length, cache.length))

    monkeypatch.setattr(KVCache, "rollback", record)
    prompt, k = torch.randint(0, SMALL.vocab, (1, 5)), 4
    tokens, stats = speculative_generate(target, draft, prompt, 12, k)
    assert len(after) == 2 * stats.target_passes
    assert all(asked == held for asked, held in after)
    target_lengths, draft_lengths = [a for a, _ in after[::2]], [a for a, _ in after[1::2]]
    # After each pass the target holds every token kept so far but the last, which the
    # next pass feeds: the prompt's positions and those of the tokens produced before it.
    # The draft holds as many, or one fewer when the target kept all k of its drafts.
    assert target_lengths[-1] == 5 + stats.produced
    steps = [b - a for a, b in zip([5] + target_lengths, target_lengths)]
    assert all(1 <= s <= k + 1 for s in steps) and sum(steps) == stats.produced
    assert all(t - 1 <= d <= t for t, d in zip(target_lengths, draft_lengths))
    assert 5 + 12 <= 5 + stats.produced + 1 <= 5 + 12 + k
    assert tokens.shape == (1, 17)
    cache = KVCache(layers=1, batch=1, kv_heads=1, max_len=8, head_dim=2)
    cache.extend(0, torch.ones(1, 1, 6, 2), torch.ones(1, 1, 6, 2), start=0)
    cache.rollback(4)
    assert cache.length == 4
    with pytest.raises(ValueError, match="roll a cache of 4 positions back to 5"):
        cache.rollback(5)


def test_rolled_back_positions_are_overwritten_not_read():
    # Score 4 wrong tokens, roll back past them, then decode: the logits match a full pass.
    torch.manual_seed(5)
    model = TinyDecoder(SMALL).eval()
    tokens = torch.randint(0, SMALL.vocab, (1, 10))
    cache = model.new_cache(1, 16)
    with torch.no_grad():
        model(tokens[:, :8], 0, cache)
        model(torch.randint(0, SMALL.vocab, (1, 4)), 8, cache)
        cache.rollback(8)
        step = model(tokens[:, 8:], 8, cache)
        full = model(tokens)[:, 8:]
    torch.testing.assert_close(step, full)
    assert cache.length == 10


def test_a_shallow_draft_shares_the_weights():
    model = TinyDecoder(SMALL).eval()
    draft = shallow_draft(model, 1)
    assert draft.head.weight is model.head.weight and draft.blocks[0] is model.blocks[0]
    assert len(draft.blocks) == 1 and draft.new_cache(1, 8).keys.shape[0] == 1
    full_bytes = weight_bytes(model)
    assert weight_bytes(draft) < full_bytes


def test_paged_reservation_counts_whole_blocks():
    counted = kv_reservation([1, 16, 17, 40], max_len=64, block=16)
    assert counted == {"used": 74, "up front": 256, "paged": 16 + 16 + 32 + 48}
    assert kv_reservation([5, 9], max_len=9, block=1)["paged"] == 14
    with pytest.raises(ValueError, match="between 1 and 64"):
        kv_reservation([65], max_len=64)


@pytest.mark.integration
def test_the_page_counts_the_cache_and_the_published_models(page_outputs):
    nb, text, values = page_outputs("chapters/inference")
    assert "greedy tokens with and without the cache agree: True" in text
    assert values["cache_formula_holds"] == "True"
    assert number(values, "llama2_kib") == 512 and number(values, "llama3_kib") == 128
    assert number(values, "llama2_batch_gib") == 32 and number(values, "llama3_batch_gib") == 8
    assert number(values, "cache_factor") > 2  # the weights do not fit in a cache
    assert 0 < number(values, "same_choice") <= 100
    assert values["spec_same"] == "True"  # speculation kept the greedy tokens
    assert 0 <= number(values, "paged_empty") < number(values, "upfront_empty")
    assert 1 <= number(values, "spec_per_pass") <= 5  # k = 4 drafts per pass
