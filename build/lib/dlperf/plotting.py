"""Plot defaults and the few figure types several pages draw."""
from __future__ import annotations

from typing import Dict, Iterable, Optional, Sequence, Tuple

import matplotlib
import matplotlib.pyplot as plt


def use_book_style() -> None:
    """Crisp SVG figures of one size everywhere in the book."""
    try:
        from matplotlib_inline.backend_inline import set_matplotlib_formats
        set_matplotlib_formats("svg")
    except ImportError:  # outside IPython nothing needs setting
        pass
    matplotlib.rcParams.update({
        "figure.figsize": (6.0, 3.5),
        "axes.grid": True,
        "grid.alpha": 0.3,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "svg.fonttype": "none",
        "svg.hashsalt": "dlperf",  # same figure, same SVG: builds diff cleanly
    })


def plot_lines(x: Sequence, series: Dict[str, Sequence], *, xlabel: str = "",
               ylabel: str = "", title: str = "", logx: bool = False,
               logy: bool = False, ax=None, markers: bool = True):
    """One line per entry of ``series`` over the same ``x``; returns the axes."""
    if ax is None:
        _, ax = plt.subplots()
    for label, ys in series.items():
        ax.plot(x, ys, marker="o" if markers else None, markersize=4, label=label)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    if len(series) > 1:
        ax.legend()
    return ax


def plot_timeline(spans: Iterable[Tuple[str, float, float, str]], *, unit: str = "ms",
                  title: str = "", ax=None):
    """A Gantt chart of ``(lane, start, end, label)`` spans: what ran when, on what."""
    spans = list(spans)
    lanes = list(dict.fromkeys(lane for lane, *_ in spans))
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 0.6 + 0.55 * len(lanes)))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    labels = list(dict.fromkeys(label for *_, label in spans))
    for lane, start, end, label in spans:
        ax.barh(lanes.index(lane), end - start, left=start, height=0.6,
                color=colors[labels.index(label) % len(colors)], edgecolor="black",
                linewidth=0.5)
        if end - start > 0:
            ax.text((start + end) / 2, lanes.index(lane), label, ha="center",
                    va="center", fontsize=8, clip_on=True)
    ax.set_yticks(range(len(lanes)), lanes)
    ax.invert_yaxis()
    ax.set_xlabel(f"time ({unit})")
    ax.grid(axis="y", visible=False)
    if title:
        ax.set_title(title)
    return ax


def bar_chart(values: Dict[str, float], *, ylabel: str = "", title: str = "",
              ax=None, annotate: Optional[str] = "{:.3g}"):
    """Bars for a handful of named numbers, each labelled with its value."""
    if ax is None:
        _, ax = plt.subplots()
    bars = ax.bar(list(values), list(values.values()))
    if annotate:
        ax.bar_label(bars, labels=[annotate.format(v) for v in values.values()], fontsize=8)
    ax.set(ylabel=ylabel, title=title)
    ax.grid(axis="x", visible=False)
    return ax
