"""Model FLOPs utilisation, the overlap condition of data parallelism, and memory in practice.

The page ``chapters/utilization-memory.md`` uses this module for:

* :class:`TinyGPT`, a small decoder-only transformer whose every matrix product is a
  ``Linear`` layer or an explicit ``matmul`` (so that ``FlopCounterMode`` sees them all);
* :func:`count_flops` and :func:`transformer_flops_per_token`, the counted FLOPs of a step
  and the rule they are checked against (6N plus PaLM's attention term);
* :func:`~dlperf.timing.interleaved_times` (imported here) and :func:`fastest_spread`,
  timings of several variants run in turn, and how well their fastest runs reproduce;
* :func:`mfu`, :func:`ring_allreduce_seconds`, :func:`fit_alpha_beta`,
  :func:`min_tokens_to_hide` and :func:`bandwidth_to_hide`, the arithmetic of utilisation
  and of hiding a gradient allreduce behind the backward pass;
* :func:`allreduce_timing_job`, run in worker processes to time ``dist.all_reduce``;
* :func:`snapshot_summary` and :func:`allocator_probe`, which read the CUDA caching
  allocator (a GPU only); ``python -m dlperf.utilization allocator-probe`` runs the probe in
  a fresh process, so that ``PYTORCH_CUDA_ALLOC_CONF`` can differ from the caller's;
* :class:`FloatFormat`, the range of a small floating-point format from its bit layout
  (FP8's E4M3 and E5M2).
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from .timing import interleaved_times  # noqa: F401 (the page times its variants with it)


# ---------------------------------------------------------------- the model
class Attention(nn.Module):
    """Causal multi-head self-attention, written out: the two products are visible matmuls."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        if width % heads:
            raise ValueError(f"width {width} is not a multiple of heads {heads}")
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, self.heads, width // self.heads).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (batch, heads, length, head width)
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        mask = torch.ones(length, length, dtype=torch.bool, device=x.device).triu(1)
        weights = scores.masked_fill(mask, float("-inf")).softmax(-1)
        out = (weights @ v).transpose(1, 2).reshape(batch, length, width)
        return self.proj(out)


class Block(nn.Module):
    """Pre-norm transformer block: x + attention(norm(x)), then x + MLP(norm(x))."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attention = Attention(width, heads)
        self.norm2 = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class TinyGPT(nn.Module):
    """Token embedding, ``depth`` blocks, a final norm and a linear head over the vocabulary.

    The positions are learned embeddings. With ``checkpoint_blocks=True`` every block runs
    under ``torch.utils.checkpoint`` (non-reentrant): its insides are recomputed in backward.
    """

    def __init__(self, vocab: int, width: int, depth: int, heads: int, length: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Embedding(length, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.checkpoint_blocks = False

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.embed(tokens) + self.position(positions)
        for block in self.blocks:
            if self.checkpoint_blocks:
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return self.head(self.norm(x))


def lm_loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy: predict tokens[:, 1:] from tokens[:, :-1]."""
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def matmul_parameters(model: nn.Module) -> int:
    """Parameters that take part in matrix products: the weights of the ``Linear`` layers.

    Embedding tables are looked up, not multiplied, and biases and norms are added or
    scaled elementwise: none of them is counted. The output head is counted: it is a
    ``Linear`` layer of its own in :class:`TinyGPT`. Kaplan et al.'s N leaves out the
    embeddings and, with them, a head that shares the token embedding's matrix."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))


# ---------------------------------------------------------------- counting FLOPs
def count_flops(fn: Callable[[], object]) -> int:
    """FLOPs of the matrix products ``fn()`` runs, as ``torch.utils.flop_counter`` counts them
    (2 per multiply-add; elementwise work, softmax and norms are not counted)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


def transformer_flops_per_token(n_matmul: int, depth: int, width: int, length: int) -> Dict[str, float]:
    """FLOPs per token of one training step (forward and backward) of a transformer.

    ``6 N``: every weight does a multiply-add per token forward (2 FLOPs) and two backward
    (the gradient of the input and of the weight). ``12 L d s``: the two attention products,
    Q K^T and weights x V, cost 2 s d each per token and layer forward, times 3 with
    backward; this is the term of PaLM's MFU (Chowdhery et al. 2022, appendix B, written
    there 12 L H Q T with H Q = d), for attention that computes the whole score matrix."""
    dense = 6 * n_matmul
    attention = 12 * depth * width * length
    return {"dense": float(dense), "attention": float(attention), "total": float(dense + attention)}


def mfu(tokens_per_second: float, flops_per_token: float, peak_flops: float) -> float:
    """Model FLOPs utilisation: the model's FLOPs per second over the peak, a fraction."""
    return tokens_per_second * flops_per_token / peak_flops


# ---------------------------------------------------------------- timing side by side
def fastest_spread(seconds: Sequence[float]) -> float:
    """How far the second-fastest run lies above the fastest, as a fraction of the fastest: how
    well a series reproduces its fastest run. 0 for fewer than two runs."""
    ordered = sorted(seconds)
    return ordered[1] / ordered[0] - 1 if len(ordered) >= 2 else 0.0


# ---------------------------------------------------------------- allreduce and overlap
def ring_allreduce_seconds(n: int, message_bytes: float, alpha: float, beta: float) -> float:
    """The alpha-beta model of a ring allreduce (chapters/parameter-server):
    ``2 (n - 1) alpha + 2 (n - 1) / n * m / beta``; zero for one process."""
    if n < 2:
        return 0.0
    return 2 * (n - 1) * alpha + 2 * (n - 1) / n * message_bytes / beta


def fit_alpha_beta(n: int, sizes: Sequence[float], seconds: Sequence[float]):
    """Least-squares alpha (s per ring step, at least 0) and beta (bytes/s) of the ring model
    for ``n`` processes from measured (message bytes, seconds) pairs.

    The fit minimises relative errors. When the joint fit gives a negative alpha, alpha is set
    to 0 and beta is fitted again alone, so that it is the best beta for a model without
    latency rather than the one that went with the negative alpha."""
    import numpy as np

    sizes, seconds = np.asarray(sizes, dtype=float), np.asarray(seconds, dtype=float)
    features = np.stack([np.full_like(sizes, 2 * (n - 1)), 2 * (n - 1) / n * sizes], axis=1)
    # relative errors: divide each row by its time, so small and large messages weigh alike
    scaled = features / seconds[:, None]
    (alpha, inverse_beta), *_ = np.linalg.lstsq(scaled, np.ones_like(seconds), rcond=None)
    if alpha < 0:
        # alpha = 0: minimise sum((c x_i - 1)^2) over c = 1/beta alone, x_i the bandwidth column
        column = scaled[:, 1]
        alpha, inverse_beta = 0.0, float(column.sum() / (column**2).sum())
    return float(alpha), (1 / float(inverse_beta) if inverse_beta > 0 else math.inf)


def min_tokens_to_hide(allreduce_seconds: float, backward_flops_per_token: float,
                       flops_per_second: float) -> float:
    """Tokens per device whose backward pass lasts as long as the allreduce: from this many
    on, the allreduce can run entirely under the backward pass."""
    return allreduce_seconds * flops_per_second / backward_flops_per_token


def bandwidth_to_hide(n: int, message_bytes: float, backward_seconds: float,
                      alpha: float = 0.0) -> float:
    """The bandwidth beta (bytes/s) at which the ring allreduce takes exactly
    ``backward_seconds``; infinite when the latency alone takes that long."""
    left = backward_seconds - 2 * (n - 1) * alpha
    if n < 2:
        return 0.0
    return math.inf if left <= 0 else 2 * (n - 1) / n * message_bytes / left


def allreduce_timing_job(rank: int, world_size: int, numels: Sequence[int],
                         repeat: int = 5, warmup: int = 1) -> Optional[List[dict]]:
    """Time ``dist.all_reduce`` of float32 vectors of each length (on this process's GPU under
    NCCL, else on the CPU); rank 0 returns {numel, bytes, min_s}, the others None."""
    from .distributed import _timed, _timing_device

    device = _timing_device()
    records = []
    for numel in numels:
        data = torch.ones(numel, dtype=torch.float32, device=device)
        times = _timed(lambda: dist.all_reduce(data), None, repeat, warmup)
        records.append({"numel": numel, "bytes": numel * 4, "min_s": min(times)})
    return records if rank == 0 else None


# ---------------------------------------------------------------- the CUDA caching allocator
def snapshot_summary(snapshot: dict) -> Dict[str, float]:
    """What a ``torch.cuda.memory._snapshot()`` says about the caching allocator.

    ``reserved`` is what the segments (memory obtained from CUDA) hold, ``allocated`` what
    live tensors' blocks hold (state ``active_allocated``), ``cached_free`` the difference
    (blocks the allocator keeps for reuse, or that are waiting to be freed), and
    ``largest_free`` the largest single block not allocated: a request larger than it needs
    a new segment even when ``cached_free`` is larger. ``events`` counts the recorded
    allocation history (zero when history was not recorded)."""
    segments = snapshot.get("segments", [])
    blocks = [block for segment in segments for block in segment.get("blocks", [])]
    reserved = sum(segment["total_size"] for segment in segments)
    allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
    free = [b["size"] for b in blocks if b["state"] != "active_allocated"]
    events = sum(len(trace) for trace in snapshot.get("device_traces", []))
    return {"segments": len(segments), "blocks": len(blocks), "reserved": reserved,
            "allocated": allocated, "cached_free": reserved - allocated,
            "free_blocks": len(free), "largest_free": max(free, default=0), "events": events}


def varying_workload(device, width: int = 1024, sizes: Sequence[int] = (), seed: int = 0):
    """Forward and backward passes of a four-layer MLP over batches whose number of rows
    changes from step to step, as the sequences of a language model's batches do; the
    tensors' sizes change with it, which is what fragments a caching allocator."""
    torch.manual_seed(seed)
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(4)]).to(device)
    for rows in sizes:
        x = torch.randn(rows, width, device=device)
        model(x).square().mean().backward()
    model.zero_grad(set_to_none=True)


PROBE_ORDERS = ("random", "growing", "shrinking")


def probe_sizes(steps: int = 40, low: int = 256, high: int = 16384, seed: int = 0,
                order: str = "random") -> List[int]:
    """Row counts for :func:`varying_workload`: multiples of 256 drawn at random (seeded), in
    the order drawn (``"random"``), sorted from small to large (``"growing"``) or from large to
    small (``"shrinking"``)."""
    if order not in PROBE_ORDERS:
        raise ValueError(f"order must be one of {PROBE_ORDERS}, not {order!r}")
    generator = torch.Generator().manual_seed(seed)
    sizes = [256 * int(k) for k in torch.randint(low // 256, high // 256 + 1, (steps,),
                                                 generator=generator)]
    return sizes if order == "random" else sorted(sizes, reverse=order == "shrinking")


def allocator_probe(steps: int = 40, order: str = "random") -> dict:
    """Run :func:`varying_workload` on the GPU, with the sizes of :func:`probe_sizes` in the
    given ``order``, and report the allocator's peaks: the most bytes tensors held, the most
    the allocator reserved from CUDA, and how often it had to free its cache and retry.
    ``{"cuda": False}`` where there is no GPU."""
    sizes = probe_sizes(steps, order=order)  # checks the order on any machine
    if not torch.cuda.is_available():
        return {"cuda": False}
    device = torch.device("cuda")
    torch.cuda.reset_peak_memory_stats(device)
    varying_workload(device, sizes=sizes)
    torch.cuda.synchronize(device)
    stats = torch.cuda.memory_stats(device)
    return {"cuda": True, "setting": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""), "order": order,
            "peak_allocated": torch.cuda.max_memory_allocated(device),
            "peak_reserved": torch.cuda.max_memory_reserved(device),
            "reserved_end": torch.cuda.memory_reserved(device),
            "retries": stats.get("num_alloc_retries", 0),
            "segments_made": stats.get("segment.all.allocated", 0)}


def allocator_probe_in_subprocess(alloc_conf: Optional[str], steps: int = 40,
                                  timeout: float = 300, order: str = "random") -> dict:
    """:func:`allocator_probe` in a fresh Python process with ``PYTORCH_CUDA_ALLOC_CONF`` set to
    ``alloc_conf`` (unset for None). The allocator reads the variable when it starts, and a
    fresh process also starts with an empty cache, so that one probe cannot inherit the
    segments of another."""
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if alloc_conf is not None:
        env["PYTORCH_CUDA_ALLOC_CONF"] = alloc_conf
    done = subprocess.run([sys.executable, "-m", "dlperf.utilization", "allocator-probe",
                           str(steps), order], env=env, capture_output=True, text=True, timeout=timeout,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- small float formats
@dataclass(frozen=True)
class FloatFormat:
    """A binary floating-point format from its layout: 1 sign bit, ``exponent`` bits with a
    ``bias``, ``mantissa`` bits. ``ieee``: the top exponent is kept for inf and NaN (E5M2,
    float16). Otherwise (E4M3 "fn", finite and NaN-only) only the all-ones pattern is NaN, and
    the top exponent carries numbers too."""
    name: str
    exponent: int
    mantissa: int
    bias: int
    ieee: bool

    @property
    def bits(self) -> int:
        return 1 + self.exponent + self.mantissa

    @property
    def max(self) -> float:
        top = 2**self.exponent - 1  # the all-ones exponent
        if self.ieee:  # the largest normal number has the exponent below it, all mantissa bits
            return (2 - 2.0**-self.mantissa) * 2.0 ** (top - 1 - self.bias)
        # all-ones exponent with all-ones mantissa is NaN: the largest mantissa is one less
        return (2 - 2 * 2.0**-self.mantissa) * 2.0 ** (top - self.bias)

    @property
    def smallest_normal(self) -> float:
        return 2.0 ** (1 - self.bias)

    @property
    def smallest_subnormal(self) -> float:
        return 2.0 ** (1 - self.bias - self.mantissa)

    @property
    def eps(self) -> float:
        """The gap between 1 and the next number: 2^-mantissa."""
        return 2.0**-self.mantissa


E4M3 = FloatFormat("E4M3", exponent=4, mantissa=3, bias=7, ieee=False)
E5M2 = FloatFormat("E5M2", exponent=5, mantissa=2, bias=15, ieee=True)


def scaled_roundtrip(x: torch.Tensor, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    """``x`` multiplied by ``scale``, rounded to ``dtype``, converted back and divided by
    ``scale``: what per-tensor scaling does to the values."""
    return (x * scale).to(dtype).to(x.dtype) / scale


def amax_scale(x: torch.Tensor, fmt_max: float) -> float:
    """The per-tensor scale that maps the largest magnitude of ``x`` onto the format's max."""
    return float(fmt_max / x.abs().max())


def _main(argv: Sequence[str]) -> int:
    if len(argv) >= 1 and argv[0] == "allocator-probe":
        steps = int(argv[1]) if len(argv) > 1 else 40
        order = argv[2] if len(argv) > 2 else "random"
        print(json.dumps(allocator_probe(steps, order)))
        return 0
    print("usage: python -m dlperf.utilization allocator-probe [STEPS [random|growing|shrinking]]",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
