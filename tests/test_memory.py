"""dlperf.memory: byte counts that follow from the tensors, on any device."""
import pytest
import torch
from torch import nn

from dlperf import memory


def small_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def test_tensor_bytes_counts_elements_times_their_size():
    assert memory.tensor_bytes(torch.zeros(3, 5)) == 60
    assert memory.tensor_bytes(torch.zeros(3, 5, dtype=torch.bfloat16)) == 30
    assert memory.tensor_bytes([torch.zeros(2), torch.zeros(4, dtype=torch.float64)]) == 8 + 32
    assert memory.tensor_bytes([]) == 0


def test_model_state_counts_parameters_gradients_and_adam_state():
    model = small_model()
    n = memory.parameter_count(model)
    assert n == 8 * 16 + 16 + 16 * 4 + 4
    optimizer = torch.optim.Adam(model.parameters())
    before = memory.model_state_bytes(model, optimizer)
    assert before == {"parameters": 4 * n, "gradients": 0}  # no grads, lazy Adam state
    model(torch.randn(5, 8)).sum().backward()
    optimizer.step()
    after = memory.model_state_bytes(model, optimizer)
    assert after["parameters"] == after["gradients"] == 4 * n
    assert after["optimizer: exp_avg"] == after["optimizer: exp_avg_sq"] == 4 * n
    # one step counter per parameter tensor, tiny next to the rest
    assert after["optimizer: step"] == 4 * len(list(model.parameters()))


def test_a_shared_parameter_counts_once():
    layer = nn.Linear(4, 4)
    model = nn.Sequential(layer, nn.ReLU(), layer)
    assert memory.parameter_count(model) == 20
    assert memory.model_state_bytes(model)["parameters"] == 80


def test_saved_tensors_counts_activations_and_not_parameters():
    model = small_model()
    x = torch.randn(32, 8)
    with memory.SavedTensors(exclude=model.parameters()) as saved:
        model(x).sum()
    # Linear 1 saves its input (32x8), ReLU its output (32x16), Linear 2 its input
    # (the same ReLU output: one storage, counted once); the weights are excluded.
    assert saved.bytes == 4 * (32 * 8 + 32 * 16)
    assert saved.excluded_bytes == 4 * 16 * 4  # the second weight is saved for the input grad
    assert saved.by_dtype == {"float32": saved.bytes}
    assert saved.tensors >= 3


def test_saved_tensors_scale_with_the_batch_and_vanish_without_grad():
    model = small_model()
    sizes = []
    for rows in (16, 64):
        with memory.SavedTensors(exclude=model.parameters()) as saved:
            model(torch.randn(rows, 8))
        sizes.append(saved.bytes)
    assert sizes[1] == 4 * sizes[0]
    with torch.no_grad(), memory.SavedTensors() as saved:
        model(torch.randn(16, 8))
    assert saved.bytes == 0 and saved.tensors == 0


def test_saved_tensors_sees_low_precision_under_autocast():
    model = small_model()
    with memory.SavedTensors(exclude=model.parameters()) as saved:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(torch.randn(32, 8)).float().sum()
    assert saved.by_dtype.get("bfloat16", 0) > 0


def test_the_hook_is_removed_afterwards():
    model = small_model()
    with memory.SavedTensors() as saved:
        pass
    model(torch.randn(4, 8)).sum().backward()
    assert saved.tensors == 0


def test_device_peak_is_none_on_the_cpu():
    with memory.DevicePeak(torch.device("cpu")) as peak:
        torch.ones(1000)
    assert not peak.available
    assert peak.peak_bytes is None and peak.extra_bytes is None and peak.baseline_bytes is None


@pytest.mark.gpu
def test_device_peak_sees_an_allocation_on_the_gpu():
    dev = torch.device("cuda")
    with memory.DevicePeak(dev) as peak:
        block = torch.empty(2**20, device=dev)  # 4 MiB
        del block
    assert peak.available
    assert peak.extra_bytes >= 4 * 2**20
    assert peak.peak_bytes >= peak.baseline_bytes + 4 * 2**20


@pytest.mark.parametrize("size, text", [(None, "n/a"), (512, "512 B"), (2048, "2.00 KiB"),
                                        (3 * 2**20, "3.00 MiB"), (5 * 2**30, "5.00 GiB")])
def test_format_bytes(size, text):
    assert memory.format_bytes(size) == text


def test_saved_views_count_their_extent_and_excluded_data_counts_nothing():
    model = small_model()
    batch = torch.randn(64, 8)
    with memory.SavedTensors(exclude=model.parameters()) as saved:
        model(batch[:16])  # a view of the first quarter of the batch
    assert saved.bytes == 4 * (16 * 8 + 16 * 16)  # the view's 16 rows, not all 64
    with memory.SavedTensors(exclude=[*model.parameters(), batch]) as saved:
        model(batch[16:32])
    assert saved.bytes == 4 * 16 * 16  # only the ReLU output: the input is data
    assert saved.excluded_bytes == 4 * 16 * 8 + 4 * 16 * 4


def test_overlapping_views_of_one_storage_count_once():
    x = torch.randn(10, 10, requires_grad=True)
    base = x * 1  # a non-leaf, so that its views are saved
    with memory.SavedTensors() as saved:
        (base[:6] * base[4:]).sum()  # rows 0-5 and 4-9 of one storage: 10 rows in all
    assert saved.bytes == 4 * 100


def test_allocation_peak_sees_a_temporary_that_is_gone_at_the_end():
    """The peak counts tensors alive at the same moment, even those freed before the end."""
    x = torch.randn(256, 256)  # 256 KiB, from before the block: not counted
    with memory.AllocationPeak("cpu") as peak:
        y = x @ x  # 256 KiB
        z = y + 1  # 256 KiB more while y is alive: the peak
        del y
        w = z * 2  # y is gone: 512 KiB again
        del z
    size = 256 * 256 * 4
    assert 2 * size <= peak.peak_bytes < 2 * size + 4096  # small bookkeeping allocations aside
    assert size <= peak.held_bytes < size + 4096  # only w is left
    assert w.shape == (256, 256)
