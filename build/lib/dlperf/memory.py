"""Where the bytes of a training step go, counted from the tensors themselves.

A training step keeps four kinds of tensors in memory: the parameters, their
gradients, the optimizer's state (Adam keeps two tensors per parameter) and the
activations that autograd saves during the forward pass for the backward pass.
The first three can be counted from ``model.parameters()``, ``.grad`` and
``optimizer.state``; the fourth only by watching autograd save them, which
:class:`SavedTensors` does with ``torch.autograd.graph.saved_tensors_hooks`` on
any device. :class:`DevicePeak` adds what the CUDA caching allocator saw (the
peak of a whole step, workspaces included); on a CPU there is no such counter
and it says so with ``None`` rather than guessing.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Dict, Iterable, Optional, Union

import torch

from .intervals import total

TensorOrTensors = Union[torch.Tensor, Iterable[torch.Tensor]]


def tensor_bytes(tensors: TensorOrTensors) -> int:
    """Bytes of the elements of a tensor, or of several (``numel * element_size``).

    A sharded tensor (a DTensor, as FSDP2 makes them) counts only the shard this process holds.
    """
    if isinstance(tensors, torch.Tensor):
        if hasattr(tensors, "to_local"):
            tensors = tensors.to_local()
        return tensors.numel() * tensors.element_size()
    return sum(tensor_bytes(t) for t in tensors)


def parameter_count(model: torch.nn.Module) -> int:
    """Number of parameter elements (a shared parameter counts once)."""
    return sum(p.numel() for p in model.parameters())


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> Dict[str, int]:
    """Bytes of the optimizer's state tensors, by state name (Adam: exp_avg, exp_avg_sq, step).

    Empty before the first ``step()``: optimizers create their state lazily.
    """
    totals: Dict[str, int] = defaultdict(int)
    for state in optimizer.state.values():
        for name, value in state.items():
            if isinstance(value, torch.Tensor):
                totals[name] += tensor_bytes(value)
    return dict(totals)


def model_state_bytes(model: torch.nn.Module,
                      optimizer: Optional[torch.optim.Optimizer] = None) -> Dict[str, int]:
    """Bytes of the parameters, of the gradients that exist, and of the optimizer state."""
    params = list(model.parameters())
    totals = {"parameters": tensor_bytes(params),
              "gradients": tensor_bytes(p.grad for p in params if p.grad is not None)}
    if optimizer is not None:
        for name, size in optimizer_state_bytes(optimizer).items():
            totals[f"optimizer: {name}"] = size
    return totals


def _storage_extent(t: torch.Tensor):
    """(storage identity, (first byte, end byte)) of the memory a saved tensor refers to.

    A view (a micro-batch cut from a batch, a transposed weight) refers to part of
    a storage: its extent runs from its first to its last element.
    """
    try:
        storage = t.untyped_storage()
        key = (t.device.type, t.device.index, storage.data_ptr())
    except (RuntimeError, NotImplementedError):  # tensors without a plain storage
        return ("tensor", id(t)), (0, tensor_bytes(t))
    if t.numel() == 0:
        return key, (0, 0)
    size = t.element_size()
    first = t.storage_offset() * size
    elements = 1 + sum((n - 1) * abs(step) for n, step in zip(t.shape, t.stride()))
    return key, (first, first + elements * size)


class SavedTensors:
    """Count the bytes autograd saves for backward while the block runs.

    ``with SavedTensors(exclude=[*model.parameters(), x]) as saved: loss = f(model(x))``;
    then ``saved.bytes`` is the memory of the saved tensors outside ``exclude``:
    the activations (and, under autocast, the low-precision copies of the
    weights). Saving a parameter or the input batch costs nothing extra, since
    they exist anyway; such bytes go to ``saved.excluded_bytes``. Memory that
    several saved tensors share counts once, and a saved view counts the part of
    its storage it spans, not the whole storage.

    Use one block per forward pass: if a backward inside the block frees the
    graph, the allocator may hand a freed address to a new tensor, which would
    then be taken for the old one.
    """

    def __init__(self, exclude: Iterable[torch.Tensor] = ()):
        self._excluded = {_storage_extent(t)[0] for t in exclude}
        self._extents: Dict[tuple, list] = defaultdict(list)
        self._dtypes: Dict[tuple, str] = {}
        self.tensors = 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        self.tensors += 1
        key, extent = _storage_extent(t)
        self._extents[key].append(extent)
        self._dtypes.setdefault(key, str(t.dtype).replace("torch.", ""))
        return t  # autograd keeps the tensor itself, as it would without the hook

    @staticmethod
    def _unpack(t: torch.Tensor) -> torch.Tensor:
        return t

    def _sum(self, excluded: bool) -> int:
        return sum(total(extents) for key, extents in self._extents.items()
                   if (key in self._excluded) == excluded)

    @property
    def bytes(self) -> int:
        """Bytes of the saved tensors that are not in ``exclude``."""
        return self._sum(excluded=False)

    @property
    def excluded_bytes(self) -> int:
        """Bytes of the saved tensors that are in ``exclude`` (no extra memory)."""
        return self._sum(excluded=True)

    @property
    def by_dtype(self) -> Dict[str, int]:
        """``bytes`` split by the data type of the saved tensors."""
        totals: Dict[str, int] = defaultdict(int)
        for key, extents in self._extents.items():
            if key not in self._excluded:
                totals[self._dtypes[key]] += total(extents)
        return dict(totals)

    def __enter__(self) -> "SavedTensors":
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> bool:
        self._hooks.__exit__(*exc)
        return False


class DevicePeak:
    """Peak memory the CUDA caching allocator handed out while the block ran.

    ``baseline_bytes`` is what was allocated on entry (parameters, optimizer
    state, data), ``peak_bytes`` the highest allocation during the block and
    ``extra_bytes`` their difference: what the block itself needed at its worst
    moment (activations, gradients, temporaries, library workspaces). On a
    device without allocator statistics (the CPU) all three stay ``None``.
    """

    def __init__(self, device: Union[str, torch.device, None] = None):
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.available = self.device.type == "cuda" and torch.cuda.is_available()
        self.baseline_bytes: Optional[int] = None
        self.peak_bytes: Optional[int] = None
        self.extra_bytes: Optional[int] = None
        self.reserved_peak_bytes: Optional[int] = None
        self.alloc_retries: Optional[int] = None

    def __enter__(self) -> "DevicePeak":
        if self.available:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.baseline_bytes = torch.cuda.memory_allocated(self.device)
        return self

    def __exit__(self, *exc) -> bool:
        if self.available:
            torch.cuda.synchronize(self.device)
            self.peak_bytes = torch.cuda.max_memory_allocated(self.device)
            self.extra_bytes = self.peak_bytes - self.baseline_bytes
            self.reserved_peak_bytes = torch.cuda.max_memory_reserved(self.device)
            # How often the allocator had to free its cache and retry: a sign of memory pressure.
            self.alloc_retries = torch.cuda.memory_stats(self.device).get("num_alloc_retries", 0)
        return False


class AllocationPeak:
    """The most bytes that tensors allocated inside the block held at one moment.

    Counts what PyTorch's allocator handed out while the block ran and had not yet
    taken back: ``peak_bytes`` at the worst moment, ``held_bytes`` at the end. Tensors
    that existed before the block do not count, so to measure everything a setup needs,
    build it inside the block. On a GPU this reads the CUDA caching allocator's
    statistics (as :class:`DevicePeak`); on the CPU, which keeps no such statistics,
    it runs ``torch.profiler`` with ``profile_memory=True`` and adds up the allocations
    and frees that the profiler's memory events report, in the order they happened
    (only those of this thread and the threads autograd runs for it, and only memory
    that PyTorch's allocator handed out: a library's own buffers are not seen).
    """

    def __init__(self, device: Union[str, torch.device, None] = None):
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.on_cuda = self.device.type == "cuda" and torch.cuda.is_available()
        self.peak_bytes: Optional[int] = None
        self.held_bytes: Optional[int] = None
        self._start = 0
        self._profiler = None

    def __enter__(self) -> "AllocationPeak":
        if self.on_cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._start = torch.cuda.memory_allocated(self.device)
        else:
            import os
            # Kineto logs each start and stop, and that it found no GPU: keep it quiet.
            os.environ.setdefault("KINETO_LOG_LEVEL", "6")
            from torch.profiler import ProfilerActivity, profile
            self._profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
            self._profiler.__enter__()
        return self

    def __exit__(self, *exc) -> bool:
        if self.on_cuda:
            torch.cuda.synchronize(self.device)
            self.peak_bytes = torch.cuda.max_memory_allocated(self.device) - self._start
            self.held_bytes = torch.cuda.memory_allocated(self.device) - self._start
            return False
        self._profiler.__exit__(*exc)
        from torch.autograd import DeviceType
        events = [e for e in self._profiler.profiler.kineto_results.events()
                  if e.name() == "[memory]" and e.device_type() == DeviceType.CPU]
        running = peak = 0
        for event in sorted(events, key=lambda e: e.start_ns()):
            running += event.nbytes()
            peak = max(peak, running)
        self.peak_bytes, self.held_bytes = peak, running
        return False


def format_bytes(size: Optional[float]) -> str:
    """Bytes as B, KiB, MiB or GiB, whichever reads best ("n/a" for None)."""
    if size is None:
        return "n/a"
    for unit, factor in [("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)]:
        if abs(size) >= factor:
            return f"{size / factor:,.2f} {unit}"
    return f"{size:,.0f} B"
