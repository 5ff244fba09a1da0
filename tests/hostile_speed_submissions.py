"""Submissions of ``fast_attention`` that try to make its speed test say more than their code
does, each with the speed points it must get (of the cell's 4) and what its feedback must say;
and honest answers beside them, some handed in more than once (the same file graded again
must get the same speed points).

Most tricks behave for the first calls, which the correctness tests and the speed cell's own
check make, and cheat from the 30th call on, where only the timing calls them: a trick that
failed those checks would never be timed at all, and would show nothing about the timing.
"""
from __future__ import annotations

from dataclasses import dataclass

from coursebook.cases import speed_answers

ASSIGNMENT = NOTEBOOK = "fast_attention"
ANSWER_CELL = "attention_answer"
SPEED_CELL = "attention_speed"

# The reference and the first improvement a learner makes (loops over batch and heads kept:
# 2 of the 4 speed points on the course's CPU schedule).
FUSED, HEADS_LOOP = (speed_answers(ASSIGNMENT)[name] for name in ("reference", "middle"))
# Counts the calls: honest for the first ones.
LATER = "_calls = [0]\ndef _later():\n    _calls[0] += 1\n    return _calls[0] > 30\n"


@dataclass
class SpeedCase:
    name: str
    answer: str
    points: float            # the speed cell's score it must get
    says: str                # a phrase its feedback must hold
    copies: int = 1          # handed in this many times (the same bytes each time)
    at_most: bool = False    # points is the most it may get (it may lose by its own doing)


CASES = [
    SpeedCase("fused", FUSED, 4, "times as fast as the baseline"),
    SpeedCase("heads loop", HEADS_LOOP, 2, "times as fast as the baseline", copies=3),
    SpeedCase("calls the baseline",
              "def causal_attention(q, k, v):\n    return slow_causal_attention(q, k, v)",
              0, "times as fast as the baseline"),
    SpeedCase("wrong once timed", LATER + FUSED.replace(
        "    return torch", "    scale = 1.01 if _later() else 1.0\n    return scale * torch"),
        0, "wrong result"),
    SpeedCase("caches its last result", LATER + '''_last = {}
def causal_attention(q, k, v):
    if _later() and q.shape in _last:
        return _last[q.shape]
    _last[q.shape] = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    return _last[q.shape]''', 0, "wrong result"),
    # A hooked random generator that would compute the answers while the inputs are drawn,
    # the slow loop otherwise: the inputs are drawn in the clean kernel, so it gains nothing.
    SpeedCase("computes while the inputs are drawn", '''_drawn, _stash, _randn = [], {}, torch.randn
def _drawing(*args, **kwargs):
    tensor = _randn(*args, **kwargs)
    _drawn.append(tensor)
    if len(_drawn) == 3:  # q, k and v of one call, drawn one after the other
        q, k, v = _drawn
        _drawn.clear()
        if q.shape == k.shape == v.shape and q.dim() == 4:
            _stash[q.data_ptr()] = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=True)
    return tensor
torch.randn = _drawing
def causal_attention(q, k, v):
    found = _stash.pop(q.data_ptr(), None)
    return found if found is not None else slow_causal_attention(q, k, v)''',
              0, "times as fast as the baseline"),
    # The same with the loader of the inputs, which runs at the start of the timed request:
    # the slow loop done there, so that the function itself returns at once, is timed too.
    SpeedCase("computes while the inputs are mapped", '''import sys
_evidence = sys.modules["autograder.kernel.evidence"]
_load, _stash = _evidence.load_inputs, {}
def _loading(path):
    calls = _load(path)
    for args in calls:
        _stash[args[0].data_ptr()] = slow_causal_attention(*args[:3])
    return calls
_evidence.load_inputs = _loading
def causal_attention(q, k, v):
    found = _stash.pop(q.data_ptr(), None)
    if found is not None:
        return found
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)''',
              0, "times as fast as the baseline"),
    SpeedCase("returns before a thread has done the work", LATER + '''import queue, threading
_work = queue.Queue()
def _worker():
    while True:
        q, k, v, out = _work.get()
        out.copy_(torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
threading.Thread(target=_worker, daemon=True).start()
def causal_attention(q, k, v):
    if not _later():
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    out = torch.empty_like(q)
    _work.put((q, k, v, out))
    return out''', 0, "wrong result"),
    SpeedCase("returns a lazy tensor", LATER + '''class Lazy(torch.Tensor):
    pass
def causal_attention(q, k, v):
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    return out.as_subclass(Lazy) if _later() else out''', 0, "not a plain tensor"),
    SpeedCase("patches the clocks",  # those a timer in the kernel would read
              "import time\ntime.perf_counter = lambda: 0.0\ntime.time = lambda: 0.0\n"
              "time.perf_counter_ns = lambda: 0\ntime.process_time = lambda: 0.0\n" + FUSED,
              4, "times as fast as the baseline"),
    SpeedCase("asks for more threads and every CPU",  # the cgroup's cpuset decides
              "import os\ntorch.set_num_threads(8)\n"
              "try:\n    os.sched_setaffinity(0, range(os.cpu_count()))\n"
              "except OSError:\n    pass\n" + HEADS_LOOP.replace(
                  "    batch, heads", "    torch.set_num_threads(8)\n    batch, heads"),
              2, "times as fast as the baseline", at_most=True),
]
