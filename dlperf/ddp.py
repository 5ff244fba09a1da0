"""Inside DistributedDataParallel: gradient buckets, overlap, accumulation and sharding (ZeRO).

The page ``chapters/ddp-internals.md`` runs the jobs at the end of this module in
several processes with :func:`dlperf.distributed.run_workers` (they must live in an
importable module, because the workers import them by name). The rest is plain
bookkeeping that the page and the tests share:

* :func:`assign_buckets` repeats the rule by which DDP packs gradients into buckets,
  so that the page can predict the buckets and check them against what DDP did;
* :func:`overlap_stats` measures, from a profiler trace, how much of the allreduce
  time fell inside the backward pass's computation;
* :func:`zero_bytes_per_parameter` does the memory accounting of ZeRO's three stages,
  and :func:`held_bytes` counts what a process really holds.
"""
from __future__ import annotations

import copy
import os
import time
import warnings
from contextlib import nullcontext
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import nn

from .accelerators import synchronize
from .distributed import OperatorWatch
from .intervals import intersection, subtract, total, union  # noqa: F401 (the chapter's ddp.union)
from .memory import AllocationPeak, optimizer_state_bytes, tensor_bytes

MIB = 1024 * 1024
DEFAULT_BUCKET_CAP_MB = 25  # DDP's default, in MiB (the argument says MB, it means 2**20 bytes)
DEFAULT_FIRST_BUCKET_MB = 1  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES, in MiB


# ---------------------------------------------------------------- the models of the page
def mlp(width: int, depth: int, seed: int = 0) -> nn.Sequential:
    """``depth`` blocks of Linear(width, width) + ReLU, the same on every rank (seeded).

    Equal layers make the buckets easy to predict: every weight has ``width**2``
    floats and every bias ``width``.
    """
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.ReLU())
                            for _ in range(depth)])
    torch.random.set_rng_state(generator_state)
    return model


# ---------------------------------------------------------------- buckets
def bucket_limits(bucket_cap_mb: Optional[float] = None) -> List[int]:
    """The byte limits DDP uses when it builds its buckets (after the first iteration).

    With the default (``bucket_cap_mb=None``) the first bucket is capped at 1 MiB and the
    others at 25 MiB; a bucket size given explicitly applies to every bucket, the first
    included (torch 2.11 to 2.14 behave alike).
    """
    if bucket_cap_mb is None:
        return [DEFAULT_FIRST_BUCKET_MB * MIB, DEFAULT_BUCKET_CAP_MB * MIB]
    cap = int(bucket_cap_mb * MIB)
    return [cap, cap]


def assign_buckets(sizes: Sequence[int], limits: Sequence[int]) -> List[List[int]]:
    """Group tensors of ``sizes`` bytes, in the given order, into buckets as DDP does.

    The rule of DDP's ``compute_bucket_assignment_by_size`` (for one dtype and device):
    tensors are added in order; a bucket is closed as soon as its size reaches its
    limit, and the next bucket gets the next limit of ``limits`` (the last one repeats).
    Returns lists of positions in ``sizes``.
    """
    if not limits:
        raise ValueError("at least one size limit is needed")
    buckets, current, filled, which = [], [], 0, 0
    for index, size in enumerate(sizes):
        current.append(index)
        filled += size
        if filled >= limits[which]:
            buckets.append(current)
            current, filled = [], 0
            which = min(which + 1, len(limits) - 1)
    if current:
        buckets.append(current)
    return buckets


def ready_order(model: nn.Module) -> List[Tuple[str, nn.Parameter]]:
    """The parameters in the order DDP expects their gradients: reverse registration order.

    The backward pass runs the forward pass backwards, so the last layer's gradients come
    first. (DDP checks this guess in the first iteration and rebuilds its buckets in the
    order it really saw.)
    """
    return [(name, p) for name, p in reversed(list(model.named_parameters())) if p.requires_grad]


def predicted_buckets(model: nn.Module, bucket_cap_mb: Optional[float] = None) -> List[List[str]]:
    """Parameter names per bucket, bucket 0 first, as DDP will build them for ``model``."""
    named = ready_order(model)
    sizes = [p.numel() * p.element_size() for _, p in named]
    buckets = assign_buckets(sizes, bucket_limits(bucket_cap_mb))
    return [[named[i][0] for i in bucket] for bucket in buckets]


# ---------------------------------------------------------------- overlap in a trace
# The interval algebra lives in dlperf.intervals; its names stay importable from here because
# the DDP chapter calls them as ddp.union and ddp.subtract.


def overlap_stats(spans: Sequence[Tuple[str, float, float, str]]) -> Dict[str, float]:
    """How much communication ran while the backward pass computed, from ``(kind, start, end,
    name)`` spans whose kind is 'forward', 'backward', 'launch' or 'allreduce'.

    Backward computation is the time of the backward operations less the time the
    computing thread spent in calls that launch collectives ('launch'). ``overlapped`` is
    the allreduce time that coincides with it, ``share`` its fraction of all allreduce
    time, and ``exposed`` the rest of the allreduce time, which nothing hid.
    """
    comm = [(s, e) for kind, s, e, _ in spans if kind == "allreduce"]
    launches = [(s, e) for kind, s, e, _ in spans if kind == "launch"]
    backward = subtract([(s, e) for kind, s, e, _ in spans if kind == "backward"], launches)
    comm_time = total(comm)
    overlapped = intersection(comm, backward)
    return {"allreduce": comm_time, "backward": total(backward), "overlapped": overlapped,
            "share": overlapped / comm_time if comm_time > 0 else 0.0,
            "exposed": comm_time - overlapped, "allreduces": len(comm)}


def step_spans(events, on_gpu: bool) -> List[Tuple[str, float, float, str]]:
    """``(kind, start ms, end ms, name)`` for a DDP step profiled between the record_function
    marks 'ddp forward' and 'ddp backward'; times from the start of the forward pass.

    On a CPU (gloo) the backward operations are the autograd engine's
    ``evaluate_function`` events, the communication is gloo's ``gloo:all_reduce``, which
    runs on gloo's own threads, and the ``c10d::`` calls in which the computing thread
    hands buckets to gloo are 'launch' spans. On a GPU both are kernels on the device: NCCL's
    kernels are the communication, every other kernel launched after the backward mark
    is backward computation (the step synchronizes between the two passes).
    """
    from torch.autograd import DeviceType

    names = ("ddp forward", "ddp backward")
    marks = {e.name: (e.time_range.start, e.time_range.end) for e in events
             if e.name in names and e.device_type == DeviceType.CPU}
    origin, backward_start = marks["ddp forward"][0], marks["ddp backward"][0]
    spans = []
    if not on_gpu:
        spans.append(("forward", 0.0, (marks["ddp forward"][1] - origin) / 1e3, "ddp forward"))
    for event in events:
        on_device = event.device_type != DeviceType.CPU
        if on_device != on_gpu:
            continue
        name, start, end = event.name, event.time_range.start, event.time_range.end
        if name in names or name.startswith("ProfilerStep"):  # marks, not work
            continue
        if on_device and getattr(event, "is_user_annotation", False):
            continue  # a CPU-side label copied onto the GPU's timeline, not a kernel
        if name.startswith("gloo:") or "nccl" in name.lower():
            kind = "allreduce"
        elif name.startswith("c10d::"):  # the computing thread hands a bucket to gloo
            kind = "launch"
        elif on_gpu or name.startswith("autograd::engine::evaluate_function:"):
            kind = "backward" if start >= backward_start else "forward"
        else:
            continue
        spans.append((kind, (start - origin) / 1e3, (end - origin) / 1e3, name))
    return sorted(spans, key=lambda span: span[1])


# ---------------------------------------------------------------- ZeRO accounting
STAGES = ["DDP (replicated)", "ZeRO-1: optimizer state", "ZeRO-2: + gradients",
          "ZeRO-3: + parameters"]


def zero_bytes_per_parameter(n: int, param_bytes: float = 2, grad_bytes: float = 2,
                             state_bytes: float = 12) -> Dict[str, Dict[str, float]]:
    """Bytes per model parameter that each of ``n`` processes holds, for every stage.

    Defaults are the mixed-precision Adam of the ZeRO paper (Rajbhandari et al., SC 2020):
    16-bit parameters and gradients (2 bytes each) and 12 bytes of optimizer state (a
    32-bit master copy, momentum and variance). Stage 1 shards the optimizer state over
    the processes, stage 2 the gradients too, stage 3 the parameters too.
    """
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    p, g, s = param_bytes, grad_bytes, state_bytes
    layouts = [(p, g, s), (p, g, s / n), (p, g / n, s / n), (p / n, g / n, s / n)]
    return {stage: {"parameters": a, "gradients": b, "optimizer state": c, "total": a + b + c}
            for stage, (a, b, c) in zip(STAGES, layouts)}


def zero_traffic_per_parameter(n: int) -> Dict[str, float]:
    """Elements each process sends per parameter and step, with ring collectives.

    An allreduce is a reduce-scatter plus an all-gather, each ``(n-1)/n``. Stages 1 and
    2 do exactly those two (reduce-scatter the gradients, all-gather the updated
    parameters); stage 3 all-gathers the parameters twice (forward and backward), 1.5x.
    """
    half = (n - 1) / n
    return {STAGES[0]: 2 * half, STAGES[1]: 2 * half, STAGES[2]: 2 * half, STAGES[3]: 3 * half}


def zero_redundancy_traffic_per_parameter(n: int) -> float:
    """Elements each process sends per parameter and step with ``ZeroRedundancyOptimizer``.

    It does not do ZeRO-1's reduce-scatter and all-gather: DDP still allreduces the whole
    gradient, ``2(n-1)/n``, and after the step every process broadcasts the parameters
    it updated, which all the others must receive, ``(n-1)/n`` per process on average:
    ``3(n-1)/n`` in all, 1.5 times the ideal ``2(n-1)/n`` of :func:`zero_traffic_per_parameter`.
    """
    return 3 * (n - 1) / n


# What each process sends per element of a collective's full tensor, with ring algorithms
# (or, for a broadcast, on average over the processes: the n - 1 others must each receive it).
COLLECTIVE_TRAFFIC = {"allreduce": lambda n: 2 * (n - 1) / n,
                      "broadcast": lambda n: (n - 1) / n,
                      "all-gather": lambda n: (n - 1) / n,
                      "reduce-scatter": lambda n: (n - 1) / n}


def _collective(name: str, args: tuple):
    """(kind, elements of the full tensor) of a c10d operator call, or None for other ops."""
    def numel(value):
        if isinstance(value, torch.Tensor):
            return value.numel()
        if isinstance(value, (list, tuple)):
            return sum(numel(v) for v in value)
        return 0

    op = name.split(".")[1] if name.startswith("c10d.") else None
    if op in ("allreduce_", "allreduce_coalesced_"):
        return "allreduce", numel(args[0])
    if op == "broadcast_":
        return "broadcast", numel(args[0])
    if op in ("_allgather_base_", "allgather_into_tensor_coalesced_"):
        return "all-gather", numel(args[0])  # the output: every process's piece
    if op == "allgather_":
        return "all-gather", numel(args[0])
    if op in ("_reduce_scatter_base_", "reduce_scatter_tensor_coalesced_"):
        return "reduce-scatter", numel(args[1])  # the input: the whole tensor to reduce
    if op == "reduce_scatter_":
        return "reduce-scatter", numel(args[1])
    if op is not None and op not in ("barrier", "monitored_barrier_"):
        return op, numel(args[0]) if args else 0
    return None


class CollectiveCounter(OperatorWatch):
    """Counts the collectives that pass through PyTorch's dispatcher while the block runs.

    ``calls`` and ``elements`` per kind ('allreduce', 'broadcast', 'all-gather',
    'reduce-scatter'); elements are those of the full tensor each call works on (for an
    all-gather its output, for a reduce-scatter its input). It sees DDP's bucket
    allreduces, which DDP's C++ reducer starts, as well as the collectives called from
    Python (ZeroRedundancyOptimizer's broadcasts, FSDP's all-gathers), because all of
    them are dispatcher operators (``torch.ops.c10d``); it watches them through a
    ``TorchDispatchMode``, which autograd hands on to the threads that run the backward pass.
    """

    def __init__(self):
        super().__init__()
        self.calls: Dict[str, int] = {}
        self.elements: Dict[str, int] = {}

    def note(self, func, types, args) -> bool:
        found = _collective(str(func), args)
        if found is not None:
            kind, elements = found
            self.calls[kind] = self.calls.get(kind, 0) + 1
            self.elements[kind] = self.elements.get(kind, 0) + elements
        return True

    def sent_per_element(self, n: int, per: int) -> float:
        """Elements each process sends, per element of a model of ``per`` elements, with
        ring algorithms (:data:`COLLECTIVE_TRAFFIC`)."""
        return sum(COLLECTIVE_TRAFFIC[kind](n) * elements / per
                   for kind, elements in self.elements.items() if kind in COLLECTIVE_TRAFFIC)


def held_bytes(model: nn.Module, optimizer) -> Dict[str, int]:
    """Bytes of parameters, gradients and optimizer state that this process holds.

    For a ``ZeroRedundancyOptimizer`` the state is that of its local optimizer
    (``.optim``), which holds only this process's partition; FSDP2's sharded tensors count
    their local shard (:func:`dlperf.memory.tensor_bytes`).
    """
    local = getattr(optimizer, "optim", optimizer)
    params = list(model.parameters())
    return {"parameters": tensor_bytes(params),
            "gradients": tensor_bytes(p.grad for p in params if p.grad is not None),
            "optimizer state": sum(optimizer_state_bytes(local).values())}


# ---------------------------------------------------------------- worker jobs
def _device(config: dict) -> torch.device:
    if config.get("device", "cpu") == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _ddp(model: nn.Module, device: torch.device, **kwargs):
    from torch.nn.parallel import DistributedDataParallel
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda"
                                   else None, **kwargs)


def _batch(config: dict, device: torch.device, seed: int, size: Optional[int] = None):
    generator = torch.Generator().manual_seed(seed)
    size = size or config["batch"]
    X = torch.randn(size, config["width"], generator=generator)
    y = torch.randn(size, config["width"], generator=generator)
    return X.to(device), y.to(device)


def _loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return ((output - target) ** 2).mean()


def _recording_hook(record: list, bucket):
    """A DDP communication hook that notes the bucket's parameters, then allreduces as usual."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    record.append((bucket.index(), [id(p) for p in bucket.parameters()],
                   bucket.buffer().numel() * bucket.buffer().element_size()))
    return default_hooks.allreduce_hook(None, bucket)


def _seconds(step, repeat: int, warmup: int) -> List[float]:
    """Seconds per call of ``step`` on the slowest process, one value per repeat."""
    from dlperf.distributed import _timed
    return _timed(step, None, repeat, warmup)


def buckets_job(rank: int, world_size: int, config: dict) -> Optional[dict]:
    """What DDP put in each bucket, and a profiled training step on rank 0.

    For each bucket size in ``config['caps']`` (None: the default) a fresh DDP model
    records, through a communication hook, which parameters each bucket of its second
    step held (the first step rebuilds the buckets). Then one step with
    ``config['trace_cap']`` is recorded by torch.profiler; rank 0 returns the spans.
    """
    device = _device(config)
    model = mlp(config["width"], config["depth"]).to(device)
    names = {id(p): name for name, p in model.named_parameters()}
    X, y = _batch(config, device, seed=rank)
    buckets = {}
    for cap in config["caps"]:
        ddp_model = _ddp(copy.deepcopy(model), device, bucket_cap_mb=cap)
        copy_names = {id(p): names[id(q)] for p, q in zip(ddp_model.module.parameters(),
                                                          model.parameters())}
        record: list = []
        ddp_model.register_comm_hook(record, _recording_hook)
        for _ in range(2):
            record.clear()
            _loss(ddp_model(X), y).backward()
        buckets[cap] = [[copy_names[i] for i in ids] for _, ids, _ in sorted(record)]

    os.environ.setdefault("KINETO_LOG_LEVEL", "99")  # keep the profiler's log lines quiet
    from torch.profiler import ProfilerActivity, profile, record_function
    ddp_model = _ddp(copy.deepcopy(model), device, bucket_cap_mb=config["trace_cap"])
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.01)

    def step():
        with record_function("ddp forward"):
            loss = _loss(ddp_model(X), y)
            synchronize(device)
        with record_function("ddp backward"):
            loss.backward()
            synchronize(device)
        optimizer.step()
        optimizer.zero_grad()

    for _ in range(3):
        step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    traces = []
    for _ in range(config.get("traced_steps", 1)):
        dist.barrier()
        with warnings.catch_warnings():  # torch 2.11 warns that each profile is a new cycle
            warnings.filterwarnings("ignore", message=".*Profiler clears events")
            with profile(activities=activities) as prof:
                step()
        traces.append(step_spans(prof.events(), device.type == "cuda") if rank == 0 else None)
    if rank != 0:
        return None
    return {"buckets": buckets, "traces": traces, "backend": dist.get_backend(),
            "device": str(device), "parameters": sum(p.numel() for p in model.parameters())}


def accumulation_job(rank: int, world_size: int, config: dict) -> Optional[dict]:
    """Gradient accumulation over ``config['micro_steps']`` micro-batches, with and without
    ``no_sync()``: the allreduces each way, the time of one accumulation round (slowest
    process, every repeat), and how the accumulated gradients compare with those of one
    step on the large batch that all micro-batches of all processes make up (without DDP):
    ``assert_close`` is None where ``torch.testing.assert_close`` passed, else its message."""
    device = _device(config)
    model = mlp(config["width"], config["depth"]).to(device)
    reference = copy.deepcopy(model)
    k, b = config["micro_steps"], config.get("micro_batch", config["batch"])
    X, y = _batch(config, device, seed=123, size=world_size * k * b)  # everyone's data
    # Micro-batch j of rank r is block j * world_size + r of the large batch.
    blocks = [(X[i * b:(i + 1) * b], y[i * b:(i + 1) * b]) for i in range(world_size * k)]
    mine = [blocks[j * world_size + rank] for j in range(k)]
    ddp_model = _ddp(model, device, bucket_cap_mb=config["trace_cap"])
    record: list = []
    ddp_model.register_comm_hook(record, _recording_hook)

    # ACCUMULATE-START
    def accumulate(use_no_sync: bool):
        ddp_model.zero_grad(set_to_none=True)
        for j, (Xj, yj) in enumerate(mine):
            last = j == k - 1
            with ddp_model.no_sync() if (use_no_sync and not last) else nullcontext():
                (_loss(ddp_model(Xj), yj) / k).backward()  # each micro-batch weighs 1/k
        synchronize(device)
    # ACCUMULATE-END

    result = {}
    for mode in (True, False):
        accumulate(mode)  # also builds the buckets in the first round
        record.clear()
        accumulate(mode)
        result[mode] = {"allreduces": len(record),
                        "grads": [p.grad.detach().clone() for p in ddp_model.module.parameters()]}
    _loss(reference(X), y).backward()  # one step on the whole large batch, no DDP
    expected = [p.grad for p in reference.parameters()]
    checks = {}
    for mode in (True, False):
        try:
            torch.testing.assert_close(result[mode]["grads"], expected, rtol=1e-4, atol=1e-6)
            checks[mode] = None
        except AssertionError as error:
            checks[mode] = str(error)
    times = {}
    for round_ in range(config["repeat"]):  # take turns, each going first every other round
        for mode in ((True, False) if round_ % 2 == 0 else (False, True)):
            times.setdefault(mode, []).extend(_seconds(lambda: accumulate(mode), 1, 0))
    if rank != 0:
        return None
    runs = {mode: {"allreduces": result[mode]["allreduces"], "seconds": times[mode],
                   "assert_close": checks[mode],
                   "max_diff": max(float((g - e).abs().max())
                                   for g, e in zip(result[mode]["grads"], expected))}
            for mode in (True, False)}
    return {"no_sync": runs[True], "every micro-step": runs[False],
            "micro_steps": k, "micro_batch": b, "world_size": world_size}


def bucket_sweep_job(rank: int, world_size: int, config: dict) -> Optional[dict]:
    """Seconds per training step (slowest process) for each ``bucket_cap_mb`` in
    ``config['sweep']``, the settings taking turns in every round."""
    device = _device(config)
    model = mlp(config["width"], config["depth"]).to(device)
    X, y = _batch(config, device, seed=rank)
    runs = {}
    for cap in config["sweep"]:
        ddp_model = _ddp(copy.deepcopy(model), device, bucket_cap_mb=cap)
        optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.01)

        def step(ddp_model=ddp_model, optimizer=optimizer):
            _loss(ddp_model(X), y).backward()
            optimizer.step()
            optimizer.zero_grad()
            synchronize(device)

        for _ in range(2):  # the first step also rebuilds the buckets
            step()
        runs[cap] = step
    times: Dict[float, List[float]] = {cap: [] for cap in runs}
    for _ in range(config["repeat"]):
        for cap, step in runs.items():
            times[cap].extend(_seconds(step, 1, 0))
    return times if rank == 0 else None


def sharding_job(rank: int, world_size: int, config: dict) -> dict:
    """Bytes of parameters, gradients and Adam state that this process holds after a few
    steps of plain DDP, DDP with ``ZeroRedundancyOptimizer`` (ZeRO-1) and FSDP2's
    ``fully_shard`` (ZeRO-3), and how far each one's final parameters are from DDP's.

    Also, per setup: ``peak`` bytes, the most that the tensors this process allocated
    while building the setup and training it held at one moment
    (:class:`dlperf.memory.AllocationPeak`: parameters, gradients, optimizer state,
    DDP's buckets, FSDP's all-gathered parameters and reduce-scatter inputs,
    activations and temporaries; the input batches are made before and not counted), and
    the ``collectives`` of the last step (:class:`CollectiveCounter`), after the first
    steps have set everything up."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.optim import ZeroRedundancyOptimizer

    device = _device(config)
    base = mlp(config["width"], config["depth"]).to(device)
    batches = [_batch(config, device, seed=1000 * step + rank) for step in range(config["steps"])]
    lr = 1e-3

    def train(model, optimizer, setup):
        counter = CollectiveCounter()
        for step, (X, y) in enumerate(batches):
            with counter if step == len(batches) - 1 else nullcontext():
                optimizer.zero_grad(set_to_none=True)
                _loss(model(X), y).backward()
                optimizer.step()
                synchronize(device)
        collectives[setup] = {"calls": counter.calls, "elements": counter.elements}

    def full_parameters(model):
        return [(p.full_tensor() if hasattr(p, "full_tensor") else p).detach()
                for p in model.parameters()]

    def ddp_adam():
        model = _ddp(copy.deepcopy(base), device)
        return model, torch.optim.Adam(model.parameters(), lr=lr)

    def ddp_zero():
        model = _ddp(copy.deepcopy(base), device)
        return model, ZeroRedundancyOptimizer(model.parameters(),
                                              optimizer_class=torch.optim.Adam, lr=lr)

    def fsdp_adam():
        model = copy.deepcopy(base)
        for block in model:  # each block all-gathers its parameters on its own, then the rest
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model, torch.optim.Adam(model.parameters(), lr=lr)

    results, finals, peaks, collectives = {}, {}, {}, {}
    mesh = init_device_mesh(device.type, (world_size,))
    setups = {"DDP + Adam": ddp_adam, "DDP + ZeroRedundancyOptimizer": ddp_zero,
              "FSDP2 fully_shard + Adam": fsdp_adam}
    for setup, build in setups.items():
        with AllocationPeak(device) as peak:  # building the setup counts towards its peak
            model, optimizer = build()
            train(model, optimizer, setup)
        peaks[setup] = peak.peak_bytes
        results[setup], finals[setup] = held_bytes(model, optimizer), full_parameters(model)
        del model, optimizer  # freed before the next setup is measured
    reference = finals["DDP + Adam"]
    differences = {name: max(float((a - b).abs().max()) for a, b in zip(params, reference))
                   for name, params in finals.items()}
    return {"bytes": results, "max_diff": differences, "peak": peaks,
            "collectives": collectives, "parameters": sum(p.numel() for p in base.parameters())}


PARTS = {"buckets": buckets_job, "accumulation": accumulation_job, "sweep": bucket_sweep_job,
         "sharding": sharding_job}


def page_job(rank: int, world_size: int, config: dict) -> dict:
    """The jobs named in ``config['parts']`` (keys of :data:`PARTS`), one after the other in
    the same processes and process group: the first DDP model a process builds takes a while
    (DDP imports torch's compiler stack), so the page launches its workers once."""
    results = {"started": time.time()}
    start = time.perf_counter()
    _ddp(nn.Linear(1, 1).to(_device(config)), _device(config))  # pays for the imports once
    results["setup seconds"] = time.perf_counter() - start
    for part in config["parts"]:
        dist.barrier()
        start = time.perf_counter()
        results[part] = PARTS[part](rank, world_size, config)
        results[f"{part} seconds"] = time.perf_counter() - start
    results["finished"] = time.time()
    return results
