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


# A speed test's timed calls (autograder.pipeline.timing): the timed request ends by writing
# every output's bytes to a file (so an output exists, in full, when the request replies: a
# lazily computed one is computed inside the timed request), and the clean kernel, where no
# learner's code runs, compares that file with its own.
_json_loads = json.loads


def _raw_bytes(tensor, torch) -> bytes:
    """A tensor's elements as bytes, in order, copied from the device if it is on one."""
    flat = tensor.detach().reshape(-1).contiguous().cpu()
    return flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""


def _parts(value, torch) -> list:
    """One call's output as a list of tensors (a tuple or list item by item, a number as a
    0-d tensor); anything else as None, which matches nothing."""
    kind = _type(value)
    if kind in (tuple, list):
        return [part for item in value for part in _parts(item, torch)]
    if kind in (int, float, bool):
        return [torch.tensor(value)]
    return [value if kind is torch.Tensor else None]


def dump_outputs(outputs, path: str) -> None:
    """Write the outputs of the timed calls to ``path``: per tensor a JSON header (dtype,
    shape) and its raw bytes, copied from the device if it is on one."""
    torch = _torch()
    with open(path, "wb") as out:
        for output in outputs:
            parts = _parts(output, torch)
            out.write(_len(parts).to_bytes(4, "little"))
            for part in parts:
                if part is None:
                    header, data = b'{"opaque": true}', b""
                else:
                    header = _dumps({"dtype": _str(part.dtype).replace("torch.", ""),
                                     "shape": [int(n) for n in part.shape]}).encode()
                    data = _raw_bytes(part, torch)
                out.write(_len(header).to_bytes(4, "little"))
                out.write(header)
                out.write(_len(data).to_bytes(8, "little"))
                out.write(data)


# A speed test's inputs on a CPU: the clean kernel draws them and writes them in one file
# (a JSON header that says where each tensor's bytes are, then the bytes, each aligned), and
# each kernel maps its own copy inside the timed request: one header to parse and a view per
# tensor, next to no time, and whatever else a learner's kernel makes of it is timed too.
_INPUT_ALIGN = 64


def dump_inputs(calls, path: str) -> None:
    """Write the arguments of the timed calls (a list of tuples of tensors and numbers)."""
    torch = _torch()
    header, blobs, offset = [], [], 0
    for args in calls:
        described = []
        for arg in args:
            kind = _type(arg)
            if kind in (int, float, bool, type(None)):
                described.append({"value": arg})
                continue
            if kind is not torch.Tensor:
                raise TypeError(f"a speed test's inputs must be tensors or numbers, not "
                                f"{kind.__name__}")
            data = _raw_bytes(arg, torch)
            offset += -offset % _INPUT_ALIGN
            described.append({"dtype": _str(arg.dtype).replace("torch.", ""),
                              "shape": [int(n) for n in arg.shape], "offset": offset,
                              "bytes": _len(data)})
            blobs.append((offset, data))
            offset += _len(data)
        header.append(described)
    text = _dumps(header).encode()
    start = 8 + _len(text)
    start += -start % _INPUT_ALIGN
    with open(path, "wb") as out:
        out.write(start.to_bytes(8, "little") + text)
        for at, data in blobs:
            out.seek(start + at)
            out.write(data)
        out.truncate(start + offset)


def load_inputs(path: str) -> list:
    """The calls' arguments written by :func:`dump_inputs`, as tensors over a private map of
    the file (pages are read when first touched; writing to them changes no one else's)."""
    import mmap
    torch = _torch()
    with open(path, "rb") as source:
        start = int.from_bytes(source.read(8), "little")
        header = _json_loads(source.read(start - 8).rstrip(b"\0") or b"[]")
        size = source.seek(0, 2)
        mapped = mmap.mmap(source.fileno(), size, access=mmap.ACCESS_COPY) if size else b""
    calls = []
    for described in header:
        args = []
        for arg in described:
            if "value" in arg:
                args.append(arg["value"])
                continue
            dtype = getattr(torch, arg["dtype"])
            count = arg["bytes"] // torch.empty(0, dtype=dtype).element_size()
            tensor = (torch.frombuffer(mapped, dtype=dtype, count=count,
                                       offset=start + arg["offset"])
                      if count else torch.empty(0, dtype=dtype))
            args.append(tensor.reshape(arg["shape"]))
        calls.append(tuple(args))
    return calls


def _read_outputs(path: str) -> list:
    torch = _torch()
    calls = []
    with open(path, "rb") as source:
        while True:
            count = source.read(4)
            if not count:
                return calls
            parts = []
            for _ in range(int.from_bytes(count, "little")):
                header = _json_loads(source.read(int.from_bytes(source.read(4), "little")))
                data = source.read(int.from_bytes(source.read(8), "little"))
                if header.get("opaque"):
                    parts.append(None)
                    continue
                dtype = getattr(torch, header["dtype"])
                tensor = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else \
                    torch.empty(0, dtype=torch.uint8)
                parts.append(tensor.view(dtype).reshape(header["shape"]))
            calls.append(parts)


def compare_outputs(theirs: str, mine: str, rtol: float, atol: float):
    """None if the outputs in ``theirs`` match those in ``mine`` (this kernel's) call by call
    within the tolerances, else what differs first. Run in the clean kernel."""
    torch = _torch()
    try:
        got = _read_outputs(theirs)
    except Exception as error:  # a file that is not what dump_outputs writes
        return f"the outputs could not be read back ({type(error).__name__})"
    expected = _read_outputs(mine)
    if _len(got) != _len(expected):
        return f"{_len(got)} outputs were written for {_len(expected)} calls"
    for number, (parts, wants) in enumerate(zip(got, expected)):
        where = f"the output of call {number + 1}"
        if _len(parts) != _len(wants):
            return f"{where} has {_len(parts)} tensors, expected {_len(wants)}"
        for part, want in zip(parts, wants):
            if part is None:
                return f"{where} is not a plain tensor (or a tuple of them, or a number)"
            if part.dtype != want.dtype or part.shape != want.shape:
                return (f"{where} is {_str(part.dtype).replace('torch.', '')} "
                        f"{tuple(part.shape)}, expected {_str(want.dtype).replace('torch.', '')} "
                        f"{tuple(want.shape)}")
            if want.is_floating_point() or want.is_complex():
                close = torch.isclose(part, want, rtol=rtol, atol=atol, equal_nan=True)
            else:
                close = part == want
            if not bool(close.all()):
                index = int((~close).reshape(-1).nonzero()[0])
                return (f"{where} differs at flat index {index}: "
                        f"{part.reshape(-1)[index].item()!r}, expected "
                        f"{want.reshape(-1)[index].item()!r}")
    return None


def emit_comparison(theirs: str, mine: str, rtol: float, atol: float) -> None:
    emit({"problem": compare_outputs(theirs, mine, rtol, atol)}, ("problem",))
