"""The reference split_batch and allreduce (dlperf.parallel), on CPU devices and on GPUs."""
import math

import pytest
import torch
from torch import nn

from dlperf.parallel import allreduce, split_batch

CPU = torch.device("cpu")


def expected_sizes(n: int, k: int):
    """Shard sizes of nn.parallel.scatter / torch.chunk, written out independently."""
    if n == 0:
        return [0] * k
    size = math.ceil(n / k)
    return [size] * (n // size) + ([n % size] if n % size else [])


# ---------------------------------------------------------------- split_batch
@pytest.mark.parametrize("k", [1, 2, 3, 4])
@pytest.mark.parametrize("n", [0, 1, 2, 3, 5, 6, 7, 8, 10, 13])
def test_split_batch_sizes_order_and_devices(n, k):
    X = torch.arange(n * 6, dtype=torch.float32).reshape(n, 1, 2, 3)
    y = torch.arange(n) * 10
    devices = [CPU] * k
    X_shards, y_shards = split_batch(X, y, devices)
    assert isinstance(X_shards, list) and isinstance(y_shards, list)
    sizes = expected_sizes(n, k)
    assert [len(s) for s in X_shards] == sizes
    assert [len(s) for s in y_shards] == sizes
    assert len(X_shards) <= k
    assert torch.equal(torch.cat(X_shards), X) and torch.equal(torch.cat(y_shards), y)
    for shard in X_shards:
        assert shard.shape[1:] == X.shape[1:] and shard.device == CPU


def test_expected_sizes_match_the_documented_examples():
    assert expected_sizes(8, 2) == [4, 4]
    assert expected_sizes(10, 4) == [3, 3, 3, 1]
    assert expected_sizes(6, 4) == [2, 2, 2]      # the fourth device gets nothing
    assert expected_sizes(3, 4) == [1, 1, 1]      # fewer examples than devices
    for n in range(0, 30):
        for k in range(1, 6):
            assert expected_sizes(n, k) == [len(c) for c in torch.arange(n).chunk(k)]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64,
                                   torch.int32, torch.uint8, torch.bool])
def test_split_batch_keeps_dtypes_and_values(dtype):
    X = (torch.arange(40) % 7).reshape(10, 4).to(dtype)
    y = torch.arange(10, dtype=torch.int64)
    X_shards, y_shards = split_batch(X, y, ["cpu", "cpu", "cpu"])  # strings work too
    assert all(s.dtype == dtype for s in X_shards)
    assert torch.equal(torch.cat(X_shards), X)
    assert [s.tolist() for s in y_shards] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_split_batch_labels_with_more_dimensions():
    X = torch.randn(5, 3)
    y = nn.functional.one_hot(torch.arange(5) % 3, 3)  # 2-D labels
    X_shards, y_shards = split_batch(X, y, [CPU, CPU])
    assert [s.shape for s in y_shards] == [(3, 3), (2, 3)]


def test_split_batch_errors():
    X, y = torch.randn(4, 2), torch.arange(4)
    with pytest.raises(ValueError, match="at least one device"):
        split_batch(X, y, [])
    with pytest.raises(ValueError, match="4 examples but y has 3"):
        split_batch(X, y[:3], [CPU, CPU])
    with pytest.raises(ValueError, match="batch dimension"):
        split_batch(torch.tensor(1.0), torch.tensor(1), [CPU])


def test_scatter_really_refuses_cpu_devices():
    """Why split_batch does not call nn.parallel.scatter on CPU devices."""
    with pytest.raises(ValueError, match="non cpu device"):
        nn.parallel.scatter(torch.zeros(4, 2), [CPU, CPU])


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 3, 6, 7, 64])
def test_split_batch_equals_scatter_on_gpus(n):
    gpus = [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    for devices in (gpus, [gpus[0]] * 2, [gpus[0]] * 4):
        X, y = torch.randn(n, 3), torch.arange(n)
        X_shards, y_shards = split_batch(X, y, devices)
        reference = nn.parallel.scatter(X, devices)
        assert [len(s) for s in X_shards] == [len(s) for s in reference] == \
            expected_sizes(n, len(devices))
        for shard, ref, dev in zip(X_shards, reference, devices):
            assert shard.device == dev and torch.equal(shard, ref)
        assert all(s.device == d for s, d in zip(y_shards, devices))


@pytest.mark.gpu
def test_split_batch_on_a_mix_of_gpu_and_cpu():
    devices = [torch.device("cuda", 0), CPU, torch.device("cuda", 0)]
    X, y = torch.randn(7, 2), torch.arange(7)
    X_shards, y_shards = split_batch(X, y, devices)
    assert [s.device for s in X_shards] == devices == [s.device for s in y_shards]
    assert torch.equal(torch.cat([s.cpu() for s in X_shards]), X)


# ---------------------------------------------------------------- allreduce
@pytest.mark.parametrize("count", [1, 2, 3, 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_allreduce_floats(count, dtype):
    generator = torch.Generator().manual_seed(count)
    originals = [torch.randn(3, 4, generator=generator).to(dtype) for _ in range(count)]
    data = [t.clone() for t in originals]
    allreduce(data)
    expected = torch.stack([t.double() for t in originals]).sum(0)
    tolerance = 1e-6 if dtype in (torch.float32, torch.float64) else 5e-2
    for tensor in data:
        assert tensor.dtype == dtype and tensor.shape == (3, 4)
        assert torch.allclose(tensor.double(), expected, rtol=tolerance, atol=tolerance)
        assert torch.equal(tensor, data[0])  # bit for bit the same result everywhere


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.uint8])
def test_allreduce_integers_are_exact(dtype):
    if dtype == torch.int64:
        big = 2 ** 60  # float64 cannot hold big + 1: a detour through floats would show
        data = [torch.tensor([big + 1, -3]), torch.tensor([big + 2, 5]), torch.tensor([1, 1])]
        expected = [2 * big + 4, 3]
    else:
        data = [torch.tensor([7, 100], dtype=dtype), torch.tensor([2, 50], dtype=dtype),
                torch.tensor([1, 5], dtype=dtype)]
        expected = [10, 155]
    allreduce(data)
    for tensor in data:
        assert tensor.dtype == dtype and tensor.tolist() == expected


def test_allreduce_writes_into_the_callers_tensors():
    torch.manual_seed(0)
    replicas = [nn.Linear(3, 2) for _ in range(3)]
    for k, replica in enumerate(replicas):
        replica(torch.randn(4, 3) * (k + 1)).sum().backward()
    grads = [r.weight.grad for r in replicas]
    pointers = [g.data_ptr() for g in grads]
    expected = sum(g.clone() for g in grads)
    assert allreduce(grads) is None
    for replica, pointer in zip(replicas, pointers):
        assert replica.weight.grad.data_ptr() == pointer  # same storage, new values
        assert torch.allclose(replica.weight.grad, expected)


def test_allreduce_on_parameters_views_and_repeats():
    # Leaf tensors that require grad (parameters themselves) can be reduced too.
    params = [nn.Parameter(torch.full((2,), float(k))) for k in range(3)]
    allreduce(params)
    assert all(p.tolist() == [3.0, 3.0] and p.requires_grad for p in params)
    # Non-contiguous views write through to their base tensors.
    bases = [torch.arange(6.0).reshape(2, 3) * (k + 1) for k in range(2)]
    allreduce([b.t() for b in bases])
    assert all(torch.equal(b, torch.arange(6.0).reshape(2, 3) * 3) for b in bases)
    # The same tensor twice counts twice (the sum is formed before anything is written).
    t, u = torch.tensor([1.0]), torch.tensor([10.0])
    allreduce([t, t, u])
    assert t.item() == 12.0 and u.item() == 12.0


def test_allreduce_single_tensor_is_unchanged():
    t = torch.tensor([4.0, 2.0])
    allreduce([t])
    assert t.tolist() == [4.0, 2.0]


def test_allreduce_errors():
    with pytest.raises(ValueError, match="at least one tensor"):
        allreduce([])
    with pytest.raises(ValueError, match="one shape"):
        allreduce([torch.zeros(2, 3), torch.zeros(3, 2)])
    with pytest.raises(ValueError, match="one dtype"):
        allreduce([torch.zeros(2), torch.zeros(2, dtype=torch.int64)])
    with pytest.raises(TypeError, match="item 1 is list"):
        allreduce([torch.zeros(2), [0.0, 0.0]])
    # A failed call leaves the caller's tensors alone.
    a, b = torch.ones(2), torch.ones(3)
    with pytest.raises(ValueError):
        allreduce([a, b])
    assert a.tolist() == [1.0, 1.0]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_allreduce_across_gpus_and_cpu(dtype):
    devices = [torch.device("cuda", i) for i in range(torch.cuda.device_count())] + [CPU]
    values = [torch.arange(6, dtype=dtype).reshape(2, 3) * (k + 1) for k in range(len(devices))]
    expected = sum(values)
    data = [v.to(d) for v, d in zip(values, devices)]
    allreduce(data)
    for tensor, dev in zip(data, devices):
        assert tensor.device == dev and torch.equal(tensor.cpu(), expected)
