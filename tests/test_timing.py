import pytest

import dlperf.timing as timing
from dlperf.timing import Benchmark, compare, time_it, timing_table


class FakeClock:
    def __init__(self, *readings):
        self.readings = list(readings)

    def __call__(self):
        return self.readings.pop(0)


def test_benchmark_prints_description_and_seconds(capsys):
    with Benchmark("matmul", clock=FakeClock(10.0, 10.25)) as bench:
        pass
    assert bench.elapsed == pytest.approx(0.25)
    assert capsys.readouterr().out == "matmul: 0.2500 sec\n"


def test_benchmark_default_description(capsys):
    with Benchmark(clock=FakeClock(0.0, 1.0)):
        pass
    assert capsys.readouterr().out.startswith("Done: 1.0000 sec")


def test_benchmark_lets_exceptions_through_and_still_measures(capsys):
    bench = Benchmark(clock=FakeClock(0.0, 2.0))
    with pytest.raises(KeyError):
        with bench:
            raise KeyError("inside")
    assert bench.elapsed == pytest.approx(2.0)


def test_benchmark_waits_for_the_device_before_reading_the_clock(monkeypatch):
    events = []
    monkeypatch.setattr(timing, "synchronize", lambda device=None: events.append("sync"))
    clock = lambda: events.append("clock") or 0.0  # noqa: E731
    with Benchmark(clock=clock):
        events.append("work")
    assert events == ["sync", "clock", "work", "sync", "clock"]


def test_time_it_warms_up_then_times_each_repeat():
    calls = []
    times = time_it(lambda: calls.append(1), repeat=4, warmup=2)
    assert len(calls) == 6 and len(times) == 4
    assert all(t >= 0 for t in times)
    with pytest.raises(ValueError):
        time_it(lambda: None, repeat=0)


def test_timing_table_reports_medians_and_speedup_against_the_first():
    table = timing_table({"slow": [0.004, 0.002, 0.003], "fast": [0.001, 0.0015, 0.001]})
    assert list(table.index) == ["slow", "fast"]
    assert table.loc["slow", "median (ms)"] == pytest.approx(3.0)
    assert table.loc["fast", "median (ms)"] == pytest.approx(1.0)
    assert table.loc["fast", "speedup"] == pytest.approx(3.0)
    assert table.loc["slow", "runs"] == 3


def test_compare_times_every_candidate():
    table = compare({"a": lambda: sum(range(100)), "b": lambda: None}, repeat=2, warmup=0)
    assert list(table.index) == ["a", "b"] and (table["runs"] == 2).all()
    with pytest.raises(ValueError):
        compare({})


def test_timing_table_also_compares_the_fastest_runs():
    table = timing_table({"slow": [0.004, 0.002, 0.003], "fast": [0.001, 0.0015, 0.001]})
    assert table.loc["fast", "speedup (fastest runs)"] == pytest.approx(2.0)
    assert table.loc["slow", "speedup (fastest runs)"] == pytest.approx(1.0)


def test_compare_interleaves_the_candidates_round_by_round():
    calls = []
    compare({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, repeat=3, warmup=1)
    assert calls == ["a", "b"] + ["a", "b"] * 3


def test_a_cold_l2_is_a_gpu_matter_only():
    # On a CPU flush_l2 queues nothing and keeps no buffer, and time_it calls fn as often
    # with cold_l2 as without: warm-ups, then one call per repeat.
    timing.flush_l2("cpu")
    assert timing._L2_FLUSH == {}
    for cold in (True, False):
        calls = []
        times = time_it(lambda: calls.append(1), repeat=3, warmup=2, device="cpu", cold_l2=cold)
        assert len(calls) == 5 and len(times) == 3 and all(t >= 0 for t in times)


@pytest.mark.gpu
def test_on_a_gpu_the_l2_is_overwritten_and_events_leave_out_the_launch():
    import statistics

    import torch

    dev = torch.device("cuda")
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size
    timing.flush_l2(dev)
    assert timing._L2_FLUSH[torch.device("cuda", torch.cuda.current_device())].numel() >= 2 * l2
    # Half the L2 read again: from the L2 when warm, from memory when cold.
    half = torch.ones(l2 // 8, device=dev)  # float32: l2 / 2 bytes
    cold = statistics.median(time_it(half.sum, repeat=50, device=dev))
    warm = statistics.median(time_it(half.sum, repeat=50, device=dev, cold_l2=False))
    assert cold > warm, (cold, warm)
    # A tiny kernel: the host's clock around launch and synchronize against the GPU's events.
    small = torch.ones(1024, device=dev)
    events = statistics.median(time_it(small.sum, repeat=50, device=dev))
    host = statistics.median(time_it(small.sum, repeat=50, device=None))
    assert events < host, (events, host)
