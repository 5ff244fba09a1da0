"""What the training pages share: test accuracy and a per-epoch record of a run."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import torch
from torch import nn

from .plotting import plot_lines


@torch.no_grad()
def evaluate_accuracy(predict: Callable[[torch.Tensor], torch.Tensor], data_iter,
                      device: Optional[torch.device] = None) -> float:
    """Fraction of examples of ``data_iter`` whose arg-max prediction equals the label.

    ``predict`` is any callable from a batch to logits: an ``nn.Module`` (put in
    evaluation mode for the duration, then restored) or a function such as
    ``lambda X: lenet(X, params)``. Batches are moved to ``device`` first.
    """
    module = predict if isinstance(predict, nn.Module) else None
    was_training = module.training if module is not None else False
    if module is not None:
        module.eval()
    correct, total = 0, 0
    try:
        for X, y in data_iter:
            if device is not None:
                X, y = X.to(device), y.to(device)
            correct += int((predict(X).argmax(dim=1) == y).sum())
            total += len(y)
    finally:
        if module is not None:
            module.train(was_training)
    if total == 0:
        raise ValueError("evaluate_accuracy got an empty data iterator")
    return correct / total


@dataclass
class History:
    """Test accuracy and wall-clock seconds of each epoch of one training run."""
    label: str
    test_acc: List[float] = field(default_factory=list)
    seconds: List[float] = field(default_factory=list)

    def add(self, test_acc: float, seconds: float) -> None:
        self.test_acc.append(test_acc)
        self.seconds.append(seconds)

    @property
    def epochs(self) -> int:
        return len(self.test_acc)

    def sec_per_epoch(self, skip_first: bool = True) -> float:
        """Mean seconds per epoch; the first epoch (warm-up: allocations, caches) is left
        out when there are others."""
        times = self.seconds[1:] if skip_first and len(self.seconds) > 1 else self.seconds
        return sum(times) / len(times)

    def summary(self) -> str:
        return (f"{self.label}: test accuracy {self.test_acc[-1]:.3f} after {self.epochs} "
                f"epochs, {self.sec_per_epoch():.2f} s/epoch")


def plot_accuracy(histories: Dict[str, History] | List[History], ax=None, title: str = ""):
    """Test accuracy against epoch, one line per run."""
    runs = list(histories.values()) if isinstance(histories, dict) else list(histories)
    epochs = range(1, max(h.epochs for h in runs) + 1)
    ax = plot_lines([], {}, xlabel="epoch", ylabel="test accuracy", title=title, ax=ax)
    for h in runs:
        ax.plot(range(1, h.epochs + 1), h.test_acc, marker="o", markersize=4, label=h.label)
    ax.set_xticks(list(epochs))
    ax.legend()
    return ax
