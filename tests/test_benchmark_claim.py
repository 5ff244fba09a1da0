"""The claim solutions/GRADING.md makes for the ``Benchmark`` assignment, checked on a GPU:
the reference ``Benchmark`` agrees with CUDA events within 5% on a long kernel, and d2l's
unsynchronized ``Benchmark`` reports less than 10% of it (benchmarks/benchmark_claim.py)."""
import pytest
import torch

pytestmark = pytest.mark.gpu


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_reference_benchmark_agrees_with_cuda_events_and_d2l_does_not():
    pytest.importorskip("d2l")
    from benchmarks.benchmark_claim import measure

    share = measure(repeats=3)["share_of_events"]
    assert abs(share["reference Benchmark"] - 1) < 0.05, share
    assert share["d2l Benchmark"] < 0.10, share
