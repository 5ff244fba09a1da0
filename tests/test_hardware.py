"""dlperf.hardware: quoted numbers keep their sources, peaks are looked up or honestly unknown."""
import os

import numpy as np
import pytest
import torch

from dlperf import hardware

INTEL_AVX512 = """processor	: 0
vendor_id	: GenuineIntel
cpu family	: 6
model name	: Intel(R) Xeon(R) Platinum 8480+
cpu MHz		: 2000.000
flags		: fpu sse sse2 avx avx2 fma avx512f avx512bw
"""
AMD_ZEN4 = """vendor_id	: AuthenticAMD
cpu family	: 25
model name	: AMD EPYC
cpu MHz		: 2596.142
flags		: fpu sse2 avx avx2 fma avx512f
"""


@pytest.mark.parametrize("device_name, model", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM"),
    ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA H100 NVL", "H100 NVL"),
    ("NVIDIA H200", "H200 SXM"),
    ("NVIDIA H200 NVL", "H200 NVL"),
    ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM"),
    ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe"),
    ("NVIDIA A100-SXM4-40GB", "A100 40GB"),
    ("NVIDIA A100-PCIE-40GB", "A100 40GB"),
    ("Tesla V100-SXM2-32GB", "V100 SXM2"),
    ("Tesla V100-PCIE-16GB", "V100 PCIe"),
    ("Tesla T4", "T4"),
    ("NVIDIA L4", "L4"),
    ("NVIDIA L40S", "L40S"),
    ("NVIDIA A10", "A10"),
])
def test_known_gpus_are_recognised_by_their_cuda_names(device_name, model):
    assert hardware.gpu_spec(device_name).name == model


@pytest.mark.parametrize("device_name", ["NVIDIA GH200 480GB", "NVIDIA A10G", "NVIDIA RTX A6000",
                                         "NVIDIA GeForce RTX 4090", ""])
def test_unknown_gpus_get_no_made_up_numbers(device_name):
    assert hardware.gpu_spec(device_name) is None


def test_datasheet_peaks_are_dense_numbers():
    h100 = hardware.gpu_spec("NVIDIA H100 80GB HBM3")
    assert h100.tflops["float32"] == 67
    assert h100.tflops["bfloat16"] == pytest.approx(1979 / 2, abs=1)  # datasheet quotes 1,979 with sparsity
    assert h100.bandwidth_gbs == 3350
    h200 = hardware.gpu_spec("NVIDIA H200")
    assert h200.bandwidth_gbs == 4800 and "HBM3e" in h200.memory
    for spec in hardware.GPU_SPECS:
        assert spec.source and spec.tflops["float32"] > 0
        assert all(value >= spec.tflops["float32"] for value in spec.tflops.values())


def test_reference_numbers_cover_todays_links_and_memories_with_sources():
    table = hardware.reference_table()
    for component in ["HBM3 (H100 SXM)", "HBM3e (H200)", "NVLink 4 (H100, H200)", "PCIe 5.0 x16",
                      "PCIe 4.0 x16", "DRAM (CPU main memory)", "CPU L1 data cache"]:
        assert component in table.index
    assert all(table["source"].str.len() > 10)
    by_name = {r.component: r for r in hardware.REFERENCE}
    assert by_name["NVLink 4 (H100, H200)"].bandwidth_gbs == 900
    assert by_name["PCIe 5.0 x16"].bandwidth_gbs == pytest.approx(2 * by_name["PCIe 4.0 x16"].bandwidth_gbs)
    assert by_name["CPU L1 data cache"].latency_ns < by_name["DRAM (CPU main memory)"].latency_ns
    assert list(hardware.reference_table("network").index) == ["InfiniBand NDR, one port",
                                                               "Ethernet, 100 Gb/s"]


def test_flop_per_cycle_follows_the_instruction_set():
    assert hardware.fp32_flop_per_cycle({"avx512f", "avx2", "fma"}, "GenuineIntel", 6)[0] == 64
    assert hardware.fp32_flop_per_cycle({"avx512f", "avx2", "fma"}, "AuthenticAMD", 25)[0] == 32
    assert hardware.fp32_flop_per_cycle({"avx", "avx2", "fma"})[0] == 32
    assert hardware.fp32_flop_per_cycle({"avx", "sse2"})[0] == 16
    assert hardware.fp32_flop_per_cycle({"sse2"})[0] == 8
    assert hardware.fp32_flop_per_cycle({"neon"})[0] == 0


def test_cpu_estimate_multiplies_cores_clock_and_flop_per_cycle():
    intel = hardware.cpu_peak_estimate(INTEL_AVX512, cores=4)
    assert intel.gflops == pytest.approx(4 * 2.0 * 64)
    amd = hardware.cpu_peak_estimate(AMD_ZEN4, cores=1)
    assert amd.gflops == pytest.approx(2.596142 * 32)
    assert "derived peak" in amd.describe() and "x 1 core;" in amd.describe()
    factors = dict((name, value) for name, value, _ in intel.derivation())
    assert factors["float32 lanes per vector"] == "16" and factors["vector FMA units per core"] == "2 units"
    assert factors["peak"] == "512.0 GFLOP/s"
    # A measured rate above the peak says which clock it needs at the derived FLOP per cycle.
    assert intel.implied_ghz(1.25 * intel.gflops) == pytest.approx(1.25 * 2.0)
    assert not intel.clock_is_max


def test_cpu_estimate_is_none_when_the_cpu_does_not_say():
    assert hardware.cpu_peak_estimate("processor : 0\nBogoMIPS : 50.00\n", cores=2) is None
    assert hardware.cpu_peak_estimate("cpu MHz : 1000\nflags : neon\n", cores=2) is None


def test_peak_on_the_cpu_is_an_estimate_or_unknown_never_a_datasheet():
    peak = hardware.peak_flops("cpu", torch.float32)
    assert peak.kind in {"derived", "unknown"}
    assert (peak.tflops is None) == (peak.kind == "unknown")
    assert peak.explanation
    other = hardware.peak_flops("cpu", torch.bfloat16)
    assert other.tflops is None and other.kind == "unknown"


def test_cache_sizes_are_read_from_sysfs(tmp_path):
    for index, (level, kind, size) in enumerate([("1", "Data", "48K"), ("1", "Instruction", "32K"),
                                                 ("2", "Unified", "2048K"), ("3", "Unified", "96M")]):
        folder = tmp_path / f"index{index}"
        folder.mkdir()
        (folder / "level").write_text(level + "\n")
        (folder / "type").write_text(kind + "\n")
        (folder / "size").write_text(size + "\n")
    assert hardware.cache_sizes("cpu", sysfs=tmp_path) == {
        "L1d": 48 * 2**10, "L2": 2 * 2**20, "L3": 96 * 2**20}
    assert hardware.cache_sizes("cpu", sysfs=tmp_path / "missing") == {}


def test_parse_size_rejects_nonsense():
    assert hardware._parse_size("32K") == 32 * 2**10
    assert hardware._parse_size("1 MiB") == 2**20
    with pytest.raises(ValueError):
        hardware._parse_size("lots")


def test_matmul_flops_counts_a_multiply_and_an_add_per_term():
    assert hardware.matmul_flops(2) == 16
    assert hardware.matmul_flops(2, 3, 4) == 2 * 2 * 3 * 4


@pytest.mark.gpu
def test_gpu_peak_and_l2_are_reported_for_the_real_device():
    device = torch.device("cuda:0")
    assert hardware.cache_sizes(device)["L2"] > 0
    peak = hardware.peak_flops(device, torch.float32)
    assert peak.kind in {"datasheet", "unknown"}
    if peak.kind == "datasheet":
        assert peak.tflops > 0
    else:
        assert torch.cuda.get_device_name(device) in peak.explanation


def test_quoted_finds_a_component_by_name_and_names_the_known_ones():
    from dlperf.hardware import quoted
    assert quoted("PCIe 4.0 x16").bandwidth_gbs == pytest.approx(31.5)
    with pytest.raises(KeyError, match="PCIe 5.0 x16"):
        quoted("PCIe 9.0 x16")


def test_cpu_estimate_uses_the_highest_listed_clock_when_cpufreq_has_one(tmp_path):
    (tmp_path / "cpuinfo_max_freq").write_text("3500000\n")  # kHz
    listed = hardware.cpu_peak_estimate(AMD_ZEN4, cores=2, cpufreq=tmp_path)
    assert listed.gflops == pytest.approx(2 * 3.5 * 32)
    assert "highest clock" in listed.describe()
    assert hardware.max_clock_ghz(tmp_path / "missing") is None
    nominal = hardware.cpu_peak_estimate(AMD_ZEN4, cores=2, cpufreq=tmp_path / "missing")
    assert nominal.ghz == pytest.approx(2.596142)
    assert "derived peak" in nominal.describe() and "turbo" in nominal.describe()
    assert listed.clock_is_max and not nominal.clock_is_max


def test_vector_units_multiply_to_the_flop_per_cycle():
    intel = hardware.fp32_vector_units({"avx512f", "avx2", "fma"}, "GenuineIntel", 6)
    assert (intel.lanes, intel.units, intel.flop_per_cycle) == (16, 2, 64)
    zen4 = hardware.fp32_vector_units({"avx512f", "avx2", "fma"}, "AuthenticAMD", 25)
    assert (zen4.lanes, zen4.units) == (16, 1)
    assert hardware.fp32_vector_units({"neon"}) is None


def test_physical_cores_count_hyperthreads_once(tmp_path):
    for cpu, core in [(0, 0), (1, 1), (2, 0), (3, 1)]:  # two cores, two threads each
        folder = tmp_path / f"cpu{cpu}" / "topology"
        folder.mkdir(parents=True)
        (folder / "physical_package_id").write_text("0\n")
        (folder / "core_id").write_text(f"{core}\n")
    assert hardware.physical_cores_available(tmp_path, cpus={0, 1, 2, 3}) == 2
    assert hardware.physical_cores_available(tmp_path, cpus={0}) == 1
    assert hardware.physical_cores_available(tmp_path / "none", cpus={0, 1, 2}) == 3
    assert 1 <= hardware.physical_cores_available() <= (os.cpu_count() or 1)


def test_memory_bytes_of_the_host_is_positive_or_unknown():
    memory = hardware.memory_bytes("cpu")
    assert memory is None or memory > 2**20


def test_largest_drop_and_the_cache_nearest_to_it():
    sizes = [2**k for k in range(10, 16)]
    rates = [100, 100, 90, 30, 28, 27]
    assert hardware.largest_drop(sizes, rates) == (2, pytest.approx(3.0))
    assert hardware.largest_drop([1, 2], [1, 2])[1] == pytest.approx(0.5)  # never falls
    with pytest.raises(ValueError):
        hardware.largest_drop([1], [1.0])
    caches = {"L1d": 2**11, "L2": 2**20}
    assert hardware.nearest_cache(2**12, 2**13, caches) == ("L1d", 2**11, 2.0)
    assert hardware.nearest_cache(2**11, 2**12, caches) == ("L1d", 2**11, 1.0)
    assert hardware.nearest_cache(2**18, 2**19, caches) == ("L2", 2**20, 2.0)
    assert hardware.nearest_cache(2**12, 2**13, {}) is None


def test_a_pointer_chain_is_one_random_cycle_through_every_element():
    chain = hardware.pointer_chain(8 * 1000, seed=3)
    assert len(chain) == 1000
    seen, i = set(), 0
    for _ in range(1000):
        seen.add(i)
        i = int(chain[i])
    assert i == 0 and len(seen) == 1000  # back at the start after visiting all
    assert (chain != (np.arange(1000) + 1) % 1000).any()  # not the sequential order
    assert hardware.chase_ns(chain, 1000, repeat=2) > 0
