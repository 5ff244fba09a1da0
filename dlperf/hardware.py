"""Quoted hardware numbers (with their sources) and what this machine says about itself.

Two kinds of number live in this course and must never be mixed up:

* *quoted* numbers, from vendor datasheets and standards, kept here with the
  source of each (``REFERENCE``, ``GPU_SPECS``);
* *measured* numbers, which the pages produce on the machine they run on.

``peak_flops(device, dtype)`` returns the datasheet peak of a GPU that is in
``GPU_SPECS``, a peak derived from an x86 CPU's flags, clock and cores (with the
assumption it rests on), or ``None`` with the reason, never a guess presented as a fact.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

import pandas as pd
import torch

NVIDIA_H100 = "NVIDIA H100 datasheet, https://www.nvidia.com/en-us/data-center/h100/"
NVIDIA_H200 = "NVIDIA H200 datasheet, https://www.nvidia.com/en-us/data-center/h200/"
NVIDIA_A100 = "NVIDIA A100 datasheet, https://www.nvidia.com/en-us/data-center/a100/"
NVIDIA_V100 = "NVIDIA V100 datasheet, https://www.nvidia.com/en-us/data-center/v100/"
NVIDIA_T4 = "NVIDIA T4 datasheet, https://www.nvidia.com/en-us/data-center/tesla-t4/"
NVIDIA_L4 = "NVIDIA L4 datasheet, https://www.nvidia.com/en-us/data-center/l4/"
NVIDIA_A10 = "NVIDIA A10 datasheet, https://www.nvidia.com/en-us/data-center/products/a10-gpu/"
NVIDIA_L40S = "NVIDIA L40S datasheet, https://www.nvidia.com/en-us/data-center/l40s/"
PCI_SIG = "PCI-SIG, PCI Express Base Specification 4.0 (16 GT/s) and 5.0 (32 GT/s), https://pcisig.com/specifications"
JEDEC_DDR5 = "JEDEC JESD79-5 DDR5 SDRAM standard, https://www.jedec.org/standards-documents/docs/jesd79-5c"
AMD_EPYC_9004 = "AMD EPYC 9004 series product page (12 DDR5-4800 channels), https://www.amd.com/en/products/processors/server/epyc/4th-generation-9004-and-8004-series.html"
CPU_MANUALS = ("Intel 64 and IA-32 Architectures Optimization Reference Manual; AMD Software "
               "Optimization Guide for Family 19h (Zen 4) processors")
DEAN_NORVIG = ("J. Dean, 'Numbers everyone should know' (LADIS 2009); P. Norvig, "
               "https://norvig.com/21-days.html#answers")
NVIDIA_NDR = "NVIDIA Quantum-2 InfiniBand (NDR, 400 Gb/s per port), https://www.nvidia.com/en-us/networking/quantum2/"
IEEE_8023 = "IEEE 802.3 (100 Gb/s Ethernet)"
SAMSUNG_990 = "Samsung 990 PRO datasheet (7,450 MB/s sequential read), https://semiconductor.samsung.com/consumer-storage/internal-ssd/990-pro/"


@dataclass(frozen=True)
class Reference:
    """One quoted number: a component, its typical latency and/or bandwidth, and where it is from."""
    component: str
    group: str  # 'cache', 'memory', 'interconnect', 'storage', 'network'
    latency_ns: Optional[float]
    bandwidth_gbs: Optional[float]  # GB/s, 1 GB = 1e9 bytes
    note: str
    source: str


REFERENCE: List[Reference] = [
    Reference("CPU L1 data cache", "cache", 1.0, None,
              "4-5 cycles at 4-5 GHz; 32-48 KiB per core", CPU_MANUALS),
    Reference("CPU L2 cache", "cache", 4.0, None,
              "about 12-16 cycles; 1-2 MiB per core", CPU_MANUALS),
    Reference("CPU L3 cache", "cache", 15.0, None,
              "about 40-70 cycles; tens of MiB, shared", CPU_MANUALS),
    Reference("DRAM (CPU main memory)", "memory", 100.0, None,
              "a load that misses every cache", DEAN_NORVIG),
    Reference("DDR5-4800, one 64-bit channel", "memory", None, 38.4,
              "4800 MT/s x 8 bytes", JEDEC_DDR5),
    Reference("DDR5-4800, 12 channels (one server socket)", "memory", None, 460.8,
              "12 x 38.4 GB/s", AMD_EPYC_9004),
    Reference("HBM2e (A100 80GB SXM)", "memory", None, 2039.0, "80 GB on the package",
              NVIDIA_A100),
    Reference("HBM3 (H100 SXM)", "memory", None, 3350.0, "80 GB on the package", NVIDIA_H100),
    Reference("HBM3e (H200)", "memory", None, 4800.0, "141 GB on the package", NVIDIA_H200),
    Reference("PCIe 4.0 x16", "interconnect", None, 31.5,
              "16 GT/s x 16 lanes, 128b/130b coding; per direction", PCI_SIG),
    Reference("PCIe 5.0 x16", "interconnect", None, 63.0,
              "32 GT/s x 16 lanes, 128b/130b coding; per direction (NVIDIA quotes 128 GB/s for both)",
              PCI_SIG),
    Reference("NVLink 3 (A100)", "interconnect", None, 600.0,
              "12 links; both directions together", NVIDIA_A100),
    Reference("NVLink 4 (H100, H200)", "interconnect", None, 900.0,
              "18 links x 50 GB/s; both directions together (450 GB/s each way)", NVIDIA_H100),
    Reference("NVMe SSD, PCIe 4.0 x4", "storage", 100_000.0, 7.45,
              "sequential read; latency: random 4 KiB read, order of magnitude", SAMSUNG_990),
    Reference("InfiniBand NDR, one port", "network", None, 50.0, "400 Gb/s per direction",
              NVIDIA_NDR),
    Reference("Ethernet, 100 Gb/s", "network", None, 12.5, "per direction", IEEE_8023),
]


def quoted(component: str) -> Reference:
    """The quoted ``Reference`` of a component by its exact name, e.g. ``quoted("PCIe 4.0 x16")``."""
    for ref in REFERENCE:
        if ref.component == component:
            return ref
    raise KeyError(f"no quoted number for {component!r}; known: "
                   f"{', '.join(r.component for r in REFERENCE)}")


def reference_table(group: Optional[str] = None) -> pd.DataFrame:
    """The quoted numbers as a table (optionally one group), with their sources."""
    rows = [r for r in REFERENCE if group is None or r.group == group]
    return pd.DataFrame({
        "latency": [_format_ns(r.latency_ns) for r in rows],
        "bandwidth (GB/s)": [f"{r.bandwidth_gbs:,.1f}" if r.bandwidth_gbs else "" for r in rows],
        "note": [r.note for r in rows],
        "source": [r.source for r in rows],
    }, index=pd.Index([r.component for r in rows], name="component"))


def _format_ns(ns: Optional[float]) -> str:
    if ns is None:
        return ""
    if ns >= 1e3:
        return f"~{ns / 1e3:g} µs"
    return f"~{ns:g} ns"


# --- GPUs: datasheet peaks ----------------------------------------------------------------

@dataclass(frozen=True)
class GpuSpec:
    """Datasheet numbers of one GPU model. TFLOP/s are dense (without 2:4 sparsity)."""
    name: str
    pattern: str  # regular expression matched against torch.cuda.get_device_name()
    tflops: Dict[str, float]  # 'float32', 'tf32', 'bfloat16', 'float16'
    memory: str
    bandwidth_gbs: float
    source: str


GPU_SPECS: List[GpuSpec] = [  # the more specific names first: the first match wins
    GpuSpec("H200 NVL", r"\bH200 NVL\b",
            {"float32": 60, "tf32": 417.5, "bfloat16": 835.5, "float16": 835.5},
            "141 GB HBM3e", 4800, NVIDIA_H200),
    GpuSpec("H200 SXM", r"\bH200\b",
            {"float32": 67, "tf32": 494.5, "bfloat16": 989.5, "float16": 989.5},
            "141 GB HBM3e", 4800, NVIDIA_H200),
    GpuSpec("H100 NVL", r"\bH100 NVL\b",
            {"float32": 60, "tf32": 417.5, "bfloat16": 835.5, "float16": 835.5},
            "94 GB HBM3", 3900, NVIDIA_H100),
    GpuSpec("H100 PCIe", r"\bH100 PCIe\b",
            {"float32": 51, "tf32": 378, "bfloat16": 756.5, "float16": 756.5},
            "80 GB HBM2e", 2000, NVIDIA_H100),
    GpuSpec("H100 SXM", r"\bH100\b",
            {"float32": 67, "tf32": 494.5, "bfloat16": 989.5, "float16": 989.5},
            "80 GB HBM3", 3350, NVIDIA_H100),
    GpuSpec("A100 80GB PCIe", r"\bA100\b.*80GB.*PCIe|\bA100 80GB PCIe\b",
            {"float32": 19.5, "tf32": 156, "bfloat16": 312, "float16": 312},
            "80 GB HBM2e", 1935, NVIDIA_A100),
    GpuSpec("A100 80GB SXM", r"\bA100\b.*80GB",
            {"float32": 19.5, "tf32": 156, "bfloat16": 312, "float16": 312},
            "80 GB HBM2e", 2039, NVIDIA_A100),
    GpuSpec("A100 40GB", r"\bA100\b",
            {"float32": 19.5, "tf32": 156, "bfloat16": 312, "float16": 312},
            "40 GB HBM2", 1555, NVIDIA_A100),
    GpuSpec("V100 PCIe", r"\bV100-PCIE\b|\bV100 PCIe\b",
            {"float32": 14, "float16": 112}, "16/32 GB HBM2", 900, NVIDIA_V100),
    GpuSpec("V100 SXM2", r"\bV100\b",
            {"float32": 15.7, "float16": 125}, "16/32 GB HBM2", 900, NVIDIA_V100),
    GpuSpec("T4", r"\bT4\b", {"float32": 8.1, "float16": 65}, "16 GB GDDR6", 320, NVIDIA_T4),
    GpuSpec("L40S", r"\bL40S\b",
            {"float32": 91.6, "tf32": 183, "bfloat16": 362, "float16": 362},
            "48 GB GDDR6", 864, NVIDIA_L40S),
    GpuSpec("L4", r"\bL4\b",
            {"float32": 30.3, "tf32": 60, "bfloat16": 121, "float16": 121},
            "24 GB GDDR6", 300, NVIDIA_L4),
    GpuSpec("A10", r"\bA10\b",
            {"float32": 31.2, "tf32": 62.5, "bfloat16": 125, "float16": 125},
            "24 GB GDDR6", 600, NVIDIA_A10),
]


def gpu_spec(device_name: str) -> Optional[GpuSpec]:
    """The datasheet entry whose pattern matches ``device_name``, or None for an unknown GPU."""
    for spec in GPU_SPECS:
        if re.search(spec.pattern, device_name, flags=re.IGNORECASE):
            return spec
    return None


# --- CPUs: a peak derived from what the CPU reports -----------------------------------------

CPUFREQ = Path("/sys/devices/system/cpu/cpu0/cpufreq")
CPU_SYSFS = Path("/sys/devices/system/cpu")


@dataclass(frozen=True)
class VectorUnits:
    """The widest float32 vector arithmetic a core offers, from its instruction-set flags.

    ``lanes`` float32 numbers per vector, ``units`` vector units per core that each
    finish one fused multiply-add (2 FLOPs) per lane and cycle (for CPUs without
    FMA: one add unit and one multiply unit together, also 2 FLOPs per lane).
    The flags name the instruction set, not the number of units: that is the
    assumption, stated in ``assumption``.
    """
    isa: str
    flag: str  # the /proc/cpuinfo flag it is read from
    lanes: int
    units: int
    assumption: str

    @property
    def flop_per_cycle(self) -> int:
        return self.lanes * self.units * 2


def fp32_vector_units(flags: set, vendor: str = "", family: Optional[int] = None) -> Optional[VectorUnits]:
    """Lanes and vector units per core of the widest instruction set in ``flags``, or None."""
    if "avx512f" in flags:
        if vendor == "AuthenticAMD" and family is not None and family <= 25:
            return VectorUnits("AVX-512", "avx512f", 16, 1,
                               "AMD Zen 4 splits a 512-bit FMA over its two 256-bit pipes: "
                               "one 512-bit FMA per cycle")
        return VectorUnits("AVX-512", "avx512f", 16, 2,
                           "two 512-bit FMA units, the most an x86 core has (many Intel "
                           "server cores and AMD Zen 5 have two); some models have one")
    if "avx2" in flags and "fma" in flags:
        return VectorUnits("AVX2 + FMA", "avx2, fma", 8, 2, "two 256-bit FMA units, as every "
                           "Intel core since Haswell and AMD Zen 2 and later have")
    if "avx" in flags:
        return VectorUnits("AVX", "avx", 8, 1, "no FMA: one 8-lane add and one 8-lane multiply "
                           "per cycle")
    if "sse2" in flags:
        return VectorUnits("SSE2", "sse2", 4, 1, "one 4-lane add and one 4-lane multiply per cycle")
    return None


def fp32_flop_per_cycle(flags: set, vendor: str = "", family: Optional[int] = None):
    """FP32 FLOP per cycle and core from the instruction-set flags, with the assumption made."""
    units = fp32_vector_units(flags, vendor, family)
    if units is None:
        return 0, "no known vector instruction set"
    return units.flop_per_cycle, (f"{units.isa}, assuming {units.assumption}: "
                                  f"{units.units} x {units.lanes} lanes x 2")


def max_clock_ghz(cpufreq: Path = CPUFREQ) -> Optional[float]:
    """The highest clock Linux lists for a core (``cpuinfo_max_freq``, in kHz), or None."""
    try:
        khz = float((cpufreq / "cpuinfo_max_freq").read_text().strip())
    except (OSError, ValueError):
        return None
    return khz / 1e6 if khz > 0 else None


def physical_cores_available(sysfs: Path = CPU_SYSFS, cpus=None) -> int:
    """Physical cores this process may run on: its CPUs (``os.sched_getaffinity``), with
    hyper-threads of one core counted once (sysfs ``topology/core_id``)."""
    if cpus is None:
        try:
            cpus = os.sched_getaffinity(0)
        except AttributeError:  # not on Linux
            cpus = range(os.cpu_count() or 1)
    cores = set()
    for cpu in cpus:
        topology = sysfs / f"cpu{cpu}" / "topology"
        try:
            cores.add(((topology / "physical_package_id").read_text().strip(),
                       (topology / "core_id").read_text().strip()))
        except OSError:
            cores.add(("cpu", str(cpu)))  # no topology: count each CPU as a core
    return max(1, len(cores))


@dataclass(frozen=True)
class CpuPeakEstimate:
    """The float32 peak of ``cores`` cores: lanes x units x 2 FLOPs x clock x cores.

    ``clock`` says where ``ghz`` comes from: the highest clock Linux lists for the
    core (cpufreq; then this is a peak, if the assumed units are right), or else the
    clock ``/proc/cpuinfo`` reports, which in a virtual machine is usually the base
    clock. Cores run faster than the base clock for a while (turbo), so a measured
    rate can exceed a peak derived from it; ``clock_is_max`` tells the two apart.
    """
    cores: int
    ghz: float
    flop_per_cycle: int
    assumption: str
    clock: str = "clock /proc/cpuinfo reports"
    lanes: int = 0
    units: int = 0
    isa: str = ""
    clock_is_max: bool = False

    @property
    def gflops(self) -> float:
        return self.cores * self.ghz * self.flop_per_cycle

    def implied_ghz(self, gflops: float) -> float:
        """The clock ``gflops`` needs on these cores at this FLOP per cycle."""
        return gflops / (self.cores * self.flop_per_cycle)

    def derivation(self) -> List[tuple]:
        """The factors of the peak: (factor, value, where it comes from)."""
        cores = f"{self.cores} core{'s' if self.cores != 1 else ''}"
        units = f"{self.units} unit{'s' if self.units != 1 else ''}"
        return [
            ("float32 lanes per vector", f"{self.lanes}", f"{self.isa}, from the CPU's flags"),
            ("vector FMA units per core", units, f"assumed: {self.assumption}"),
            ("FLOPs per lane and FMA", "2", "a multiply and an add"),
            ("clock", f"{self.ghz:.2f} GHz", self.clock),
            ("cores", cores, "the threads PyTorch uses, at most the physical cores available"),
            ("peak", f"{self.gflops:,.1f} GFLOP/s", "the product of the factors above"),
        ]

    def describe(self) -> str:
        return (f"derived peak {self.gflops:.0f} GFLOP/s = {self.lanes} lanes x {self.units} FMA "
                f"unit{'s' if self.units != 1 else ''} x 2 FLOPs x {self.ghz:.2f} GHz, the "
                f"{self.clock} x {self.cores} core{'s' if self.cores != 1 else ''}; "
                f"{self.isa}, assuming {self.assumption}")


def _cpuinfo_field(text: str, key: str) -> Optional[str]:
    match = re.search(rf"^{re.escape(key)}\s*:\s*(.*)$", text, flags=re.M)
    return match.group(1).strip() if match else None


def cpu_peak_estimate(cpuinfo: Optional[str] = None, cores: Optional[int] = None,
                      cpufreq: Optional[Path] = None) -> Optional[CpuPeakEstimate]:
    """The float32 peak of the cores PyTorch uses, derived from what the CPU reports, or
    None where /proc/cpuinfo cannot tell.

    lanes (the widest vector flag) x vector units (assumed, see ``fp32_vector_units``)
    x 2 FLOPs x clock x cores. The clock is the highest one cpufreq lists (read from
    ``cpufreq``; by default from sysfs when ``cpuinfo`` is not given), else the one
    /proc/cpuinfo reports, often the base clock, which cores exceed while they boost.
    The cores are PyTorch's threads, at most the physical cores this process may use.
    """
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
        if cpufreq is None:
            cpufreq = CPUFREQ
    mhz = _cpuinfo_field(cpuinfo, "cpu MHz")
    flags = _cpuinfo_field(cpuinfo, "flags")
    if not mhz or not flags:
        return None
    vendor = _cpuinfo_field(cpuinfo, "vendor_id") or ""
    family = _cpuinfo_field(cpuinfo, "cpu family")
    units = fp32_vector_units(set(flags.split()), vendor,
                              int(family) if family and family.isdigit() else None)
    if units is None:
        return None
    if cores is None:
        cores = min(torch.get_num_threads(), physical_cores_available())
    per_cycle, assumption = units.flop_per_cycle, units.assumption
    shape = dict(lanes=units.lanes, units=units.units, isa=units.isa)
    listed = max_clock_ghz(cpufreq) if cpufreq is not None else None
    if listed is not None:
        return CpuPeakEstimate(cores, listed, per_cycle, assumption,
                               "highest clock cpufreq lists for the core", clock_is_max=True, **shape)
    return CpuPeakEstimate(cores, float(mhz) / 1e3, per_cycle, assumption,
                           "clock /proc/cpuinfo reports, often the base clock; turbo can exceed it",
                           **shape)


@dataclass(frozen=True)
class Peak:
    """A peak FLOP/s for a device and dtype: its value (None if unknown), kind and provenance."""
    tflops: Optional[float]
    kind: str  # 'datasheet', 'derived' (a CPU's, from its flags and clock) or 'unknown'
    explanation: str


def _dtype_key(dtype: torch.dtype, device_type: str) -> str:
    if dtype == torch.float32 and device_type == "cuda" and torch.get_float32_matmul_precision() != "highest":
        return "tf32"  # PyTorch was told it may run float32 matrix products in TF32 on tensor cores
    return str(dtype).replace("torch.", "")


def peak_flops(dev, dtype: torch.dtype = torch.float32) -> Peak:
    """The peak to compare a measured FLOP/s against, and where it comes from."""
    dev = torch.device(dev)
    if dev.type == "cuda":
        name = torch.cuda.get_device_name(dev)
        spec = gpu_spec(name)
        key = _dtype_key(dtype, "cuda")
        if spec is None:
            return Peak(None, "unknown", f"{name} is not in dlperf.hardware.GPU_SPECS: "
                                         f"look its {key} peak up in its datasheet")
        if key not in spec.tflops:
            return Peak(None, "unknown", f"the {spec.name} datasheet gives no {key} peak "
                                         f"(no tensor-core support for it)")
        return Peak(spec.tflops[key], "datasheet",
                    f"{spec.name}, {key} dense, {spec.tflops[key]:g} TFLOP/s ({spec.source})")
    if dev.type == "cpu" and dtype == torch.float32:
        estimate = cpu_peak_estimate()
        if estimate is None:
            return Peak(None, "unknown", "this CPU does not report its clock and vector units")
        return Peak(estimate.gflops / 1e3, "derived", estimate.describe())
    return Peak(None, "unknown", f"no peak known for {dtype} on {dev.type}")


# --- caches and memory this machine reports ----------------------------------------------------------

def _parse_size(text: str) -> int:
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)i?B?\s*", text, flags=re.I)
    if not match:
        raise ValueError(f"not a cache size: {text!r}")
    return int(match.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[match.group(2).upper()]


def cache_sizes(dev=None, sysfs: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> Dict[str, int]:
    """Data-cache sizes in bytes, by name: the CPU's from sysfs, a GPU's L2 from CUDA."""
    dev = torch.device(dev if dev is not None else "cpu")
    if dev.type == "cuda":
        return {"L2": int(torch.cuda.get_device_properties(dev).L2_cache_size)}
    sizes = {}
    for index in sorted(sysfs.glob("index*")):
        try:
            kind = (index / "type").read_text().strip()
            level = (index / "level").read_text().strip()
            size = _parse_size((index / "size").read_text())
        except (OSError, ValueError):
            continue
        if kind in ("Data", "Unified"):
            sizes[f"L{level}" + ("d" if kind == "Data" else "")] = size
    return sizes


def matmul_flops(n: int, m: Optional[int] = None, k: Optional[int] = None) -> int:
    """Floating-point operations of an (n x k) @ (k x m) product: one multiply and one add per term."""
    m = n if m is None else m
    k = n if k is None else k
    return 2 * n * m * k


def memory_bytes(dev=None) -> Optional[int]:
    """Physical memory of a device in bytes: a GPU's from CUDA, the host's from the OS (or None)."""
    dev = torch.device(dev if dev is not None else "cpu")
    if dev.type == "cuda":
        return int(torch.cuda.get_device_properties(dev).total_memory)
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows) or no such name
        return None


def pointer_chain(size_bytes: int, seed: int = 0):
    """A random cycle through an array of ``size_bytes`` of int64: ``chain[i]`` is the
    index that follows ``i``, and following it from anywhere visits every element once
    before it returns (a random order, so no prefetcher can guess the next address)."""
    import numpy as np

    n = max(2, size_bytes // 8)
    order = np.random.default_rng(seed).permutation(n)
    chain = np.empty(n, dtype=np.int64)
    chain[order] = np.roll(order, -1)
    return chain


def chase_ns(chain, steps: int, repeat: int = 3) -> float:
    """Nanoseconds per step of following ``chain`` for ``steps`` steps, the fastest of
    ``repeat`` runs. Each load needs the one before it, so the loads cannot overlap: a
    step costs the latency of wherever the element lives, plus the interpreter's own
    fixed cost per step, which a small chain that stays in L1 measures alone."""
    import time

    best = float("inf")
    for _ in range(repeat):
        i = 0
        start = time.perf_counter()
        for _ in range(steps):
            i = chain[i]
        best = min(best, time.perf_counter() - start)
    return best / steps * 1e9


def largest_drop(sizes: List[int], rates: List[float]):
    """Where a throughput curve falls most between neighbouring working sets.

    Returns ``(i, factor)``: the rate fell by ``factor = rates[i] / rates[i + 1]``
    from ``sizes[i]`` to ``sizes[i + 1]``, the largest such factor (below 1 if
    the curve never falls).
    """
    if len(sizes) != len(rates) or len(rates) < 2:
        raise ValueError("need at least two working sets, each with its rate")
    factors = [rates[i] / rates[i + 1] for i in range(len(rates) - 1)]
    i = max(range(len(factors)), key=factors.__getitem__)
    return i, factors[i]


def nearest_cache(low: int, high: int, caches: Dict[str, int]):
    """The reported cache closest to a drop between working sets ``low`` and ``high`` bytes.

    Returns ``(name, size, factor)``, where ``factor`` is 1 if the cache size lies
    between ``low`` and ``high`` and otherwise how many times the size lies beyond
    the nearer end (so 2 means twice ``high``, or half of ``low``); None without caches.
    """
    if not caches:
        return None

    def distance(size: int) -> float:
        if size < low:
            return low / size
        if size > high:
            return size / high
        return 1.0

    name = min(caches, key=lambda key: distance(caches[key]))
    return name, caches[name], distance(caches[name])
