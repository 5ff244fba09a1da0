"""Whether PyTorch sees a CUDA GPU, asked in a throwaway process.

CUDA, once initialised, does not survive ``fork()``: neither the grader nor its fork server
may touch it, so a spawner starts :func:`probe` (forked from the warm server, where PyTorch
is imported already, or a fresh interpreter) and reads its answer from a file.
"""
from __future__ import annotations

import os
import tempfile
from typing import Optional

from .policy import process_environment
from .spawn import Spawner, open_spawner

TARGET = "autograder.device:probe"


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


def cuda_available(spawner: Optional[Spawner] = None) -> bool:
    """Ask a throwaway process of ``spawner`` (a fresh interpreter when None)."""
    handle, path = tempfile.mkstemp(prefix="cuda-probe-")
    os.close(handle)
    try:
        (spawner or open_spawner("fresh", env=process_environment())).start(TARGET, path).wait()
        with open(path) as answer:
            return answer.read() == "1"
    finally:
        os.unlink(path)

