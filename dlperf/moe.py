"""Mixture of experts: routing, capacity, load balancing and expert parallelism.

The helpers of the mixture-of-experts chapter. ``MoELayer`` routes each token to
its ``top_k`` experts (a linear router and a softmax), keeps at most ``capacity``
tokens per expert and adds the chosen experts' outputs weighted by their gates;
``dense_reference`` computes the same thing the slow way, every expert on every token.
``load_balancing_loss`` is the Switch Transformer's auxiliary loss.
``ExpertParallelMoE`` shares a layer's experts out over the processes of a
``torch.distributed`` group and moves the tokens to them and back with two
all-to-alls, counting the bytes each one sends.
"""
from __future__ import annotations

import copy
import math
import statistics
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F


def expert_capacity(tokens: int, experts: int, top_k: int,
                    capacity_factor: float) -> int:
    """Tokens one expert takes: ceil(capacity_factor * tokens * top_k / experts)."""
    if capacity_factor <= 0:
        raise ValueError(f"capacity_factor must be positive, got {capacity_factor}")
    return math.ceil(capacity_factor * tokens * top_k / experts)


class ExpertMLP(nn.Module):
    """One expert: the feed-forward block of a transformer, width -> hidden -> width."""

    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.up = nn.Linear(width, hidden)
        self.down = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


@dataclass
class Routing:
    """Where a router sent ``T`` tokens: the softmax over experts (T, E), the ``top_k``
    experts chosen for each token and their gates (T, k), and which of those choices fit
    in their expert's ``capacity`` (T, k)."""
    probs: torch.Tensor
    experts: torch.Tensor
    gates: torch.Tensor
    kept: torch.Tensor
    capacity: int

    @property
    def load(self) -> torch.Tensor:
        """Tokens routed to each expert, before any were dropped."""
        return torch.bincount(self.experts.reshape(-1), minlength=self.probs.shape[-1])

    @property
    def dropped_fraction(self) -> float:
        """The share of (token, expert) choices dropped for lack of capacity."""
        return 1.0 - float(self.kept.float().mean())


def route(logits: torch.Tensor, top_k: int, capacity: int) -> Routing:
    """Top-k routing with a capacity per expert.

    Every token's first choices queue before any second choice, in token order, so
    that an expert over capacity drops the choices that came last.
    """
    tokens, experts = logits.shape
    probs = logits.softmax(dim=-1)
    gates, chosen = probs.topk(top_k, dim=-1)
    queue = chosen.t().reshape(-1)  # first choices of all tokens, then second choices
    arrivals = F.one_hot(queue, experts).cumsum(dim=0)
    place = arrivals.gather(1, queue[:, None]).squeeze(1) - 1  # position in its queue
    kept = (place < capacity).view(top_k, tokens).t()
    return Routing(probs, chosen, gates, kept, capacity)


def route_tokens(router: nn.Module, tokens: torch.Tensor, experts: int, top_k: int,
                 capacity_factor: float) -> Routing:
    """Route ``tokens`` (T, width) with ``router`` to ``top_k`` of ``experts``, at the
    capacity ``capacity_factor`` gives for T tokens."""
    capacity = expert_capacity(len(tokens), experts, top_k, capacity_factor)
    return route(router(tokens), top_k, capacity)


def kept_by_expert(routing: Routing):
    """The kept choices as (token, choice, expert) index tensors, sorted by expert
    (stably, so each expert's tokens stay in token order): expert 0's first."""
    token, choice = routing.kept.nonzero(as_tuple=True)
    expert = routing.experts[token, choice]
    order = expert.argsort(stable=True)
    return token[order], choice[order], expert[order]


def load_balancing_loss(routing: Routing, alpha: float) -> torch.Tensor:
    """Switch Transformer's auxiliary loss, alpha * E * sum_i f_i * P_i.

    f_i is the share of the routed choices that went to expert i (counted before any
    are dropped; no gradient flows through a count), P_i the mean router probability of
    expert i. Both are 1/E when the load is even, and the loss is then alpha.
    """
    experts = routing.probs.shape[-1]
    share = routing.load.to(routing.probs.dtype) / routing.experts.numel()
    mean_prob = routing.probs.mean(dim=0)
    return alpha * experts * (share * mean_prob).sum()


def apply_experts(x: torch.Tensor, routing: Routing,
                  experts: Sequence[nn.Module]) -> torch.Tensor:
    """Run each expert on the tokens it kept, and add its outputs, times their gates,
    to those tokens' rows. A choice that was dropped adds nothing."""
    token, choice, expert = kept_by_expert(routing)
    counts = torch.bincount(expert, minlength=len(experts)).tolist()
    chunks = x[token].split(counts)
    outputs = torch.cat([mlp(chunk) for mlp, chunk in zip(experts, chunks)])
    weighted = outputs * routing.gates[token, choice].unsqueeze(1)
    return torch.zeros_like(x).index_add(0, token, weighted)


class MoELayer(nn.Module):
    """A mixture-of-experts feed-forward layer: ``experts`` MLPs, each token sent to
    its ``top_k`` best by a linear router, at most ``capacity_factor * T * k / E``
    tokens per expert. After a forward pass, ``aux_loss`` holds the load-balancing
    loss and ``last_routing`` the routing."""

    def __init__(self, width: int, hidden: int, experts: int, top_k: int = 2,
                 capacity_factor: float = 1.25, aux_alpha: float = 0.01):
        super().__init__()
        if not 1 <= top_k <= experts:
            raise ValueError(f"top_k must be between 1 and experts={experts}, "
                             f"got {top_k}")
        self.width, self.top_k = width, top_k
        self.capacity_factor, self.aux_alpha = capacity_factor, aux_alpha
        self.router = nn.Linear(width, experts, bias=False)
        self.experts = nn.ModuleList(ExpertMLP(width, hidden) for _ in range(experts))
        self.aux_loss: Optional[torch.Tensor] = None
        self.last_routing: Optional[Routing] = None

    @property
    def num_experts(self) -> int:
        return len(self.experts)

    def route(self, tokens: torch.Tensor) -> Routing:
        return route_tokens(self.router, tokens, self.num_experts, self.top_k,
                            self.capacity_factor)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, self.width)
        routing = self.route(tokens)
        self.last_routing = routing
        self.aux_loss = load_balancing_loss(routing, self.aux_alpha)
        return apply_experts(tokens, routing, self.experts).view_as(x)


def dense_reference(layer: MoELayer, x: torch.Tensor) -> torch.Tensor:
    """What ``layer(x)`` computes, the slow way: every expert on every token, each
    output weighted by its gate where the expert was chosen and kept, by zero
    elsewhere."""
    tokens = x.reshape(-1, layer.width)
    routing = layer.route(tokens)
    weights = torch.zeros_like(routing.probs).scatter(
        1, routing.experts, routing.gates * routing.kept)
    out = torch.zeros_like(tokens)
    for index, expert in enumerate(layer.experts):
        out = out + weights[:, index:index + 1] * expert(tokens)
    return out.view_as(x)


def dropped_by_overflow(load: torch.Tensor, capacity: int) -> int:
    """Choices an expert must drop: whatever its load exceeds its capacity by."""
    return int((load - capacity).clamp(min=0).sum())


# ---------------------------------------------------------------- a skewed router
def clustered_task(tokens: int, width: int, clusters: int, seed: int = 0):
    """Synthetic tokens in ``clusters`` groups around a common offset, and targets that
    apply a different random linear map to each group: a task that experts can share
    out. Returns the inputs, the targets and the offset."""
    generator = torch.Generator().manual_seed(seed)
    centers = torch.randn(clusters, width, generator=generator)
    offset = 0.5 * torch.randn(width, generator=generator)
    cluster = torch.randint(0, clusters, (tokens,), generator=generator)
    noise = 0.5 * torch.randn(tokens, width, generator=generator)
    x = offset + centers[cluster] + noise
    maps = torch.randn(clusters, width, width, generator=generator) / math.sqrt(width)
    y = torch.einsum("tw,twv->tv", x, maps[cluster])
    return x, y, offset


def skew_router(layer: MoELayer, offset: torch.Tensor, strength: float = 3.0) -> None:
    """Make the router favour expert 0, and expert 1 half as much, for every token
    near ``offset``: the imbalance of a router early in training."""
    with torch.no_grad():
        direction = offset / offset.norm() ** 2
        layer.router.weight[0] += strength * direction
        layer.router.weight[1] += strength / 2 * direction


def train_with_balance(layer: MoELayer, x: torch.Tensor, y: torch.Tensor, steps: int,
                       lr: float = 1e-2) -> List[dict]:
    """Fit ``layer(x)`` to ``y`` with Adam, the layer's auxiliary loss added to the
    mean squared error; per step, the error, the dropped share and the busiest
    expert's load over the mean load."""
    optimizer = torch.optim.Adam(layer.parameters(), lr=lr)
    history = []
    threads = torch.get_num_threads()
    if x.device.type == "cpu":
        # Tensors this small gain nothing from a second thread, and on a shared
        # machine a thread that waits for a busy core stalls every step.
        torch.set_num_threads(1)
    try:
        for _ in range(steps):
            error = F.mse_loss(layer(x), y)
            optimizer.zero_grad()
            (error + layer.aux_loss).backward()
            optimizer.step()
            load = layer.last_routing.load.float()
            history.append({"error": error.item(),
                            "dropped": layer.last_routing.dropped_fraction,
                            "busiest over mean": float(load.max() / load.mean())})
    finally:
        torch.set_num_threads(threads)
    return history


# ---------------------------------------------------------------- parameters and FLOPs
def moe_transformer_parameters(width: int, layers: int, hidden: int, experts: int,
                               top_k: int, heads: int, kv_heads: int, head_dim: int,
                               vocab: int, gated: bool = True,
                               tied_embeddings: bool = False) -> Dict[str, float]:
    """Parameters of a decoder whose MLPs are mixtures of experts: in all, and those one
    token uses ("active": attention, embeddings, router and top_k experts per layer).
    A gated expert (SwiGLU) has three width x hidden matrices, a plain one two; norms
    count their weights, linear layers have no biases."""
    matrices = 3 if gated else 2
    expert = matrices * width * hidden
    attention = width * head_dim * (2 * heads + 2 * kv_heads)  # q and o, k and v
    router = width * experts
    norms = 2 * width
    embeddings = vocab * width * (1 if tied_embeddings else 2)
    shared = layers * (attention + router + norms) + embeddings + width  # final norm
    return {"total": shared + layers * experts * expert,
            "active": shared + layers * top_k * expert,
            "experts": layers * experts * expert}


def mlp_flops_per_token(width: int, hidden: int, experts: int = 1, top_k: int = 1,
                        gated: bool = False) -> int:
    """Forward FLOPs of one token through a feed-forward layer: 2 per multiply-add of
    the top_k experts it runs, and of the router when there is more than one expert."""
    matrices = 3 if gated else 2
    router = 2 * width * experts if experts > 1 else 0
    return 2 * top_k * matrices * width * hidden + router


# ---------------------------------------------------------------- expert parallelism
class _AllToAll(torch.autograd.Function):
    """``dist.all_to_all_single`` with split sizes, and its backward pass: the same
    exchange run the other way. Each call appends what this rank sent to ``log``."""

    @staticmethod
    def forward(ctx, x, send_splits, recv_splits, group, log):
        ctx.splits, ctx.group, ctx.log = (send_splits, recv_splits), group, log
        return exchange(x, send_splits, recv_splits, group, log, "forward")

    @staticmethod
    def backward(ctx, grad):
        send_splits, recv_splits = ctx.splits
        back = exchange(grad, recv_splits, send_splits, ctx.group, ctx.log, "backward")
        return back, None, None, None, None


def exchange(x: torch.Tensor, send_splits: List[int], recv_splits: List[int],
             group=None, log: Optional[list] = None, phase: str = "") -> torch.Tensor:
    """Send ``send_splits[r]`` rows of ``x`` to rank r, in rank order, and receive
    ``recv_splits[r]`` rows from it; with a ``log``, record the bytes that left this
    rank (the rows it keeps for itself are a local copy)."""
    x = x.contiguous()
    out = x.new_empty((sum(recv_splits),) + tuple(x.shape[1:]))
    dist.all_to_all_single(out, x, recv_splits, send_splits, group=group)
    if log is not None:
        row_bytes = x.element_size() * math.prod(x.shape[1:])
        me = dist.get_rank(group)
        log.append({"phase": phase, "bytes sent": row_bytes * (sum(send_splits)
                                                                - send_splits[me]),
                    "rows kept": send_splits[me]})
    return out


class ExpertParallelMoE(nn.Module):
    """A ``MoELayer`` whose experts are shared out over the processes of ``group``:
    rank r holds experts r * E/n to (r + 1) * E/n - 1, every rank the router. Each rank
    routes its own tokens, as the layer would on them alone."""

    def __init__(self, layer: MoELayer, group=None):
        super().__init__()
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        if layer.num_experts % self.world:
            raise ValueError(f"{layer.num_experts} experts cannot be shared evenly "
                             f"over {self.world} processes")
        self.group, self.per_rank = group, layer.num_experts // self.world
        self.width, self.top_k = layer.width, layer.top_k
        self.num_experts = layer.num_experts
        self.capacity_factor = layer.capacity_factor
        first = self.rank * self.per_rank
        self.router = copy.deepcopy(layer.router)
        self.local = nn.ModuleList(copy.deepcopy(layer.experts[first + i])
                                   for i in range(self.per_rank))
        self.log: List[dict] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, self.width)
        routing = route_tokens(self.router, tokens, self.num_experts, self.top_k,
                               self.capacity_factor)
        # sorted by expert, so by the rank that holds it
        token, choice, expert = kept_by_expert(routing)
        # Tell every rank how many rows it gets for each of its experts.
        sending = torch.bincount(expert, minlength=self.num_experts)
        receiving = torch.empty_like(sending)
        dist.all_to_all_single(receiving, sending, group=self.group)
        send_splits = sending.view(self.world, -1).sum(1).tolist()
        recv_splits = receiving.view(self.world, -1).sum(1).tolist()
        arrived = _AllToAll.apply(tokens[token], send_splits, recv_splits, self.group,
                                  self.log)
        computed = self._run_local(arrived, receiving.view(self.world, -1))
        returned = _AllToAll.apply(computed, recv_splits, send_splits, self.group,
                                   self.log)
        weighted = returned * routing.gates[token, choice].unsqueeze(1)
        return torch.zeros_like(tokens).index_add(0, token, weighted).view_as(x)

    def _run_local(self, arrived: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Rows arrive grouped by sender, then by expert; each local expert runs once on
        all of its rows, and the results go back into the order they arrived in."""
        pieces = list(arrived.split(counts.reshape(-1).tolist()))
        for j, expert in enumerate(self.local):
            mine = [pieces[s * self.per_rank + j] for s in range(self.world)]
            results = expert(torch.cat(mine)).split([len(p) for p in mine])
            for s, result in enumerate(results):
                pieces[s * self.per_rank + j] = result
        return torch.cat(pieces)


def remote_rows(routing: Routing, rank: int, world_size: int) -> Dict[str, int]:
    """From a rank's own routing: the kept choices it sends to other ranks' experts."""
    per_rank = routing.probs.shape[-1] // world_size
    owner = routing.experts[routing.kept] // per_rank
    return {"sent": int((owner != rank).sum()), "kept here": int((owner == rank).sum())}


def _inputs(rank: int, tokens: int, width: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 + rank)
    return torch.randn(tokens, width, generator=generator)


def expert_parallel_check(rank: int, world_size: int, config: dict, group=None) -> dict:
    """One forward and backward pass of the expert-parallel layer on this rank's tokens,
    against the single-process layer on the same tokens; the bytes each all-to-all sent;
    and the rows this rank's routing says it sends (the count to check them against)."""
    torch.manual_seed(config.get("seed", 0))  # the same layer on every rank
    layer = MoELayer(config["width"], config["hidden"], config["experts"],
                     config["top_k"], config["capacity_factor"])
    parallel = ExpertParallelMoE(layer, group)
    n, me = parallel.world, parallel.rank
    x = _inputs(me, config["tokens"], config["width"]).requires_grad_()
    upstream = _inputs(100 + me, config["tokens"], config["width"])
    out = parallel(x)
    (out * upstream).sum().backward()
    # The reference: the whole layer in this process, on every rank's tokens in turn.
    inputs = [_inputs(s, config["tokens"], config["width"]).requires_grad_()
              for s in range(n)]
    for s in range(n):
        upstream_s = _inputs(100 + s, config["tokens"], config["width"])
        (layer(inputs[s]) * upstream_s).sum().backward()
    with torch.no_grad():
        expected = layer(x)
    first = me * parallel.per_rank
    grad_diffs = [float((mine.grad - layer.experts[first + i].get_parameter(name).grad)
                        .abs().max())
                  for i, expert in enumerate(parallel.local)
                  for name, mine in expert.named_parameters()]
    grad_diffs.append(float((x.grad - inputs[me].grad).abs().max()))
    return {"rank": me, "output_diff": float((out.detach() - expected).abs().max()),
            "grad_diff": max(grad_diffs), "log": parallel.log,
            "rows": remote_rows(layer.route(x.detach()), me, n),
            "row_bytes": config["width"] * x.element_size()}


# ---------------------------------------------------------------- the all-to-all's cost
def all_to_all_timing(rank: int, group_sizes: Sequence[int],
                      buffer_bytes: Sequence[int], repeat: int = 5,
                      warmup: int = 1) -> List[dict]:
    """Time ``dist.all_to_all_single`` of float32 buffers of each size, equal splits, in
    groups of the first n processes; the slowest rank's time per call (rank 0 keeps the
    records)."""
    from .distributed import _timed

    records = []
    for n in group_sizes:
        group = dist.new_group(list(range(n)))  # every process takes part in making it
        if rank < n:
            for size in buffer_bytes:
                numel = size // 4 // n * n
                send, recv = torch.ones(numel), torch.empty(numel)
                times = _timed(lambda: dist.all_to_all_single(recv, send, group=group),
                               group, repeat, warmup)
                records.append({"processes": n, "buffer bytes": numel * 4,
                                "bytes sent": numel * 4 * (n - 1) // n,
                                "min_s": min(times),
                                "median_s": statistics.median(times)})
        dist.barrier()
    return records


def fit_alpha_beta(bytes_sent: Sequence[float], seconds: Sequence[float]):
    """Fit t = latency + bytes / bandwidth by least squares on the relative error, so
    that small messages count as much as large ones; (latency in s, bandwidth in
    bytes/s)."""
    seconds = np.asarray(seconds, float)
    slope, intercept = np.polyfit(np.asarray(bytes_sent, float), seconds, 1,
                                  w=1 / seconds)
    return float(intercept), float(1 / slope)


def all_to_all_seconds(buffer_bytes: float, processes: int, latency: float,
                       bandwidth: float) -> float:
    """The alpha-beta model of one all-to-all: each process sends (n - 1)/n of its
    buffer over its own link, all at once."""
    return latency + (processes - 1) / processes * buffer_bytes / bandwidth


def page_job(rank: int, world_size: int, config: dict) -> dict:
    """The chapter's launch: the expert-parallel check on all processes, then the timing
    of all-to-alls in groups of each size."""
    check = expert_parallel_check(rank, world_size, config["layer"])
    dist.barrier()
    timing = all_to_all_timing(rank, config["group_sizes"], config["buffer_bytes"],
                               config["repeat"])
    return {"check": check, "timing": timing if rank == 0 else None}
