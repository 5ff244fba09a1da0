"""Generating text with a small decoder: prefill, decode and the KV cache (the inference chapter).

``TinyDecoder`` is a decoder-only transformer small enough to run on a laptop's CPU, with
multi-head, grouped-query or multi-query attention (``kv_heads``), and an optional
``KVCache``, so that the chapter can time the two phases of generation and count the bytes
the formulas predict. ``Int8Linear`` stores a linear layer's weight in int8 with one scale per
output row (weight-only quantization). ``speculative_generate`` lets a cheap draft model propose
tokens that the model checks in one pass (greedy speculative decoding), and
``kv_reservation`` counts the cache a batch of requests reserves up front or in blocks
(paged attention).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Dict, Optional, Sequence, Tuple

import torch
from torch import nn
from torch.nn import functional as F

from .memory import tensor_bytes


def kv_cache_bytes(layers: int, kv_heads: int, head_dim: int, tokens: int, batch: int = 1,
                   bytes_per_value: int = 2) -> int:
    """Bytes of the keys and values a decoder keeps for ``tokens`` tokens of ``batch``
    sequences: a key and a value vector of ``head_dim`` numbers per KV head, layer and token."""
    return 2 * layers * kv_heads * head_dim * tokens * batch * bytes_per_value


class KVCache:
    """Keys and values of every layer, allocated once for ``max_len`` tokens; ``length`` is how
    many positions hold values."""

    def __init__(self, layers: int, batch: int, kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device=None):
        shape = (layers, batch, kv_heads, max_len, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0

    @property
    def nbytes(self) -> int:
        return tensor_bytes((self.keys, self.values))

    def extend(self, layer: int, keys: torch.Tensor, values: torch.Tensor, start: int
               ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Store the keys and values of positions ``start`` onwards for ``layer``; return those
        of every position up to the last one stored."""
        end = start + keys.shape[2]
        if end > self.keys.shape[3]:
            raise ValueError(f"the cache holds {self.keys.shape[3]} positions; {end} asked for")
        self.keys[layer, :, :, start:end] = keys
        self.values[layer, :, :, start:end] = values
        if layer == self.keys.shape[0] - 1:
            self.length = end
        return self.keys[layer, :, :, :end], self.values[layer, :, :, :end]

    def rollback(self, length: int) -> None:
        """Forget every position from ``length`` on: the next pass overwrites them, and no
        pass reads past the positions it stores."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot roll a cache of {self.length} positions back to {length}")
        self.length = length


class Int8Linear(nn.Module):
    """A linear layer whose weight is stored in int8, one float scale per output row: a
    quarter of float32's bytes. PyTorch's private operator ``torch._weight_int8pack_mm``
    multiplies by it without making a float copy of the weight, where the device has it;
    elsewhere the weight is converted at every call."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        weight = linear.weight.detach()
        scale = weight.abs().amax(dim=1).clamp(min=1e-12) / 127
        self.register_buffer("weight", torch.round(weight / scale[:, None]).to(torch.int8))
        self.register_buffer("scale", scale.to(weight.dtype))
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone())
        self.fused = _int8_matmul_works(weight.device, weight.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        if self.fused:
            y = torch._weight_int8pack_mm(rows, self.weight, self.scale)
        else:
            y = rows @ (self.weight.to(x.dtype) * self.scale[:, None]).T
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], -1)


@lru_cache(maxsize=None)  # one probe per device and dtype, not one per layer
def _int8_matmul_works(device, dtype) -> bool:
    try:
        torch._weight_int8pack_mm(torch.ones(1, 32, device=device, dtype=dtype),
                                  torch.ones(8, 32, device=device, dtype=torch.int8),
                                  torch.ones(8, device=device, dtype=dtype))
        return True
    except (AttributeError, RuntimeError, NotImplementedError):
        return False


def quantize_weights(model: nn.Module) -> nn.Module:
    """Replace every ``nn.Linear`` of ``model`` (in place) by an :class:`Int8Linear`."""
    for name, child in model.named_children():
        if isinstance(child, nn.Linear):
            setattr(model, name, Int8Linear(child))
        else:
            quantize_weights(child)
    return model


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters and buffers (its weights, however stored)."""
    return tensor_bytes([*model.parameters(), *model.buffers()])


class DecoderBlock(nn.Module):
    """Pre-norm attention (``heads`` query heads sharing ``kv_heads`` key/value heads) and MLP."""

    def __init__(self, width: int, heads: int, kv_heads: int):
        super().__init__()
        if heads % kv_heads:
            raise ValueError(f"{heads} query heads cannot share {kv_heads} KV heads evenly")
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, width // heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.query = nn.Linear(width, heads * self.head_dim, bias=False)
        self.key_value = nn.Linear(width, 2 * kv_heads * self.head_dim, bias=False)
        self.out = nn.Linear(heads * self.head_dim, width, bias=False)
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor, layer: int, start: int,
                cache: Optional[KVCache]) -> torch.Tensor:
        batch, steps, _ = x.shape
        h = self.norm1(x)
        q = self.query(h).view(batch, steps, self.heads, self.head_dim).transpose(1, 2)
        kv = self.key_value(h).view(batch, steps, 2, self.kv_heads, self.head_dim)
        k, v = kv.permute(2, 0, 3, 1, 4)  # each (batch, kv_heads, steps, head_dim)
        if cache is not None:
            k, v = cache.extend(layer, k, v, start)  # every position so far
        group = self.heads // self.kv_heads
        if group > 1:  # each KV head serves `group` query heads
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        # Position start + i sees positions 0 .. start + i: a causal mask shifted by start.
        seen = torch.arange(k.shape[2], device=x.device)
        mask = seen[None, :] <= (start + torch.arange(steps, device=x.device))[:, None]
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.out(attended.transpose(1, 2).reshape(batch, steps, -1))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


@dataclass
class DecoderShape:
    vocab: int = 512
    width: int = 256
    layers: int = 4
    heads: int = 8
    kv_heads: int = 8
    max_len: int = 512


class TinyDecoder(nn.Module):
    """A decoder-only transformer: token and position embeddings, ``layers`` blocks, a final
    norm and a projection back to the vocabulary."""

    def __init__(self, shape: DecoderShape = DecoderShape()):
        super().__init__()
        self.shape = shape
        self.embed = nn.Embedding(shape.vocab, shape.width)
        self.position = nn.Embedding(shape.max_len, shape.width)
        self.blocks = nn.ModuleList(DecoderBlock(shape.width, shape.heads, shape.kv_heads)
                                    for _ in range(shape.layers))
        self.norm = nn.LayerNorm(shape.width)
        self.head = nn.Linear(shape.width, shape.vocab, bias=False)

    def new_cache(self, batch: int, max_len: Optional[int] = None) -> KVCache:
        s, like = self.shape, self.embed.weight
        return KVCache(s.layers, batch, s.kv_heads, max_len or s.max_len, s.width // s.heads,
                       dtype=like.dtype, device=like.device)

    def forward(self, tokens: torch.Tensor, start: int = 0,
                cache: Optional[KVCache] = None) -> torch.Tensor:
        """Logits for every position of ``tokens`` (batch, steps), which sit at positions
        ``start`` onwards; with a ``cache``, the earlier positions' keys and values come from it
        and those of these positions go into it."""
        steps = tokens.shape[1]
        positions = torch.arange(start, start + steps, device=tokens.device)
        x = self.embed(tokens) + self.position(positions)
        for layer, block in enumerate(self.blocks):
            x = block(x, layer, start, cache)
        return self.head(self.norm(x))


@torch.no_grad()
def generate(model: TinyDecoder, prompt: torch.Tensor, new_tokens: int,
             use_cache: bool = True) -> torch.Tensor:
    """Greedy generation: ``prompt`` (batch, length) followed by ``new_tokens`` tokens.
    With the cache, one prefill pass over the prompt, then one position per step
    (decode); without it, every step runs the whole sequence so far again."""
    tokens = prompt
    cache = (model.new_cache(prompt.shape[0], prompt.shape[1] + new_tokens)
             if use_cache else None)
    logits = model(prompt, 0, cache)  # the prefill
    for step in range(new_tokens):
        following = logits[:, -1].argmax(dim=-1, keepdim=True)
        tokens = torch.cat([tokens, following], dim=1)
        if step + 1 < new_tokens:
            logits = (model(following, tokens.shape[1] - 1, cache) if use_cache
                      else model(tokens))
    return tokens


def shallow_draft(model: TinyDecoder, layers: int) -> TinyDecoder:
    """A draft model made of ``model``'s first ``layers`` blocks, sharing its embeddings,
    its final norm and its projection to the vocabulary (no weights are copied)."""
    draft = TinyDecoder(replace(model.shape, layers=0, vocab=1, max_len=1))
    draft.shape = replace(model.shape, layers=layers)
    draft.embed, draft.position = model.embed, model.position
    draft.norm, draft.head = model.norm, model.head
    draft.blocks = nn.ModuleList(list(model.blocks)[:layers])
    return draft.train(model.training)


@dataclass
class SpeculationStats:
    """What a speculative generation did: ``target_passes`` passes of the target after its
    prefill, ``drafted`` tokens proposed, ``checked`` of them compared with the target's
    choice (up to and including the first disagreement), ``accepted`` of those kept, and
    ``produced`` tokens the passes yielded (accepted drafts plus one of the target's own per
    pass; the last pass may overshoot the tokens asked for)."""
    target_passes: int = 0
    drafted: int = 0
    checked: int = 0
    accepted: int = 0
    produced: int = 0

    @property
    def acceptance(self) -> float:
        return self.accepted / self.checked if self.checked else float("nan")

    @property
    def tokens_per_pass(self) -> float:
        passes = self.target_passes
        return self.produced / passes if passes else float("nan")


@torch.no_grad()
def speculative_generate(target: TinyDecoder, draft: TinyDecoder,
                         prompt: torch.Tensor, new_tokens: int, k: int
                         ) -> Tuple[torch.Tensor, SpeculationStats]:
    """Greedy speculative decoding of one sequence: ``draft`` proposes ``k`` tokens
    one at a time, ``target`` scores them all in one pass, and the longest prefix it
    agrees with, plus its own next token, is kept; both caches roll back to what was
    kept. Returns the tokens of ``generate(target, prompt, new_tokens)`` and the
    counts."""
    if prompt.shape[0] != 1 or k < 1:
        raise ValueError("one sequence and k >= 1 drafts per pass")
    room = prompt.shape[1] + new_tokens + k + 1
    t_cache, d_cache = target.new_cache(1, room), draft.new_cache(1, room)
    stats = SpeculationStats()
    tokens = prompt
    first = target(prompt, 0, t_cache)[:, -1].argmax(-1, keepdim=True)  # the prefill
    tokens = torch.cat([tokens, first], dim=1)
    while tokens.shape[1] < prompt.shape[1] + new_tokens:
        n = tokens.shape[1]  # both caches hold fewer than n positions
        proposal = tokens[:, d_cache.length:]  # what the draft has not seen yet
        for _ in range(k):
            logits = draft(proposal, d_cache.length, d_cache)
            proposal = logits[:, -1:].argmax(-1)
            tokens = torch.cat([tokens, proposal], dim=1)
        # One pass over the last kept token and the k drafts: k + 1 target choices.
        choices = target(tokens[:, n - 1:], n - 1, t_cache).argmax(-1)
        agree = (choices[0, :k] == tokens[0, n:]).tolist() + [False]
        kept = agree.index(False)  # drafts before the first disagreement
        tokens = torch.cat([tokens[:, :n + kept], choices[:, kept:kept + 1]], dim=1)
        t_cache.rollback(n + kept)  # its own choice is not in the cache yet
        d_cache.rollback(min(d_cache.length, n + kept))
        stats.target_passes += 1
        stats.drafted += k
        stats.checked += min(kept + 1, k)
        stats.accepted += kept
        stats.produced += kept + 1
    return tokens[:, :prompt.shape[1] + new_tokens], stats


def kv_reservation(lengths: Sequence[int], max_len: int, block: int = 16
                   ) -> Dict[str, int]:
    """Cache positions a batch of requests of ``lengths`` tokens needs, and what it
    reserves when each request reserves ``max_len`` positions up front, or blocks of
    ``block`` positions as it grows (paged attention): the last block of each is
    partly empty."""
    if any(not 0 < n <= max_len for n in lengths):
        raise ValueError(f"every length must lie between 1 and {max_len}")
    return {"used": sum(lengths), "up front": len(lengths) * max_len,
            "paged": sum(math.ceil(n / block) * block for n in lengths)}
