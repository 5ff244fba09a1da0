"""dlperf: the helpers every page of the course shares.

One place for each idea: devices (GPUs or CPU stand-ins), the run profile,
Fashion-MNIST (real or synthetic), timing and plots. Pages start with
``import dlperf; dlperf.page_setup()``.
"""
from __future__ import annotations

import platform

import torch

from .data import LABELS, fashion_mnist, load_fashion_mnist
from .accelerators import describe, device, devices, gpu_count, synchronize
from .plotting import bar_chart, plot_lines, plot_timeline, use_book_style
from .profile import RunProfile, run_profile
from .timing import Benchmark, compare, time_it, timing_table

__all__ = [
    "LABELS", "Benchmark", "RunProfile", "bar_chart", "compare", "describe", "device",
    "devices", "fashion_mnist", "gpu_count", "load_fashion_mnist", "page_setup",
    "plot_lines", "plot_timeline", "run_profile", "synchronize", "time_it",
    "timing_table", "use_book_style",
]


def environment_line(profile: RunProfile) -> str:
    gpus = gpu_count()
    hardware = (f"{gpus} GPU(s): {describe(torch.device('cuda:0'))}" if gpus
                else describe(torch.device("cpu")))
    return (f"Run profile {profile}; PyTorch {torch.__version__}, "
            f"Python {platform.python_version()}; {hardware}")


def page_setup(seed: int = 0) -> RunProfile:
    """First cell of every page: plot style, a fixed seed, and one line saying where we run."""
    use_book_style()
    torch.manual_seed(seed)
    profile = run_profile()
    print(environment_line(profile))
    return profile
