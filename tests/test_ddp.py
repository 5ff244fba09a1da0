"""dlperf.ddp: DDP's bucket rule, overlap from intervals, ZeRO accounting, and the page's jobs.

The bookkeeping is checked on small hand-made cases and against PyTorch's own bucket
assignment; one launch of two gloo processes runs every job of the page on a tiny model.
"""
import random

import pytest
import torch
import torch.distributed as dist
from torch import nn

from dlperf import ddp, intervals
from dlperf.distributed import run_workers

MIB = ddp.MIB


# ---------------------------------------------------------------- buckets
def test_a_bucket_closes_when_it_reaches_its_limit():
    assert ddp.assign_buckets([4, 4, 4, 4], [8]) == [[0, 1], [2, 3]]
    assert ddp.assign_buckets([3, 3, 3], [8]) == [[0, 1, 2]]  # 9 >= 8 only with the third
    assert ddp.assign_buckets([10, 1, 1], [8]) == [[0], [1, 2]]  # a large tensor fills one alone
    assert ddp.assign_buckets([], [8]) == []


def test_the_first_limit_applies_to_the_first_bucket_only():
    assert ddp.assign_buckets([2, 2, 2, 2, 2, 2], [2, 6]) == [[0], [1, 2, 3], [4, 5]]
    with pytest.raises(ValueError):
        ddp.assign_buckets([1], [])


def test_bucket_limits_follow_ddp_defaults():
    assert ddp.bucket_limits() == [1 * MIB, 25 * MIB]
    assert ddp.bucket_limits(0.5) == [MIB // 2, MIB // 2]


@pytest.mark.skipif(not hasattr(dist, "_compute_bucket_assignment_by_size"),
                    reason="this PyTorch has no _compute_bucket_assignment_by_size")
@pytest.mark.parametrize("limits", [[1 * MIB, 25 * MIB], [MIB // 4], [3000, 10_000]])
def test_assignment_equals_pytorchs_own(limits):
    rng = random.Random(0)
    for _ in range(20):
        numels = [rng.choice([1, 7, 100, 1000, 2**14, 2**17, 2**18])
                  for _ in range(rng.randint(1, 30))]
        tensors = [torch.empty(n) for n in numels]
        theirs, _ = dist._compute_bucket_assignment_by_size(tensors, limits, [False] * len(tensors))
        ours = ddp.assign_buckets([n * 4 for n in numels], limits)
        assert [list(b) for b in theirs] == ours


def test_predicted_buckets_of_the_page_model():
    model = ddp.mlp(256, 12)  # each weight 256 KiB, each bias 1 KiB
    default = ddp.predicted_buckets(model)
    assert default[0] == ["11.0.bias", "11.0.weight", "10.0.bias", "10.0.weight",
                          "9.0.bias", "9.0.weight", "8.0.bias", "8.0.weight"]
    assert len(default) == 2 and default[1][-1] == "0.0.weight"
    two_layers = ddp.predicted_buckets(model, 0.5)
    assert len(two_layers) == 6 and all(len(b) == 4 for b in two_layers)


def test_mlp_is_the_same_for_a_seed_and_leaves_the_global_generator_alone():
    torch.manual_seed(5)
    before = torch.rand(1)
    torch.manual_seed(5)
    a, b = ddp.mlp(8, 2, seed=3), ddp.mlp(8, 2, seed=3)
    assert torch.equal(torch.rand(1), before)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


# ---------------------------------------------------------------- intervals and overlap
def test_the_chapter_finds_the_interval_algebra_under_ddp():
    # chapters/ddp-internals.md calls ddp.union and ddp.subtract; the one implementation is
    # dlperf.intervals (tests/test_intervals.py).
    assert (ddp.union, ddp.subtract, ddp.total, ddp.intersection) == (
        intervals.union, intervals.subtract, intervals.total, intervals.intersection)


def test_overlap_stats_counts_only_computation_as_cover():
    spans = [("forward", 0, 4, "f"), ("backward", 4, 10, "b"), ("launch", 6, 7, "c10d"),
             ("allreduce", 5, 8, "a0"), ("allreduce", 9, 12, "a1")]
    stats = ddp.overlap_stats(spans)
    assert stats["allreduce"] == 6
    assert stats["backward"] == 5  # 4-10 less the launch 6-7
    assert stats["overlapped"] == 3  # 5-6, 7-8 and 9-10
    assert stats["share"] == pytest.approx(0.5)
    assert stats["exposed"] == 3
    assert stats["allreduces"] == 2
    assert ddp.overlap_stats([("backward", 0, 1, "b")])["share"] == 0.0


# ---------------------------------------------------------------- ZeRO accounting
def test_zero_bytes_per_parameter():
    stages = ddp.zero_bytes_per_parameter(8)
    totals = [stages[s]["total"] for s in ddp.STAGES]
    assert totals == pytest.approx([16, 4 + 12 / 8, 2 + 14 / 8, 2])
    for parts in ddp.zero_bytes_per_parameter(1).values():  # one process: nothing to share
        assert parts["total"] == 16
    fp32 = ddp.zero_bytes_per_parameter(2, 4, 4, 8)
    assert fp32[ddp.STAGES[3]]["total"] == 8
    with pytest.raises(ValueError):
        ddp.zero_bytes_per_parameter(0)


def test_zero_traffic_per_parameter():
    traffic = ddp.zero_traffic_per_parameter(4)
    assert traffic[ddp.STAGES[0]] == traffic[ddp.STAGES[2]] == pytest.approx(1.5)
    assert traffic[ddp.STAGES[3]] == pytest.approx(2.25)


def test_held_bytes_counts_parameters_gradients_and_adam_state():
    model = nn.Linear(10, 5)  # 55 parameters
    adam = torch.optim.Adam(model.parameters())
    model(torch.randn(3, 10)).sum().backward()
    adam.step()
    held = ddp.held_bytes(model, adam)
    assert held["parameters"] == held["gradients"] == 55 * 4
    step_bytes = sum(s["step"].numel() * s["step"].element_size() for s in adam.state.values())
    assert held["optimizer state"] == 2 * 55 * 4 + step_bytes


# ---------------------------------------------------------------- the jobs, in two processes
TINY = dict(width=32, depth=4, batch=8, caps=[None, 0.004], trace_cap=0.004, traced_steps=1,
            micro_steps=3, repeat=2, sweep=[0.004, 25], steps=2, device="cpu",
            parts=["buckets", "accumulation", "sweep", "sharding"])


@pytest.fixture(scope="module")
def page_results():
    return run_workers(ddp.page_job, 2, args=(TINY,), timeout=180)


def test_jobs_predict_buckets_and_trace_allreduces(page_results):
    first = page_results[0]["buckets"]
    model = ddp.mlp(TINY["width"], TINY["depth"])
    for cap, seen in first["buckets"].items():
        assert ddp.predicted_buckets(model, cap) == seen
    assert len(first["buckets"][0.004]) > 1
    spans = first["traces"][0]
    kinds = {kind for kind, *_ in spans}
    assert {"forward", "backward", "allreduce"} <= kinds
    assert ddp.overlap_stats(spans)["allreduces"] == len(first["buckets"][0.004])
    assert page_results[1]["buckets"] is None  # only rank 0 profiles


def test_jobs_accumulate_with_no_sync(page_results):
    accumulation = page_results[0]["accumulation"]
    buckets = len(ddp.predicted_buckets(ddp.mlp(TINY["width"], TINY["depth"]), TINY["trace_cap"]))
    assert accumulation["no_sync"]["allreduces"] == buckets
    assert accumulation["every micro-step"]["allreduces"] == TINY["micro_steps"] * buckets
    for mode in ("no_sync", "every micro-step"):
        assert accumulation[mode]["assert_close"] is None
        assert len(accumulation[mode]["seconds"]) == TINY["repeat"]


def test_jobs_sweep_and_shard(page_results):
    sweep = page_results[0]["sweep"]
    assert sorted(sweep) == TINY["sweep"] and all(len(t) == TINY["repeat"] for t in sweep.values())
    parameters = page_results[0]["sharding"]["parameters"]
    for result in page_results:
        held = result["sharding"]["bytes"]
        plain = held["DDP + Adam"]
        assert plain["parameters"] == plain["gradients"] == parameters * 4
        assert held["DDP + ZeroRedundancyOptimizer"]["optimizer state"] < plain["optimizer state"]
        fsdp = held["FSDP2 fully_shard + Adam"]
        assert fsdp["parameters"] == parameters * 4 // 2  # every dimension 0 splits evenly
        assert fsdp["gradients"] == parameters * 4 // 2
        assert max(result["sharding"]["max_diff"].values()) < 1e-5
    zero_state = sum(r["sharding"]["bytes"]["DDP + ZeroRedundancyOptimizer"]["optimizer state"]
                     for r in page_results)
    # every parameter's Adam state lives on exactly one process
    assert zero_state == page_results[0]["sharding"]["bytes"]["DDP + Adam"]["optimizer state"]


def test_zero_redundancy_traffic_is_half_as_much_again_as_zero1():
    for n in (2, 4, 8):
        ideal = ddp.zero_traffic_per_parameter(n)[ddp.STAGES[1]]
        assert ddp.zero_redundancy_traffic_per_parameter(n) == pytest.approx(1.5 * ideal)
    assert ddp.zero_redundancy_traffic_per_parameter(8) == pytest.approx(2.625)


def test_collective_counter_names_kinds_and_full_sizes():
    """Sizes are those of the full tensor: an all-gather's output, a reduce-scatter's input."""
    counter = ddp.CollectiveCounter()
    counter.note("c10d.allreduce_.default", (), ([torch.zeros(6), torch.zeros(4)], None))
    counter.note("c10d.broadcast_.default", (), ([torch.zeros(10)], None))
    counter.note("c10d._allgather_base_.default", (), (torch.zeros(10), torch.zeros(5)))
    counter.note("c10d._reduce_scatter_base_.default", (), (torch.zeros(5), torch.zeros(10)))
    counter.note("aten.add.Tensor", (), (torch.zeros(3), torch.zeros(3)))  # not a collective
    assert counter.calls == {"allreduce": 1, "broadcast": 1, "all-gather": 1, "reduce-scatter": 1}
    assert counter.elements == {"allreduce": 10, "broadcast": 10, "all-gather": 10,
                                "reduce-scatter": 10}
    # per element of a 10-element model, 4 processes: 2*3/4 + 3 * 3/4
    assert counter.sent_per_element(4, 10) == pytest.approx(1.5 + 3 * 0.75)


def test_jobs_count_collectives_and_peaks(page_results):
    """DDP allreduces the model once a step; ZeroRedundancyOptimizer adds a broadcast of it;
    FSDP2 all-gathers it twice and reduce-scatters it once. Every peak is above what the
    setup keeps after its steps."""
    parameters = page_results[0]["sharding"]["parameters"]
    for result in page_results:
        counted = result["sharding"]["collectives"]
        per = {setup: {kind: e / parameters for kind, e in c["elements"].items()}
               for setup, c in counted.items()}
        assert per["DDP + Adam"]["allreduce"] == pytest.approx(1.0)
        assert per["DDP + ZeroRedundancyOptimizer"]["allreduce"] == pytest.approx(1.0)
        assert per["DDP + ZeroRedundancyOptimizer"]["broadcast"] == pytest.approx(1.0, abs=0.01)
        assert per["FSDP2 fully_shard + Adam"]["all-gather"] == pytest.approx(2.0)
        assert per["FSDP2 fully_shard + Adam"]["reduce-scatter"] == pytest.approx(1.0)
        for setup, held in result["sharding"]["bytes"].items():
            assert result["sharding"]["peak"][setup] > sum(held.values())
