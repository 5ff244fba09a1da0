"""dlperf: the helpers every page of the course shares.

One place for each idea: devices (GPUs or CPU stand-ins), the run profile,
Fashion-MNIST (real or synthetic), timing, plots and quoting measured values in the
text (``dlperf.glue``, which works with or without myst-nb). Pages start with
``import dlperf; dlperf.page_setup()``.
"""
from __future__ import annotations

import importlib
import logging
import platform
import re
import warnings

import torch

from .accelerators import describe, device, devices, gpu_count, synchronize
from .profile import RunProfile, run_profile

# Names from heavier submodules (torchvision, pandas, matplotlib) load on first use, so a
# process that needs only part of the package (each torchrun worker) does not pay for all.
_LAZY = {
    "LABELS": "data", "fashion_mnist": "data", "load_fashion_mnist": "data",
    "bar_chart": "plotting", "plot_lines": "plotting", "plot_timeline": "plotting",
    "use_book_style": "plotting",
    "Benchmark": "timing", "compare": "timing", "time_it": "timing", "timing_table": "timing",
    "glue": "pages",
}

__all__ = sorted([*_LAZY, "RunProfile", "describe", "device", "devices", "gpu_count",
                  "page_setup", "run_profile", "synchronize"])


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def environment_line(profile: RunProfile) -> str:
    gpus = gpu_count()
    hardware = (f"{gpus} GPU{'s' if gpus > 1 else ''}: {describe(torch.device('cuda:0'))}" if gpus
                else describe(torch.device("cpu")))
    # Two lines, so that neither runs past a page's 88 columns.
    return (f"Run profile {profile};\nPyTorch {torch.__version__}, "
            f"Python {platform.python_version()}; {hardware}")


# Warnings that PyTorch prints from inside its own code on a GPU run and that say nothing
# about a page's code: (category, start of the message). Each is silenced by its own text,
# so that any other warning still shows. TF32 stays off: the pages measure float32 as is.
QUIET_WARNINGS = [
    # Inductor, once per process where a GPU has TF32 tensor cores
    (UserWarning, "TensorFloat32 tensor cores for float32 matrix multiplication available "
                  "but not enabled"),
    # torch.export's pickling of tree specs, deprecated inside PyTorch itself
    (FutureWarning, "`isinstance(treespec, LeafSpec)` is deprecated"),
    # torch.export.load reads weights from a read-only buffer with torch.frombuffer
    (UserWarning, "The given buffer is not writable"),
    # a profiler with a schedule reports only its last cycle, which is what the pages read
    (UserWarning, "Warning: Profiler clears events at the end of each cycle"),
]


def quiet_library_warnings() -> None:
    """Silence the warnings of QUIET_WARNINGS, and only those."""
    for category, start in QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=re.escape(start), category=category)


def page_setup(seed: int = 0) -> RunProfile:
    """First cell of every page: plot style, a fixed seed, and one line saying where we run."""
    from .plotting import use_book_style
    use_book_style()
    # torch.compile probes for a CUDA toolkit even on a CPU-only machine and logs a warning
    # when it finds a compiler without a GPU runtime; it says nothing about the page's code.
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    quiet_library_warnings()
    torch.manual_seed(seed)
    profile = run_profile()
    print(environment_line(profile))
    return profile
