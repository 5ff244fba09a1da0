"""The kernel's side of a test: report what the learner's code gave, as plain data.

A test cell of the instructor's notebook is split at a line ``### CHECKS`` (see
:mod:`autograder.pipeline.checks`). Its first part, the *probe*, runs in the learner's kernel and ends with
a call to :func:`emit`, which sends the values the checks will read as one
``display_data`` output of type :data:`MIME`. Only plain data crosses: numbers, strings,
``None``, lists, tuples and dicts of them, tensors (as their dtype, shape and values),
dtypes, devices and built-in exceptions. A subclass of one of these plain types (a
``typing.NamedTuple``, ``numpy.float64``, an ``IntEnum``, a ``defaultdict``) crosses as
its base type's value, read with the base type's own methods (``float.__float__``,
``tuple.__iter__``), so none of the subclass's code runs and the checks see what a plain
value would give them. Anything else crosses as an opaque stand-in that equals nothing,
so an object whose ``__eq__`` always says yes proves nothing.

This module is imported by the kernel before any of the learner's code runs, and binds
what it uses then: a learner who later replaces ``type``, ``isinstance`` or
``json.dumps`` does not change how it encodes.
"""
from __future__ import annotations

import builtins
import json
import math

from autograder.protocol import EVIDENCE_MIME as MIME
MAX_BYTES = 8 * 1024 * 1024  # a report larger than this is refused, not sent
MAX_DEPTH = 20

_type, _isinstance, _len, _str, _repr, _list = type, isinstance, len, str, repr, list
_issubclass = issubclass
_dumps, _isfinite = json.dumps, math.isfinite
_plain = (bool, int, float, str, type(None))
_exceptions = {name: value for name, value in vars(builtins).items()
               if _isinstance(value, type) and issubclass(value, BaseException)}
# A subclass's value, read by the base type's own slot (bool cannot be subclassed).
_by_value = ((int, int.__int__), (float, float.__float__), (str, str.__str__))


def _number(value):
    if _type(value) is float and not _isfinite(value):
        return {"__float__": _repr(value)}
    return value


def encode(value, depth: int = 0):
    """``value`` as JSON-ready data (see the module's docstring for what crosses)."""
    kind = _type(value)
    if depth > MAX_DEPTH:
        return {"__opaque__": "too deeply nested"}
    if kind in _plain:
        return _number(value)
    for base, read in _by_value:
        if _issubclass(kind, base):
            return _number(read(value))
    if _issubclass(kind, list):
        return [encode(item, depth + 1) for item in _list.__iter__(value)]
    if _issubclass(kind, tuple):
        return {"__tuple__": [encode(item, depth + 1) for item in tuple.__iter__(value)]}
    if _issubclass(kind, dict):
        if all(_type(key) is str for key in dict.keys(value)):
            return {"__dict__": {key: encode(item, depth + 1)
                                 for key, item in dict.items(value)}}
        return {"__opaque__": "dict with non-string keys"}
    if kind in _exceptions.values():
        return {"__exception__": {"type": kind.__name__,
                                  "args": [encode(arg, depth + 1) for arg in value.args]}}
    torch = _torch()
    if torch is not None:
        if kind is torch.Size:
            return {"__tuple__": [int(n) for n in value]}
        if kind is torch.dtype:
            return {"__dtype__": _str(value).replace("torch.", "")}
        if kind is torch.device:
            return {"__device__": _str(value)}
        if kind is torch.Tensor or kind is torch.nn.Parameter:
            return _tensor(torch, value)
    return {"__opaque__": getattr(kind, "__qualname__", "object")}


def _tensor(torch, tensor):
    dtype = _str(tensor.dtype).replace("torch.", "")
    shape = [int(n) for n in tensor.shape]
    if tensor.device.type == "meta":
        return {"__tensor__": {"dtype": dtype, "shape": shape, "meta": True}}
    if tensor.is_complex() or tensor.layout != torch.strided:
        return {"__opaque__": f"{dtype} tensor ({tensor.layout})"}
    flat = torch.Tensor.tolist(tensor.detach().to("cpu").reshape(-1))
    return {"__tensor__": {"dtype": dtype, "shape": shape,
                           "values": [_number(v) for v in flat]}}


def _torch():
    import sys
    return sys.modules.get("torch")


def report(namespace: dict, names) -> str:
    """The JSON report of ``names`` in ``namespace`` (names that are missing are left out)."""
    values = {}
    for name in names:
        if name in namespace:
            values[name] = encode(dict.__getitem__(namespace, name))
    text = _dumps({"values": values})
    if _len(text) > MAX_BYTES:
        text = _dumps({"error": f"the test's results were larger than {MAX_BYTES} bytes"})
    return text


def emit(namespace: dict, names) -> None:
    """Send the report as this cell's evidence output (called at the end of a probe)."""
    from IPython.display import display
    display({MIME: report(namespace, names)}, raw=True)


# A speed test's timed calls (autograder.pipeline.timing): what the grader compares of each
# output with the clean kernel's, chosen after the call returned.
SAMPLES = 256


def speed_summary(value, sample_seed: int, count: int = SAMPLES, depth: int = 0):
    """One timed call's output as the grader compares it: a tensor's dtype, shape, the sum
    of its values and of their magnitudes (every element counts) and ``count`` values at
    positions drawn from ``sample_seed``, which the grader picks after the call returned, so
    an output cannot be right only where it is looked at; a tuple or list item by item; a
    number as it is. The grader refuses anything else."""
    kind = _type(value)
    torch = _torch()
    if depth > MAX_DEPTH:
        return {"__opaque__": "too deeply nested"}
    if kind in (int, float, bool):
        return _number(value)
    if kind in (tuple, list):
        return [speed_summary(item, sample_seed + n, count, depth + 1)
                for n, item in enumerate(value)]
    if torch is None or kind is not torch.Tensor:
        return {"__opaque__": getattr(kind, "__qualname__", "object")}
    import random
    flat = value.detach().reshape(-1)
    size = int(flat.numel())
    picks = random.Random(sample_seed).sample(range(size), min(count, size)) if size else []
    wide = flat.to(torch.float64) if not value.is_complex() else flat.abs().to(torch.float64)
    sampled = torch.Tensor.tolist(wide[torch.tensor(picks, dtype=torch.long,
                                                    device=flat.device)].cpu()) if picks else []
    return {"dtype": _str(value.dtype).replace("torch.", ""),
            "shape": [int(n) for n in value.shape],
            "sum": _number(float(wide.sum())), "abs": _number(float(wide.abs().sum())),
            "at": picks, "values": [_number(v) for v in sampled]}


def emit_speed(value, sample_seed: int) -> None:
    """Send :func:`speed_summary` of ``value`` as this request's evidence."""
    emit({"summary": speed_summary(value, sample_seed)}, ("summary",))
