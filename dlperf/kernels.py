"""Attention written three ways, the cost of launching an operation, and what torch.compile
does with a function, for the page chapters/attention-kernels.

* :func:`naive_attention` computes softmax(QK^T / sqrt(d)) V as written, keeping the whole
  S x S score matrix; :func:`blockwise_attention` computes the same result a block of keys at
  a time with an *online softmax* (the idea behind FlashAttention), so it never holds more
  than a few block x block tiles of the scores.
* :func:`sdpa_backends` tries each backend of ``scaled_dot_product_attention`` on given inputs
  and reports which ran and why the others refused (:func:`refusal_reason` reads PyTorch's
  warnings for the reason).
* :func:`op_chain` and :func:`cuda_graphed` measure and remove the fixed cost of launching
  many small operations (a CUDA graph replays a recorded sequence of kernels in one launch).
* :func:`explain` and :class:`RecompileLog` read what Dynamo, torch.compile's front end, did:
  how many graphs it made, why it broke them, and why it compiled a function again.
"""
from __future__ import annotations

import logging
import math
import re
from typing import Callable, Dict, List, Optional, Sequence

import torch
from torch.nn import functional as F


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v over the last two
    dimensions, holding all the scores."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., S_q, S_k)
    return torch.softmax(scores, dim=-1) @ v


def blockwise_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        block: int = 64) -> torch.Tensor:
    """The same result as :func:`naive_attention`, a block of queries
    against a block of keys at a time.

    For each block of queries it keeps, per query, the largest score seen so far
    ``m``, the sum of exponentials ``l`` (relative to ``m``) and the weighted sum of
    values ``acc``. A new block of keys may raise the maximum; the old sums are then
    rescaled by exp(m_old - m_new) before the new block's terms are added (the online
    softmax of Milakov and Gimelshein, 2018, as FlashAttention uses it). At the end
    acc / l is the softmax-weighted sum.

    ``m``, ``l`` and ``acc`` are float32 whatever the inputs' dtype, as in
    FlashAttention's kernels: they are sums over the whole row, rescaled again at every
    block, and 16-bit numbers (bfloat16 keeps 8 significant bits) would lose the small
    terms added late. The scores are float32 too, as a GPU's matrix units produce them
    from 16-bit inputs; only the result is cast back to the inputs' dtype.
    """
    if block < 1:
        raise ValueError(f"block must be at least 1, got {block}")
    scale = 1 / math.sqrt(q.shape[-1])
    stats = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
    out = torch.empty(*q.shape[:-1], v.shape[-1], dtype=q.dtype, device=q.device)
    for qs in range(0, q.shape[-2], block):
        qb = q[..., qs:qs + block, :].to(stats) * scale
        m = torch.full(qb.shape[:-1], -math.inf, dtype=stats, device=q.device)
        l = torch.zeros_like(m)
        acc = torch.zeros(*qb.shape[:-1], v.shape[-1], dtype=stats, device=q.device)
        for ks in range(0, k.shape[-2], block):
            # block x block
            s = qb @ k[..., ks:ks + block, :].to(stats).transpose(-2, -1)
            m_new = torch.maximum(m, s.amax(dim=-1))
            p = torch.exp(s - m_new.unsqueeze(-1))
            rescale = torch.exp(m - m_new)  # 0 for the first block, where m is -inf
            l = l * rescale + p.sum(dim=-1)
            acc = acc * rescale.unsqueeze(-1) + p @ v[..., ks:ks + block, :].to(stats)
            m = m_new
        out[..., qs:qs + block, :] = (acc / l.unsqueeze(-1)).to(q.dtype)
    return out


def score_bytes(batch: int, heads: int, seq: int, dtype: torch.dtype = torch.float32) -> int:
    """Bytes of one (batch, heads, seq, seq) matrix of attention scores."""
    return batch * heads * seq * seq * torch.tensor([], dtype=dtype).element_size()


def growth_exponent(sizes: Sequence[float], values: Sequence[float]) -> float:
    """The slope of log(values) against log(sizes), fitted by least squares: about 1 for
    values that grow linearly with the size, about 2 for values that grow as its square."""
    if len(sizes) != len(values) or len(sizes) < 2:
        raise ValueError("growth_exponent needs two or more (size, value) pairs")
    xs = [math.log(s) for s in sizes]
    ys = [math.log(v) for v in values]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return (sum((x - mx) * (y - my) for x, y in zip(xs, ys))
            / sum((x - mx) ** 2 for x in xs))


# The backends a user can ask for; ERROR and OVERRIDEABLE are not kernels of their own.
BACKENDS = ("MATH", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION")


def sdpa_backends(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  reference: Optional[torch.Tensor] = None,
                  **kwargs) -> Dict[str, Dict[str, object]]:
    """Run ``scaled_dot_product_attention`` once under each backend alone.

    Returns, by backend name, ``ran`` (whether it accepted these inputs on this device),
    ``why`` (empty if it ran, else the reason :func:`refusal_reason` finds in PyTorch's
    warnings or, without one, the first line of the error) and, where it ran and a
    ``reference`` output was given, ``max_diff`` (the largest absolute difference from it).
    """
    import warnings

    from torch.nn.attention import SDPBackend, sdpa_kernel

    found = {}
    for name in BACKENDS:
        backend = getattr(SDPBackend, name, None)
        if backend is None:
            found[name] = {"ran": False, "why": "not in this version of PyTorch"}
            continue
        # On CUDA, a call that no allowed backend can take warns why each fused kernel declined
        # before it fails; those warnings are kept here rather than shown.
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            try:
                with sdpa_kernel(backend):
                    out = F.scaled_dot_product_attention(q, k, v, **kwargs)
            except RuntimeError as refused:
                why = refusal_reason(name, [str(w.message) for w in warned], str(refused))
                found[name] = {"ran": False, "why": why}
                continue
        entry = {"ran": True, "why": ""}
        if reference is not None:
            entry["max_diff"] = float((out.float() - reference.float()).abs().max())
        found[name] = entry
    return found


# How select_sdp_backend's warnings head the section of each fused backend, as in
# "Flash attention kernel not used because:"; the spelling of cuDNN varies between versions.
_HEADER = re.compile(r"^(.*?) kernel not used because:?$", re.IGNORECASE)
_HEADER_NAMES = {"EFFICIENT_ATTENTION": "memory efficient", "FLASH_ATTENTION": "flash attention",
                 "CUDNN_ATTENTION": "cudnn attention"}
_TRIGGERED = re.compile(r"\s*\(Triggered internally at .*\)\s*$", re.DOTALL)


def refusal_reason(backend: str, warned: Sequence[str], error: str = "") -> str:
    """Why ``backend`` refused, from the warnings a refused SDPA call gave and its error.

    When no allowed backend takes the inputs, PyTorch's CUDA backend selection warns a header
    for each fused kernel in turn ("Memory efficient kernel not used because:", then flash,
    then cuDNN), each followed by that kernel's failed checks, and raises "No available
    kernel". The reason kept is the checks under ``backend``'s own header, joined by "; ",
    without the "(Triggered internally at ...)" tail that names PyTorch's C++ source line.
    Without such a section (a CPU build warns nothing) it is the first line of ``error``.
    """
    header = _HEADER_NAMES.get(backend)
    section, inside = [], False
    for message in warned:
        text = _TRIGGERED.sub("", message).strip()
        found = _HEADER.match(text)
        if found:
            inside = header is not None and found.group(1).strip().lower() == header
            continue
        if inside and text:
            section.append(_first_line(text))
    return "; ".join(section) if section else _first_line(error)


def op_chain(x: torch.Tensor, n: int) -> torch.Tensor:
    """n small elementwise operations in a row, each its own kernel launch when eager:
    x * 0.5 + 0.25, alternately, which keeps the values bounded."""
    for i in range(n):
        x = x * 0.5 if i % 2 == 0 else x + 0.25
    return x


def cuda_graphed(fn: Callable[[torch.Tensor], torch.Tensor], example: torch.Tensor,
                 warmup: int = 3) -> Callable[[torch.Tensor], torch.Tensor]:
    """``fn`` recorded once into a CUDA graph; the returned function copies its
    argument into the graph's input tensor, replays every recorded kernel with
    one launch and returns the graph's output tensor (the same tensor at every
    call: clone it to keep a result).

    The recording runs ``fn`` on ``example``'s shape, dtype and device: call the result
    with tensors like it. Needs a CUDA device.
    """
    if example.device.type != "cuda":
        raise ValueError("CUDA graphs need a tensor on a CUDA device")
    static_in = example.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    # warm up outside the graph, as the PyTorch docs advise
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn(static_in)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = fn(static_in)

    def replay(x: torch.Tensor) -> torch.Tensor:
        static_in.copy_(x)
        graph.replay()
        return static_out

    return replay


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def _explanation(reason: str) -> str:
    """The "Explanation:" line of a graph-break reason, without its label; "" if none."""
    for line in reason.splitlines():
        if line.strip().startswith("Explanation:"):
            return line.strip()[len("Explanation:"):].strip()
    return ""


def explain(fn: Callable, *args, **kwargs) -> Dict[str, object]:
    """What ``torch._dynamo.explain`` found when it traced ``fn(*args, **kwargs)``: the number
    of graphs and of graph breaks, the operations in the graphs, and for each break the first
    line of its reason and, where the reason has one, its "Explanation:" line.

    ``ops`` counts the nodes of every graph that call something: functions such as
    ``torch.tanh`` and methods such as ``y.sum()`` (``call_function``, ``call_method`` and
    ``call_module`` nodes). ``torch._dynamo.explain``'s own ``op_count`` counts only the
    first kind. Dynamo's warning about each break is not logged (the reasons are returned).
    """
    import torch._dynamo

    graph_breaks = logging.getLogger("torch._dynamo")
    level = graph_breaks.level
    graph_breaks.setLevel(logging.ERROR)
    try:
        found = torch._dynamo.explain(fn)(*args, **kwargs)
    finally:
        graph_breaks.setLevel(level)
    calls = ("call_function", "call_method", "call_module")
    ops = sum(node.op in calls for graph in found.graphs for node in graph.graph.nodes)
    return {"graphs": found.graph_count, "breaks": found.graph_break_count, "ops": ops,
            "reasons": [_first_line(str(r.reason)) for r in found.break_reasons],
            "explanations": [_explanation(str(r.reason)) for r in found.break_reasons]}


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages: List[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


class RecompileLog:
    """What ``TORCH_LOGS="recompiles"`` would print, collected instead of printed.

    Inside the block, each time Dynamo compiles a function again because every graph it kept
    for it had at least one failing guard, the message is kept; ``.recompiles`` counts them
    and ``.guard_failures`` holds the failed guards they name (one line each, such as ``tensor
    'x' size mismatch at index 0. expected 8, actual 16``). The block turns on the
    ``recompiles`` log alone; on exit it is as it was before (on or off), and every other
    log setting is left as it is.
    """

    LOGGER = "torch._dynamo.guards.__recompiles"
    ARTIFACT = "recompiles"
    # "- 0/1: tensor 'x' dtype mismatch..." names cache entry 1 of frame 0; the message's other
    # lines that start with "- " (such as "- User stack trace:") are not guards
    GUARD_LINE = re.compile(r"^- \d+/\d+: (.*)$")

    def __enter__(self) -> "RecompileLog":
        from torch._logging import _internal

        self._state = _internal.log_state  # the settings of TORCH_LOGS and set_logs()
        self._was_on = self._state.is_artifact_enabled(self.ARTIFACT)
        self._state.enable_artifact(self.ARTIFACT)
        self._handler = _Collect()
        self._logger = logging.getLogger(self.LOGGER)
        self._level, self._propagate = self._logger.level, self._logger.propagate
        self._logger.setLevel(logging.DEBUG)
        self._logger.addHandler(self._handler)
        self._logger.propagate = False  # ours only: not to the console
        return self

    def __exit__(self, *exc) -> bool:
        self._logger.removeHandler(self._handler)
        self._logger.setLevel(self._level)
        self._logger.propagate = self._propagate
        if not self._was_on:
            self._state.artifact_names.discard(self.ARTIFACT)
        return False

    @property
    def messages(self) -> List[str]:
        return list(self._handler.messages)

    @property
    def recompiles(self) -> int:
        return len(self._handler.messages)

    @property
    def guard_failures(self) -> List[str]:
        lines = []
        for message in self._handler.messages:
            for line in message.splitlines():
                found = self.GUARD_LINE.match(line.strip())
                if found:
                    # the guard without its cache entry, nor the "# file:line in f" comment
                    # that follows some guards; one that failed for several entries is kept once
                    guard = re.sub(r"\s+#.*$", "", found.group(1)).strip()
                    if guard not in lines:
                        lines.append(guard)
        return lines
