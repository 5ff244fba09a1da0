"""Choosing a parallel layout: what each way of splitting a training step costs.

The planner of chapters/parallel-layout. For a transformer (:class:`Transformer`) and a
cluster (:class:`Cluster`) it counts, for every layout (:class:`Layout`: data, tensor,
pipeline, context and expert parallel sizes, a ZeRO stage, a micro-batch size and whether
activations are recomputed), the bytes each GPU holds and an estimate of the step time,
and lists the layouts that fit (:func:`plan`).

The estimate is a bound, not a forecast. The matrix products run at a stated share of the
peak, collectives follow the alpha-beta model at the bandwidth the cluster states, and
communication that frameworks overlap with computation is charged only where it outlasts
that computation. Everything the model leaves out (kernel launches, norms and softmax,
imbalance between stages or experts, the optimizer step, stragglers) makes a real step
slower, never faster.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, replace
from typing import Dict, Iterable, List, Optional

import pandas as pd

from .moe import all_to_all_seconds
from . import utilization
from .utilization import ring_allreduce_seconds


# ---------------------------------------------------------------- what is trained, on what
@dataclass(frozen=True)
class Transformer:
    """A GPT-style decoder: ``layers`` blocks of width ``width``, a context of ``seq``
    tokens. Its MLP has a hidden size of ``ffn`` (4 times the width unless given), with
    a third matrix if ``gated`` (SwiGLU); its attention has ``kv_heads`` key and value
    heads (``heads`` unless given: grouped-query attention when fewer). ``experts > 1``
    makes every block's MLP a mixture of ``experts`` MLPs of which each token uses
    ``top_k``."""
    name: str
    layers: int
    width: int
    heads: int
    seq: int
    vocab: int
    experts: int = 1
    top_k: int = 1
    tied_embeddings: bool = True  # the output layer reuses the token embedding
    kv_heads: int = 0
    ffn: int = 0
    gated: bool = False
    learned_positions: bool = True  # a table of position embeddings (not RoPE)

    @property
    def kv_share(self) -> float:
        """Key and value heads over query heads: 1 for multi-head attention."""
        return (self.kv_heads or self.heads) / self.heads

    @property
    def _mlp(self) -> float:
        """Weights of one MLP: 8h^2 for the plain 4h one."""
        return (3 if self.gated else 2) * self.width * (self.ffn or 4 * self.width)

    def _per_layer(self, mlps: int) -> float:
        h = self.width
        router = h * self.experts if self.experts > 1 else 0
        # attention 4h^2 (less with fewer key and value heads), each MLP 8h^2, biases and
        # norms 13h (Narayanan et al. 2021, eq. 2)
        attention = 2 * h * h + 2 * h * h * self.kv_share
        return attention + self._mlp * mlps + 13 * h + router

    @property
    def parameters(self) -> float:
        """All parameters: the blocks and the token and position embeddings, and the
        output layer's unless it is the token embedding."""
        return self.layers * self._per_layer(self.experts) + self._embeddings

    @property
    def expert_parameters(self) -> float:
        """The parameters of the MLPs that expert parallelism spreads out (0 if dense)."""
        if self.experts == 1:
            return 0.0
        return self.layers * self._mlp * self.experts

    @property
    def active_parameters(self) -> float:
        """Parameters one token's forward pass uses: ``top_k`` of the experts."""
        return self.layers * self._per_layer(self.top_k) + self._embeddings

    @property
    def _embeddings(self) -> float:
        tables = 1 if self.tied_embeddings else 2
        positions = self.seq if self.learned_positions else 0
        return (tables * self.vocab + positions) * self.width

    def flops_per_token(self, recompute: bool = False) -> float:
        """Matrix-product FLOPs of one training step, per token: forward, backward (twice the
        forward) and, with ``recompute``, the blocks' forward once more. Attention scores and
        weighted values cost 4sh per layer forward; the output layer 2hV. For a dense model
        this is Narayanan et al.'s eq. 3 divided by the tokens, 96 l h^2 (1 + s/6h +
        V/16lh) with recomputation, 72 l h^2 (1 + s/6h + V/12lh) without."""
        h = self.width
        block = 2 * (self._per_layer(self.top_k) - 13 * h) + 4 * self.seq * h
        passes = 4 if recompute else 3
        return self.layers * block * passes + 3 * 2 * h * self.vocab


@dataclass(frozen=True)
class Precision:
    """Bytes per parameter of the weights, the gradients and the optimizer's state, and
    bytes per activation value. The default is mixed precision with Adam: 16-bit weights
    and gradients, and float32 master weights, momentum and variance (Rajbhandari et al.
    2020, section 3.1: 2 + 2 + 12 bytes)."""
    weights: int = 2
    grads: int = 2
    optimizer: int = 12
    activation: int = 2


MIXED_ADAM = Precision()
FLOAT32_ADAM = Precision(weights=4, grads=4, optimizer=8, activation=4)


@dataclass(frozen=True)
class Cluster:
    """Identical GPUs in nodes of ``gpus_per_node``. Bandwidths are per GPU and direction,
    as a collective's *bus bandwidth* (nccl-tests); ``latency`` is the alpha of one step of
    a ring. ``efficiency`` is the share of ``peak_flops`` that large matrix products reach.
    """
    name: str
    gpus: int
    gpus_per_node: int
    memory: float  # bytes per GPU
    peak_flops: float
    intra_node: float  # bytes/s
    inter_node: float  # bytes/s
    latency: float = 10e-6
    efficiency: float = 1.0
    headroom: float = 0.1  # memory kept back for the framework, the allocator and buffers

    def bandwidth(self, size: int, stride: int) -> float:
        """The bandwidth of a group of ``size`` GPUs ``stride`` apart: the node's links if
        the group lies within one node, the network otherwise."""
        return self.intra_node if size * stride <= self.gpus_per_node else self.inter_node


@dataclass(frozen=True)
class Layout:
    """How ``dp * tp * pp * cp`` GPUs split a step. Ranks are numbered tensor-parallel
    first (neighbours share a node), then context, data and pipeline parallel; the ``ep``
    expert-parallel ranks are taken from the data-parallel ones."""
    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    zero: int = 0
    micro_batch: int = 1
    recompute: bool = False
    virtual_stages: int = 1  # interleaved 1F1B: this many chunks of blocks per GPU

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    def label(self) -> str:
        parts = [f"{name.upper()} {size}" for name, size in
                 (("dp", self.dp), ("tp", self.tp), ("pp", self.pp), ("cp", self.cp),
                  ("ep", self.ep)) if size > 1]
        if self.zero:
            parts.append(f"ZeRO-{self.zero}")
        return ", ".join(parts) or "one GPU"


# ---------------------------------------------------------------- memory
def stage_blocks(model: Transformer, stages: int) -> int:
    """Blocks on the busiest pipeline stage: the layers shared out as evenly as whole
    blocks allow."""
    return math.ceil(model.layers / stages)


def activation_bytes(model: Transformer, layout: Layout, precision: Precision = MIXED_ADAM
                     ) -> float:
    """Activations one block keeps for its backward pass, per micro-batch on one GPU
    (Korthikanti et al. 2023: sbh (34 + 5as/h) bytes with 16-bit values: 4 for the norms,
    11 for attention, 19 for the MLP). Attention is taken to be fused, so the 5as/h of
    score matrices is never stored; fewer key and value heads shrink their 4 of the 11;
    the MLP's 16 in its hidden layer scale with its size and by 3/2 if gated, and a
    mixture keeps them once per chosen expert. Tensor parallelism runs with sequence
    parallelism, so every term is split ``tp`` ways; context parallelism splits s. With
    ``recompute`` a block keeps only its input."""
    s = model.seq / layout.cp
    sbh = s * layout.micro_batch * model.width * precision.activation / 2
    if layout.recompute:
        return 2 * sbh / layout.tp
    hidden = 16 * (model.ffn or 4 * model.width) / (4 * model.width)
    mlp = 3 + hidden * (1.5 if model.gated else 1)
    attention = 7 + 4 * model.kv_share
    return (4 + attention + mlp * model.top_k) * sbh / layout.tp


def state_bytes(parameters: float, shards: int, zero: int, precision: Precision) -> float:
    """Weights, gradients and optimizer state of ``parameters`` with ZeRO stage ``zero``
    over ``shards`` data-parallel copies (Rajbhandari et al. 2020, figure 1)."""
    w, g, o = precision.weights, precision.grads, precision.optimizer
    sharded = {0: 0, 1: o, 2: g + o, 3: w + g + o}[zero]
    return parameters * ((w + g + o - sharded) + sharded / shards)


def memory_per_gpu(model: Transformer, layout: Layout, batch: int,
                   precision: Precision = MIXED_ADAM) -> Dict[str, float]:
    """Bytes on the busiest GPU, the first pipeline stage: model states and
    activations."""
    split = layout.tp * layout.pp
    dense = (model.parameters - model.expert_parameters) / split
    experts = model.expert_parameters / (split * layout.ep)
    copies = layout.dp * layout.cp  # ZeRO shards over every rank that holds a copy
    states = (state_bytes(dense, copies, layout.zero, precision)
              + state_bytes(experts, copies // layout.ep, layout.zero, precision))
    micro = batch // (layout.dp * layout.micro_batch)
    in_flight = min(layout.pp, micro)  # 1F1B: the first stage holds pp micro-batches
    per_block = activation_bytes(model, layout, precision)
    activations = stage_blocks(model, layout.pp) * per_block * in_flight
    if layout.recompute:  # the block being recomputed holds all of its activations
        whole = replace(layout, recompute=False)
        activations += activation_bytes(model, whole, precision)
    return {"states": states, "activations": activations,
            "total": states + activations}


# ---------------------------------------------------------------- time
def _allgather_seconds(n: int, message_bytes: float, alpha: float, beta: float) -> float:
    """A ring all-gather or reduce-scatter: half a ring allreduce."""
    return ring_allreduce_seconds(n, message_bytes, alpha, beta) / 2


def step_time(model: Transformer, layout: Layout, cluster: Cluster, batch: int,
              precision: Precision = MIXED_ADAM) -> Dict[str, float]:
    """Seconds of one step of ``batch`` sequences, split into what adds up to it."""
    tp, cp, dp, pp, ep = layout.tp, layout.cp, layout.dp, layout.pp, layout.ep
    alpha, rate = cluster.latency, cluster.peak_flops * cluster.efficiency
    micro = batch // (dp * layout.micro_batch)
    tokens = layout.micro_batch * model.seq  # of one micro-batch, before cp splits them
    blocks = stage_blocks(model, pp)
    # the busiest stage sets the pace: its share of the blocks, not an even 1/pp
    busiest = blocks * pp / model.layers
    compute = (model.flops_per_token(layout.recompute) * tokens / (tp * pp * cp) / rate
               * busiest)

    # tensor parallel: 2 all-gathers and 2 reduce-scatters of the block's activations
    # forward, as many backward, and 2 more in a recomputed forward; on the critical path
    act = tokens / cp * model.width * precision.activation
    passes = 3 if layout.recompute else 2
    tensor = blocks * passes * 4 * _allgather_seconds(tp, act, alpha, cluster.bandwidth(tp, 1))

    # context parallel: keys and values go round the ring, forward and (with their
    # gradients) backward; it overlaps the attention's own arithmetic
    kv = 2 * tokens / cp * model.width * model.kv_share / tp * precision.activation
    ring = 3 * (cp - 1) * (alpha + kv / cluster.bandwidth(cp, tp))
    attention = 3 * 4 * model.seq * model.width * tokens / cp / tp / rate
    context = blocks * max(0.0, ring - attention)

    # expert parallel: two all-to-alls forward, two backward, of each token's chosen copies
    routed = tokens / cp / tp * model.top_k * model.width * precision.activation
    link = cluster.bandwidth(ep, tp * cp)
    experts = (blocks * 4 * all_to_all_seconds(routed, ep, alpha, link)
               if model.experts > 1 and ep > 1 else 0.0)

    # pipeline: each stage boundary passes activations forward and their gradient back
    boundary = act / tp
    v = layout.virtual_stages  # a micro-batch crosses v times as many boundaries
    hop = (2 * v * (alpha + boundary / cluster.bandwidth(2, tp * cp * dp))
           if pp > 1 else 0.0)

    stage = compute + tensor + context + experts + hop
    # 1F1B: the bubble is (pp - 1) micro-batch steps, v times fewer when interleaved
    # (Narayanan et al. 2021, section 2.2.2)
    bubble = (pp - 1) / v * stage
    pipeline = micro * stage + bubble

    # data parallel: the gradients of this GPU's parameters are reduced while the last
    # micro-batch's backward pass runs; ZeRO-1 and 2 reduce-scatter them there and gather
    # the updated weights after the optimizer step; ZeRO-3 gathers the weights for every
    # micro-batch, forward and backward, and reduce-scatters its gradients
    shards = dp * cp
    dense = (model.parameters - model.expert_parameters) / (tp * pp)
    grads = dense * precision.grads
    bw = cluster.bandwidth(shards, tp)
    reduce = ring_allreduce_seconds(shards, grads, alpha, bw)
    if model.experts > 1 and shards // ep > 1:
        expert_grads = model.expert_parameters / (tp * pp * ep) * precision.grads
        reduce += ring_allreduce_seconds(shards // ep, expert_grads, alpha, bw)
    if layout.zero == 3:
        weights = dense * precision.weights
        gather = 2 * _allgather_seconds(shards, weights, alpha, bw)
        data = micro * max(0.0, gather + reduce / 2 - compute)
    elif layout.zero:
        data = max(0.0, reduce / 2 - compute * 2 / 3) + reduce / 2 * (
            precision.weights / precision.grads)
    else:
        data = max(0.0, reduce - compute * 2 / 3)
    total = pipeline + data
    return {"compute": micro * compute, "bubble": bubble,
            "tensor": micro * tensor, "context": micro * context, "experts": micro * experts,
            "pipeline p2p": micro * hop, "data": data, "total": total}


def mfu(model: Transformer, cluster: Cluster, batch: int, seconds: float) -> float:
    """Model FLOPs utilisation: the step's FLOPs without recomputation over the peak."""
    return utilization.mfu(batch * model.seq / seconds, model.flops_per_token(),
                           cluster.gpus * cluster.peak_flops)


# ---------------------------------------------------------------- the planner
def _divisors(n: int, cap: Optional[int] = None) -> List[int]:
    return [d for d in range(1, n + 1) if n % d == 0 and (cap is None or d <= cap)]


def why_not(model: Transformer, layout: Layout, cluster: Cluster, batch: int) -> Optional[str]:
    """Why ``layout`` cannot run this model on this cluster, or None if it can."""
    if layout.gpus != cluster.gpus:
        return f"it uses {layout.gpus} GPUs, the cluster has {cluster.gpus}"
    if model.heads % layout.tp:
        return f"{model.heads} heads do not split evenly over tp = {layout.tp}"
    if layout.pp > model.layers:
        return f"{model.layers} layers cannot fill pp = {layout.pp} stages"
    if layout.virtual_stages > stage_blocks(model, layout.pp):
        return (f"{stage_blocks(model, layout.pp)} blocks per stage cannot make "
                f"{layout.virtual_stages} virtual stages")
    if model.seq % layout.cp:
        return f"{model.seq} tokens do not split evenly over cp = {layout.cp}"
    if batch % (layout.dp * layout.micro_batch):
        return (f"{batch} sequences do not split into micro-batches of {layout.micro_batch} "
                f"over dp = {layout.dp}")
    if model.experts % layout.ep or (layout.dp * layout.cp) % layout.ep:
        return f"ep = {layout.ep} must divide the experts and the data-parallel ranks"
    return None


def candidates(model: Transformer, cluster: Cluster, batch: int,
               micro_batches: Iterable[int] = (1, 2, 4, 8)) -> Iterable[Layout]:
    """Every layout the planner considers: tensor parallelism within a node, any split of
    the rest, each ZeRO stage, with and without recomputation."""
    n = cluster.gpus
    node = cluster.gpus_per_node
    for tp in [t for t in _divisors(n, node) if node % t == 0]:
        for pp in _divisors(n // tp):
            for cp in _divisors(n // (tp * pp), 8):
                dp = n // (tp * pp * cp)
                for ep, zero, micro, recompute in itertools.product(
                        _divisors(model.experts), range(4), micro_batches, (False, True)):
                    layout = Layout(dp, tp, pp, cp, ep, zero, micro, recompute)
                    if why_not(model, layout, cluster, batch) is None:
                        yield layout


@dataclass
class Estimate:
    layout: Layout
    memory: Dict[str, float]
    time: Dict[str, float]
    mfu: float
    fits: bool = False


def estimate(model: Transformer, layout: Layout, cluster: Cluster, batch: int,
             precision: Precision = MIXED_ADAM) -> Estimate:
    """Memory, step time and MFU of one layout; raises ValueError if it cannot run."""
    reason = why_not(model, layout, cluster, batch)
    if reason:
        raise ValueError(f"{layout.label()}: {reason}")
    memory = memory_per_gpu(model, layout, batch, precision)
    time = step_time(model, layout, cluster, batch, precision)
    return Estimate(layout, memory, time, mfu(model, cluster, batch, time["total"]),
                    memory["total"] <= cluster.memory * (1 - cluster.headroom))


def plan(model: Transformer, cluster: Cluster, batch: int, precision: Precision = MIXED_ADAM,
         top: Optional[int] = 10, micro_batches: Iterable[int] = (1, 2, 4, 8),
         pareto: bool = True) -> pd.DataFrame:
    """The layouts that fit in memory, fastest estimated step first (the first ``top``).

    With ``pareto`` only those that no other layout beats on both counts: a shorter or
    equal step with less memory, or a shorter step with no more memory."""
    rows = []
    for layout in candidates(model, cluster, batch, micro_batches):
        result = estimate(model, layout, cluster, batch, precision)
        if result.fits:
            rows.append({"layout": layout.label(), **asdict(layout),
                         "GB per GPU": result.memory["total"] / 1e9,
                         "step s": result.time["total"], "MFU %": 100 * result.mfu})
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    table = table.sort_values(["step s", "GB per GPU"], kind="stable").reset_index(drop=True)
    if pareto:  # sorted by step time: keep a row only if it needs less memory than all before
        smallest_so_far = table["GB per GPU"].cummin().shift(fill_value=float("inf"))
        table = table[table["GB per GPU"] < smallest_so_far].reset_index(drop=True)
    return table.head(top) if top else table


# ---------------------------------------------------------------- the page's own small run
def small_run_job(rank: int, world_size: int, config: dict) -> dict:
    """Data parallelism on CPU processes, measured for the planner to predict.

    The processes time allreduces of float32 vectors of ``config["numels"]``, then, in
    turns, a step of :class:`~dlperf.utilization.TinyGPT` (forward and backward) alone,
    with no communication, and the same step under ``DistributedDataParallel``. Every
    process runs each step at once, so each has the core it has in the other. Last they
    take one Adam step, plain and under ``ZeroRedundancyOptimizer`` (ZeRO-1), and each
    returns the bytes of its state. Times are the slowest process's, the fastest of
    ``config["repeat"]`` runs."""
    import copy

    import torch
    import torch.distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    from .distributed import _timed
    from .memory import optimizer_state_bytes
    from .utilization import TinyGPT, lm_loss

    torch.manual_seed(0)  # the same weights everywhere, as DDP requires
    shape = config["model"]
    model = TinyGPT(shape["vocab"], shape["width"], shape["layers"], shape["heads"],
                    shape["seq"])
    generator = torch.Generator().manual_seed(rank)
    tokens = torch.randint(0, shape["vocab"], (config["batch"], shape["seq"] + 1),
                           generator=generator)
    repeat = config["repeat"]

    def step(net):
        net.zero_grad(set_to_none=True)
        lm_loss(net, tokens).backward()

    allreduce = []
    for numel in config["numels"]:
        data = torch.ones(numel)
        times = _timed(lambda: dist.all_reduce(data), None, repeat, 1)
        allreduce.append({"bytes": numel * 4, "seconds": min(times)})

    alone = copy.deepcopy(model)  # a step with no hooks of DDP's on its parameters
    ddp = DistributedDataParallel(model, bucket_cap_mb=config["bucket_mib"])
    alone_times, ddp_times = [], []
    step(alone), step(ddp)
    for _ in range(repeat):  # in turns, so that a slow spell of the machine hits both
        alone_times += _timed(lambda: step(alone), None, 1, 0)
        ddp_times += _timed(lambda: step(ddp), None, 1, 0)

    def state_after_one_step(optimizer) -> int:
        step(ddp)
        optimizer.step()
        states = optimizer_state_bytes(getattr(optimizer, "optim", optimizer))
        return states.get("exp_avg", 0) + states.get("exp_avg_sq", 0)

    adam = state_after_one_step(torch.optim.Adam(model.parameters()))
    zero = state_after_one_step(ZeroRedundancyOptimizer(model.parameters(),
                                                        optimizer_class=torch.optim.Adam))
    return {"rank": rank, "alone_s": min(alone_times), "ddp_s": min(ddp_times),
            "allreduce": allreduce, "adam_bytes": adam, "zero_bytes": zero,
            "parameters": sum(p.numel() for p in model.parameters())}
