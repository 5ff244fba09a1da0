"""dlperf.roofline: counting FLOPs and bytes, the roofline's arithmetic, small measurements, drawing."""
import math

import matplotlib

matplotlib.use("Agg")

import pytest
import torch

from dlperf import hardware, roofline


def gelu_by_hand(v):
    return 0.5 * v * (1 + torch.tanh(0.7978845608 * (v + 0.044715 * v**3)))


def test_intensity_attainable_and_ridge():
    assert roofline.intensity(8, 4) == 2
    with pytest.raises(ValueError):
        roofline.intensity(1, 0)
    peak, bandwidth = 100e9, 10e9
    assert roofline.ridge_point(peak, bandwidth) == pytest.approx(10)
    assert roofline.attainable(1, peak, bandwidth) == pytest.approx(10e9)  # memory roof
    assert roofline.attainable(10, peak, bandwidth) == pytest.approx(peak)  # the ridge
    assert roofline.attainable(1000, peak, bandwidth) == pytest.approx(peak)  # compute roof


def test_formulas_for_elementwise_and_matmul():
    add = roofline.elementwise_cost(1000, inputs=2)
    assert (add.flops, add.bytes) == (1000, 12000)
    assert add.intensity == pytest.approx(1 / 12)
    assert roofline.elementwise_cost(10, inputs=1, itemsize=2).bytes == 40
    square = roofline.matmul_cost(64)
    assert square.flops == hardware.matmul_flops(64)
    assert square.intensity == pytest.approx(64 / 6)
    rect = roofline.matmul_cost(8, 3, 4)
    assert (rect.flops, rect.bytes) == (2 * 8 * 3 * 4, (8 * 4 + 4 * 3 + 8 * 3) * 4)


def test_counter_sees_every_operation_of_eager_gelu():
    v = torch.randn(100)
    with roofline.TrafficCounter() as counter:
        gelu_by_hand(v)
    assert [op["op"] for op in counter.ops] == ["mul", "pow", "mul", "add", "mul", "tanh", "add", "mul"]
    eager = roofline.eager_cost(gelu_by_hand, v)
    assert eager.flops == 8 * 100
    assert eager.bytes == 72 * 100  # six unary ops move 8 bytes per element, two binary ones 12
    fused = roofline.fused_cost(gelu_by_hand, v)
    assert fused.flops == eager.flops and fused.bytes == 8 * 100
    assert eager.bytes / fused.bytes == 9


def test_counter_counts_matmuls_views_copies_and_in_place_ops():
    a, b = torch.randn(8, 4), torch.randn(4, 3)
    assert roofline.eager_cost(lambda: a @ b) == roofline.Cost(
        2 * 8 * 4 * 3, (32 + 12 + 24) * 4, roofline.eager_cost(lambda: a @ b).how)
    view = roofline.eager_cost(lambda: a.t())
    assert (view.flops, view.bytes) == (0, 0)
    copy = roofline.eager_cost(lambda: a.t().contiguous())
    assert (copy.flops, copy.bytes) == (0, 2 * 32 * 4)
    c = torch.zeros(5)
    in_place = roofline.eager_cost(lambda: c.add_(1))
    assert (in_place.flops, in_place.bytes) == (5, 2 * 5 * 4)
    attributes = roofline.eager_cost(lambda: (a.shape, a.dtype))
    assert attributes.bytes == 0 and "0 operations" in attributes.how
    with pytest.raises(ValueError):
        attributes.intensity


def test_place_puts_an_operation_under_its_roof():
    cost = roofline.Cost(flops=1e9, bytes=1e9)  # intensity 1
    point = roofline.place("x", cost, seconds=0.5, peak_flops=100e9, bandwidth=10e9)
    assert point.flops_per_s == pytest.approx(2e9)
    assert point.roof == pytest.approx(10e9)
    assert point.share == pytest.approx(0.2)
    assert point.side == "memory-bound"
    assert roofline.place("y", roofline.Cost(1e12, 1e9), 20, 100e9, 10e9).side == "compute-bound"


def test_datasheet_ridges_of_h100_and_h200():
    h100, h200 = roofline.datasheet_specs(["H100 SXM", "H200 SXM"])
    assert roofline.datasheet_ridge(h100, "float32") == pytest.approx(67e12 / 3.35e12)
    assert roofline.datasheet_ridge(h100, "bfloat16") == pytest.approx(989.5 / 3.35, rel=1e-3)
    assert roofline.datasheet_ridge(h200, "bfloat16") < roofline.datasheet_ridge(h100, "bfloat16")
    table = roofline.ridge_table()
    assert list(table.index) == ["H100 SXM", "H200 SXM"]
    assert table.loc["H200 SXM", "HBM TB/s"] == pytest.approx(4.8)
    assert table["source"].str.contains("datasheet").all()
    with pytest.raises(KeyError):
        roofline.datasheet_specs(["H900"])


def test_measurements_on_the_cpu_are_positive_and_sane():
    bandwidth = roofline.measure_bandwidth("cpu", 2**16, repeat=2)
    flops = roofline.measure_matmul_flops("cpu", 64, repeat=2)
    assert 1e7 < bandwidth < 1e13
    assert 1e6 < flops < 1e13
    assert roofline.fastest(lambda: None, "cpu", repeat=3) >= 0
    rates = roofline.streaming_rates("cpu", 2**16, repeat=2)
    assert set(rates) == {"copy", "add"} and all(1e7 < r < 1e13 for r in rates.values())
    assert 1e7 < roofline.triad_bandwidth("cpu", 2**16, repeat=2) < 1e13


def test_elementwise_cost_says_how_it_counted_in_plain_words():
    assert roofline.elementwise_cost(8, inputs=2).how == (
        "2 inputs read and 1 output written once, 1 FLOP per element")
    assert "(" not in roofline.elementwise_cost(8, inputs=1, flops_per_element=3).how


def test_plot_roofline_draws_roof_points_and_curves():
    peak, bandwidth = 100e9, 10e9
    points = [roofline.place("add", roofline.elementwise_cost(100, inputs=2), 1e-7, peak, bandwidth)]
    series = [roofline.place(f"matmul n={n}", roofline.matmul_cost(n), 1e-4, peak, bandwidth)
              for n in (16, 64)]
    ax = roofline.plot_roofline(peak, bandwidth, points, curves={"products": series},
                                extra_roofs={"other": 2 * peak}, title="t")
    labels = [line.get_label() for line in ax.get_lines()]
    assert any(label.startswith("roofline") for label in labels)
    assert {"add", "products", "other"} <= set(labels)
    assert ax.get_xscale() == ax.get_yscale() == "log"
    texts = [t.get_text() for t in ax.texts]
    assert "n=16" in texts and any("ridge" in t for t in texts)
    matplotlib.pyplot.close(ax.figure)


@pytest.mark.gpu
def test_gpu_ceilings_are_below_the_datasheet():
    dev = torch.device("cuda:0")
    spec = hardware.gpu_spec(torch.cuda.get_device_name(dev))
    bandwidth = roofline.measure_bandwidth(dev, 2**26, repeat=3)
    flops = roofline.measure_matmul_flops(dev, 4096, repeat=3)
    if spec is None:
        pytest.skip("GPU not in hardware.GPU_SPECS")
    assert bandwidth < 1.05 * spec.bandwidth_gbs * 1e9
    assert flops < 1.05 * spec.tflops["float32"] * 1e12
    assert not math.isnan(roofline.ridge_point(flops, bandwidth))
