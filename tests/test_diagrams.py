"""dlperf.diagrams: graphs traced from code, their levels, and the drawing."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from dlperf import diagrams  # noqa: E402
from dlperf.diagrams import DependencyGraph  # noqa: E402


def small_program(x, y):
    p = x @ y
    q = x + 2
    r = p * q
    return r.sum()


def test_trace_records_every_value_and_who_reads_it():
    graph = diagrams.trace(small_program)
    assert graph.nodes == ["x", "y", "matmul", "add", "mul", "sum_1", "output"]
    assert set(graph.edges) == {("x", "matmul"), ("y", "matmul"), ("x", "add"),
                                ("matmul", "mul"), ("add", "mul"), ("mul", "sum_1"),
                                ("sum_1", "output")}
    assert graph.kinds == {"x": "input", "y": "input", "matmul": "op", "add": "op",
                           "mul": "op", "sum_1": "op", "output": "output"}


def test_labels_show_the_code_each_node_stands_for():
    def block(x, w):
        return torch.relu(x @ w).T + 0.5

    labels = diagrams.trace(block).labels
    assert labels["matmul"] == "matmul\nx @ w"
    assert labels["relu"] == "relu\nrelu(matmul)"
    assert labels["getattr_1"] == "getattr_1\nrelu.T"
    assert labels["add"] == "add\ngetattr_1 + 0.5"
    assert labels["x"] == "input\nx"


def test_levels_and_parallel_groups_follow_the_dependencies():
    graph = diagrams.trace(small_program)
    assert graph.levels() == {"x": 0, "y": 0, "matmul": 1, "add": 1, "mul": 2, "sum_1": 3,
                              "output": 4}
    assert graph.parallel_groups() == [["matmul", "add"], ["mul"], ["sum_1"]]


def test_trace_of_a_module_names_its_submodules():
    graph = diagrams.trace(nn.Sequential(nn.Linear(3, 4), nn.ReLU()))
    ops = [n for n in graph.nodes if graph.kinds[n] == "op"]
    assert len(ops) == 2
    assert graph.labels[ops[0]].endswith("self.0(input_1)")


def test_trace_refuses_data_dependent_control_flow():
    def sign_flip(x):
        return x if x.sum() > 0 else -x

    with pytest.raises(torch.fx.proxy.TraceError):
        diagrams.trace(sign_flip)


def test_hand_made_graph_is_checked():
    with pytest.raises(ValueError, match="not in the graph"):
        DependencyGraph(["a"], [("a", "b")])
    with pytest.raises(ValueError, match="unique"):
        DependencyGraph(["a", "a"], [])
    cyclic = DependencyGraph(["a", "b"], [("a", "b"), ("b", "a")])
    with pytest.raises(ValueError, match="cycle"):
        cyclic.levels()


def test_hand_made_graph_gets_default_labels_and_kinds():
    graph = DependencyGraph(["a", "b", "c"], [("a", "c"), ("b", "c")])
    assert graph.labels == {"a": "a", "b": "b", "c": "c"}
    assert graph.parallel_groups() == [["a", "b"], ["c"]]


def test_layout_puts_one_level_in_one_column_without_overlaps():
    positions = diagrams.layout(diagrams.trace(small_program))
    assert positions["matmul"][0] == positions["add"][0] == 1.0
    assert positions["matmul"][1] != positions["add"][1]
    assert positions["output"][0] == 4.0


def test_draw_makes_one_box_per_node_and_one_arrow_per_edge():
    graph = diagrams.trace(small_program)
    fig, ax = plt.subplots()
    returned = diagrams.draw(graph, ax=ax, title="t", show_levels=False)
    assert returned is ax
    boxes = [t for t in ax.texts if t.get_bbox_patch() is not None]
    assert sorted(t.get_text() for t in boxes) == sorted(graph.labels.values())
    arrows = [c for c in ax.get_children() if isinstance(c, matplotlib.text.Annotation)]
    assert len(arrows) == len(graph.edges)
    assert ax.get_title() == "t"
    plt.close(fig)


def test_draw_creates_its_own_figure_and_labels_levels():
    ax = diagrams.draw(diagrams.trace(small_program))
    level_texts = [t.get_text() for t in ax.texts if t.get_text().startswith("level ")]
    assert level_texts == [f"level {i}" for i in range(5)]
    plt.close(ax.figure)
