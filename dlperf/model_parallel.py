"""Splitting the model itself: tensor, sequence, context and pipeline parallelism.

The page "Beyond Data Parallelism" (chapters/model-parallelism) runs everything here in
processes started by :func:`dlperf.distributed.run_workers`: CPU processes over gloo on a
laptop, one process per GPU over NCCL on a GPU machine.

* Tensor parallelism of a feed-forward block as Megatron-LM builds it (Shoeybi et al.,
  2019): a :class:`ColumnParallelLinear` then a :class:`RowParallelLinear`, joined by the
  two autograd functions of the paper, an identity whose backward pass is an allreduce
  (:func:`copy_to_group`) and an allreduce whose backward pass is an identity
  (:func:`reduce_from_group`). With ``sequence_parallel=True`` the allreduce becomes a
  reduce-scatter and the identity an all-gather over the tokens (Korthikanti et al., MLSys
  2023).
* Context parallelism: :func:`ring_attention`, attention over a sequence whose tokens are
  split over the processes, with the keys and values passed round a ring.
* Pipeline parallelism: the GPipe and 1F1B-with-a-flush schedules (:func:`gpipe_schedule`,
  :func:`one_f_one_b_schedule`), a simulator of their timing (:func:`simulate`) and a
  runner that executes a schedule over stages in processes, its sends and receives posted
  in batches (:func:`p2p_plan`, :func:`run_pipeline`).
* :class:`CommCounter` counts every collective and send of a block, including those that
  DTensor (``parallelize_module``, ``fully_shard``) issues, with the size of its group.
"""
from __future__ import annotations

import math
import time
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from .distributed import OperatorWatch

# ---------------------------------------------------------------- counting communication
# What one process sends per element of a collective's full tensor, with ring algorithms.
RING_SENT = {"allreduce": lambda n: 2 * (n - 1) / n,
             "all-gather": lambda n: (n - 1) / n,
             "reduce-scatter": lambda n: (n - 1) / n,
             "broadcast": lambda n: (n - 1) / n}

# Operator names (the part after the namespace) of the collectives, by kind, and which
# argument holds the full tensor: for an all-gather its output, for a reduce-scatter its input.
_C10D = {"allreduce_": ("allreduce", 0), "allreduce_coalesced_": ("allreduce", 0),
         "_allgather_base_": ("all-gather", 0), "allgather_": ("all-gather", 0),
         "allgather_into_tensor_coalesced_": ("all-gather", 0),
         "_reduce_scatter_base_": ("reduce-scatter", 1), "reduce_scatter_": ("reduce-scatter", 1),
         "reduce_scatter_tensor_coalesced_": ("reduce-scatter", 1),
         "broadcast_": ("broadcast", 0), "send": ("send", 0)}
# Functional collectives (what DTensor calls): the input is the local piece.
_FUNCTIONAL = {"all_reduce": "allreduce", "all_gather_into_tensor": "all-gather",
               "reduce_scatter_tensor": "reduce-scatter", "broadcast": "broadcast"}


def _numel(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel()
    if isinstance(value, (list, tuple)):
        return sum(_numel(v) for v in value)
    return 0


def _group(args: tuple, default: int) -> Tuple[int, Optional[Tuple[int, ...]]]:
    """The size and the global ranks of the process group an operator call names: c10d
    operators take the group as a boxed ``ProcessGroup`` (a TorchScript object), functional
    collectives by its name. ``(default, None)`` when the call names none."""
    def found(group):
        try:
            ranks = tuple(dist.get_process_group_ranks(group))
        except (ValueError, RuntimeError, KeyError):  # a group this process did not register
            ranks = None
        return group.size(), ranks

    for arg in args:
        if isinstance(arg, torch.ScriptObject) and arg._type().name() == "ProcessGroup":
            return found(dist.ProcessGroup.unbox(arg))
        if isinstance(arg, str):
            from torch.distributed.distributed_c10d import _resolve_process_group
            try:
                group = _resolve_process_group(arg)
            except (ValueError, RuntimeError, KeyError):  # a string that names no group
                continue
            return found(group)
    return default, None


def classify(name: str, args: tuple, default_size: int = 1):
    """``(kind, elements of the full tensor, group size, group ranks)`` of a communication
    operator's call, or None for any other operator. ``name`` is the operator's name,
    ``c10d.allreduce_.default`` or ``_c10d_functional.all_reduce.default``; sends count the
    elements sent; the ranks are None where the group cannot be told."""
    namespace, _, rest = name.partition(".")
    op = rest.split(".")[0]
    if namespace == "c10d" and op in _C10D:
        kind, index = _C10D[op]
        return (kind, _numel(args[index]), *_group(args, default_size))
    if namespace == "_c10d_functional" and op in _FUNCTIONAL:
        kind = _FUNCTIONAL[op]
        size, ranks = _group(args, default_size)
        local = _numel(args[0])
        full = local * size if kind == "all-gather" else local
        return kind, full, size, ranks
    return None


class CommCounter(OperatorWatch):
    """Counts the communication of the block: every collective and every send that passes
    through PyTorch's dispatcher, in this thread and in the threads autograd runs the backward
    pass on. ``records`` holds ``(kind, elements, group size)`` per call; elements are those of
    the full tensor (for an all-gather its output, for a reduce-scatter its input, for a send
    what was sent). DTensor's collectives are seen too: for a DTensor operator the counter
    steps aside (returns ``NotImplemented``) so that DTensor turns it into plain operators and
    collectives first, as ``torch.distributed.tensor.debug.CommDebugMode`` does.
    """

    def __init__(self):
        super().__init__()
        self.records: List[tuple] = []
        self._default = 1

    def __enter__(self) -> "CommCounter":
        self._default = dist.get_world_size() if dist.is_initialized() else 1
        return super().__enter__()

    def note(self, func, types, args) -> bool:
        if any(getattr(t, "__name__", "") == "DTensor" for t in types):
            return False
        found = classify(str(func), args, self._default)
        if found is not None:
            self.records.append(found)
        return True

    def calls(self) -> Dict[str, int]:
        out: Dict[str, int] = {}
        for kind, *_ in self.records:
            out[kind] = out.get(kind, 0) + 1
        return out

    def elements(self) -> Dict[str, int]:
        out: Dict[str, int] = {}
        for kind, numel, *_ in self.records:
            out[kind] = out.get(kind, 0) + numel
        return out

    def sent(self) -> float:
        """Elements this process *would* send in the block if every collective ran as a ring
        (:data:`RING_SENT`, each with its own group's size), plus the elements of every send.
        Not a measurement of the wire: it applies the ring formula to the calls counted, and
        gloo and NCCL choose their own algorithms."""
        return sum(numel if kind == "send" else RING_SENT[kind](size) * numel
                   for kind, numel, size, *_ in self.records)


# ---------------------------------------------------------------- tensor parallelism
class _CopyToGroup(torch.autograd.Function):
    """Megatron-LM's f: the identity forward; backward, the gradients of the processes'
    copies of the input are added up (an allreduce)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromGroup(torch.autograd.Function):
    """Megatron-LM's g: forward, the partial outputs are added up (an allreduce);
    backward, the identity, since every process holds the whole sum."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous().clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


# PyTorch 2.14 renamed the single-tensor all-gather and reduce-scatter; older versions have only
# the old names.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _all_gather_rows(x: torch.Tensor, group) -> torch.Tensor:
    n = dist.get_world_size(group)
    out = torch.empty((n * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
    _all_gather_single(out, x.contiguous(), group=group)
    return out


def _reduce_scatter_rows(x: torch.Tensor, group) -> torch.Tensor:
    n = dist.get_world_size(group)
    if x.shape[0] % n:
        raise ValueError(f"{x.shape[0]} rows (tokens) do not split evenly over {n} processes")
    out = torch.empty((x.shape[0] // n, *x.shape[1:]), dtype=x.dtype, device=x.device)
    _reduce_scatter_single(out, x.contiguous(), group=group)
    return out


class _GatherSequence(torch.autograd.Function):
    """Sequence parallelism's entry to a tensor-parallel block: forward, all-gather the
    processes' tokens; backward, reduce-scatter the gradient back to each one's tokens."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _all_gather_rows(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter_rows(grad, ctx.group), None


class _ScatterSequence(torch.autograd.Function):
    """Sequence parallelism's exit: forward, add up the partial outputs and keep only this
    process's tokens (a reduce-scatter); backward, all-gather the gradient."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _reduce_scatter_rows(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather_rows(grad, ctx.group), None


def copy_to_group(x, group=None):
    return _CopyToGroup.apply(x, group)


def reduce_from_group(x, group=None):
    return _ReduceFromGroup.apply(x, group)


def gather_sequence(x, group=None):
    return _GatherSequence.apply(x, group)


def scatter_sequence(x, group=None):
    return _ScatterSequence.apply(x, group)


def shard(tensor: torch.Tensor, dim: int, group=None) -> torch.Tensor:
    """This process's block of ``tensor`` along ``dim`` (equal blocks, in rank order)."""
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    if tensor.shape[dim] % n:
        raise ValueError(f"dimension {dim} of size {tensor.shape[dim]} does not split evenly "
                         f"over {n} processes")
    return tensor.detach().chunk(n, dim=dim)[rank].clone()


class ColumnParallelLinear(nn.Module):
    """This process's block of the output features of ``full`` (a block of the rows of
    its weight and of its bias). Its input is whole on every process; with sequence
    parallelism each process holds only its tokens, and they are all-gathered first."""

    def __init__(self, full: nn.Linear, group=None, sequence_parallel: bool = False):
        super().__init__()
        self.group, self.sequence_parallel = group, sequence_parallel
        self.weight = nn.Parameter(shard(full.weight, 0, group))
        self.bias = nn.Parameter(shard(full.bias, 0, group))

    def forward(self, x):
        if self.sequence_parallel:
            x = gather_sequence(x, self.group)
        else:
            x = copy_to_group(x, self.group)
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """This process's block of the input features of ``full`` (a block of the columns of
    its weight); the partial outputs are added up over the processes, and the bias,
    whole on every process, is added once, after the sum. With sequence parallelism
    the sum is a reduce-scatter and each process keeps its own tokens."""

    def __init__(self, full: nn.Linear, group=None, sequence_parallel: bool = False):
        super().__init__()
        self.group, self.sequence_parallel = group, sequence_parallel
        self.weight = nn.Parameter(shard(full.weight, 1, group))
        self.bias = nn.Parameter(full.bias.detach().clone())

    def forward(self, x):
        partial = F.linear(x, self.weight)
        total = (scatter_sequence(partial, self.group) if self.sequence_parallel
                 else reduce_from_group(partial, self.group))
        return total + self.bias


class Block(nn.Module):
    """A transformer's feed-forward block, pre-norm with a residual connection:
    ``x + down(gelu(up(norm(x))))``, ``up`` widening four times."""

    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


class TensorParallelBlock(nn.Module):
    """:class:`Block` split over ``group`` the Megatron-LM way: ``up`` by columns, ``down`` by
    rows; the norm and the residual are whole on every process. Forward, one allreduce of the
    activations; backward, one allreduce of their gradient.

    With ``sequence_parallel=True`` each process holds only its block of the tokens outside the
    pair: it normalizes and adds the residual for those alone, the allreduces become an
    all-gather before ``up`` and a reduce-scatter after ``down`` (and the other way round in the
    backward pass), and the gradients of the parameters used on a process's tokens only, the
    norm's and ``down``'s bias, are partial sums that must still be added up over the group
    (:meth:`sum_partial_grads`).
    """

    def __init__(self, full: Block, group=None, sequence_parallel: bool = False):
        super().__init__()
        self.group, self.sequence_parallel = group, sequence_parallel
        self.norm = nn.LayerNorm(full.norm.normalized_shape)
        self.norm.load_state_dict(full.norm.state_dict())
        self.up = ColumnParallelLinear(full.up, group, sequence_parallel)
        self.down = RowParallelLinear(full.down, group, sequence_parallel)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))

    def sum_partial_grads(self) -> None:
        if self.sequence_parallel:
            for p in [*self.norm.parameters(), self.down.bias]:
                dist.all_reduce(p.grad, group=self.group)


def tp_traffic(tokens: int, width: int, n: int) -> float:
    """Elements one process sends in one pass (forward or backward) of a tensor-parallel
    :class:`Block` over ``n`` processes, with ring algorithms: one allreduce of the
    ``tokens x width`` activations (or their gradient), ``2(n-1)/n`` of them. Sequence
    parallelism's all-gather and reduce-scatter send ``(n-1)/n`` each: the same."""
    return 2 * (n - 1) / n * tokens * width


def saved_bytes(fn, *args, exclude: Sequence[torch.Tensor] = ()) -> Tuple[object, int]:
    """Run ``fn(*args)`` and count the bytes of the tensors autograd saved for the backward
    pass (each storage once), leaving out those of ``exclude`` (the parameters, say): what the
    forward pass keeps alive until the backward pass. Returns ``(result, bytes)``."""
    seen = {t.untyped_storage().data_ptr() for t in exclude}
    found: Dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in seen:
            found[ptr] = max(found.get(ptr, 0), t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        result = fn(*args)
    return result, sum(found.values())


# ---------------------------------------------------------------- context parallelism
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Plain softmax attention of one head, ``softmax(q k^T / sqrt(d)) v``, no mask."""
    return torch.softmax(q @ k.T / math.sqrt(q.shape[-1]), dim=-1) @ v


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   group=None) -> torch.Tensor:
    """Attention of this process's queries over the keys and values of *all* processes,
    each of which holds one block of the sequence. The key and value blocks travel
    round a ring, ``n - 1`` steps: in each step a process attends to the block it
    holds, sends it to its right neighbour and receives the next from its left one.
    The softmax is computed online (running maximum and sum, as in FlashAttention),
    so no process ever holds more than one remote block.
    """
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    global_rank = ((lambda r: dist.get_global_rank(group, r)) if group is not None
                   else (lambda r: r))
    right, left = global_rank((rank + 1) % n), global_rank((rank - 1) % n)
    scale = 1 / math.sqrt(q.shape[-1])
    top = torch.full((q.shape[0], 1), -math.inf, dtype=q.dtype, device=q.device)
    total = torch.zeros((q.shape[0], 1), dtype=q.dtype, device=q.device)
    out = torch.zeros_like(q)
    # one message per step: keys and values
    block = torch.cat([k, v], dim=1).contiguous()
    d = k.shape[1]
    for step in range(n):
        incoming = None
        requests = []
        if step < n - 1:  # start passing this block on while computing with it
            incoming = torch.empty_like(block)
            # One batch, so that NCCL posts the send and the receive together.
            requests = dist.batch_isend_irecv(
                [dist.P2POp(dist.isend, block, right, group),
                 dist.P2POp(dist.irecv, incoming, left, group)])
        k_j, v_j = block[:, :d], block[:, d:]
        scores = q @ k_j.T * scale
        new_top = torch.maximum(top, scores.max(dim=1, keepdim=True).values)
        rescale = torch.exp(top - new_top)
        weights = torch.exp(scores - new_top)
        total = total * rescale + weights.sum(dim=1, keepdim=True)
        out = out * rescale + weights @ v_j
        top = new_top
        for request in requests:
            request.wait()
        if incoming is not None:
            block = incoming
    return out / total


def ring_attention_traffic(seq: int, head_dim: int, n: int) -> float:
    """Elements one process sends in :func:`ring_attention`: ``n - 1`` blocks of keys and
    values of ``seq / n`` tokens each, ``2 (n-1)/n seq d``: what all-gathering the keys and
    values would send too."""
    return (n - 1) * 2 * (seq / n) * head_dim


# ---------------------------------------------------------------- pipeline parallelism
Op = Tuple[str, int]  # ("F" or "B", micro-batch)


def gpipe_schedule(stages: int, micro: int) -> List[List[Op]]:
    """GPipe (Huang et al., 2019): every stage runs the forward passes of all micro-batches,
    then their backward passes."""
    return [[("F", i) for i in range(micro)] + [("B", i) for i in range(micro)]
            for _ in range(stages)]


def one_f_one_b_schedule(stages: int, micro: int) -> List[List[Op]]:
    """1F1B with a flush (PipeDream-Flush; Narayanan et al., ICML 2021), synchronous:
    every micro-batch of the batch uses the same weights, and the weights change
    after the last backward pass (PipeDream of 2019 was asynchronous, with several
    versions of the weights in flight). Stage ``s`` first runs ``p - s - 1`` forward
    passes (fewer if there are fewer micro-batches), then alternates one forward and
    one backward pass, and ends with the backward passes left."""
    schedule = []
    for s in range(stages):
        warmup = min(stages - s - 1, micro)
        ops: List[Op] = [("F", i) for i in range(warmup)]
        forward, backward = warmup, 0
        while forward < micro:
            ops += [("F", forward), ("B", backward)]
            forward, backward = forward + 1, backward + 1
        ops += [("B", i) for i in range(backward, micro)]
        schedule.append(ops)
    return schedule


SCHEDULES = {"GPipe": gpipe_schedule, "1F1B": one_f_one_b_schedule}


def bubble_fraction(stages: int, micro: int) -> float:
    """The idle share of a pipeline with equal stages, ``(p - 1) / (m + p - 1)``."""
    return (stages - 1) / (micro + stages - 1)


def simulate(schedule: List[List[Op]], forward: Sequence[float], backward: Sequence[float],
             link: float = 0.0) -> List[Tuple[int, str, int, float, float]]:
    """Start and end of every operation when each stage runs its list in order, as soon as its
    input is there: ``F`` of micro-batch ``i`` on stage ``s`` after ``F`` of ``i`` on stage
    ``s - 1``, ``B`` of ``i`` after ``B`` of ``i`` on stage ``s + 1`` (and the stage's own ``F``
    of ``i``), ``link`` seconds later. ``forward[s]`` and ``backward[s]`` are a stage's times.
    Returns ``(stage, kind, micro, start, end)`` records; raises on a schedule that deadlocks."""
    p = len(schedule)
    done: Dict[Tuple[int, str, int], float] = {}
    position = [0] * p
    clock = [0.0] * p
    records = []
    progress = True
    while progress:
        progress = False
        for s in range(p):
            while position[s] < len(schedule[s]):
                kind, i = schedule[s][position[s]]
                needs = [(s - 1, "F", i)] if kind == "F" and s > 0 else []
                if kind == "B":
                    needs = [(s, "F", i)] + ([(s + 1, "B", i)] if s < p - 1 else [])
                if any(need not in done for need in needs):
                    break
                ready = max([clock[s]] + [done[need] + (link if need[0] != s else 0.0)
                                          for need in needs])
                end = ready + (forward[s] if kind == "F" else backward[s])
                done[(s, kind, i)] = clock[s] = end
                records.append((s, kind, i, ready, end))
                position[s] += 1
                progress = True
    if any(position[s] < len(schedule[s]) for s in range(p)):
        raise RuntimeError("the schedule deadlocks: some stage waits for an operation that "
                           "never runs")
    return records


def idle_fraction(records) -> float:
    """Share of the stages' time (from the first start to the last end, times the number of
    stages) in which they ran no operation."""
    stages = {r[0] for r in records}
    span = max(r[4] for r in records) - min(r[3] for r in records)
    busy = sum(r[4] - r[3] for r in records)
    return 1 - busy / (len(stages) * span)


def in_flight(ops: Sequence[Op]) -> int:
    """The most micro-batches whose forward pass a stage has run and whose backward pass it has
    not, at any point of its list: how many sets of activations it must keep at once."""
    live = peak = 0
    for kind, _ in ops:
        live += 1 if kind == "F" else -1
        peak = max(peak, live)
    return peak


Post = Tuple[str, str, int, int]  # ("send" or "recv", "F" or "B", micro-batch, peer stage)


def _recv_of(op: Op, rank: int, world: int) -> Optional[Post]:
    kind, i = op
    if kind == "F" and rank > 0:
        return ("recv", "F", i, rank - 1)  # the activations of micro-batch i
    if kind == "B" and rank < world - 1:
        return ("recv", "B", i, rank + 1)  # the gradient of this stage's output
    return None


def _send_of(op: Op, rank: int, world: int) -> Optional[Post]:
    kind, i = op
    if kind == "F" and rank < world - 1:
        return ("send", "F", i, rank + 1)
    if kind == "B" and rank > 0:
        return ("send", "B", i, rank - 1)
    return None


def p2p_plan(ops: Sequence[Op], rank: int, world: int) -> List[List[List[Post]]]:
    """The transfers stage ``rank`` posts around its list of operations, in batches.

    ``plan[k]`` holds the batches to post before operation ``k`` (for ``k > 0``, just
    after operation ``k - 1``), ``plan[len(ops)]`` those after the last. An operation's
    send and the next operation's receive go in one batch when they are with the same
    neighbour (a forward pass's activations out and a gradient back from the next stage,
    or a gradient out and the next activations in from the stage before), as
    Megatron-LM's ``send_forward_recv_backward`` and ``send_backward_recv_forward`` do:
    each of the two stages then posts the pair together, and neither waits for the other
    to take its send before it posts its receive. Otherwise the send goes first, in a
    batch of its own, then the receive.
    """
    plan: List[List[List[Post]]] = [[] for _ in range(len(ops) + 1)]
    if ops and _recv_of(ops[0], rank, world):
        plan[0].append([_recv_of(ops[0], rank, world)])
    for k, op in enumerate(ops):
        send = _send_of(op, rank, world)
        recv = _recv_of(ops[k + 1], rank, world) if k + 1 < len(ops) else None
        if send and recv and send[3] == recv[3]:
            plan[k + 1].append([send, recv])
        else:
            plan[k + 1] += [[post] for post in (send, recv) if post]
    return plan


def run_pipeline(stage: nn.Module, ops: Sequence[Op], inputs: Sequence[torch.Tensor],
                 targets: Sequence[torch.Tensor], shape: Tuple[int, ...],
                 device: torch.device, group=None):
    """Run this process's list of operations as its stage of a pipeline, one stage per process.

    The first stage reads micro-batch ``i`` from ``inputs``; the others receive it, of shape
    ``shape``, from the stage before; the last stage computes a mean-squared-error loss
    against ``targets[i]`` (divided by the number of micro-batches, so that the gradients add
    up to those of the whole batch) and starts the backward pass; the others receive the
    gradient of their output from the stage after. The transfers are posted as
    :func:`p2p_plan` batches them, with ``dist.batch_isend_irecv``; a stage waits only for what
    it receives, before the operation that needs it.

    Returns the ``(kind, micro, start, end)`` of each operation on ``time.perf_counter``'s
    clock, from the moment its input was there (and the stage's previous operation done) to
    the end of its computation, and the losses of the last stage. On a GPU the host only
    queues work: the times come from CUDA events recorded on the stream, placed on the host's
    clock by one event recorded at the start, and nothing waits for the GPU until the end.
    """
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    peer = (lambda r: dist.get_global_rank(group, r)) if group is not None else (lambda r: r)
    plan = p2p_plan(ops, rank, world)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        origin = torch.cuda.Event(enable_timing=True)
        origin.record()
        origin_time = time.perf_counter()

    def now():
        if not cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    received: Dict[Tuple[str, int], Tuple[torch.Tensor, list]] = {}  # (kind, i) -> (tensor, work)
    in_transit: List[Tuple[torch.Tensor, list]] = []  # what was sent, kept until it has gone

    def post(batches, outgoing: Optional[torch.Tensor] = None) -> None:
        for batch in batches:
            p2p, arrivals = [], []
            for direction, kind, i, neighbour in batch:
                if direction == "send":
                    p2p.append(dist.P2POp(dist.isend, outgoing, peer(neighbour), group))
                else:
                    buffer = torch.empty(shape, device=device)
                    p2p.append(dist.P2POp(dist.irecv, buffer, peer(neighbour), group))
                    arrivals.append(((kind, i), buffer))
            works = dist.batch_isend_irecv(p2p)
            for key, buffer in arrivals:
                received[key] = (buffer, works)
            if outgoing is not None and any(post[0] == "send" for post in batch):
                in_transit.append((outgoing, works))

    def take(key) -> torch.Tensor:
        buffer, works = received.pop(key)
        for work in works:  # on a GPU: the stream waits, the host goes on
            work.wait()
        return buffer

    kept: Dict[int, Tuple[torch.Tensor, torch.Tensor]] = {}  # micro-batch -> (input, output)
    marks, losses = [], []
    m = len(targets)
    post(plan[0])
    for k, (kind, i) in enumerate(ops):
        outgoing = None
        if kind == "F":
            x = inputs[i].to(device) if rank == 0 else take(("F", i)).requires_grad_(True)
            start = now()
            y = stage(x)
            if rank == world - 1:
                y = F.mse_loss(y, targets[i].to(device)) / m
                losses.append(y.detach())
            else:
                outgoing = y.detach().contiguous()
            kept[i] = (x, y)
        else:
            x, y = kept.pop(i)
            grad = None if rank == world - 1 else take(("B", i))
            start = now()
            y.backward(grad)
            if rank > 0:
                outgoing = x.grad.contiguous()
            del x, y
        marks.append((kind, i, start, now()))
        post(plan[k + 1], outgoing)
        in_transit[:] = [(t, works) for t, works in in_transit
                         if not all(work.is_completed() for work in works)]
    for _, works in in_transit:
        for work in works:
            work.wait()
    if cuda:
        torch.cuda.synchronize(device)

        def clock(event):
            return origin_time + origin.elapsed_time(event) / 1e3

        marks = [(kind, i, clock(a), clock(b)) for kind, i, a, b in marks]
    return marks, [float(loss) for loss in losses]


# ---------------------------------------------------------------- worker jobs
def _device(config: dict) -> torch.device:
    if config.get("device", "cpu") == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _randn(*shape, seed: int, device) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(device)


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach() - b.detach()).abs().max())


def _block(width: int, device) -> Block:
    torch.manual_seed(0)  # the same weights on every process
    return Block(width).to(device)


def tensor_parallel_part(config: dict, group=None) -> dict:
    """Tensor and sequence parallelism of one :class:`Block` over ``group``, against the whole
    block on the whole batch: differences, collectives counted by pass, and the activation
    bytes saved for the backward pass."""
    device = _device(config)
    tokens, width = config["tokens"], config["width"]
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    full = _block(width, device)
    x = _randn(tokens, width, seed=1, device=device).requires_grad_(True)
    grad_out = _randn(tokens, width, seed=2, device=device)  # the gradient from above
    y, full_saved = saved_bytes(full, x, exclude=list(full.parameters()))
    y.backward(grad_out)
    out = {"n": n, "full_saved": full_saved}
    for name, sp in (("tensor parallel", False), ("sequence parallel", True)):
        block = TensorParallelBlock(full, group, sequence_parallel=sp)
        mine = shard(x, 0, group) if sp else x.detach().clone()
        mine.requires_grad_(True)
        with CommCounter() as forward:
            y_mine, kept = saved_bytes(block, mine, exclude=list(block.parameters()))
        with CommCounter() as backward:
            y_mine.backward(shard(grad_out, 0, group) if sp else grad_out)
        block.sum_partial_grads()
        want_y = shard(y, 0, group) if sp else y
        want_dx = shard(x.grad, 0, group) if sp else x.grad
        diffs = [_max_diff(y_mine, want_y), _max_diff(mine.grad, want_dx),
                 _max_diff(block.up.weight.grad, shard(full.up.weight.grad, 0, group)),
                 _max_diff(block.up.bias.grad, shard(full.up.bias.grad, 0, group)),
                 _max_diff(block.down.weight.grad, shard(full.down.weight.grad, 1, group)),
                 _max_diff(block.down.bias.grad, full.down.bias.grad),
                 _max_diff(block.norm.weight.grad, full.norm.weight.grad)]
        out[name] = {"max_diff": max(diffs), "saved": kept,
                     "forward": {"calls": forward.calls(), "elements": forward.elements(),
                                 "sent": forward.sent()},
                     "backward": {"calls": backward.calls(), "elements": backward.elements(),
                                  "sent": backward.sent()},
                     "weights": sum(p.numel() for p in (block.up.weight, block.down.weight))}
    out["full weights"] = full.up.weight.numel() + full.down.weight.numel()
    out["rank"] = rank
    return out


def context_parallel_part(config: dict, group=None) -> dict:
    """:func:`ring_attention` over ``group`` against plain attention over the whole sequence."""
    device = _device(config)
    seq, d = config["seq"], config["head_dim"]
    q, k, v = (_randn(seq, d, seed=s, device=device) for s in (3, 4, 5))
    want = shard(attention(q, k, v), 0, group)
    with CommCounter() as counter:
        got = ring_attention(shard(q, 0, group), shard(k, 0, group), shard(v, 0, group), group)
    return {"max_diff": _max_diff(got, want), "calls": counter.calls(),
            "elements": counter.elements(), "sent": counter.sent(),
            "n": dist.get_world_size(group)}


def mesh_part(config: dict) -> dict:
    """A 2-D ``DeviceMesh`` (data x tensor): the groups it made for this process, one training
    step of a :class:`Block` split over the "tp" dimension with its gradients averaged over
    the "dp" dimension, PyTorch's ``parallelize_module`` against the hand-built split, and
    HSDP (``fully_shard`` on a 2-D mesh)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    device = _device(config)
    dp, tp = config["mesh"]
    tokens, width = config["tokens"], config["width"]
    mesh = init_device_mesh(device.type, (dp, tp), mesh_dim_names=("dp", "tp"))
    dp_group, tp_group = mesh["dp"].get_group(), mesh["tp"].get_group()
    coordinate = mesh.get_coordinate()
    out = {"coordinate": tuple(coordinate),
           "dp ranks": dist.get_process_group_ranks(dp_group),
           "tp ranks": dist.get_process_group_ranks(tp_group)}
    # Each data-parallel replica has its own batch; the reference sees all of them.
    full = _block(width, device)
    batches = [_randn(tokens, width, seed=10 + r, device=device) for r in range(dp)]
    grads = [_randn(tokens, width, seed=20 + r, device=device) for r in range(dp)]
    for X, G in zip(batches, grads):
        full(X).backward(G / dp)  # the average over the replicas
    block = TensorParallelBlock(full, tp_group)
    with CommCounter() as tp_counter:
        block(batches[coordinate[0]]).backward(grads[coordinate[0]])
    with CommCounter() as dp_counter:
        for p in block.parameters():
            p.grad /= dp
            dist.all_reduce(p.grad, group=dp_group)
    diffs = [_max_diff(block.up.weight.grad, shard(full.up.weight.grad, 0, tp_group)),
             _max_diff(block.down.weight.grad, shard(full.down.weight.grad, 1, tp_group)),
             _max_diff(block.down.bias.grad, full.down.bias.grad),
             _max_diff(block.norm.weight.grad, full.norm.weight.grad)]
    out["2d"] = {"max_diff": max(diffs), "tp": tp_counter.records, "dp": dp_counter.records,
                 "tp sent": tp_counter.sent(), "dp sent": dp_counter.sent(),
                 "gradient elements": sum(p.numel() for p in block.parameters())}
    # PyTorch's own tensor parallelism on the same mesh dimension.
    theirs = _block(width, device)
    parallelize_module(theirs, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
    x = batches[coordinate[0]]
    x_ours, x_theirs = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    ours = TensorParallelBlock(_block(width, device), tp_group)
    with CommCounter() as ours_counter:
        ours(x_ours).backward(grads[coordinate[0]])
    with CommCounter() as theirs_counter:
        y_theirs = theirs(x_theirs)
        y_theirs.backward(grads[coordinate[0]])
    out["parallelize_module"] = {
        "output_diff": _max_diff(y_theirs, ours(x)),
        "input_grad_diff": _max_diff(x_theirs.grad, x_ours.grad),
        "up_shape": tuple(theirs.up.weight.to_local().shape),
        "ours": ours_counter.records, "theirs": theirs_counter.records}
    # HSDP: replicate over the first dimension, shard over the second.
    hsdp_mesh = init_device_mesh(device.type, (dp, tp), mesh_dim_names=("replicate", "shard"))
    model = _block(width, device)
    total = sum(p.numel() for p in model.parameters())
    fully_shard(model, mesh=hsdp_mesh)
    with CommCounter() as hsdp_counter:
        model(x).backward(grads[coordinate[0]])
    out["hsdp"] = {"local": sum(p.to_local().numel() for p in model.parameters()),
                   "total": total, "records": hsdp_counter.records}
    return out


def page_job(rank: int, world_size: int, config: dict) -> dict:
    """Everything the page runs in its first launch of processes, by part."""
    out = {}
    for part in config["parts"]:
        start = time.perf_counter()
        if part == "tensor":
            out[part] = tensor_parallel_part(config)
        elif part == "context":
            out[part] = context_parallel_part(config)
        elif part == "mesh":
            out[part] = mesh_part(config)
        out[f"{part} seconds"] = time.perf_counter() - start
    out["device"] = str(_device(config))
    return out


def stage_layers(layers: int, stages: int, layers_per_stage: Optional[Sequence[int]] = None
                 ) -> List[range]:
    """The layers of each stage: ``layers_per_stage[s]`` consecutive layers for stage ``s``, or,
    without it, an equal share for each (which needs ``layers`` divisible by ``stages``)."""
    if layers_per_stage is None:
        if layers % stages:
            raise ValueError(f"{layers} layers do not split evenly over {stages} stages: "
                             "give layers_per_stage")
        layers_per_stage = [layers // stages] * stages
    if len(layers_per_stage) != stages or sum(layers_per_stage) != layers:
        raise ValueError(f"layers_per_stage {list(layers_per_stage)} must give each of the "
                         f"{stages} stages its layers, {layers} in all")
    if min(layers_per_stage) < 1:
        raise ValueError("every stage needs at least one layer")
    bounds = [0]
    for count in layers_per_stage:
        bounds.append(bounds[-1] + count)
    return [range(a, b) for a, b in zip(bounds, bounds[1:])]


def _stages(config: dict, device: torch.device) -> Tuple[nn.Sequential, nn.Sequential]:
    """The whole model (a stack of Linear + ReLU layers, the same on every process) and this
    process's stage of it: its consecutive layers by :func:`stage_layers`
    (``config["layers_per_stage"]`` if given, else an equal share)."""
    torch.manual_seed(0)
    width, layers = config["width"], config["layers"]
    model = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.ReLU())
                            for _ in range(layers)]).to(device)
    p, rank = dist.get_world_size(), dist.get_rank()
    mine = stage_layers(layers, p, config.get("layers_per_stage"))[rank]
    stage = nn.Sequential(*[model[i] for i in mine])
    return model, stage


def pipeline_job(rank: int, world_size: int, config: dict) -> dict:
    """Run the pipeline schedules over ``world_size`` stages: timed repeats of each schedule,
    then one run under :class:`dlperf.memory.AllocationPeak`; the gradients of the last run
    are checked against the whole model's on the whole batch."""
    from .memory import AllocationPeak
    device = _device(config)
    m, rows, width = config["micro"], config["micro_batch"], config["width"]
    model, stage = _stages(config, device)
    inputs = [_randn(rows, width, seed=100 + i, device=device) for i in range(m)]
    targets = [_randn(rows, width, seed=200 + i, device=device) for i in range(m)]
    reference = sum(F.mse_loss(model(X), Y) for X, Y in zip(inputs, targets)) / m
    reference.backward()
    want = {id(p): p.grad.detach().clone() for p in stage.parameters()}
    out = {"schedules": {}, "rank": rank}
    for name in config["schedules"]:
        ops = SCHEDULES[name](world_size, m)[rank]
        runs = []
        for _ in range(config["repeat"] + 1):  # the first run warms up
            stage.zero_grad(set_to_none=True)
            dist.barrier()
            records, losses = run_pipeline(stage, ops, inputs, targets, (rows, width), device)
            runs.append(records)
        grad_diff = max(_max_diff(p.grad, want[id(p)]) for p in stage.parameters())
        stage.zero_grad(set_to_none=True)
        dist.barrier()
        with AllocationPeak(device) as peak:
            run_pipeline(stage, ops, inputs, targets, (rows, width), device)
        out["schedules"][name] = {"runs": runs[1:], "grad_diff": grad_diff,
                                  "loss": sum(losses), "peak_bytes": peak.peak_bytes,
                                  "in_flight": in_flight(ops)}
    out["reference_loss"] = float(reference.detach())
    out["micro_batch_bytes"] = rows * width * 4
    return out


def plot_schedule(records, ax=None, title: str = "", unit: str = "ms", scale: float = 1e3):
    """Draw ``(stage, kind, micro, start, end)`` records, one lane per stage: forward passes in
    one colour, backward passes in another, each labelled with its micro-batch; times are
    multiplied by ``scale`` and shifted to start at 0."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 0.6 + 0.45 * len({r[0] for r in records})))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    origin = min(r[3] for r in records)
    for stage, kind, micro, start, end in records:
        left, width = (start - origin) * scale, (end - start) * scale
        ax.barh(stage, width, left=left, height=0.6, color=colors[0 if kind == "F" else 1],
                edgecolor="black", linewidth=0.5)
        ax.text(left + width / 2, stage, str(micro), ha="center", va="center", fontsize=7,
                clip_on=True)
    stages = sorted({r[0] for r in records})
    ax.set_yticks(stages, [f"stage {s}" for s in stages])
    ax.invert_yaxis()
    ax.set_xlabel(f"time ({unit})")
    ax.grid(axis="y", visible=False)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors[0]), plt.Rectangle((0, 0), 1, 1,
                                                                           color=colors[1])]
    ax.legend(handles, ["forward", "backward"], loc="lower right", fontsize=7)
    if title:
        ax.set_title(title)
    return ax


def pipeline_runs(results: Sequence[dict], name: str) -> List[list]:
    """The timed runs of schedule ``name`` from :func:`pipeline_job`'s results (one per stage),
    each as ``(stage, kind, micro, start, end)`` records of all the stages."""
    count = len(results[0]["schedules"][name]["runs"])
    return [[(result["rank"], kind, micro, start, end)
             for result in results
             for kind, micro, start, end in result["schedules"][name]["runs"][run]]
            for run in range(count)]


def stage_times(records) -> Tuple[List[float], List[float]]:
    """Each stage's mean forward and backward time in ``records``: what :func:`simulate` takes."""
    stages = sorted({r[0] for r in records})

    def mean(stage, kind):
        spans = [end - start for s, k, _, start, end in records if s == stage and k == kind]
        return sum(spans) / len(spans)

    return [mean(s, "F") for s in stages], [mean(s, "B") for s in stages]
