"""The run profile, read in one place.

``quick`` keeps every page small enough for a CPU-only laptop and CI (small
sizes, few batches); ``full`` runs the real experiment and wants a GPU. The
environment variable ``DLPERF_PROFILE`` chooses; unset, a machine with a GPU
gets ``full`` and one without gets ``quick``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, Optional, TypeVar

import torch

ENV_VAR = "DLPERF_PROFILE"
PROFILES = ("quick", "full")

T = TypeVar("T")


@dataclass(frozen=True)
class RunProfile:
    name: str
    reason: str  # why this profile was chosen, shown to the reader

    @property
    def quick(self) -> bool:
        return self.name == "quick"

    @property
    def full(self) -> bool:
        return self.name == "full"

    def pick(self, *, quick: T, full: T) -> T:
        """The value that belongs to this profile: ``pick(quick=2, full=10)``."""
        return quick if self.quick else full

    def __str__(self) -> str:
        return f"{self.name} ({self.reason})"


def run_profile(environ: Optional[Mapping[str, str]] = None,
                cuda_available: Optional[bool] = None) -> RunProfile:
    """The profile this run uses; see the module docstring for the rule."""
    environ = os.environ if environ is None else environ
    value = environ.get(ENV_VAR, "").strip().lower()
    if value:
        if value not in PROFILES:
            raise ValueError(
                f"{ENV_VAR}={value!r} is not a run profile: set it to 'quick' or "
                f"'full', or unset it to choose by hardware.")
        return RunProfile(value, f"set by {ENV_VAR}")
    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    if cuda_available:
        return RunProfile("full", f"{ENV_VAR} unset and a GPU is present")
    return RunProfile("quick", f"{ENV_VAR} unset and no GPU is present")
