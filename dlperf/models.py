"""The two models of the multi-device chapters.

* ``lenet``: a LeNet-style network written with explicit parameter tensors
  (no ``nn.Module``), so that copying parameters to devices and summing their
  gradients is visible code, not something a wrapper does.
* ``resnet18``: ResNet-18 for small (28x28) images, as an ``nn.Module`` made
  of ordinary (not lazy) layers, with a ``width`` knob so the quick profile can
  train it on a CPU. ``init_resnet`` initializes every layer explicitly.
"""
from __future__ import annotations

import math
from typing import List, Optional

import torch
import torch.nn.functional as F
from torch import nn

# (shape, fan_in) of every LeNet parameter, in the order lenet() uses them.
LENET_SHAPES = [
    ((6, 1, 5, 5), 1 * 5 * 5), ((6,), None),        # conv 1: 1 -> 6 channels, 5x5
    ((16, 6, 5, 5), 6 * 5 * 5), ((16,), None),      # conv 2: 6 -> 16 channels, 5x5
    ((16 * 5 * 5, 120), 16 * 5 * 5), ((120,), None),  # dense 400 -> 120
    ((120, 84), 120), ((84,), None),                # dense 120 -> 84
    ((84, 10), 84), ((10,), None),                  # dense 84 -> 10 classes
]


def lenet_params(seed: Optional[int] = 0, device=None) -> List[torch.Tensor]:
    """Fresh LeNet parameters: He-normal weights (suited to ReLU), zero biases.

    The same ``seed`` gives the same parameters, so runs on 1 and on 2 devices
    can start from identical weights.
    """
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    params = []
    for shape, fan_in in LENET_SHAPES:
        if fan_in is None:
            tensor = torch.zeros(shape)
        else:
            tensor = torch.randn(shape, generator=generator) * math.sqrt(2.0 / fan_in)
        params.append(tensor.to(device) if device is not None else tensor)
    return params


def lenet(X: torch.Tensor, params: List[torch.Tensor]) -> torch.Tensor:
    """LeNet-5 on a batch of 1x28x28 images; returns logits of shape (batch, 10)."""
    W1, b1, W2, b2, W3, b3, W4, b4, W5, b5 = params
    h = F.avg_pool2d(F.relu(F.conv2d(X, W1, b1, padding=2)), 2)  # 6 x 14 x 14
    h = F.avg_pool2d(F.relu(F.conv2d(h, W2, b2)), 2)              # 16 x 5 x 5
    h = h.flatten(1)
    h = F.relu(h @ W3 + b3)
    h = F.relu(h @ W4 + b4)
    return h @ W5 + b5


class Residual(nn.Module):
    """Two 3x3 convolutions with batch norm and a shortcut (1x1 conv when the shape changes)."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut = None
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels))

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        Y = F.relu(self.bn1(self.conv1(X)))
        Y = self.bn2(self.conv2(Y))
        return F.relu(Y + (X if self.shortcut is None else self.shortcut(X)))


def resnet18(num_classes: int = 10, in_channels: int = 1,
             width: int = 64) -> nn.Sequential:
    """ResNet-18 for small images: a 3x3 stem with stride 1 and no max-pooling.

    ``width`` is the channel count of the first stage (64 in the original); the
    four stages have ``width``, 2x, 4x and 8x channels, two residual blocks each.
    """
    widths = [width, 2 * width, 4 * width, 8 * width]
    layers = [nn.Conv2d(in_channels, width, 3, padding=1, bias=False),
              nn.BatchNorm2d(width), nn.ReLU()]
    channels = width
    for stage, out_channels in enumerate(widths):
        # every stage after the first halves the resolution
        stride = 1 if stage == 0 else 2
        layers += [Residual(channels, out_channels, stride),
                   Residual(out_channels, out_channels)]
        channels = out_channels
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, num_classes)]
    return nn.Sequential(*layers)


def init_resnet(net: nn.Module, seed: Optional[int] = 0) -> nn.Module:
    """Initialize every layer of ``net`` explicitly and reset batch-norm statistics.

    Convolutions get He-normal weights, the classifier a small normal, batch
    norm scale 1 and shift 0 with fresh running statistics. Lazy layers
    (``nn.LazyConv2d`` ...) have no weights until their first forward pass, so
    they are refused here instead of being silently skipped.
    """
    if seed is not None:
        torch.manual_seed(seed)
    for name, module in net.named_modules():
        lazy = isinstance(module, nn.modules.lazy.LazyModuleMixin)
        if lazy and module.has_uninitialized_params():
            raise ValueError(f"layer {name!r} is lazy and has no weights yet: run a "
                             "forward pass with a dummy batch before initializing")
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.01)
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.BatchNorm2d):
            module.reset_parameters()  # weight 1, bias 0, running mean 0 and variance 1
    return net


def parameter_count(net: nn.Module) -> int:
    return sum(p.numel() for p in net.parameters())
