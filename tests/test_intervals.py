"""dlperf.intervals: the interval algebra that dlperf.ddp (trace spans) and dlperf.memory
(storage extents) share."""
import pytest

from dlperf.intervals import intersection, subtract, total, union


def test_interval_arithmetic():
    assert union([(3, 4), (0, 1), (0.5, 2)]) == [(0, 2), (3, 4)]
    assert union([(0, 1), (1.05, 2)], gap=0.1) == [(0, 2)]
    assert union([]) == []
    assert total([(0, 2), (1, 3)]) == 3
    assert total([]) == 0
    assert intersection([(0, 2), (5, 6)], [(1, 5.5)]) == pytest.approx(1.5)
    assert intersection([(0, 1)], [(2, 3)]) == 0
    assert subtract([(0, 10)], [(2, 3), (5, 6)]) == [(0, 2), (3, 5), (6, 10)]
    assert subtract([(0, 1)], [(0, 1)]) == []


def test_byte_extents_stay_whole_numbers():
    # dlperf.memory counts the bytes saved tensors span: touching and nested extents count once.
    extents = [(0, 400), (400, 800), (100, 200), (1000, 1004)]
    length = total(extents)
    assert length == 804 and isinstance(length, int)


def test_memory_counts_shared_storage_with_this_module():
    import torch

    from dlperf.memory import SavedTensors
    x = torch.randn(64, requires_grad=True)
    with SavedTensors(exclude=[x]) as saved:
        y = x.exp()          # saves its output (64 floats)
        (y * y).sum()        # saves y twice more: the same storage, counted once
    assert saved.bytes == 64 * 4 and isinstance(saved.bytes, int)
