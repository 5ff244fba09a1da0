"""Several processes on one machine: a launcher, a ring allreduce and a key-value store.

Everything here talks over the loopback interface only (127.0.0.1): the
rendezvous store listens on a socket bound to 127.0.0.1, and gloo is told to
use the loopback device. Every wait has a timeout, so a failed or stuck worker
ends the run with an error instead of hanging the notebook.

Functions that run inside the worker processes live in this module (not in a
notebook): workers are started with ``spawn`` or ``forkserver``, which pickle
the function *by name* and import it again in the new process. On Linux the
launcher uses ``forkserver`` with this module preloaded: the server process
imports torch once, and every worker after that is a cheap ``fork`` of it
(``spawn`` would import torch afresh in every worker, seconds each).
"""
from __future__ import annotations

import io
import multiprocessing
import os
import pickle
import queue as queue_module
import socket
import statistics
import time
import traceback
from contextlib import contextmanager
from datetime import timedelta
from typing import Callable, Dict, List, Optional, Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.multiprocessing.spawn import ProcessException, ProcessRaisedException

LOOPBACK = "127.0.0.1"


# ---------------------------------------------------------------- launching
def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def loopback_interface() -> Optional[str]:
    """The name of the loopback network interface on Linux ('lo'), else None."""
    return "lo" if os.path.exists("/sys/class/net/lo") else None


def _listening_socket(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((LOOPBACK, port))
    sock.listen(128)
    return sock


def tcp_store(port: int, world_size: int, is_master: bool, timeout: float) -> dist.TCPStore:
    """A ``TCPStore`` on 127.0.0.1:``port``; the master's socket is bound to loopback only.

    (``TCPStore(is_master=True)`` on its own listens on every interface; handing
    it a socket we bound ourselves keeps it on 127.0.0.1.)
    """
    wait = timedelta(seconds=timeout)
    if is_master:
        # detach(): the store takes the file descriptor over, Python must not close it
        listen_fd = _listening_socket(port).detach()
        return dist.TCPStore(LOOPBACK, port, world_size, is_master=True, timeout=wait,
                             wait_for_workers=False, master_listen_fd=listen_fd)
    return dist.TCPStore(LOOPBACK, port, world_size, is_master=False, timeout=wait)


def init_process_group(rank: int, world_size: int, port: int, backend: str = "gloo",
                       timeout: float = 60.0, device_id: Optional[torch.device] = None) -> None:
    """Join a process group whose rendezvous store is on 127.0.0.1:``port`` (rank 0 hosts it).

    ``device_id``, for NCCL, binds the group to this process's GPU: PyTorch then forms the
    communicator at once instead of at the first collective, and makes the communicators of
    subgroups by splitting it (``init_process_group``'s documentation)."""
    if backend == "gloo" and loopback_interface():
        os.environ.setdefault("GLOO_SOCKET_IFNAME", loopback_interface())
    store = tcp_store(port, world_size, is_master=(rank == 0), timeout=timeout)
    extra = {"device_id": device_id} if device_id is not None else {}
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=timeout), **extra)


def start_method() -> str:
    """'forkserver' (with this module preloaded) where the platform has it, else 'spawn'."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return "spawn"
    # Takes effect when the fork server starts (at the first launch); harmless after.
    mp.get_context("forkserver").set_forkserver_preload([__name__])
    return "forkserver"


class _Failure(tuple):
    """(when, traceback) of a worker's exception; ``when`` on the machine's monotonic clock."""


def _worker_entry(rank: int, fn: Callable, world_size: int, port: int, backend: Optional[str],
                  args: tuple, results, timeout: float, threads: int) -> None:
    torch.set_num_threads(threads)
    joined = False
    try:
        device_id = None
        if backend == "nccl":  # NCCL wants one GPU per process
            device_id = torch.device("cuda", rank % torch.cuda.device_count())
            torch.cuda.set_device(device_id)
        if backend is not None:
            init_process_group(rank, world_size, port, backend, timeout, device_id)
            joined = True
        result = fn(rank, world_size, *args)
    except BaseException:
        # Reported, with the moment it happened, before this worker leaves the group: its
        # peers then fail too (a closed connection), and the parent must tell the cause
        # from its consequences.
        results.put((rank, _Failure((time.monotonic(), traceback.format_exc()))))
        raise
    finally:
        if joined:
            dist.destroy_process_group()
    # Plain pickle: torch's multiprocessing queues would send tensors through shared
    # memory that this process owns, and it is about to exit.
    results.put((rank, pickle.dumps(result)))


@contextmanager
def quiet_cpp_log(level: str = "ERROR"):
    """Start processes with PyTorch's C++ log at ``level`` (``TORCH_CPP_LOG_LEVEL``).

    The C++ side of PyTorch reads the variable once, when a process imports torch, so it
    must be in the environment the workers (and the fork server that forks them) start
    from. Process groups log notices there, on stderr, that say nothing about the
    results (gloo, for instance, which address it fell back to); errors still show. A
    value already set by the user wins; this process's own environment is restored after.
    """
    previous = os.environ.get("TORCH_CPP_LOG_LEVEL")
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", level)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("TORCH_CPP_LOG_LEVEL", None)


def run_workers(fn: Callable, world_size: int, args: Sequence = (), *,
                backend: Optional[str] = "gloo", timeout: float = 120.0,
                threads: Optional[int] = None) -> List[object]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` new processes; their results by rank.

    ``fn`` must be importable (defined at the top level of a module) because the
    workers are started with ``forkserver`` or ``spawn`` (see :func:`start_method`).
    With a ``backend`` ('gloo' for CPU tensors, 'nccl' for GPUs, one per worker)
    every worker first joins a process group that rendezvouses on a free port of
    127.0.0.1; with ``backend=None`` it does not.
    ``threads`` is each worker's intra-op thread count (default: the cores
    shared out). A worker's exception is raised here with its traceback; a run
    longer than ``timeout`` seconds is stopped and raises ``TimeoutError``.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    threads = threads or max(1, (os.cpu_count() or 1) // world_size)
    method = start_method()
    context = mp.get_context(method)
    results = context.Queue()
    port = free_port()
    with quiet_cpp_log():
        processes = mp.start_processes(
            _worker_entry, args=(fn, world_size, port, backend, tuple(args), results, timeout,
                                 threads),
            nprocs=world_size, join=False, start_method=method)
    collected: Dict[int, object] = {}
    deadline = time.monotonic() + timeout

    failures: Dict[int, _Failure] = {}

    def drain(wait: float) -> None:
        try:
            while True:
                rank, result = results.get(timeout=wait)
                if isinstance(result, _Failure):
                    failures[rank] = result
                else:
                    collected[rank] = pickle.loads(result)
        except queue_module.Empty:
            pass

    try:
        try:
            while not processes.join(timeout=0.1):  # raises if a worker failed
                drain(0.0)
                if time.monotonic() > deadline:
                    running = [r for r, p in enumerate(processes.processes) if p.is_alive()]
                    raise TimeoutError(f"workers {running} of {world_size} still running "
                                       f"after {timeout:.0f} s; stopped them")
        except ProcessException as first:
            raise _root_cause(first, failures, drain, processes.processes) from None
        while len(collected) < world_size and time.monotonic() < deadline:
            drain(0.5)
    finally:
        for process in processes.processes:
            if process.is_alive():
                process.terminate()
        for process in processes.processes:
            process.join(5)
            if process.is_alive():
                process.kill()
        results.close()
    missing = sorted(set(range(world_size)) - set(collected))
    if missing:
        raise RuntimeError(f"workers {missing} exited without a result")
    return [collected[rank] for rank in range(world_size)]


def _root_cause(first: Exception, failures: Dict[int, "_Failure"], drain: Callable,
                processes: list, grace: float = 5.0) -> Exception:
    """The exception to raise when workers failed: the earliest worker's own.

    The first failure the parent notices is often a consequence (a peer's closed
    connection), so it waits up to ``grace`` seconds for the other workers to report or
    end, then names the worker whose exception came first, with its traceback.
    """
    until = time.monotonic() + grace
    while time.monotonic() < until and any(p.is_alive() for p in processes):
        drain(0.1)
    drain(0.0)
    if not failures:
        return first  # a worker died without raising (a signal, os._exit)
    rank = min(failures, key=lambda r: failures[r][0])
    others = sorted(set(failures) - {rank})
    note = (f" (then worker(s) {others} failed too, as a consequence)" if others else "")
    return ProcessRaisedException(f"worker {rank} of {len(processes)} raised first{note}:\n\n"
                                  f"{failures[rank][1]}", rank, processes[rank].pid)


# ---------------------------------------------------------------- ring allreduce
def ring_schedule(world_size: int) -> List[List[tuple]]:
    """The ring's steps: for each step, ``(sender, receiver, chunk, phase)`` for every worker.

    The vector is cut into ``world_size`` chunks. In the ``reduce-scatter``
    phase worker ``r`` sends chunk ``(r - step) % n`` to its right neighbour,
    which adds it to its own copy; after ``n - 1`` steps worker ``r`` holds the
    complete sum of chunk ``(r + 1) % n``. In the ``all-gather`` phase those
    complete chunks travel once more round the ring, overwriting stale ones.
    """
    n = world_size
    steps = []
    for step in range(n - 1):
        steps.append([(r, (r + 1) % n, (r - step) % n, "reduce-scatter") for r in range(n)])
    for step in range(n - 1):
        steps.append([(r, (r + 1) % n, (r + 1 - step) % n, "all-gather") for r in range(n)])
    return steps


def _exchange(send: torch.Tensor, dst: int, recv: torch.Tensor, src: int, group) -> None:
    # Non-blocking send and receive together: every worker sends and receives at
    # once, so blocking calls in one fixed order would deadlock round the ring.
    requests = []
    if send.numel():
        requests.append(dist.isend(send, dst, group=group))
    if recv.numel():
        requests.append(dist.irecv(recv, src, group=group))
    for request in requests:
        request.wait()


def ring_allreduce(tensor: torch.Tensor, group=None, trace: Optional[list] = None) -> torch.Tensor:
    """Sum ``tensor`` over the processes of ``group`` in place, by reduce-scatter then all-gather.

    Every process calls it with a tensor of the same shape and dtype; each sends
    and receives ``2 (n - 1)`` chunks of ``1/n`` of the tensor, only to and from
    its ring neighbours. If ``trace`` is a list, a copy of the local (flattened)
    tensor is appended before the first and after every step.
    """
    n = dist.get_world_size(group)
    rank = dist.get_rank(group)
    right = dist.get_global_rank(group, (rank + 1) % n) if group is not None else (rank + 1) % n
    left = dist.get_global_rank(group, (rank - 1) % n) if group is not None else (rank - 1) % n
    work = tensor.detach().contiguous().view(-1)  # a view when tensor is contiguous
    chunks = work.tensor_split(n)  # views; sizes differ by at most 1 (some may be empty)
    incoming = torch.empty_like(chunks[0])
    if trace is not None:
        trace.append(work.clone())
    schedule = ring_schedule(n)
    for step in schedule:
        _, _, send_chunk, phase = step[rank]
        _, _, recv_chunk, _ = step[(rank - 1) % n]  # what my left neighbour sends me
        if phase == "reduce-scatter":
            buffer = incoming[:chunks[recv_chunk].numel()]
            _exchange(chunks[send_chunk], right, buffer, left, group)
            chunks[recv_chunk].add_(buffer)
        else:  # all-gather: the received chunk is complete, it replaces ours
            _exchange(chunks[send_chunk], right, chunks[recv_chunk], left, group)
        if trace is not None:
            trace.append(work.clone())
    if work.data_ptr() != tensor.data_ptr() or not tensor.is_contiguous():
        with torch.no_grad():
            tensor.copy_(work.view_as(tensor))
    return tensor


def ring_trace_job(rank: int, world_size: int, length: int) -> dict:
    """Worker ``r`` starts with ``length`` copies of ``2**r``, so every partial sum shows who
    contributed; returns its trace and the checks against ``dist.all_reduce``."""
    mine = torch.full((length,), 2 ** rank, dtype=torch.int64)
    trace: list = []
    ours = ring_allreduce(mine.clone(), trace=trace)
    theirs = mine.clone()
    dist.all_reduce(theirs)
    # The same on random floats: equal up to the order of the additions.
    generator = torch.Generator().manual_seed(rank)
    values = torch.randn(1000, generator=generator, dtype=torch.float64)
    ring_float, gloo_float = ring_allreduce(values.clone()), values.clone()
    dist.all_reduce(gloo_float)
    return {"trace": [t.tolist() for t in trace], "ring": ours.tolist(),
            "all_reduce": theirs.tolist(),
            "int_equal": torch.equal(ours, theirs),
            "float_max_diff": float((ring_float - gloo_float).abs().max())}


def _timing_device(group=None) -> torch.device:
    """Where ``group``'s collectives take their tensors: this process's GPU under NCCL, else
    the CPU. (A group started with plain "nccl" has a backend for CUDA tensors only: a CPU
    tensor handed to its collectives raises.)"""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _finish(result: object = None) -> None:
    """Wait until a collective has finished: its ``Work`` handle if it returned one
    (``async_op=True``), then the kernels queued on this process's GPU, if it uses one.
    An NCCL collective, like any CUDA operation, returns once its kernel is queued."""
    if hasattr(result, "wait"):
        result.wait()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()  # the current device: this process's GPU


def _timed(op: Callable[[], object], group, repeat: int, warmup: int) -> List[float]:
    """Seconds per call of a collective: the slowest process's time, one value per repeat.

    The clock stops once the collective has finished (:func:`_finish`), not when ``op``
    returns; the slowest time is found with a MAX allreduce on a tensor where ``group``'s
    backend takes it (:func:`_timing_device`)."""
    device = _timing_device(group)
    for _ in range(warmup):
        _finish(op())
    times = []
    for _ in range(repeat):
        _finish()  # nothing queued earlier runs into the timed window
        dist.barrier(group=group)  # everyone starts together
        start = time.perf_counter()
        _finish(op())
        slowest = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
        times.append(float(slowest))
    return times


def aggregation_timing_job(rank: int, world_size: int, group_sizes: Sequence[int],
                           numels: Sequence[int], repeat: int = 5, warmup: int = 1):
    """Time our ring and gloo's ``all_reduce`` on float32 vectors of each size, for groups of
    the first ``n`` processes; rank 0 returns the records, the others ``None``."""
    records = []
    for n in group_sizes:
        group = dist.new_group(list(range(n)))  # every process must take part in creating it
        if rank < n:
            for numel in numels:
                data = torch.ones(numel, dtype=torch.float32)
                methods = (("ring_allreduce (ours)", lambda: ring_allreduce(data, group)),
                           ("dist.all_reduce (gloo)", lambda: dist.all_reduce(data, group=group)))
                for method, op in methods:
                    times = _timed(op, group, repeat, warmup)
                    records.append({"method": method, "workers": n, "numel": numel,
                                    "bytes": numel * 4, "median_s": statistics.median(times),
                                    "min_s": min(times)})
        dist.barrier()
    return records if rank == 0 else None


# ---------------------------------------------------------------- key-value store
def tensor_to_bytes(tensor: torch.Tensor) -> bytes:
    buffer = io.BytesIO()
    torch.save(tensor.detach().cpu(), buffer)
    return buffer.getvalue()


def bytes_to_tensor(data: bytes) -> torch.Tensor:
    return torch.load(io.BytesIO(data), weights_only=True)


class KVServer:
    """A parameter server: holds a value per key and aggregates what workers push.

    It hosts a ``torch.distributed.TCPStore`` on 127.0.0.1; workers reach it with
    :class:`KVClient`. Rounds are synchronous: in round ``t`` the server waits for
    every worker's push of a key, sums the pushes in worker order, applies
    ``update(key, value, total)`` (default: the value becomes the sum) and
    publishes version ``t``, which is what a worker's next ``pull`` returns.
    """

    def __init__(self, port: int, num_workers: int, timeout: float = 60.0):
        self.num_workers = num_workers
        self.store = tcp_store(port, num_workers + 1, is_master=True, timeout=timeout)

    def serve(self, initial: Dict[str, torch.Tensor], rounds: int,
              update: Optional[Callable[[str, torch.Tensor, torch.Tensor],
                                        torch.Tensor]] = None
              ) -> Dict[str, torch.Tensor]:
        values = {key: value.detach().clone() for key, value in initial.items()}
        for key, value in values.items():
            self.store.set(f"{key}/value/0", tensor_to_bytes(value))
        for t in range(1, rounds + 1):
            for key in values:
                pushes = [f"{key}/push/{t}/{worker}"
                          for worker in range(self.num_workers)]
                # get() blocks until the key exists (or the store's timeout passes)
                received = [bytes_to_tensor(self.store.get(name)) for name in pushes]
                total = received[0].clone()
                for tensor in received[1:]:
                    total += tensor
                values[key] = update(key, values[key], total) if update else total
                self.store.set(f"{key}/value/{t}", tensor_to_bytes(values[key]))
                for name in pushes:  # aggregated: the server need not keep them
                    self.store.delete_key(name)
        # The store lives in this process: wait until every
        # worker has read the last version.
        self.store.get("all-workers-done")
        return values


class KVClient:
    """A worker's handle on a :class:`KVServer`:
    ``push(key, tensor)`` and ``pull(key)``."""

    def __init__(self, port: int, worker: int, num_workers: int, timeout: float = 60.0):
        self.worker, self.num_workers = worker, num_workers
        self.store = tcp_store(port, num_workers + 1, is_master=False, timeout=timeout)
        self.round: Dict[str, int] = {}

    def push(self, key: str, tensor: torch.Tensor) -> None:
        """Send this worker's contribution to the next round of ``key``."""
        self.round[key] = self.round.get(key, 0) + 1
        self.store.set(f"{key}/push/{self.round[key]}/{self.worker}",
                       tensor_to_bytes(tensor))

    def pull(self, key: str) -> torch.Tensor:
        """The value of ``key`` after the round of this worker's
        last push (blocks until ready)."""
        return bytes_to_tensor(self.store.get(f"{key}/value/{self.round.get(key, 0)}"))

    def close(self) -> None:
        """Tell the server this worker is finished (the
        last one to call lets it exit)."""
        if self.store.add("workers-done", 1) == self.num_workers:
            self.store.set("all-workers-done", b"1")


def kv_sum_job(rank: int, world_size: int, port: int, rounds: int) -> object:
    """Rank 0 serves, ranks 1.. push integers and pull the sums; returns what each pulled."""
    num_workers = world_size - 1
    if rank == 0:
        final = KVServer(port, num_workers).serve({"x": torch.zeros(3, dtype=torch.int64)}, rounds)
        return final["x"].tolist()
    client = KVClient(port, worker=rank - 1, num_workers=num_workers)
    pulled = []
    for t in range(1, rounds + 1):
        client.push("x", torch.tensor([rank, 10 * rank, 100 * t], dtype=torch.int64))
        pulled.append(client.pull("x").tolist())
    client.close()
    return pulled


def linear_data(worker: int, n: int, true_w: torch.Tensor, true_b: float, noise: float = 0.01):
    """``n`` examples of a linear model with noise, different for every worker (seeded)."""
    generator = torch.Generator().manual_seed(100 + worker)
    X = torch.randn(n, len(true_w), generator=generator)
    y = X @ true_w + true_b + noise * torch.randn(n, generator=generator)
    return X, y


def kv_sgd_job(rank: int, world_size: int, port: int, steps: int, lr: float,
               true_w: List[float], true_b: float, examples_per_worker: int = 1000,
               batch_size: int = 32) -> object:
    """Linear regression by synchronous SGD through a parameter server.

    Rank 0 holds ``w`` and ``b`` and applies ``param -= lr * mean of the pushed
    gradients``; ranks 1.. each own a shard of data, pull the parameters,
    compute a minibatch gradient and push it. Workers return their losses and
    the seconds all steps took, the server the final parameters.
    """
    num_workers = world_size - 1
    true_w = torch.tensor(true_w)
    if rank == 0:
        def sgd(key, value, gradient_sum):
            return value - lr * gradient_sum / num_workers
        initial = {"w": torch.zeros(len(true_w)), "b": torch.zeros(1)}
        final = KVServer(port, num_workers).serve(initial, steps, update=sgd)
        return {key: value.tolist() for key, value in final.items()}
    worker = rank - 1
    X, y = linear_data(worker, examples_per_worker, true_w, true_b)
    generator = torch.Generator().manual_seed(worker)
    client = KVClient(port, worker, num_workers)
    losses = []
    start = time.perf_counter()
    for _ in range(steps):
        w, b = client.pull("w").requires_grad_(), client.pull("b").requires_grad_()
        batch = torch.randint(0, len(X), (batch_size,), generator=generator)
        loss = ((X[batch] @ w + b - y[batch]) ** 2).mean() / 2
        loss.backward()
        client.push("w", w.grad)
        client.push("b", b.grad)
        losses.append(loss.item())
    seconds = time.perf_counter() - start
    client.close()
    return {"losses": losses, "seconds": seconds}


class OperatorWatch:
    """A context manager that shows :meth:`note` every operator passing through PyTorch's
    dispatcher while it is active, in this thread and in the threads autograd runs the
    backward pass on (a ``TorchDispatchMode``): the collective counters of the DDP and
    model-parallel pages build on it. ``note`` returns False to step aside for a tensor
    subclass's operator (DTensor), which then comes back as plain operators and collectives."""

    def __init__(self):
        self._mode = None

    def note(self, func, types, args) -> bool:
        raise NotImplementedError

    def __enter__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        watch = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if watch.note(func, types, args) is False:
                    return NotImplemented
                return func(*args, **(kwargs or {}))

        self._mode = _Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> bool:
        self._mode.__exit__(*exc)
        return False
