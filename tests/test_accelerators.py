import pytest
import torch

import dlperf.accelerators as devices_module
from dlperf.accelerators import describe, device, devices, synchronize


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(devices_module, "_announced", False)


@pytest.fixture
def three_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)


def test_cpu_only_gives_virtual_devices_and_says_so_once(no_gpu, capsys):
    assert devices(num_cpu=3) == [torch.device("cpu")] * 3
    assert devices(num_cpu=2) == [torch.device("cpu")] * 2
    out = capsys.readouterr().out
    assert out.count("No GPU found") == 1, out
    assert "CPU number" in out


def test_cpu_only_single_device_never_raises(no_gpu):
    assert device() == torch.device("cpu")
    assert device(5) == torch.device("cpu")


def test_every_gpu_when_there_are_some(three_gpus, capsys):
    assert devices() == [torch.device(f"cuda:{i}") for i in range(3)]
    assert devices(max_gpus=2) == [torch.device("cuda:0"), torch.device("cuda:1")]
    assert device(2) == torch.device("cuda:2")
    assert device(3) == torch.device("cpu")
    assert capsys.readouterr().out == ""


def test_num_cpu_must_be_positive(no_gpu):
    with pytest.raises(ValueError, match="at least 1"):
        devices(num_cpu=0)


def test_synchronize_is_a_no_op_on_the_cpu(no_gpu, monkeypatch):
    def boom(*args):
        raise AssertionError("torch.cuda.synchronize must not be called without a GPU")
    monkeypatch.setattr(torch.cuda, "synchronize", boom)
    synchronize()
    synchronize(torch.device("cpu"))


def test_describe_names_the_cpu():
    assert describe(torch.device("cpu")).startswith("CPU:")


@pytest.mark.gpu
def test_describe_and_synchronize_on_a_real_gpu():
    x = torch.ones(1000, 1000, device="cuda")
    (x @ x).sum()
    synchronize()
    assert "cuda:0" in describe(torch.device("cuda:0"))


def test_page_setup_silences_only_the_listed_library_warnings():
    """The GPU run's pages showed PyTorch's own warnings (Inductor's TF32 hint, a LeafSpec
    deprecation, torch.frombuffer on a read-only buffer, the profiler's acc_events note);
    page_setup silences those by their text, and any other warning still shows."""
    import warnings

    import dlperf

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dlperf.quiet_library_warnings()
        for category, start in dlperf.QUIET_WARNINGS:
            warnings.warn(start + " (and the rest of the message)", category)
        warnings.warn("a page's own warning", UserWarning)
    assert [str(w.message) for w in caught] == ["a page's own warning"]
    assert not torch.backends.cuda.matmul.allow_tf32  # silenced, not acted on
