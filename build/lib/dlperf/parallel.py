"""Data parallelism by hand: the course's reference ``split_batch`` and ``allreduce``.

These are the two functions learners write in the ``split_batch`` and
``allreduce`` assignments, and the ones the chapter "Training on Multiple
Devices from Scratch" uses. They work on GPUs and on CPU "virtual devices"
alike (``dlperf.devices()`` gives ``[cpu, cpu]`` on a machine without a GPU).
"""
from __future__ import annotations

from typing import List, Sequence, Tuple, Union

import torch
from torch import nn

DeviceLike = Union[torch.device, str, int]


def _as_device(dev: DeviceLike) -> torch.device:
    # A bare integer means a GPU index, as in nn.parallel.scatter's target_gpus.
    return torch.device("cuda", dev) if isinstance(dev, int) else torch.device(dev)


def split_batch(X: torch.Tensor, y: torch.Tensor,
                devices: Sequence[DeviceLike]) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
    """Shard a minibatch ``X`` and its labels ``y`` over ``devices`` along dimension 0.

    Returns ``(X_shards, y_shards)``, two lists of the same length; shard ``i`` of
    both lives on ``devices[i]``, and the shards, concatenated in order, give back
    ``X`` and ``y``.

    Shard sizes are exactly those of ``nn.parallel.scatter`` on GPUs, which cuts
    with ``torch.chunk``: every shard has ``ceil(n / k)`` rows except a smaller
    last one, for ``n`` examples and ``k`` devices. So there can be FEWER than
    ``k`` shards, and only the first devices get one: 3 examples on 4 devices
    give 3 shards of 1, and 6 examples on 4 devices give 3 shards of 2. An empty
    batch gives ``k`` empty shards, as ``torch.chunk`` does.

    ``nn.parallel.scatter`` itself raises ``ValueError: Expected a non cpu
    device`` for CPU devices, so it is only used when every device is a GPU;
    otherwise the same cut is made with ``torch.chunk`` and each shard is copied
    with ``.to(device)``.
    """
    devices = [_as_device(d) for d in devices]
    if not devices:
        raise ValueError("split_batch needs at least one device, got an empty list")
    if X.dim() == 0 or y.dim() == 0:
        raise ValueError("X and y need a batch dimension (dimension 0); got a scalar")
    if len(X) != len(y):
        raise ValueError(f"X has {len(X)} examples but y has {len(y)} labels; "
                         "they must agree in length (dimension 0)")
    if all(d.type == "cuda" for d in devices):
        X_shards = nn.parallel.scatter(X, devices)
        y_shards = nn.parallel.scatter(y, devices)
        return list(X_shards), list(y_shards)
    # torch.chunk is what scatter uses internally; zip stops at the shorter list,
    # so when there are fewer shards than devices the last devices get nothing.
    X_shards = [shard.to(d) for shard, d in zip(X.chunk(len(devices)), devices)]
    y_shards = [shard.to(d) for shard, d in zip(y.chunk(len(devices)), devices)]
    return X_shards, y_shards


def allreduce(data: Sequence[torch.Tensor]) -> None:
    """Sum same-shaped tensors that may live on different devices, in place.

    Afterwards every tensor of ``data`` holds the sum of all of them (the
    caller's tensors change: pass parameter gradients and they are
    synchronized). The sum is accumulated in list order on the device of
    ``data[0]`` and then copied back, so every tensor receives the identical
    result, and integer dtypes are summed exactly. One tensor is left as it is.

    Raises ``ValueError`` for an empty list or tensors of different shapes or
    dtypes, ``TypeError`` for something that is not a tensor.
    """
    data = list(data)
    if not data:
        raise ValueError("allreduce needs at least one tensor, got an empty list")
    for i, tensor in enumerate(data):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"allreduce expects tensors; item {i} is {type(tensor).__name__}")
    first = data[0]
    for i, tensor in enumerate(data[1:], start=1):
        if tensor.shape != first.shape:
            raise ValueError(f"allreduce needs tensors of one shape: item 0 has shape "
                             f"{tuple(first.shape)}, item {i} has {tuple(tensor.shape)}")
        if tensor.dtype != first.dtype:
            raise ValueError(f"allreduce needs tensors of one dtype: item 0 is {first.dtype}, "
                             f"item {i} is {tensor.dtype}")
    with torch.no_grad():  # in-place writes into leaf tensors (parameters, .grad) are fine here
        # A separate accumulator keeps the result right even if the same tensor is passed twice.
        total = first.detach().clone()
        for tensor in data[1:]:
            total += tensor.detach().to(total.device)
        for tensor in data:
            tensor.copy_(total)
