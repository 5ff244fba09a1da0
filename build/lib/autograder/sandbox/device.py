"""What this machine gives a kernel, asked in throwaway processes: a CUDA GPU
(:func:`cuda_available`) and the sandbox's layers (:func:`machine_layers`).

CUDA, once initialised, does not survive ``fork()``: neither the grader nor its fork server
may touch it, so a spawner starts :func:`probe` (forked from the warm server, where PyTorch
is imported already, or a fresh interpreter) and reads its answer from a file.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from typing import Optional, Tuple

from autograder.protocol import DEVICE_PROBE_TARGET, LAYER_NOTES, LAYERS_PROBE_TARGET
from autograder.sandbox.policy import process_environment
from autograder.sandbox.spawn import Spawner, open_spawner

_MACHINE_LAYERS: Optional[Tuple[str, ...]] = None  # machine_layers(), once found


def probe(answer_path: str) -> None:
    """In the throwaway process: write 1 when PyTorch sees a CUDA GPU, else 0."""
    answer = "0"
    try:
        os.environ.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)  # the real check, here
        import torch
        answer = "1" if torch.cuda.is_available() else "0"
    finally:
        with open(answer_path, "w") as out:
            out.write(answer)


def _ask(target: str, spawner: Optional[Spawner] = None, timeout: Optional[float] = None) -> str:
    """What ``target(answer_path)`` wrote, run in a throwaway process of ``spawner`` (a
    fresh interpreter with the environment the grader writes when None)."""
    handle, path = tempfile.mkstemp(prefix="autograder-probe-")
    os.close(handle)
    process = (spawner or open_spawner("fresh", env=process_environment())).start(target, path)
    try:
        process.wait(timeout)
        with open(path) as answer:
            return answer.read()
    finally:
        if process.poll() is None:
            process.kill()
        os.unlink(path)


def cuda_available(spawner: Optional[Spawner] = None) -> bool:
    """Ask a throwaway process of ``spawner`` (a fresh interpreter when None)."""
    return _ask(DEVICE_PROBE_TARGET, spawner) == "1"


def machine_layers() -> Tuple[str, ...]:
    """The namespaces a kernel started by this process can get on this machine (none
    without root or off Linux), found once by making them as a kernel does, with the same
    functions (:func:`autograder.kernel.confine.probe_layers`), in a fresh process (a
    container may allow ``unshare`` and still deny the mounts). The resource group and the
    change of user are decided by the grader."""
    global _MACHINE_LAYERS
    if _MACHINE_LAYERS is None:
        found: Tuple[str, ...] = ()
        if sys.platform.startswith("linux") and os.geteuid() == 0:
            try:
                answer = _ask(LAYERS_PROBE_TARGET, timeout=60)
                found = tuple(sorted(set(answer.splitlines()) & set(LAYER_NOTES)))
            except (OSError, subprocess.SubprocessError):
                pass  # no answer in time: no layer is taken for given
        _MACHINE_LAYERS = found
    return _MACHINE_LAYERS
