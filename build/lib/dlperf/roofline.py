"""The roofline model: how fast an operation can be, given what it computes and what it moves.

An operation does ``flops`` floating-point operations and moves ``bytes`` between
memory and the processor; its *arithmetic intensity* is ``flops / bytes``. A
device cannot compute faster than its peak FLOP/s, nor feed the arithmetic units
faster than its memory bandwidth allows, so the speed an operation can attain is

    min(peak FLOP/s, intensity x bandwidth).

The *ridge point* ``peak / bandwidth`` is the intensity at which the two limits
meet: operations to its left are memory-bound, to its right compute-bound.

This module counts FLOPs and bytes (by formula, or by watching which tensor
operations a function runs), measures the two ceilings of the device a page
runs on, and draws the roofline with measured operations on it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Sequence

import torch
from torch.overrides import TorchFunctionMode

from .hardware import GPU_SPECS, GpuSpec
from .timing import time_it

# Names of the torch functions a counter treats as matrix products (2 m n k FLOPs).
_MATMULS = {"matmul", "mm", "bmm", "__matmul__", "__rmatmul__"}
# Operations that only move data: bytes, but no FLOPs.
_COPIES = {"clone", "contiguous", "copy_", "reshape", "to", "flatten", "cat", "stack"}


@dataclass(frozen=True)
class Cost:
    """What an operation computes (``flops``) and moves (``bytes``), with how that was counted."""
    flops: float
    bytes: float
    how: str = ""

    @property
    def intensity(self) -> float:
        """FLOPs per byte moved."""
        return intensity(self.flops, self.bytes)


def intensity(flops: float, moved_bytes: float) -> float:
    """Arithmetic intensity: floating-point operations per byte moved."""
    if moved_bytes <= 0:
        raise ValueError(f"an operation must move some bytes, got {moved_bytes}")
    return flops / moved_bytes


def attainable(intensity_: float, peak_flops: float, bandwidth: float) -> float:
    """The roofline: the FLOP/s an operation of this intensity can reach at best."""
    return min(peak_flops, intensity_ * bandwidth)


def ridge_point(peak_flops: float, bandwidth: float) -> float:
    """The intensity (FLOP/byte) where the memory roof meets the compute roof."""
    return peak_flops / bandwidth


def elementwise_cost(n: int, *, inputs: int, outputs: int = 1, flops_per_element: int = 1,
                     itemsize: int = 4) -> Cost:
    """An element-wise kernel over ``n`` elements that reads every input and writes every
    output exactly once (the least any implementation can move)."""
    def count(number, noun):
        return f"{number} {noun}{'s' if number != 1 else ''}"

    return Cost(flops_per_element * n, (inputs + outputs) * n * itemsize,
                f"{count(inputs, 'input')} read and {count(outputs, 'output')} written once, "
                f"{count(flops_per_element, 'FLOP')} per element")


def matmul_cost(n: int, m: Optional[int] = None, k: Optional[int] = None,
                itemsize: int = 4) -> Cost:
    """An (n x k) @ (k x m) product: 2nmk FLOPs; both operands read and the result written
    once, the least traffic possible (a real kernel may reread tiles from cache)."""
    m = n if m is None else m
    k = n if k is None else k
    return Cost(2 * n * m * k, (n * k + k * m + n * m) * itemsize,
                "2nmk FLOPs; operands read once, result written once")


def _tensors(values) -> List[torch.Tensor]:
    found = []
    for value in values:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found.extend(_tensors(value))
    return found


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class TrafficCounter(TorchFunctionMode):
    """Records every tensor operation a block of eager code runs, with its FLOPs and bytes.

    Each operation is assumed to be a kernel of its own that reads each tensor
    argument once and writes its result once, which is what eager PyTorch does
    for element-wise operations. Results that share memory with an argument
    (views such as ``reshape`` or ``t()``) move nothing; an in-place operation
    (``add_``) reads its arguments and writes its result. An element-wise
    operation counts one FLOP per result element, whatever it computes (a
    ``tanh`` costs several instructions, but counts as one); copies count none
    and matrix products 2mnk.
    """

    def __init__(self):
        super().__init__()
        self.ops: List[Dict] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        name = getattr(func, "__name__", str(func))
        inputs = _tensors(list(args) + list(kwargs.values()))
        outputs = _tensors([result])
        if not outputs:
            return result  # an attribute (.shape, .dtype) or a Python number: no kernel ran
        in_place = name.endswith("_") and not name.startswith("_")
        if not in_place and inputs and all(_storage(o) in {_storage(i) for i in inputs}
                                           for o in outputs):
            moved, flops = 0, 0  # a view of an argument: no data moves
        else:
            moved = sum(t.numel() * t.element_size() for t in inputs + outputs)
            if name in _MATMULS and len(inputs) == 2 and inputs[0].dim() >= 1:
                k = inputs[0].shape[-1]
                flops = 2 * k * sum(o.numel() for o in outputs)
            elif name in _COPIES:
                flops = 0
            else:
                flops = sum(o.numel() for o in outputs)
        self.ops.append({"op": name, "flops": flops, "bytes": moved})
        return result

    @property
    def cost(self) -> Cost:
        return Cost(sum(op["flops"] for op in self.ops), sum(op["bytes"] for op in self.ops),
                    f"{len(self.ops)} operations, each reading its arguments and writing its result")


def eager_cost(fn: Callable, *args) -> Cost:
    """FLOPs and bytes of ``fn(*args)`` run eagerly, one kernel per tensor operation."""
    with TrafficCounter() as counter:
        fn(*args)
    return counter.cost


def fused_cost(fn: Callable, *args) -> Cost:
    """FLOPs of ``fn(*args)`` with the bytes of a single fused kernel: each tensor argument
    read once and each result written once, the intermediates never leaving registers."""
    with TrafficCounter() as counter:
        result = fn(*args)
    moved = sum(t.numel() * t.element_size() for t in _tensors(list(args)) + _tensors([result]))
    return Cost(counter.cost.flops, moved, "one kernel: inputs read once, results written once")


# --- measuring the two ceilings ------------------------------------------------------------------

def fastest(fn: Callable[[], object], device, repeat: int = 5, warmup: int = 1) -> float:
    """Seconds of the fastest of ``repeat`` synchronized calls: the least disturbed run."""
    return min(time_it(fn, repeat=repeat, warmup=warmup, device=device))


def measure_bandwidth(device, numel: int, repeat: int = 5, dtype=torch.float32) -> float:
    """Memory bandwidth in bytes/s from copying a tensor of ``numel`` elements into another:
    bytes read plus bytes written, over the fastest copy. Take ``numel`` large enough that the
    tensors do not fit in the caches."""
    source = torch.ones(numel, device=device, dtype=dtype)
    target = torch.empty_like(source)
    seconds = fastest(lambda: target.copy_(source), device, repeat)
    return 2 * source.numel() * source.element_size() / seconds


def streaming_rates(device, numel: int, repeat: int = 5, dtype=torch.float32) -> Dict[str, float]:
    """Bytes/s of two streaming kernels, timed in turn round after round: a copy (two tensors'
    bytes moved) and an addition into an existing tensor (three). Counted this way the two can
    differ, e.g. because caches read a line before writing it; the roof takes the faster."""
    a = torch.ones(numel, device=device, dtype=dtype)
    b = torch.ones_like(a)
    c = torch.empty_like(a)
    kernels = {"copy": (lambda: c.copy_(a), 2), "add": (lambda: torch.add(a, b, out=c), 3)}
    best = {name: math.inf for name in kernels}
    for round_ in range(repeat + 1):  # the first round warms up
        for name, (fn, _) in kernels.items():
            seconds = time_it(fn, repeat=1, warmup=0, device=device)[0]
            if round_:
                best[name] = min(best[name], seconds)
    size = a.numel() * a.element_size()
    return {name: tensors * size / best[name] for name, (_, tensors) in kernels.items()}


def triad_bandwidth(device, numel: int, repeat: int = 5, dtype=torch.float32) -> float:
    """Memory bandwidth in bytes/s from STREAM's *triad*, ``a = b + s * c`` over tensors of
    ``numel`` elements: three tensors' bytes (two read, one written) over the fastest call.
    Take ``numel`` large enough that the tensors do not fit in the caches."""
    a = torch.empty(numel, device=device, dtype=dtype)
    b = torch.ones_like(a)
    c = torch.ones_like(a)
    seconds = fastest(lambda: torch.add(b, c, alpha=3.0, out=a), device, repeat)
    return 3 * a.numel() * a.element_size() / seconds


def measure_matmul_flops(device, n: int, repeat: int = 5, dtype=torch.float32) -> float:
    """FLOP/s of the fastest ``n x n`` matrix product: 2n^3 over its time."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    return 2 * n**3 / fastest(lambda: a @ b, device, repeat)


@dataclass(frozen=True)
class Placement:
    """A measured operation on the roofline: where it is, and what that means."""
    name: str
    intensity: float
    flops_per_s: float
    roof: float  # attainable FLOP/s at this intensity
    ridge: float

    @property
    def share(self) -> float:
        """Measured FLOP/s as a fraction of the roof above it."""
        return self.flops_per_s / self.roof

    @property
    def side(self) -> str:
        return "memory-bound" if self.intensity < self.ridge else "compute-bound"


def place(name: str, cost: Cost, seconds: float, peak_flops: float, bandwidth: float) -> Placement:
    """Put an operation that took ``seconds`` on the roofline of the given ceilings."""
    return Placement(name, float(cost.intensity), float(cost.flops / seconds),
                     float(attainable(cost.intensity, peak_flops, bandwidth)),
                     float(ridge_point(peak_flops, bandwidth)))


# --- datasheets ----------------------------------------------------------------------------------

def datasheet_ridge(spec: GpuSpec, dtype: str = "float32") -> float:
    """FLOP per byte at a GPU's datasheet ridge point (dense TFLOP/s over HBM bandwidth)."""
    return ridge_point(spec.tflops[dtype] * 1e12, spec.bandwidth_gbs * 1e9)


def datasheet_specs(names: Iterable[str] = ("H100 SXM", "H200 SXM")) -> List[GpuSpec]:
    """The ``hardware.GPU_SPECS`` entries with these model names, in this order."""
    by_name = {spec.name: spec for spec in GPU_SPECS}
    missing = [name for name in names if name not in by_name]
    if missing:
        raise KeyError(f"not in dlperf.hardware.GPU_SPECS: {missing}")
    return [by_name[name] for name in names]


def ridge_table(names: Iterable[str] = ("H100 SXM", "H200 SXM"),
                dtypes: Sequence[str] = ("float32", "bfloat16")):
    """Peaks, bandwidth and ridge points of GPUs from their datasheets, with the source."""
    import pandas as pd
    rows = {}
    for spec in datasheet_specs(names):
        row = {f"{d} TFLOP/s (dense)": spec.tflops[d] for d in dtypes}
        row["HBM TB/s"] = spec.bandwidth_gbs / 1e3
        row.update({f"{d} ridge (FLOP/byte)": round(datasheet_ridge(spec, d), 1) for d in dtypes})
        row["source"] = spec.source
        rows[spec.name] = row
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis("GPU")


# --- drawing -------------------------------------------------------------------------------------

def plot_roofline(peak_flops: float, bandwidth: float, placements: Sequence[Placement] = (), *,
                  curves: Optional[Dict[str, Sequence[Placement]]] = None,
                  unit: float = 1e9, unit_name: str = "GFLOP/s",
                  extra_roofs: Optional[Dict[str, float]] = None, title: str = "", ax=None):
    """The roofline on log-log axes, the ridge point marked and the measured operations on it.

    ``placements`` are drawn as one marker each; ``curves`` maps a label to a
    series of placements (matrix products of growing size, say) drawn as one
    line, each point labelled with the last word of its name. ``extra_roofs``
    maps a label to another compute ceiling (FLOP/s), drawn dashed.
    """
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 4.2))
    curves = curves or {}
    extra_roofs = extra_roofs or {}
    everything = list(placements) + [p for series in curves.values() for p in series]
    ridge = ridge_point(peak_flops, bandwidth)
    xs = [p.intensity for p in everything] + [ridge]
    low = 10 ** math.floor(math.log10(min(xs) / 2))
    high = 10 ** math.ceil(math.log10(max(xs + [ridge * 10]) * 2))
    grid = [low * (high / low) ** (i / 200) for i in range(201)]
    ax.plot(grid, [attainable(x, peak_flops, bandwidth) / unit for x in grid], color="black",
            linewidth=1.5, label=f"roofline: {bandwidth / 1e9:,.1f} GB/s, "
                                 f"{peak_flops / unit:,.3g} {unit_name}")
    for label, roof in extra_roofs.items():
        ax.plot(grid, [attainable(x, roof, bandwidth) / unit for x in grid], color="gray",
                linestyle="--", linewidth=0.9, label=label)
    ax.axvline(ridge, color="gray", linestyle=":", linewidth=0.8)
    floor = min([p.flops_per_s for p in everything] + [low * bandwidth]) / unit / 3
    ax.annotate(f" ridge point\n {ridge:.3g} FLOP/byte", (ridge, floor * 1.5), fontsize=8,
                color="gray")
    markers = "osD^vP*X"
    for i, p in enumerate(placements):
        ax.plot([p.intensity], [p.flops_per_s / unit], marker=markers[i % len(markers)],
                linestyle="none", markersize=7, label=p.name)
    for label, series in curves.items():
        line, = ax.plot([p.intensity for p in series], [p.flops_per_s / unit for p in series],
                        marker="o", markersize=4, linewidth=1, label=label)
        for p in series:
            ax.annotate(p.name.split()[-1], (p.intensity, p.flops_per_s / unit), fontsize=6,
                        color=line.get_color(), xytext=(3, -9), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(floor, max([peak_flops, *extra_roofs.values()]) / unit * 3)
    ax.set_xlim(low, high)
    ax.set(xlabel="arithmetic intensity (FLOP/byte, log scale)",
           ylabel=f"{unit_name} (log scale)", title=title)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return ax
