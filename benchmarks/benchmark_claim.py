"""The ``Benchmark`` assignment's claim, measured: on a GPU, the reference ``Benchmark``
(``dlperf.Benchmark``: synchronize before both clock readings) agrees with CUDA events on a
long kernel, and d2l's ``Benchmark`` (clock readings only) reports a small fraction of it.

Each of ``--repeats`` rounds queues the same long chain of matrix multiplications three ways,
one after the other, on a GPU that has finished all earlier work: timed by a pair of CUDA
events, by the reference ``Benchmark``, and by ``d2l.torch.Benchmark`` itself.
It prints one table (the median of each, and each median as a share of the events'), and
with ``--json FILE`` writes the same numbers. Without a CUDA GPU it says so and exits 0.

    .venv/bin/python benchmarks/benchmark_claim.py --repeats 5
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def long_kernel(size: int, steps: int):
    """A chain of ``steps`` float32 matrix products on the GPU: well over 100 ms of work."""
    import torch
    a = torch.randn(size, size, device="cuda")
    b = torch.randn(size, size, device="cuda") / size ** 0.5

    def work():
        x = a
        for _ in range(steps):
            x = x @ b
        return x
    return work


def measure(repeats: int = 5, size: int = 8192, steps: int = 40) -> dict:
    """Seconds per round for each timer; the medians and their shares of the events'."""
    import torch
    from d2l import torch as d2l
    from dlperf.timing import Benchmark

    work = long_kernel(size, steps)
    torch.backends.cuda.matmul.allow_tf32 = False  # keep the kernel long on any GPU
    work()
    torch.cuda.synchronize()
    seconds = {"cuda events": [], "reference Benchmark": [], "d2l Benchmark": []}
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        work()
        end.record()
        end.synchronize()
        seconds["cuda events"].append(start.elapsed_time(end) / 1000)
        torch.cuda.synchronize()
        reference = Benchmark("reference")
        with contextlib.redirect_stdout(io.StringIO()), reference:
            work()
        seconds["reference Benchmark"].append(reference.elapsed)
        torch.cuda.synchronize()
        theirs = d2l.Benchmark("d2l")
        with contextlib.redirect_stdout(io.StringIO()), theirs:
            work()
        seconds["d2l Benchmark"].append(theirs.timer.times[-1])  # d2l keeps it in its Timer
        torch.cuda.synchronize()
    events = statistics.median(seconds["cuda events"])
    return {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "size": size, "steps": steps, "repeats": repeats, "seconds": seconds,
            "median": {name: statistics.median(runs) for name, runs in seconds.items()},
            "share_of_events": {name: statistics.median(runs) / events
                                for name, runs in seconds.items()}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("No CUDA GPU here: the claim is about GPUs; nothing measured.")
        return 0
    result = measure(args.repeats)
    print(f"{result['device']}, PyTorch {result['torch']}: {result['steps']} float32 products "
          f"of {result['size']}x{result['size']}, median of {result['repeats']} rounds")
    print(f"{'timer':<22}{'median s':>12}{'share of events':>18}")
    for name, median in result["median"].items():
        print(f"{name:<22}{median:>12.4f}{result['share_of_events'][name]:>17.1%}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
