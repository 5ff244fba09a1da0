"""Devices for every page: the real GPUs when there are some, CPU stand-ins otherwise.

d2l's ``try_all_gpus()`` returns ``[]`` on a CPU-only machine, and code that
splits work over ``devices`` then divides by zero or indexes an empty list.
Here a machine without a GPU gets a stated number of CPU "virtual devices"
(the same ``torch.device('cpu')`` repeated), so multi-device code runs
unchanged, and the reader is told once that the numbers are CPU numbers.
"""
from __future__ import annotations

import os
import platform
from typing import List, Optional

import torch

_announced = False


def gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def cpu_notice(num_cpu: int) -> str:
    plural = "s" if num_cpu != 1 else ""
    return (f"No GPU found: using {num_cpu} CPU virtual device{plural}; "
            f"every timing on this page is a CPU number.")


def devices(num_cpu: int = 2, max_gpus: Optional[int] = None,
            announce: bool = True) -> List[torch.device]:
    """Every GPU (at most ``max_gpus``) or, without one, ``num_cpu`` CPU virtual devices."""
    if num_cpu < 1:
        raise ValueError(f"num_cpu must be at least 1, got {num_cpu}")
    n = gpu_count()
    if max_gpus is not None:
        n = min(n, max_gpus)
    if n:
        return [torch.device(f"cuda:{i}") for i in range(n)]
    global _announced
    if announce and not _announced:
        print(cpu_notice(num_cpu))
        _announced = True
    return [torch.device("cpu")] * num_cpu


def device(i: int = 0) -> torch.device:
    """GPU ``i`` if it exists, else the CPU (never raises, unlike indexing a list)."""
    return torch.device(f"cuda:{i}") if gpu_count() > i else torch.device("cpu")


def synchronize(dev: Optional[torch.device] = None) -> None:
    """Wait for queued work on ``dev`` (every GPU when ``None``); a no-op on the CPU.

    CUDA kernels run asynchronously, so a clock stopped before this call
    measures how fast work was queued, not how fast it ran.
    """
    if dev is not None and torch.device(dev).type != "cuda":
        return
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return
    if dev is not None:
        torch.cuda.synchronize(dev)
        return
    for i in range(torch.cuda.device_count()):
        torch.cuda.synchronize(i)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe(dev: torch.device) -> str:
    """A name for the output: 'NVIDIA H100 80GB HBM3 (cuda:0)' or 'CPU: <model>, 2 threads'."""
    dev = torch.device(dev)
    if dev.type == "cuda":
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        return f"{torch.cuda.get_device_name(index)} (cuda:{index})"
    threads = torch.get_num_threads()
    return (f"CPU: {_cpu_model()}, {threads} thread{'s' if threads != 1 else ''} "
            f"of {os.cpu_count()} cores")
