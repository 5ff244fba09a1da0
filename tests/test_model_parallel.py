"""dlperf.model_parallel: the schedules and their simulator on hand-checked cases, the counting
of communication, and the page's jobs in real gloo processes on tiny sizes (one launch of four
processes for tensor, sequence and context parallelism and the 2-D mesh, one of two for the
pipeline)."""
import pytest
import torch

from dlperf import model_parallel as mp
from dlperf.distributed import run_workers


# ---------------------------------------------------------------- schedules
@pytest.mark.parametrize("name", list(mp.SCHEDULES))
@pytest.mark.parametrize("p, m", [(1, 1), (2, 1), (2, 8), (4, 3), (4, 8), (8, 16)])
def test_every_stage_runs_each_micro_batch_once_each_way(name, p, m):
    schedule = mp.SCHEDULES[name](p, m)
    assert len(schedule) == p
    for ops in schedule:
        assert sorted(ops) == sorted([("F", i) for i in range(m)] + [("B", i) for i in range(m)])
        for i in range(m):  # a micro-batch's backward pass after its forward pass
            assert ops.index(("F", i)) < ops.index(("B", i))


def test_one_f_one_b_starts_with_fewer_forward_passes_down_the_pipeline():
    schedule = mp.one_f_one_b_schedule(4, 8)
    assert schedule[0][:4] == [("F", 0), ("F", 1), ("F", 2), ("F", 3)]
    assert schedule[0][4] == ("B", 0)
    assert schedule[3][:4] == [("F", 0), ("B", 0), ("F", 1), ("B", 1)]
    assert schedule[1][-3:] == [("B", 5), ("B", 6), ("B", 7)]


@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (4, 2), (8, 32)])
def test_activations_in_flight(p, m):
    assert [mp.in_flight(ops) for ops in mp.gpipe_schedule(p, m)] == [m] * p
    assert [mp.in_flight(ops) for ops in mp.one_f_one_b_schedule(p, m)] == [
        min(p - s, m) for s in range(p)]


@pytest.mark.parametrize("name", list(mp.SCHEDULES))
@pytest.mark.parametrize("p, m", [(1, 4), (2, 1), (2, 8), (4, 4), (4, 16), (8, 8)])
def test_equal_stages_leave_the_bubble_of_the_formula(name, p, m):
    tf, tb = 1.0, 2.0
    records = mp.simulate(mp.SCHEDULES[name](p, m), [tf] * p, [tb] * p)
    assert max(r[4] for r in records) == pytest.approx((m + p - 1) * (tf + tb))
    assert mp.idle_fraction(records) == pytest.approx(mp.bubble_fraction(p, m))


def test_bubble_fraction_by_hand():
    assert mp.bubble_fraction(4, 8) == pytest.approx(3 / 11)
    assert mp.bubble_fraction(1, 5) == 0
    assert mp.bubble_fraction(2, 1) == pytest.approx(1 / 2)


def test_simulator_respects_dependencies_and_links():
    records = mp.simulate(mp.gpipe_schedule(2, 1), [1.0, 1.0], [1.0, 1.0], link=0.5)
    times = {(s, k, i): (a, b) for s, k, i, a, b in records}
    assert times[(1, "F", 0)] == (1.5, 2.5)  # after stage 0's forward pass and the link
    assert times[(1, "B", 0)] == (2.5, 3.5)  # its own forward pass done: no link
    assert times[(0, "B", 0)] == (4.0, 5.0)
    # a slow last stage stretches everyone: the bubble grows beyond the formula
    slow = mp.simulate(mp.gpipe_schedule(2, 4), [1.0, 2.0], [1.0, 2.0])
    assert mp.idle_fraction(slow) > mp.bubble_fraction(2, 4)


def test_a_schedule_that_waits_for_itself_is_refused():
    bad = [[("B", 0), ("F", 0)], [("F", 0), ("B", 0)]]
    with pytest.raises(RuntimeError, match="deadlocks"):
        mp.simulate(bad, [1, 1], [1, 1])


def _rendezvous(plans):
    """Run every stage's batches of transfers in order, each stage blocked on its current batch,
    in the strictest model of NCCL: no buffering, so a transfer happens only while the stage at
    the other end has the matching transfer in *its* current batch; a batch is done when all its
    transfers have happened. Returns True if every stage gets through its plan."""
    queues = [[batch for batches in plan for batch in batches] for plan in plans]
    heads, done = [0] * len(queues), [set() for _ in queues]
    progress = True
    while progress:
        progress = False
        for s, queue in enumerate(queues):
            if heads[s] == len(queue):
                continue
            for post in queue[heads[s]]:
                direction, kind, i, peer = post
                other = ("recv" if direction == "send" else "send", kind, i, s)
                if heads[peer] < len(queues[peer]) and other in queues[peer][heads[peer]]:
                    done[s].add(post)
                    done[peer].add(other)
        for s, queue in enumerate(queues):
            while heads[s] < len(queue) and all(post in done[s] for post in queue[heads[s]]):
                heads[s] += 1
                progress = True
    return all(heads[s] == len(queue) for s, queue in enumerate(queues))


@pytest.mark.parametrize("name", list(mp.SCHEDULES))
@pytest.mark.parametrize("p, m", [(2, 1), (2, 4), (3, 5), (4, 2), (4, 8), (8, 16)])
def test_the_batched_transfers_never_wait_for_each_other(name, p, m):
    schedule = mp.SCHEDULES[name](p, m)
    plans = [mp.p2p_plan(ops, s, p) for s, ops in enumerate(schedule)]
    assert _rendezvous(plans)
    for s, (ops, plan) in enumerate(zip(schedule, plans)):
        assert len(plan) == len(ops) + 1
        posts = [post for batches in plan for batch in batches for post in batch]
        # every micro-batch crosses each link once each way, in the schedule's order
        assert [(k, i) for d, k, i, _ in posts if d == "send"] == [
            op for op in ops if (op[0] == "F" and s < p - 1) or (op[0] == "B" and s > 0)]
        for k, op in enumerate(ops):  # an operation's input is posted before it runs
            needed = mp._recv_of(op, s, p)
            if needed:
                assert needed in [post for batches in plan[:k + 1]
                                  for batch in batches for post in batch]


def test_unbatched_sends_would_deadlock_1f1b_without_buffering():
    # the pairs that p2p_plan batches, posted one at a time: stage 0 sends F1 while stage 1
    # sends B0, and neither has posted the receive the other waits for
    plans = [[[[post] for batch in batches for post in batch] for batches in mp.p2p_plan(ops, s, 2)]
             for s, ops in enumerate(mp.one_f_one_b_schedule(2, 4))]
    assert not _rendezvous(plans)


def test_1f1b_pairs_a_send_with_the_next_receive_from_the_same_neighbour():
    plan = mp.p2p_plan(mp.one_f_one_b_schedule(4, 8)[1], 1, 4)
    # stage 1: F0 F1 F2 B0 ...; after F2, activations out to stage 2 and gradient 0 back
    assert plan[3] == [[("send", "F", 2, 2), ("recv", "B", 0, 2)]]
    # after B0: its gradient to stage 0 and the activations of micro-batch 3 from it
    assert plan[4] == [[("send", "B", 0, 0), ("recv", "F", 3, 0)]]
    # warm-up: different neighbours, the send first
    assert plan[1] == [[("send", "F", 0, 2)], [("recv", "F", 1, 0)]]
    assert plan[0] == [[("recv", "F", 0, 0)]] and plan[-1] == [[("send", "B", 7, 0)]]


def test_stage_layers_split_equally_or_as_asked():
    assert mp.stage_layers(8, 4) == [range(0, 2), range(2, 4), range(4, 6), range(6, 8)]
    assert mp.stage_layers(7, 2, [4, 3]) == [range(0, 4), range(4, 7)]
    with pytest.raises(ValueError, match="layers_per_stage"):
        mp.stage_layers(7, 2)
    with pytest.raises(ValueError):
        mp.stage_layers(7, 2, [4, 4])


# ---------------------------------------------------------------- counting
def test_classify_reads_c10d_and_functional_names():
    x = torch.zeros(6)
    # without a group among the arguments: the default size, ranks unknown
    assert mp.classify("c10d.allreduce_.default", ([x],), 4) == ("allreduce", 6, 4, None)
    assert mp.classify("c10d._reduce_scatter_base_.default", (torch.zeros(2), x), 3) == (
        "reduce-scatter", 6, 3, None)
    assert mp.classify("c10d.send.default", ([x],), 2) == ("send", 6, 2, None)
    # a functional all-gather takes the local piece: the full tensor is n times larger
    assert mp.classify("_c10d_functional.all_gather_into_tensor.default", (x,), 1)[1] == 6
    assert mp.classify("aten.mm.default", (x, x), 2) is None


def test_traffic_formulas():
    assert mp.tp_traffic(8, 16, 2) == 8 * 16  # 2(n-1)/n = 1 for two processes
    assert mp.tp_traffic(8, 16, 4) == pytest.approx(1.5 * 8 * 16)
    assert mp.ring_attention_traffic(64, 16, 4) == 3 * 2 * 16 * 16


def test_saved_bytes_counts_what_autograd_keeps():
    w = torch.randn(8, 8, requires_grad=True)
    x = torch.randn(4, 8, requires_grad=True)
    _, kept = mp.saved_bytes(lambda a: (a @ w).relu(), x, exclude=[w])
    assert kept == 4 * 8 * 4 + 4 * 8 * 4  # the product's input x and relu's output


def test_attention_is_a_softmax_average_of_the_values():
    q, k, v = torch.randn(5, 4), torch.randn(7, 4), torch.randn(7, 3)
    out = mp.attention(q, k, v)
    assert out.shape == (5, 3)
    assert torch.allclose(out, torch.nn.functional.scaled_dot_product_attention(q, k, v),
                          atol=1e-6)


# ---------------------------------------------------------------- in processes
@pytest.fixture(scope="module")
def page_results():
    config = dict(tokens=16, width=8, seq=16, head_dim=4, mesh=(2, 2),
                  parts=["tensor", "context", "mesh"])
    return run_workers(mp.page_job, 4, args=(config,), timeout=180)


def test_tensor_and_sequence_parallel_blocks_equal_the_whole_block(page_results):
    for result in page_results:
        tensor = result["tensor"]
        for name in ("tensor parallel", "sequence parallel"):
            assert tensor[name]["max_diff"] < 1e-5
            assert tensor[name]["weights"] * 4 == tensor["full weights"]
        tp, sp = tensor["tensor parallel"], tensor["sequence parallel"]
        for phase in ("forward", "backward"):
            assert tp[phase]["calls"] == {"allreduce": 1}
            assert sp[phase]["calls"] == {"all-gather": 1, "reduce-scatter": 1}
            assert tp[phase]["sent"] == pytest.approx(mp.tp_traffic(16, 8, 4))
            assert sp[phase]["sent"] == pytest.approx(tp[phase]["sent"])
        assert sp["saved"] < tp["saved"] < tensor["full_saved"]


def test_ring_attention_equals_attention_and_sends_the_formula(page_results):
    for result in page_results:
        context = result["context"]
        assert context["max_diff"] < 1e-5
        assert context["calls"] == {"send": 3}
        assert context["sent"] == mp.ring_attention_traffic(16, 4, 4)


def test_the_mesh_makes_rows_and_columns_of_processes(page_results):
    for rank, result in enumerate(page_results):
        mesh = result["mesh"]
        row, column = divmod(rank, 2)
        assert mesh["coordinate"] == (row, column)
        assert mesh["tp ranks"] == [2 * row, 2 * row + 1]
        assert mesh["dp ranks"] == [column, column + 2]
        assert mesh["2d"]["max_diff"] < 1e-5
        tp_ranks, dp_ranks = tuple(mesh["tp ranks"]), tuple(mesh["dp ranks"])
        assert {(size, ranks) for _, _, size, ranks in mesh["2d"]["tp"]} == {(2, tp_ranks)}
        assert {(size, ranks) for _, _, size, ranks in mesh["2d"]["dp"]} == {(2, dp_ranks)}
        assert sum(n for _, n, *_ in mesh["2d"]["dp"]) == mesh["2d"]["gradient elements"]
        torch_tp = mesh["parallelize_module"]
        assert torch_tp["output_diff"] < 1e-5 and torch_tp["input_grad_diff"] < 1e-5
        assert sorted(torch_tp["theirs"]) == sorted(torch_tp["ours"])
        hsdp = mesh["hsdp"]
        assert hsdp["local"] * 2 == hsdp["total"]
        # the second dimension of the mesh shards, the first replicates
        groups = {kind: ranks for kind, _, _, ranks in hsdp["records"]}
        assert groups == {"all-gather": tp_ranks, "reduce-scatter": tp_ranks,
                          "allreduce": dp_ranks}


@pytest.mark.parametrize("split", [None, [2, 1]])
def test_the_pipeline_computes_the_whole_model_s_gradients(split):
    config = dict(width=8, layers=4 if split is None else 3, micro=3, micro_batch=4,
                  schedules=["GPipe", "1F1B"], repeat=1, layers_per_stage=split)
    results = run_workers(mp.pipeline_job, 2, args=(config,), timeout=120, threads=1)
    last = results[-1]
    for result in results:
        for name, run in result["schedules"].items():
            assert run["grad_diff"] < 1e-6
            assert len(run["runs"]) == 1 and len(run["runs"][0]) == 2 * 3
            assert run["peak_bytes"] > 0
        assert result["schedules"]["GPipe"]["in_flight"] == 3
        assert result["schedules"]["1F1B"]["in_flight"] == 2 - result["rank"]
    for run in last["schedules"].values():
        assert run["loss"] == pytest.approx(last["reference_loss"], rel=1e-5)
        for kind, micro, start, end in run["runs"][0]:
            assert start <= end


# ---------------------------------------------------------------- the page's verdict rules
def _rule(name):
    from tests.test_book_claims import CLAIMS
    return next(rule for page, verdict, rule, _ in CLAIMS
                if page == "chapters/model-parallelism" and verdict == name)


@pytest.mark.parametrize("gap, words", [(3.0, "within 5"), (-4.9, "within 5"),
                                        (7.0, "above what"), (-7.0, "below what")])
def test_the_simulator_verdict_reads_the_sign_of_the_gap(gap, words):
    verdict = _rule("pipe_sim_verdict")({"pipe_sim_gap": gap})
    assert words in verdict
    # only idle time beyond the prediction is blamed on the transfers
    assert ("transfers" in verdict) == (gap > 5)


@pytest.mark.parametrize("ratio, verdict", [(1.005, "the same time, within 1%"),
                                            (1.08, "longer with GPipe"),
                                            (0.9, "longer with 1F1B")])
def test_the_shared_times_verdict(ratio, verdict):
    assert _rule("same_time_verdict")({"same_time_ratio": ratio}) == verdict
