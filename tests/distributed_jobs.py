"""Jobs that tests/test_distributed.py runs in worker processes with dlperf.distributed.

They live in a module (not in the test file) because the workers are started with ``forkserver``
or ``spawn`` and import the function by name; they are here, not in ``dlperf``, because only the
tests run them. The workers find ``tests`` through the parent's ``sys.path``, which the fork
server and spawn hand on.
"""
from __future__ import annotations

import os
import time
from typing import Sequence

import torch
import torch.distributed as dist

from dlperf.distributed import ring_allreduce


def _check_data(rank: int, shape: Sequence[int], dtype_name: str, transpose: bool) -> torch.Tensor:
    dtype = getattr(torch, dtype_name)
    generator = torch.Generator().manual_seed(1000 + rank)
    if dtype.is_floating_point:
        data = torch.randn(*shape, generator=generator).to(dtype)
    else:
        data = torch.randint(-1000, 1000, tuple(shape), generator=generator).to(dtype)
    return data.t() if transpose and data.dim() == 2 else data  # non-contiguous must work too


def allreduce_check_job(rank: int, world_size: int, cases: Sequence[tuple]) -> dict:
    """For each ``(shape, dtype name, transpose)``: our ring and ``dist.all_reduce`` on the same
    per-rank data, over all processes and over a subgroup of all but the last process."""
    results = {"world": [], "subgroup": []}
    for shape, dtype_name, transpose in cases:
        data = _check_data(rank, shape, dtype_name, transpose)
        ours, theirs = data.clone(), data.clone(memory_format=torch.contiguous_format)
        returned = ring_allreduce(ours)
        dist.all_reduce(theirs)
        results["world"].append({"input": data, "ours": ours, "theirs": theirs,
                                 "same_object": returned is ours})
    members = list(range(max(1, world_size - 1)))
    group = dist.new_group(members)  # every process must call new_group, members or not
    if rank in members:
        for shape, dtype_name, transpose in cases:
            data = _check_data(rank, shape, dtype_name, transpose)
            ours, theirs = data.clone(), data.clone(memory_format=torch.contiguous_format)
            ring_allreduce(ours, group=group)
            dist.all_reduce(theirs, group=group)
            results["subgroup"].append({"input": data, "ours": ours, "theirs": theirs})
    dist.barrier()
    return results


def fail_job(rank: int, world_size: int) -> None:
    if rank == world_size - 1:
        raise RuntimeError(f"worker {rank} fails on purpose")
    dist.barrier()


def sleep_job(rank: int, world_size: int, seconds: float) -> None:
    time.sleep(seconds)


def cpp_log_level(rank, world_size):
    """The C++ log level the worker was started with."""
    return os.environ.get("TORCH_CPP_LOG_LEVEL")


class _SlowWork:
    """Stands for the ``Work`` handle of an asynchronous collective that needs ``seconds``."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def wait(self) -> bool:
        time.sleep(self.seconds)
        return True


def timed_job(rank: int, world_size: int, seconds: float) -> dict:
    """``_timed`` on an op that returns at once but whose work takes ``seconds`` on the last
    rank only, and on a real asynchronous gloo allreduce; what each rank measured."""
    from dlperf.distributed import _timed, _timing_device

    slow = rank == world_size - 1
    waited = _timed(lambda: _SlowWork(seconds if slow else 0.0), None, repeat=2, warmup=1)
    data = torch.full((1000,), float(rank + 1))
    _timed(lambda: dist.all_reduce(data, async_op=True), None, repeat=1, warmup=0)
    return {"waited": waited, "sum": float(data[0]), "device": str(_timing_device())}
