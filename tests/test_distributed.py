"""Processes on one machine (dlperf.distributed) and the shipped DDP script.

Each test that starts processes costs a few seconds (every worker imports
torch); the checks are grouped so that few process groups are started.
"""
import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dlperf import distributed as D
from tests import distributed_jobs as jobs

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "dlperf" / "train_ddp.py"

CASES = [
    ((1000,), "float32", False),
    ((7, 5), "float64", True),      # non-contiguous input
    ((2,), "int64", False),         # fewer elements than processes: empty chunks
    ((13,), "int32", False),        # chunks of unequal size
    ((0,), "float32", False),       # nothing at all
    ((3, 4, 5), "int64", False),
]


def simulate_ring(values):
    """Run ring_schedule on plain Python lists: worker r holds values[r] (a list of n numbers,
    one per chunk). Returns the state after every step."""
    n = len(values)
    state = [list(v) for v in values]
    states = [[list(v) for v in state]]
    for step in D.ring_schedule(n):
        sent = {receiver: (chunk, state[sender][chunk]) for sender, receiver, chunk, _ in step}
        for receiver, (chunk, value) in sent.items():
            phase = step[0][3]
            if phase == "reduce-scatter":
                state[receiver][chunk] += value
            else:
                state[receiver][chunk] = value
        states.append([list(v) for v in state])
    return states


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7])
def test_ring_schedule_sums_everything_using_only_neighbours(n):
    steps = D.ring_schedule(n)
    assert len(steps) == 2 * (n - 1)
    for step in steps:
        assert sorted(sender for sender, *_ in step) == list(range(n))
        assert all(receiver == (sender + 1) % n for sender, receiver, *_ in step)
    values = [[10 ** r * (c + 1) for c in range(n)] for r in range(n)]
    final = simulate_ring(values)[-1]
    total = [sum(v[c] for v in values) for c in range(n)]
    assert all(worker == total for worker in final)


def test_free_port_is_on_loopback_and_free():
    port = D.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # would raise if something listened there


def test_tcp_store_listens_on_loopback_only():
    port = D.free_port()
    store = D.tcp_store(port, 1, is_master=True, timeout=10)
    store.set("key", b"value")
    assert D.tcp_store(port, 1, is_master=False, timeout=10).get("key") == b"value"
    table = Path("/proc/net/tcp")
    if not table.exists():
        pytest.skip("no /proc/net/tcp on this system")
    listening = [line.split()[1] for line in table.read_text().splitlines()[1:]
                 if line.split()[3] == "0A" and int(line.split()[1].split(":")[1], 16) == port]
    assert listening == ["0100007F:%04X" % port]  # 127.0.0.1, nothing else
    del store


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_ring_allreduce_equals_all_reduce(world_size):
    results = D.run_workers(jobs.allreduce_check_job, world_size, args=(CASES,), timeout=180)
    for case_index, (shape, dtype_name, transpose) in enumerate(CASES):
        inputs = [r["world"][case_index]["input"] for r in results]
        expected = torch.stack([t.double() for t in inputs]).sum(0)
        for rank, r in enumerate(results):
            record = r["world"][case_index]
            ours, theirs = record["ours"], record["theirs"]
            assert record["same_object"], "ring_allreduce returns the tensor it was given"
            assert ours.shape == theirs.shape == inputs[0].shape
            assert ours.dtype == getattr(torch, dtype_name)
            if ours.dtype.is_floating_point:
                assert torch.allclose(ours, theirs, rtol=1e-5, atol=1e-5), (rank, shape)
                assert torch.allclose(ours.double(), expected, rtol=1e-5, atol=1e-5)
            else:
                assert torch.equal(ours, theirs), (rank, shape, dtype_name)
            # every rank ends with the very same bits
            assert torch.equal(ours, results[0]["world"][case_index]["ours"])
        members = results[: max(1, world_size - 1)]
        sub_inputs = [r["subgroup"][case_index]["input"] for r in members]
        sub_expected = torch.stack([t.double() for t in sub_inputs]).sum(0)
        for r in members:
            record = r["subgroup"][case_index]
            assert torch.allclose(record["ours"].double(), sub_expected, rtol=1e-5, atol=1e-5)
            assert torch.allclose(record["ours"].double(), record["theirs"].double(),
                                  rtol=1e-5, atol=1e-5)
    assert all(r["subgroup"] == [] for r in results[max(1, world_size - 1):])


def test_ring_trace_follows_the_schedule():
    n = 4
    results = D.run_workers(D.ring_trace_job, n, args=(n,), timeout=180)
    expected = simulate_ring([[2 ** r] * n for r in range(n)])  # one element per chunk
    for rank, r in enumerate(results):
        assert r["int_equal"] and r["ring"] == r["all_reduce"] == [2 ** n - 1] * n
        assert r["float_max_diff"] < 1e-9
        assert r["trace"] == [state[rank] for state in expected]


def test_key_value_store_sums_each_round_exactly():
    rounds, workers = 3, 3
    results = D.run_workers(D.kv_sum_job, workers + 1, args=(D.free_port(), rounds),
                            backend=None, timeout=180)
    server, pulled = results[0], results[1:]
    ranks = range(1, workers + 1)
    for t in range(1, rounds + 1):
        expected = [sum(ranks), 10 * sum(ranks), 100 * t * workers]
        assert all(p[t - 1] == expected for p in pulled)
    assert server == [sum(ranks), 10 * sum(ranks), 100 * rounds * workers]


def test_parameter_server_sgd_learns_the_linear_model():
    true_w, true_b = [2.0, -3.4], 4.2
    results = D.run_workers(D.kv_sgd_job, 3, args=(D.free_port(), 150, 0.1, true_w, true_b),
                            backend=None, timeout=180)
    final = results[0]
    assert final["w"] == pytest.approx(true_w, abs=0.05)
    assert final["b"] == pytest.approx([true_b], abs=0.05)
    for worker in results[1:]:
        assert len(worker["losses"]) == 150 and worker["seconds"] > 0
        assert worker["losses"][-1] < 0.01 * worker["losses"][0]


def test_timed_stops_the_clock_when_the_slowest_collective_has_finished():
    # The op returns at once; its Work handle takes 0.3 s on the last rank only. Every rank
    # must report the slowest rank's time, measured after the wait (on a GPU _finish also
    # synchronizes the device, where an NCCL kernel runs on after the call returns).
    results = D.run_workers(jobs.timed_job, 2, args=(0.3,), timeout=120)
    for r in results:
        assert len(r["waited"]) == 2 and min(r["waited"]) >= 0.3
        assert r["sum"] == 1 + 2  # the ranks' values, summed by the asynchronous allreduce
        assert r["device"] == "cpu"


def test_timing_device_is_the_gpu_under_nccl(monkeypatch):
    # A plain NCCL group reduces CUDA tensors only; the slowest time must travel on the GPU.
    monkeypatch.setattr(D.dist, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(D.torch.cuda, "current_device", lambda: 1)
    assert D._timing_device() == torch.device("cuda", 1)
    monkeypatch.setattr(D.dist, "get_backend", lambda group=None: "gloo")
    assert D._timing_device() == torch.device("cpu")


def test_worker_errors_are_raised_with_their_message():
    # Rank 1 raises; rank 0, waiting in a barrier, then loses its peer. The root cause is
    # reported, whichever failure the parent happens to notice first.
    with pytest.raises(Exception, match=r"(?s)^worker 1 of 2 raised first.*fails on purpose"):
        D.run_workers(jobs.fail_job, 2, timeout=120)
    assert multiprocessing.active_children() == []


def test_stuck_workers_are_stopped_after_the_timeout():
    with pytest.raises(TimeoutError, match="still running"):
        D.run_workers(jobs.sleep_job, 2, args=(600,), backend=None, timeout=3)
    assert multiprocessing.active_children() == []


def test_run_workers_rejects_an_empty_world():
    with pytest.raises(ValueError, match="at least 1"):
        D.run_workers(jobs.sleep_job, 0, args=(0,))


def test_ddp_script_trains_two_processes_to_the_same_parameters(tmp_path):
    import dlperf
    dlperf.fashion_mnist(verbose=False)  # write the data files before two processes read them
    out = tmp_path / "ddp.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2",
               # as a module: run as a file, dlperf/ would come first on sys.path and its
               # profile.py would stand in for the standard library's profile
               "--master-addr=127.0.0.1", f"--master-port={D.free_port()}", "-m", "dlperf.train_ddp",
               "--device=cpu", "--epochs=2", "--batch-size=32", "--width=8",
               "--max-train=256", "--max-test=128", f"--out={out}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=env, start_new_session=True) as run:
        try:
            stdout, stderr = run.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            os.killpg(run.pid, signal.SIGKILL)  # torchrun and its workers
            raise
    assert run.returncode == 0, stdout[-3000:] + stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["world_size"] == 2 and result["backend"] == "gloo"
    assert result["per_process_batch"] == 16 and result["synthetic"] is True
    assert len(result["test_acc"]) == len(result["seconds"]) == len(result["train_loss"]) == 2
    assert all(0.0 <= a <= 1.0 for a in result["test_acc"])
    assert all(s > 0 for s in result["seconds"])
    assert all(loss > 0 for loss in result["train_loss"])
    first, second = result["checksums"]
    assert first == second, "the two processes ended with different parameters"
    assert "epoch 2: train loss" in stdout


def test_ddp_script_training_step_does_not_wait_for_the_device():
    """Inside the training loop nothing may read a value back or build a tensor from host
    values (each would make the host wait for a GPU), and non_blocking copies need pinned
    batches, so the loaders pin memory when the device is a GPU."""
    import ast
    tree = ast.parse(SCRIPT.read_text())
    main = next(node for node in tree.body if isinstance(node, ast.FunctionDef)
                and node.name == "main")
    loops = [node for node in ast.walk(main) if isinstance(node, ast.For)
             and isinstance(node.iter, ast.Name) and node.iter.id == "train_loader"]
    assert len(loops) == 1
    step = ast.unparse(loops[0])
    assert "non_blocking=True" in step
    for blocker in ("torch.tensor(", ".item()", ".cpu()", ".tolist()", "float(", "print("):
        assert blocker not in step, f"{blocker} in the training step"
    loaders = [node for node in ast.walk(main) if isinstance(node, ast.Call)
               and isinstance(node.func, ast.Name) and node.func.id == "DataLoader"]
    assert len(loaders) == 2
    for call in loaders:
        pin = {kw.arg: kw.value for kw in call.keywords}.get("pin_memory")
        assert pin is not None, "a DataLoader without pin_memory"
    assert "pin = device.type == 'cuda'" in ast.unparse(main)  # pinned exactly on a GPU


def test_workers_start_with_the_cpp_log_quiet(monkeypatch):
    """Process groups' C++ notices (gloo's '[W... ProcessGroupGloo...]' lines) stay off stderr:
    the workers start with TORCH_CPP_LOG_LEVEL=ERROR unless the user chose a level; this
    process's environment is left as it was."""
    monkeypatch.delenv("TORCH_CPP_LOG_LEVEL", raising=False)
    assert D.run_workers(jobs.cpp_log_level, 2, backend=None) == ["ERROR", "ERROR"]
    assert "TORCH_CPP_LOG_LEVEL" not in os.environ
    with D.quiet_cpp_log():
        assert os.environ["TORCH_CPP_LOG_LEVEL"] == "ERROR"
    monkeypatch.setenv("TORCH_CPP_LOG_LEVEL", "INFO")
    with D.quiet_cpp_log():
        assert os.environ["TORCH_CPP_LOG_LEVEL"] == "INFO"
