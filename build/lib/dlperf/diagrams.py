"""Dependency graphs taken from real code and drawn: what has to run before what.

``trace(fn)`` records a function with ``torch.fx`` (no tensor is computed) and
returns a :class:`DependencyGraph`: one node per input, operation and output,
and one edge from each value to every operation that reads it. ``draw(graph)``
lays the graph out in columns by *level* (the longest chain of operations
leading to a node): operations in the same column do not depend on each
other, so a backend is free to run them at the same time.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import matplotlib.pyplot as plt

# Python operators that torch.fx records as plain functions, with the symbol a reader expects.
_SYMBOLS = {
    operator.add: "+", operator.sub: "-", operator.mul: "*", operator.truediv: "/",
    operator.matmul: "@", operator.pow: "**", operator.floordiv: "//",
}
KIND_COLORS = {"input": "#d9e8f5", "op": "#fbe3c4", "output": "#d5ecd4"}


@dataclass
class DependencyGraph:
    """Nodes in program order, edges ``(producer, consumer)``, and a label for every node."""
    nodes: List[str]
    edges: List[Tuple[str, str]]
    labels: Dict[str, str] = field(default_factory=dict)
    kinds: Dict[str, str] = field(default_factory=dict)  # 'input', 'op' or 'output'

    def __post_init__(self):
        known = set(self.nodes)
        if len(known) != len(self.nodes):
            raise ValueError("node names must be unique")
        for a, b in self.edges:
            if a not in known or b not in known:
                raise ValueError(f"edge {a!r} -> {b!r} names a node that is not in the graph")
        for n in self.nodes:
            self.labels.setdefault(n, n)
            self.kinds.setdefault(n, "op")

    def predecessors(self, node: str) -> List[str]:
        return [a for a, b in self.edges if b == node]

    def levels(self) -> Dict[str, int]:
        """Length of the longest chain of edges ending at each node (inputs are level 0)."""
        level: Dict[str, int] = {}
        visiting = set()

        def visit(n: str) -> int:
            if n in level:
                return level[n]
            if n in visiting:
                raise ValueError(f"the graph has a cycle through {n!r}")
            visiting.add(n)
            level[n] = max((visit(p) + 1 for p in self.predecessors(n)), default=0)
            visiting.discard(n)
            return level[n]

        for n in self.nodes:
            visit(n)
        return level

    def parallel_groups(self) -> List[List[str]]:
        """The operations of each level, in program order: each group could run at once."""
        level = self.levels()
        depth = max(level.values(), default=0)
        groups = [[n for n in self.nodes if level[n] == d and self.kinds[n] == "op"]
                  for d in range(depth + 1)]
        return [g for g in groups if g]


def _short(arg) -> str:
    if hasattr(arg, "name") and hasattr(arg, "op"):  # a torch.fx Node
        return arg.name
    if isinstance(arg, float):
        return f"{arg:g}"
    if isinstance(arg, (tuple, list)):
        return "(" + ", ".join(_short(a) for a in arg) + ")"
    return repr(arg) if isinstance(arg, str) else str(arg)


def _expression(node) -> str:
    """The line of code an fx node stands for, e.g. ``a * b`` or ``relu(mul)``."""
    args = [_short(a) for a in node.args]
    args += [f"{k}={_short(v)}" for k, v in node.kwargs.items()]
    if node.op == "call_function":
        if node.target in _SYMBOLS and len(node.args) == 2:
            return f"{args[0]} {_SYMBOLS[node.target]} {args[1]}"
        if node.target is getattr and len(node.args) == 2:
            return f"{args[0]}.{node.args[1]}"
        name = getattr(node.target, "__name__", str(node.target))
        return f"{name}({', '.join(args)})"
    if node.op == "call_method":
        return f"{args[0]}.{node.target}({', '.join(args[1:])})"
    if node.op == "call_module":
        return f"self.{node.target}({', '.join(args)})"
    if node.op == "get_attr":
        return f"self.{node.target}"
    return ", ".join(args)


def trace(fn: Callable, concrete_args: Optional[dict] = None) -> DependencyGraph:
    """The dependency graph of ``fn`` (a function or ``nn.Module``), recorded by ``torch.fx``.

    Tracing runs ``fn`` on placeholder values, so nothing is computed and
    Python control flow that depends on tensor values cannot be traced.
    """
    import torch.fx

    module = torch.fx.symbolic_trace(fn, concrete_args=concrete_args)
    nodes, edges, labels, kinds = [], [], {}, {}
    for node in module.graph.nodes:
        nodes.append(node.name)
        edges += [(source.name, node.name) for source in node.all_input_nodes]
        if node.op == "placeholder":
            kinds[node.name], labels[node.name] = "input", f"input\n{node.target}"
        elif node.op == "output":
            kinds[node.name], labels[node.name] = "output", "output"
        else:
            kinds[node.name], labels[node.name] = "op", f"{node.name}\n{_expression(node)}"
    return DependencyGraph(nodes, edges, labels, kinds)


def layout(graph: DependencyGraph) -> Dict[str, Tuple[float, float]]:
    """Positions: x is the node's level, nodes of one level are stacked and centred on y = 0."""
    level = graph.levels()
    columns: Dict[int, List[str]] = {}
    for n in graph.nodes:
        columns.setdefault(level[n], []).append(n)
    positions = {}
    for x, members in columns.items():
        for i, n in enumerate(members):
            positions[n] = (float(x), (len(members) - 1) / 2 - i)
    return positions


def draw(graph: DependencyGraph, *, ax=None, title: str = "", show_levels: bool = True):
    """Boxes and arrows, left to right; operations in one column are independent of each other."""
    positions = layout(graph)
    depth = max((x for x, _ in positions.values()), default=0)
    height = max((abs(y) for _, y in positions.values()), default=0)
    if ax is None:
        _, ax = plt.subplots(figsize=(max(4.0, 1.9 * (depth + 1)), max(2.2, 1.3 * (2 * height + 1))))
    for a, b in graph.edges:
        (xa, ya), (xb, yb) = positions[a], positions[b]
        # An edge that skips a level would cross the boxes in between: bow it over them.
        span = xb - xa
        bow = 0.0 if span <= 1 else -min(0.35, 0.9 / span) * (1 if ya >= yb else -1)
        ax.annotate("", xy=(xb, yb), xytext=(xa, ya),
                    arrowprops=dict(arrowstyle="-|>", color="0.35", lw=1, shrinkA=24, shrinkB=24,
                                    connectionstyle=f"arc3,rad={bow}"))
    for n, (x, y) in positions.items():
        ax.text(x, y, graph.labels[n], ha="center", va="center", fontsize=8, family="monospace",
                bbox=dict(boxstyle="round,pad=0.4", facecolor=KIND_COLORS[graph.kinds[n]],
                          edgecolor="0.3", linewidth=0.8))
    if show_levels:
        for x in range(int(depth) + 1):
            ax.text(x, -height - 1.1, f"level {x}", ha="center", va="center", fontsize=7,
                    color="0.4")
    ax.set_xlim(-0.6, depth + 0.6)
    ax.set_ylim(-height - 1.3, height + 1.0)  # room for bowed edges and the level names
    ax.axis("off")
    if title:
        ax.set_title(title)
    return ax
