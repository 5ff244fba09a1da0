"""Every sentence that says how a measured comparison came out agrees with its number.

Each chapter glues the number it measured and the words its sentence uses to judge it,
computed from the number with a threshold stated in the chapter's code. Here each
judgement is made again, from the glued number, by the rule the page states, and the
rendered page must say what the rule says. A page that drew its verdict from another
number (a median where it quotes a fastest run), or wrote it into the prose, fails.
"""
from __future__ import annotations

import ast
import html as html_lib
import math
import re
from pathlib import Path

import pytest

from tests.helpers import glued

pytestmark = pytest.mark.integration


def value(text: str):
    """A glued value, from its text/plain form."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return float(text) if text in ("nan", "inf", "-inf") else text


def _gelu(v):
    s = v["gelu_speedup"]
    return "faster" if s >= 1.10 else ("slower" if s <= 1 / 1.10
                                       else "about as fast as eager code, within 10%")


def _names(ops):
    return " and ".join([", ".join(ops[:-1]), ops[-1]] if len(ops) > 1 else ops)


def _decomp(v):
    """hybridize: what run_decompositions() did to the exported graph, from the operators the
    page found in each graph (and which of them carry torch.Tag.core)."""
    if not v["exported_noncore"]:
        return "had nothing to replace: the exported graph called only Core ATen operators"
    if v["decomposed_noncore"]:
        return f"left {_names(v['decomposed_noncore'])} in the graph, outside Core ATen"
    replaced = [op for op in v["exported_noncore"] if op not in v["decomposed_ops"]]
    added = [op for op in v["decomposed_ops"] if op not in v["exported_ops"]]
    return (f"replaced {_names(replaced)} with {_names(added)}, "
            "so the new graph calls only Core ATen operators")


def _logging(v):
    """async-computation: the .item() loop over the accumulating loop, fastest runs, against
    how far the accumulating loop and its control, the same loop timed again, lay apart in
    their fastest runs or their medians, whichever is wider."""
    r = v["logging_ratio"]
    band = max(v["logging_spread_pct"], v.get("logging_median_spread_pct", 0.0)) / 100
    if 1 / (1 + band) <= r <= 1 + band:
        return (f"took about the same time, within the {100 * band:.1f}% by which the "
                "accumulating loop and its control differed in their fastest or their "
                "median runs")
    return (f"differed by more than the {100 * band:.1f}% by which the accumulating loop "
            "and its control differed in their fastest or their median runs: the version "
            "that calls .item() every step was " + ("slower" if r > 1 else "faster"))


def _blockers(v):
    """async-computation: a blocker's cost shows where its loop's step exceeds the fastest
    control's by more than the controls (loops doing the same work) differ from each other."""
    above = [v[k] - v["plain_step_us"] > v["noise_step_us"]
             for k in ("item_loop_step_us", "numpy_loop_step_us")]
    if all(above):
        return "both cost more per step than that noise"
    if any(above):
        return "only one of the two cost more per step than that noise"
    return ("neither cost more per step than that noise, so on this run the "
            "table cannot tell their cost from run-to-run variation")


def _call_gap(excess, noise):
    """async-computation: a loop's extra time per step against one .item() timed alone plus the
    noise of loops doing the same work (its controls)."""
    def rule(v):
        alone, extra, spread = v["item_alone_us"], v[excess], v[noise]
        if extra <= alone + spread:
            return (f"no more than the call's own {alone:.1f} µs plus the {spread:.1f} µs by "
                    "which loops doing the same work differed")
        on_gpu = not v["logging_device"].startswith("CPU")
        why = ("on a GPU it also waits for the work queued before it" if on_gpu
               else "inside the loop the call cost more than when it is repeated on its own, "
               "and this run does not show why")
        return (f"more than the call's own {alone:.1f} µs plus the {spread:.1f} µs by which "
                f"loops doing the same work differed: {why}")
    return rule


def _speedup_against_ideal(v):
    """multiple-gpus-concise: the speedup of N processes over one, fastest epochs after the
    first, against 1 and against the ideal N, with a margin of 10% or, when wider, the spread
    of the epoch times (slowest over fastest after the first, the larger of the two runs')."""
    band = max(0.10, v["ddp_spread_pct"] / 100)
    assert v["ddp_band_pct"] == pytest.approx(100 * band)
    s, ideal, margin = v["ddp_speedup"], v["ddp_nproc"], f"the {100 * band:.0f}% margin"
    near_ideal = ideal / (1 + band) <= s <= ideal * (1 + band)
    near_one = 1 / (1 + band) < s < 1 + band
    if s > ideal * (1 + band):
        return (f"more than the ideal of {ideal} by over {margin}: the one-process run lost "
                "time to something the processes did not share, such as other programs on "
                "the machine")
    if near_ideal and near_one:
        return (f"within {margin} of both 1 and the ideal of {ideal}, so the epoch times "
                "varied too much to tell how much the processes gained")
    if near_ideal:
        return f"close to the ideal of {ideal}, within {margin}"
    if s >= 1 + band:
        return f"a gain, short of the ideal of {ideal} by more than {margin}"
    if near_one:
        return f"no gain beyond {margin}"
    return f"a loss beyond {margin}: the processes together were slower than one"


def _time_ratio(v):
    """multiple-gpus: two devices' fastest epoch over one's, against 1 and against the ideal,
    0.5 on two real devices and 1 on virtual ones, with a margin of 10% or, when wider, the
    spread of the epoch times after the first (slowest over fastest, the larger of the runs')."""
    band = max(0.10, v["time_spread_pct"] / 100)
    assert v["time_band_pct"] == pytest.approx(100 * band)
    r, margin = v["time_ratio"], f"the {100 * band:.0f}% margin"
    if band > 0.25:
        return (f"too uncertain to judge: within one run the epoch times after the first "
                f"varied by up to {v['time_spread_pct']:.0f}%, more than 25%, so the two "
                "runs' times cannot be compared")
    if v["virtual_devices"]:
        if r < 1 / (1 + band):
            return (f"shorter than on one device by more than {margin}, which shared hardware "
                    "cannot owe to a second device: the half-size shards suited the caches "
                    "better, or other programs slowed the one-device run")
        if r <= 1 + band:
            return (f"about the same as on one device, within {margin}, which is the best two "
                    "virtual devices can do")
        return (f"longer than on one device by more than {margin}: the copies, the allreduce "
                "and the half-size shards cost time on top of the same arithmetic")
    if r < 0.5 / (1 + band):
        return (f"below the ideal of 0.5 by more than {margin}: the one-device run lost time "
                "to something the two devices did not share, such as other programs on the "
                "machine")
    # within 25%, no ratio lies near both 1 and 0.5: that takes a margin above 41%
    near_ideal, near_one = r <= 0.5 * (1 + band), 1 / (1 + band) < r < 1 + band
    if near_ideal:
        return f"close to the ideal of 0.5, within {margin}"
    if r <= 1 / (1 + band):
        return f"shorter than on one device, but longer than the ideal of 0.5 by more than {margin}"
    if near_one:
        return (f"no shorter than on one device beyond {margin}: the second device gained "
                "nothing measurable")
    return (f"longer than on one device by more than {margin}: the copies, the allreduce and "
            "launching kernels for two devices cost more than the second device saved")


def _inf_decode(v):
    """inference: a decode step against one read of the weights at the streaming bandwidth."""
    r = v["decode_vs_weights"]
    if 0.75 <= r <= 1.25:
        return ("within 25% of the time it takes to read the weights once: the step was "
                "memory-bound, as the count predicts")
    if r > 1.25:
        return ("more than 25% longer than reading the weights once: the step read them "
                "below the streaming rate, or paid for work the count leaves out, such as "
                "each operation's fixed cost, attention over the cache and the norms")
    return ("more than 25% shorter than reading the weights once: part of them came from a "
            "cache, or the streaming kernels fell short of what the memory can deliver")


def _inf_batch(v):
    """inference: tokens per second at the largest batch, against a step of unchanged length."""
    if v["throughput_gain"] / v["largest_batch"] >= 0.5:
        return ("at least half of the gain a step of unchanged length would give: reading the "
                "weights still dominated the step")
    return ("under half of the gain a step of unchanged length would give: by then the "
            "arithmetic and the attention over the caches had taken over")


def _inf_int8(v):
    s = v["int8_speedup"]
    if s >= 1.1:
        return "made the decode step faster"
    if s > 1 / 1.1:
        return "left the decode step's time within 10% of float32's"
    return "made the decode step slower"


def _pl_small_step(v):
    """parallel-layout: the measured DP step against the planner's bound and the sum of
    the step and the allreduce."""
    measured = v["small_measured_ms"]
    if measured < v["small_overlapped_ms"]:
        return ("shorter than the planner's estimate, which this bound should never "
                "allow: one of the rates it was given was measured too low")
    if measured < v["small_in_turn_ms"] * 0.95:
        return ("between the planner's estimate and the sum of the step and the "
                "allreduce: the processes hid part of the allreduce, not all of it")
    if measured <= v["small_in_turn_ms"] * 1.05:
        return ("within 5% of the sum of the step and the allreduce: the processes hid "
                "next to none of the allreduce")
    return ("longer than even the step and the allreduce one after the other: "
            "data parallelism cost more than the traffic the planner counts")


def _pl_published_rank(v):
    rank = v["published_rank"]
    if rank == 0:
        return "not among the layouts that fit"
    if rank == 1:
        return "the planner's first choice"
    return (f"number {rank:,} of the {v['plan_146b_fits']:,} that fit, with an estimated "
            f"step {v['published_longer_pct']:.0f}% longer than the first one's")


def _lanes(v):
    speedup, share = v["lane_speedup"], 100 * v["lane_speedup"] / v["lane_ideal"]
    assert share == pytest.approx(v["lane_share"])
    if share > 105:
        return ("more than perfect overlap of the fastest sequential run allows, so the lanes' "
                "own speed varied from run to run")
    if share > 100:
        return "the lanes overlapped almost perfectly (above the ideal, within noise)"
    if share >= 90:
        return "the lanes overlapped almost perfectly"
    if speedup > 1:
        return "the lanes overlapped only in part"
    return "running the lanes together gained nothing over running them in turn"


def _threads(v):
    """auto-parallelism: on a CPU, running the workers together against one lane at a time
    with all of PyTorch's threads (intra-op parallelism), fastest runs."""
    if v["setup"] != "two CPU workers":
        return "this run had a GPU, so its table has no such row"
    r = v["threads_ratio"]
    how = ("more than the workers' number of cores can explain, so the all-threads row was "
           "held up, its threads waiting for a busy core" if r > 1.1 * v["threads_lanes"] else
           "the two workers were faster, by 10% or more" if r >= 1.1 else
           "one lane at a time with all threads was faster, by 10% or more" if r <= 1 / 1.1 else
           "the two took about the same time, within 10%")
    return f"on this run, running the lanes together was {r:.2f} times as fast as that row: {how}"


def _pipeline_bound(n, compute, copy_in_turn, copy_overlapped):
    """auto-parallelism: two stages over n chunks, in turn against the best pipeline."""
    return n * (compute + copy_in_turn) / (compute + copy_overlapped
                                           + (n - 1) * max(compute, copy_overlapped))


def _pipeline(v):
    """auto-parallelism: the measured overlap factor against the bound for the page's chunks and
    stage times (not against 2, the limit for endlessly many chunks)."""
    bound = _pipeline_bound(v["n_chunks"], v["compute_ms"], v["copy_in_turn_ms"],
                            v["copy_overlapped_ms"])
    s = v["overlap_speedup"]
    if "pipeline_share" in v:
        assert v["pipeline_share"] == pytest.approx(100 * s / bound)
    if s > 1.05 * bound:
        return ("more than the bound, so the stage times measured one by one did not "
                "predict the runs: the version that works in turn lost time between its "
                "stages, or the stages ran faster inside the runs")
    if s >= 0.9 * bound:
        return "close to the bound"
    if s > 1:
        return "a gain, but well short of the bound"
    return ("no gain at all, since overlapping was not faster than computing and copying "
            "in turn")


def _peak(v):
    """hardware: the best float32 rate against its peak; above a derived peak, the page says
    which assumption of the derivation failed (for a clock /proc/cpuinfo reports, the clock)."""
    share, basis = v["peak_share"], v["peak_basis"]
    if basis == "none":
        return "cannot be compared with a peak, because none is known for this device"
    if share <= 100:
        return ("came within 30% of the float32 peak above" if share >= 70
                else "stayed more than 30% below the float32 peak above")
    if basis == "datasheet":
        return ("exceeded the datasheet peak above, which plain float32 arithmetic cannot do: "
                "the product did not run in plain float32, or the datasheet entry does not "
                "describe this GPU")
    if basis == "reported clock":
        return (f"exceeded the derived peak above, so the derivation's clock was too low: at "
                f"{v['flop_per_cycle']:.0f} FLOP per cycle that rate needs {v['implied_ghz']:.2f} "
                f"GHz or more, above the {v['peak_ghz']:.2f} GHz that /proc/cpuinfo reports, so "
                f"the core ran faster than that clock, as a core does while it boosts")
    return (f"exceeded the derived peak above, so one of the derivation's assumptions failed: at "
            f"the highest listed clock of {v['peak_ghz']:.2f} GHz that rate needs more than the "
            f"{v['flop_per_cycle']:.0f} FLOP per cycle assumed")


def _drop_prefix(v):
    """The start of the sentence on the largest fall (the rest names the cache)."""
    if math.isnan(v["drop_cache_factor"]):
        return "the system reported no cache sizes to compare it with"
    if v["largest_drop"] < 1.1:
        return "too small a change to tie to any cache"
    return ("at or near the " if v["drop_cache_factor"] <= 2
            else "far from every cache size the system reports")


def _pm_roof(key):
    """performance-model: within 25% of its roof either way a point is at it, under half of it
    far below it; the roof's resource is memory left of the ridge, arithmetic right of it."""
    def rule(v):
        share = v[f"{key}_share"]
        limit = ("memory bandwidth" if v[f"{key}_point_intensity"] < v["ridge"]
                 else "the arithmetic peak")
        if share > 125:
            return ("more than 25% above its roof, more than noise explains: it moved fewer bytes "
                    "than counted, or the ceilings fall short of what this machine can do")
        if share >= 75:
            return f"at its roof, within 25% either way, so {limit} is what limits it"
        if share >= 50:
            return (f"below its roof but above half of it, so {limit} limits it together with "
                    "costs the model leaves out")
        return f"far below its roof, under half of it, so {limit} is not what holds it back"
    return rule


def _pm_side(intensity):
    """performance-model: the side of the page's one measured ridge point (triad bandwidth,
    large product) that a counted intensity lies on."""
    return lambda v: ("left of the ridge, under the memory roof" if v[intensity] < v["ridge"]
                      else "right of the ridge, under the compute roof")


def _pm_tanh_test(v):
    """performance-model: the tanh against the addition, both on the memory roof."""
    if v["add_share"] < 75:
        return ("even the addition stayed more than 25% below its roof on this run, so the "
                "comparison cannot tell the tanh's arithmetic from other costs")
    if v["tanh_share"] < 50:
        return ("the addition streamed at its roof while the tanh, which moves no more bytes per "
                "element, stayed under half of its roof: on this run something other than "
                "memory, most likely the tanh's arithmetic, set its speed")
    return ("the tanh reached at least half of its roof, close enough to the addition that on "
            "this run its arithmetic kept up with memory")


def _pm_gelu_fresh(v):
    """performance-model: the compiled GELU with a new result against the same kernel writing
    into c (the same cost, so the shares of the roof are inverse times)."""
    fresh = 1 - v["gelu_compiled_share"] / v["gelu_into_share"]
    assert 100 * fresh == pytest.approx(v["gelu_fresh_share"])
    if fresh >= 0.5:
        return ("the new result took more than half of the compiled GELU's time: what held it "
                "back most was the memory it asks for at every call, not its arithmetic")
    if fresh >= 0.1:
        return ("the new result took a tenth to a half of the compiled GELU's time, and the "
                "kernel itself the rest")
    return "the new result cost it less than a tenth of its time on this run"


def _pm_gelu_tanh(v):
    """performance-model: the compiled GELU into c against the eager tanh into c; both move 8
    bytes per element, so the ratio of their shares of the roof is the ratio of their times;
    within 10% either way is the same time."""
    ratio = v["tanh_share"] / v["gelu_into_share"]
    if 1 / 1.1 <= ratio <= 1.1:
        at_roof = min(v["tanh_share"], v["gelu_into_share"]) >= 75
        return (f"the compiled GELU writing into c took {ratio:.2f} times as long as the eager "
                "tanh alone, which moves the same bytes, within 10% of it: "
                + (f"both ran at the memory roof, and the compiled kernel's {v['gelu_ops'] - 1} "
                   "further operations per element were hidden behind the memory traffic"
                   if at_roof else "as at least one of them stayed below its memory roof, "
                   "the two times do not say what the arithmetic costs"))
    if ratio < 1:
        return (f"the compiled GELU writing into c, a tanh and {v['gelu_ops'] - 1} more "
                "operations per element, took less time than the eager tanh alone, which moves "
                "the same bytes: the compiled kernel's tanh is the cheaper one, and the eager "
                "tanh's cost says little about it")
    return ("the compiled GELU writing into c took more than 10% longer than the eager tanh "
            "alone, which moves the same bytes: arithmetic is part of its cost")


def _pm_matmul_roof(v):
    """performance-model: the fastest product against the compute ceiling set by a larger
    one; within 3% above it is noise."""
    top = v["matmul_max_share"]
    if top <= 103:
        return f"at or below their roof, within 3%: the fastest reached {top:.0f}% of it"
    if top <= 125:
        return (f"above their roof by at most 25%: the fastest reached {top:.0f}% of it, so "
                "a product smaller than the one that set the ceiling ran at a higher rate, "
                "and the measured ceiling falls a little short of what this machine can do")
    return "not all under the roofline: at least one is more than 25% above it"


def _pm_product_side(intensity):
    """performance-model: products are placed by intensity only; whether memory binds the small
    one is said by small_cache_verdict, from where its data lives."""
    def side(v):
        if abs(v[intensity] / v["ridge"] - 1) <= 0.05:
            return "at the ridge, within 5%"
        return "left of the ridge" if v[intensity] < v["ridge"] else "right of the ridge"
    return side


def _pm_small_cache(v):
    """performance-model: the smallest product's operands and result against the smallest cache
    the system reports that holds them (NaN where none does)."""
    if v["small_cache_name"] == "none":
        return "cannot be compared with a cache, because the system reports none"
    if not math.isnan(v["small_cache_kib"]) and v["small_kib"] <= v["small_cache_kib"]:
        return (f"fit in the {v['small_cache_name']} cache the system reports, "
                f"{v['small_cache_kib']:,.0f} KiB, so they stay in that cache from call to call "
                f"and the DRAM roof does not bind it")
    return ("are larger than every cache the system reports, so they come from main memory at "
            "every call")


def _pm_ridge(v):
    r = v["ridge_ratio"]
    if math.isnan(r):
        return ("cannot be compared with a datasheet ridge point, because there is no "
                "datasheet entry for this device")
    if 0.75 <= r <= 1.25:
        return "was close to the datasheet's, within 25%"
    return ("was more than 25% below the datasheet's" if r < 0.75
            else "was more than 25% above the datasheet's")


def _pm_gelu_bound(v):
    """performance-model: the ratio of the roofs predicts fusion's gain only where both GELU
    points reach at least half of their roofs."""
    if min(v["gelu_eager_share"], v["gelu_compiled_share"]) < 50:
        return ("at least one of the two stayed under half of its roof, held back by something "
                "the roofline leaves out, so the ratio of the roofs predicts nothing for this run")
    if v["gelu_speedup"] >= 0.8 * v["gelu_roof_ratio"]:
        return ("both reached at least half of their roofs, and the gain came to at least 80% of "
                "the predicted one")
    if v["gelu_speedup"] >= 1.1:
        return ("both reached at least half of their roofs, but the gain fell short of 80% of "
                "the predicted one")
    return "both reached at least half of their roofs, yet fusion gained less than 10%"


_PM = "chapters/performance-model"
_PM_POINTS = ("add", "add_new", "tanh", "gelu_eager", "gelu_compiled", "gelu_into")


# (page, glued verdict, rule from the page's numbers, whether the verdict is a prefix)
CLAIMS = [
    # one rule for both workloads: within 10% either way is "about as fast"
    ("chapters/hybridize", "mlp_verdict", lambda v: _gelu({"gelu_speedup": v["mlp_speedup"]}),
     False),
    ("chapters/hybridize", "gelu_verdict", _gelu, False),
    ("chapters/hybridize", "decomp_verdict", _decomp, False),
    ("chapters/async-computation", "queue_verdict",
     lambda v: ("came out right, since nothing was left to wait for" if v["reported_share"] >= 90
                else "would have been far too flattering"), False),
    ("chapters/async-computation", "logging_verdict", _logging, False),
    ("chapters/async-computation", "small_blocker_verdict", _blockers, False),
    ("chapters/async-computation", "item_gap_verdict", _call_gap("item_excess_us", "noise_step_us"),
     False),
    ("chapters/async-computation", "logging_gap_verdict",
     _call_gap("logging_step_us", "logging_noise_us"), False),
    ("chapters/inference", "cache_verdict",
     lambda v: ("made generation faster" if v["cache_gain"] >= 1.1
                else "made no difference beyond 10%, at this length"
                if v["cache_gain"] > 1 / 1.1 else
                "made generation slower, which the work it saves cannot explain: the "
                "machine was busy with something else during the runs"), False),
    ("chapters/inference", "decode_verdict", _inf_decode, False),
    ("chapters/inference", "batch_verdict", _inf_batch, False),
    ("chapters/inference", "int8_verdict", _inf_int8, False),
    ("chapters/inference", "prefill_verdict",
     lambda v: ("about in proportion with the prompts prefilled at once: one prompt already "
                "kept the arithmetic units busy" if v["prefill_four_ratio"] >= 3.2 else
                "less than in proportion with the prompts prefilled at once: one prompt of "
                "this length left part of the arithmetic units idle"), False),
    ("chapters/inference", "spec_verdict",
     lambda v: ("made generation faster" if v["spec_speedup"] >= 1.1 else
                "left generation within 10% of plain decoding's time"
                if v["spec_speedup"] > 1 / 1.1 else "made generation slower"), False),
    ("chapters/parallel-layout", "megatron_bound_verdict",
     lambda v: (f"every run reached less than the bound, between "
                f"{v['megatron_low_share']:.0f}% and {v['megatron_high_share']:.0f}% of it"
                if v["megatron_high_share"] < 100 else
                "at least one run reached more than the bound, so the model misses a cost "
                "it overstates"), False),
    ("chapters/parallel-layout", "llama_bound_verdict",
     lambda v: (f"every layout reached less than the bound, between "
                f"{v['llama_low_share']:.0f}% and {v['llama_high_share']:.0f}% of it"
                if v["llama_high_share"] < 100 else
                "at least one layout reached more than the bound, so the model misses a "
                "cost it overstates"), False),
    ("chapters/parallel-layout", "llama_memory_verdict",
     lambda v: ("within the 80 GB of an H100" if v["llama_memory_max"] <= 80
                else "more than the 80 GB of an H100"), False),
    ("chapters/parallel-layout", "small_step_verdict", _pl_small_step, False),
    ("chapters/parallel-layout", "zero_balance_verdict",
     lambda v: ("within 5% of an even split" if abs(v["zero_largest_share"] - 1) <= 0.05
                else f"{v['zero_largest_share']:.2f} times an even split, because it hands "
                "out whole tensors"), False),
    ("chapters/parallel-layout", "published_rank_verdict", _pl_published_rank, False),
    ("chapters/auto-parallelism", "lane_verdict", _lanes, False),
    ("chapters/auto-parallelism", "threads_verdict", _threads, False),
    ("chapters/auto-parallelism", "pipeline_verdict", _pipeline, False),
    ("chapters/hardware", "latency_verdict",
     lambda v: ("more than twice the typical figure: a step that misses the caches here "
                "can also miss the TLB, the cache of address translations, and walk the "
                "page tables, which the typical figure leaves out"
                if v["latency_ratio"] > 2 else
                "within a factor of two of the typical figure"
                if v["latency_ratio"] >= 0.5 else
                "less than half the typical figure: part of the chain must have stayed "
                "in a cache"), False),
    ("chapters/hardware", "peak_verdict", _peak, False),
    ("chapters/hardware", "smallest_verdict",
     lambda v: "reached only" if v["smallest_share"] < 90 else "already reached", False),
    ("chapters/hardware", "drop_verdict", _drop_prefix, True),
    ("chapters/multiple-gpus", "replica_verdict",
     lambda v: ("are bit-identical" if v["replica_difference"] == 0
                else f"differ by at most {v['replica_difference']:.1e}"), False),
    ("chapters/multiple-gpus", "growth_verdict",
     lambda v: ("had grown to" if v["final_difference"] > v["step_difference"] else "was still"),
     False),
    ("chapters/multiple-gpus", "time_ratio_verdict", _time_ratio, False),
    ("chapters/multiple-gpus-concise", "ddp_checksum_verdict",
     lambda v: ("one and the same checksum, so they hold the very same model, bit for bit"
                if v["ddp_distinct"] == 1
                else f"{v['ddp_distinct']} different checksums, so their weights differ"), False),
    ("chapters/multiple-gpus-concise", "ddp_speedup_verdict", _speedup_against_ideal, False),
    ("chapters/performance-model", "ridge_verdict", _pm_ridge, False),
    *[(_PM, f"{key}_roof_verdict", _pm_roof(key), False) for key in _PM_POINTS],
    *[(_PM, f"{key}_side_verdict", _pm_side(f"{key}_point_intensity"), False)
      for key in _PM_POINTS],
    (_PM, "matmul_roof_verdict", _pm_matmul_roof, False),
    (_PM, "tanh_test_verdict", _pm_tanh_test, False),
    (_PM, "gelu_fresh_verdict", _pm_gelu_fresh, False),
    (_PM, "gelu_tanh_verdict", _pm_gelu_tanh, False),
    (_PM, "small_side_verdict", _pm_product_side("small_intensity"), False),
    (_PM, "small_roof_verdict",
     lambda v: ("left of the ridge, so the roofline judges it by the memory roof, as if its "
                "operands came from DRAM at the triad's rate" if v["small_intensity"] < v["ridge"]
                else "right of the ridge, where its roof is the compute peak and the triad's "
                "bandwidth plays no part"), False),
    (_PM, "small_share_verdict",
     lambda v: ("far below it, under half: what holds a product this small back is the fixed "
                "cost of each call, not its arithmetic" if v["small_share"] < 50 else
                "at least half of it, so the fixed cost of each call did not dominate it on this "
                "run"), False),
    (_PM, "large_side_verdict", _pm_product_side("large_intensity"), False),
    (_PM, "small_cache_verdict", _pm_small_cache, False),
    (_PM, "gelu_bound_verdict", _pm_gelu_bound, False),
    (_PM, "timer_verdict",
     lambda v: "agree within 20%" if abs(v["timer_ratio"] - 1) <= 0.20 else "differ by more than 20%",
     False),
]


def _prof_step(v):
    """profiling: compiled against eager training step, fastest runs, 10% either way."""
    s = v["step_speedup"]
    if abs(s - 1) <= 0.10:
        return "about as fast as the eager step, within 10%"
    return "faster than the eager step" if s > 1 else "slower than the eager step"


def _prof_products(v):
    found, eager = v["compiled_products"], v["eager_products"]
    if found and found == eager:
        return f"still calls {' and '.join(found)}, like the eager step"
    said = "calls " + " and ".join(found) if found else "calls neither aten::mm nor aten::addmm"
    return said + ", where the eager step calls " + (" and ".join(eager) or "neither of them")


_PROF = "chapters/profiling"
CLAIMS += [
    (_PROF, "step_verdict", _prof_step, False),
    (_PROF, "fewer_ops_verdict",
     lambda v: "fewer" if v["compiled_aten_calls"] < v["eager_aten_calls"] else "no fewer", False),
    (_PROF, "fused_verdict",
     lambda v: ("none of them is called" if v["fused_still_called"] == 0
                else f"{v['fused_still_called']} of the 4 are still called"), False),
    (_PROF, "products_verdict", _prof_products, False),
    (_PROF, "self_check_verdict", lambda v: "agree" if v["self_gap_pct"] <= 1.0 else "disagree", False),
    (_PROF, "overhead_verdict",
     lambda v: ("more than 10% slower under the profiler" if v["eager_overhead"] > 1.10
                else "within 10% of its unprofiled time"), False),
    (_PROF, "sync_verdict",
     lambda v: "found none" if v["sync_calls_total"] == 0 else f"found {v['sync_calls_total']}",
     False),
]

def _mp_time(ratio_name, faster, slower, same, inverse=False):
    """memory-precision: a time ratio against 10% either way (speedup, or time ratio if inverse)."""
    def rule(v):
        r = v[ratio_name]
        speedup = 1 / r if inverse else r
        if speedup >= 1.10:
            return faster
        if speedup <= 1 / 1.10:
            return slower
        return same
    return rule


_MP = "chapters/memory-precision"


def _mp_peak(ratio):
    """memory-precision: the device peak of a step against the counted activations and gradients,
    2% either way; a CPU run has no peak (NaN)."""
    if math.isnan(ratio):
        return "this run had no GPU, so there is no peak to weigh them against"
    if ratio > 1.02:
        return "on this run the peak lay above the count"
    if ratio < 0.98:
        return "on this run the peak lay below the count"
    return "on this run the peak came within 2% of the count"


CLAIMS += [
    (_MP, "act_states_verdict", lambda v: "more than" if v["act_share"] > 1 else "less than", False),
    (_MP, "states_verdict",
     lambda v: ("the same" if v["states_gap"] <= 0.01 * v["fp32_bytes_per_param"]
                else "a different"), False),
    (_MP, "autocast_verdict",
     _mp_time("autocast_speedup", "faster than float32", "slower than float32",
              "about as fast as float32, within 10%"), False),
    (_MP, "autocast_act_verdict",
     lambda v: ("fewer bytes under autocast" if v["act_ratio"] < 1
                else "no fewer bytes under autocast"), False),
    (_MP, "autocast_case_verdict",
     lambda v: ("ran on a GPU, the first case" if v["on_gpu"] else
                f"ran on a CPU that lists bfloat16 instructions, {' and '.join(v['bf16_flags'])}"
                if v["bf16_flags"] else
                "ran on a CPU that lists no bfloat16 instructions, the slow case"), False),
    (_MP, "accum_rounding_verdict",
     lambda v: ("less than ten times float32's machine epsilon, what adding in another order "
                "leaves" if v["accum_rel_diff"] < 10 * v["fp32_eps"]
                else "ten times float32's machine epsilon or more"), False),
    (_MP, "precision_verdict",
     lambda v: "below" if max(v["output_error"], v["grad_error"]) < v["bf16_eps"] else "above",
     False),
    (_MP, "tf32_verdict",
     _mp_time("tf32_speedup", 'allowing TF32 was faster', 'allowing TF32 was slower',
              "the two settings took about the same time, within 10%"), False),
    (_MP, "tf32_same_verdict", lambda v: "identical" if v["tf32_max_diff"] == 0 else "different",
     False),
    (_MP, "accum_time_verdict",
     _mp_time("accum_time_ratio", "took less time than one batch", "took longer than one batch",
              "took about as long as one batch, within 10%", inverse=True), False),
    (_MP, "peak_verdict", lambda v: _mp_peak(v["peak_ratio"]), True),
    (_MP, "ckpt_time_verdict",
     _mp_time("ckpt_time_ratio", "faster than keeping the activations",
              "slower than keeping the activations",
              "about as fast as keeping the activations, within 10%", inverse=True), False),
]

# Counted facts the pages state (not measurements: they hold on any machine).
FACTS = [
    ("chapters/hybridize", "block_flops", lambda v: 2 * 4 * 8 * 8 + 3 * 4 * 8),
    # that arithmetic at 32 floating-point operations per nanosecond
    ("chapters/hybridize", "block_arith_ns", lambda v: (2 * 4 * 8 * 8 + 3 * 4 * 8) / 32),
    # two equal stages over the page's 8 chunks: 2n/(n + 1) = 16/9, not 2
    ("chapters/auto-parallelism", "equal_stage_bound", lambda v: 2 * 8 / (8 + 1)),
    ("chapters/parameter-server", "ring_vectors_sent", lambda v: 2 * (4 - 1) / 4),
    ("chapters/parameter-server", "ring_vectors_sent_2", lambda v: 2 * (2 - 1) / 2),
    ("chapters/parameter-server", "ring_vectors_sent_16", lambda v: 2 * (16 - 1) / 16),
    # one aggregating worker against a ring on full-duplex links: (n-1)m/B over 2(n-1)m/(nB)
    ("chapters/parameter-server", "one_over_ring_2", lambda v: 2 / 2),
    ("chapters/parameter-server", "one_over_ring_4", lambda v: 4 / 2),
    ("chapters/parameter-server", "one_over_ring_16", lambda v: 16 / 2),
    ("chapters/multiple-gpus", "tp_exchanges", lambda v: 2),  # one allreduce per pair of layers
    ("chapters/multiple-gpus", "column_exchanges", lambda v: 4),  # one all-gather per layer
    # numbers each device puts into the exchanges: 2 allreduces of 8 x 16 outputs; all-gathers
    # of its 8 x 32 hidden and 8 x 8 output columns per pair
    ("chapters/multiple-gpus", "tp_numbers", lambda v: 2 * 8 * 16),
    ("chapters/multiple-gpus", "column_numbers", lambda v: 2 * (8 * 32 + 8 * 8)),
    ("chapters/performance-model", "add_intensity", lambda v: 1 / 12),
    ("chapters/performance-model", "gelu_flops_per_element", lambda v: 8),
    ("chapters/performance-model", "gelu_eager_bytes_per_element", lambda v: 72),
    ("chapters/performance-model", "gelu_fused_bytes_per_element", lambda v: 8),
    ("chapters/performance-model", "h100_bf16_ridge", lambda v: 989.5 / 3.35),
    # NVLink 4 against PCIe 5.0 x16, one direction each: about seven times, not ten.
    ("chapters/hardware", "nvlink_pcie_ratio", lambda v: 450 / 63),
    ("chapters/hardware", "hbm_pcie_ratio", lambda v: 4800 / 63),
]

FACTS += [(_MP, name, lambda v, b=b: b) for name, b in [
    ("fp32_param_bpp", 4), ("fp32_grad_bpp", 4), ("fp32_adam_bpp", 8),  # float32 Adam
    ("mixed_param_bpp", 2), ("mixed_grad_bpp", 2), ("mixed_master_bpp", 4),  # ZeRO's 2 + 2 + 12
    ("mixed_adam_bpp", 8)]]

_DDP = "chapters/ddp-internals"


def _ddp_ties(ms):
    """ddp-internals: the bucket sizes whose fastest step came within 5% of the fastest one's."""
    fastest = min(ms, key=ms.get)
    tied = [f"{cap:g}" for cap in sorted(ms) if cap != fastest and ms[cap] <= 1.05 * ms[fastest]]
    return (f"{' and '.join(tied)} MiB came within 5% of it, a tie on this run" if tied
            else "no other setting came within 5% of it")


CLAIMS += [
    (_DDP, "overlap_verdict",
     lambda v: ("most of the allreduce time, at least half, ran while the backward pass was "
                "still computing" if v["overlap_share"] >= 50 else
                "part of the allreduce time, between a tenth and a half, ran while the backward "
                "pass was still computing" if v["overlap_share"] >= 10 else
                "hardly any allreduce time, less than a tenth, ran while the backward pass was "
                "computing"), False),
    (_DDP, "nosync_verdict",
     lambda v: ("faster with no_sync()" if v["nosync_ratio"] >= 1.05 else
                "slower with no_sync()" if v["nosync_ratio"] <= 1 / 1.05 else
                "about as fast either way, within 5%"), False),
    (_DDP, "sweep_verdict",
     lambda v: ("mattered: the slowest setting took more than 5% longer than the fastest"
                if v["sweep_spread"] > 1.05
                else "made no difference beyond 5% between the settings"), False),
    (_DDP, "sweep_tie_verdict", lambda v: _ddp_ties(v["sweep_ms"]), False),
    (_DDP, "ddp_extra_verdict",
     lambda v: ("exactly 16 bytes for each parameter" if v["ddp_extra_bytes"] == 0 else
                f"16 bytes for each parameter and {v['ddp_extra_bytes']} bytes besides, 4 for "
                f"each of the {v['param_tensors']} parameter tensors: Adam's step counters"
                if v["ddp_extra_bytes"] == 4 * v["param_tensors"] else
                f"16 bytes for each parameter and {v['ddp_extra_bytes']} bytes besides"), False),
]
FACTS += [(_DDP, "zero1_8", lambda v: 2 + 2 + 12 / 8), (_DDP, "zero2_8", lambda v: 2 + 14 / 8),
          (_DDP, "zero3_8", lambda v: 16 / 8),
          # ZeroRedundancyOptimizer: an allreduce and a broadcast of the whole model per step,
          # 3(n-1)/n per process; the ideal ZeRO-1 (reduce-scatter + all-gather) 2(n-1)/n
          (_DDP, "zero_redundancy_sent_8", lambda v: 3 * 7 / 8), (_DDP, "zero1_sent_8", lambda v: 2 * 7 / 8),
          (_DDP, "zero_allreduce_per_param", lambda v: 1.0),
          (_DDP, "zero_broadcast_per_param", lambda v: 1.0)]

_UM = "chapters/utilization-memory"


def _um_expandable(v):
    """utilization-memory: reserved over peak allocated bytes, default against expandable
    segments, on a GPU; on a CPU there is nothing to compare."""
    if not v["on_gpu"]:
        return "so this run says nothing about which setting reserves less"
    return ("so expandable segments reserved less" if v["expandable_ratio"] < v["default_ratio"]
            else "so expandable segments reserved no less")


def _um_reuse(v):
    """utilization-memory: the segments the third recorded training step obtained from CUDA."""
    if not v["on_gpu"]:
        return "so there is no snapshot to describe"
    return ("so the third step was served from the cache alone" if v["last_new_segments"] == 0
            else "so even the third step needed new segments from CUDA")


def _um_ckpt_time(v):
    """utilization-memory: checkpointed over plain time (fastest runs), against a band of 10%
    or, if wider, the spread of the fastest runs (second fastest over fastest, the larger of
    the two variants')."""
    band = max(0.10, v["ckpt_spread_pct"] / 100)
    assert v["ckpt_band_pct"] == pytest.approx(100 * band)
    r = v["ckpt_time_ratio"]
    if r >= 1 + band:
        return "slower than keeping the activations"
    if r <= 1 / (1 + band):
        return "faster than keeping the activations"
    return (f"about as fast as keeping the activations, within the {100 * band:.0f}% "
            "by which the fastest runs differed")


def _um_count_rule(v):
    """utilization-memory: counted FLOPs against 6N + 12 L s d, the largest relative gap."""
    gap = v["count_rule_gap"]
    if gap < 1e-12:
        return ("the count and the rule agree exactly, because every product of this model is "
                "one the rule describes, the weights of the Linear layers and the two attention "
                "products")
    return (f"the count and the rule differ by up to {100 * gap:.2f}%, so the model runs "
            "products that the rule does not describe")


def _um_overflow(v):
    """utilization-memory: what converting 500 to float8_e4m3fn gave."""
    if v["e4m3_of_500"] == v["e4m3_max"]:
        return "the largest E4M3 number: the conversion saturates"
    if math.isnan(v["e4m3_of_500"]):
        return "NaN: the conversion does not saturate"
    return "a number other than E4M3's largest"


CLAIMS += [
    (_UM, "step_share_verdict",
     lambda v: ("at least half of what the large product reached" if v["matmul_share"] >= 50
                else "less than half of what the large product reached"), False),
    (_UM, "count_rule_verdict", _um_count_rule, False),
    (_UM, "meta_rule_verdict",
     lambda v: ("agreed exactly" if v["meta_max_rule_gap"] < 1e-12
                else f"differed, by up to {100 * v['meta_max_rule_gap']:.2f}%"), False),
    (_UM, "ckpt_time_verdict", _um_ckpt_time, False),
    (_UM, "reuse_verdict", _um_reuse, False),
    (_UM, "overlap_verdict",
     lambda v: ("no longer than the backward pass, so it could hide entirely behind it"
                if v["allreduce_ms"] <= v["backward_ms_again"]
                else "longer than the backward pass, so part of it would always show"), False),
    (_UM, "expandable_verdict", _um_expandable, False),
    (_UM, "overflow_verdict", _um_overflow, False),
    # the bound 2^-4 holds for values in the normal range; the largest error there is checked
    (_UM, "fp8_error_verdict",
     lambda v: ("within the 2^-4 that rounding to 3 mantissa bits allows there"
                if v["fp8_max_error_normal"] <= 2**-4
                else "beyond the 2^-4 that rounding to 3 mantissa bits allows there"), False),
    (_UM, "unscaled_median_verdict",
     lambda v: ("1, since more than half of the values became zero, each with a relative error of 1"
                if v["fp8_zero_unscaled"] > 50 else f"{v['fp8_median_unscaled']:.3g}"), False),
]
# The FP8 formats' ranges follow from their bit layouts; backward costs twice the forward.
FACTS += [(_UM, "e4m3_max", lambda v: 448.0), (_UM, "e5m2_max", lambda v: 57344.0),
          (_UM, "e4m3_min_subnormal", lambda v: 2.0**-9),
          (_UM, "e5m2_min_subnormal", lambda v: 2.0**-16),
          (_UM, "backward_forward_ratio", lambda v: 2.0)]
_MODEL = "chapters/model-parallelism"
CLAIMS += [
    (_MODEL, "tp_count_verdict",
     lambda v: ("one allreduce of the whole activations, tokens × width elements, in each pass"
                if v["tp_one_allreduce"] and v["tp_count_gap"] == 0
                and v["tp_rank_mismatches"] == 0
                else "not one allreduce of the activations in each pass on every rank"), False),
    (_MODEL, "sp_traffic_verdict",
     lambda v: ("the same number of elements as" if v["sp_gap"] < 0.5
                else "a different number of elements from"), False),
    (_MODEL, "sp_saved_verdict", lambda v: "less" if v["sp_saved_share"] < 100 else "no less",
     False),
    (_MODEL, "ring_verdict",
     lambda v: "exactly the formula's" if v["ring_gap"] < 0.5 else "not the formula's", False),
    (_MODEL, "bubble_sim_verdict",
     lambda v: ("the formula's, to rounding" if v["bubble_gap"] < 1e-9
                else "not always the formula's"), False),
    (_MODEL, "pipe_sim_verdict",
     lambda v: ("within 5 percentage points of what the simulator predicts from the same run's "
                "operation times, for both schedules" if abs(v["pipe_sim_gap"]) <= 5 else
                "more than 5 percentage points above what the simulator predicts from the same "
                "run's operation times for at least one schedule, so time went to something the "
                "simulator leaves out: the transfers and the waiting for them"
                if v["pipe_sim_gap"] > 0 else
                "more than 5 percentage points below what the simulator predicts from the same "
                "run's operation times for at least one schedule: the simulator gives every "
                "operation of a stage that stage's mean time, and the run's operations varied "
                "around their means"), False),
    (_MODEL, "flash_fit_verdict",
     lambda v: ("more than " if v["act_flash_gb"] > v["fit_gpu_gb"] else "within ")
     + v["fit_gpu_words"], False),
    (_MODEL, "same_time_verdict",
     lambda v: ("the same time, within 1%" if abs(v["same_time_ratio"] - 1) <= 0.01 else
                "longer with GPipe" if v["same_time_ratio"] > 1 else "longer with 1F1B"), False),
    (_MODEL, "pipe_formula_verdict",
     lambda v: ("no more than 5 percentage points above the formula for both schedules"
                if v["pipe_formula_gap"] <= 5 else
                "more than 5 percentage points above the formula for at least one schedule"),
     False),
    (_MODEL, "pipe_memory_verdict",
     lambda v: ("less memory than GPipe's" if v["ofob_peak"] < v["gpipe_peak"]
                else "no less memory than GPipe's"), False),
    (_MODEL, "pipe_time_verdict",
     lambda v: ("about as long as 1F1B, within 10%" if abs(v["pipe_time_ratio"] - 1) <= 0.10 else
                "longer than 1F1B" if v["pipe_time_ratio"] > 1 else "less time than 1F1B"), False),
    (_MODEL, "peak_flight_verdict",
     lambda v: "smaller than" if v["peak_ratio"] < v["flight_ratio"] else "no smaller than", False),
    (_MODEL, "torch_tp_verdict",
     lambda v: ("the same collectives, of the same sizes, in the same groups"
                if v["torch_tp_mismatches"] == 0
                else f"different collectives on {v['torch_tp_mismatches']} of the ranks"), False),
]
# Korthikanti et al. (MLSys 2023)'s activation bytes per layer, sbh(34 + 5as/h), for GPT-3's layer
# (s = 2048, h = 12288, a = 96, one sequence): 34 + 80 = 114 unsplit; 10 + 24/8 + 80/8 = 23
# with 8-way tensor parallelism; 114/8 with sequence parallelism too; 96 layers. Without the
# attention matrices (fused attention): 34, 10 + 24/8 = 13 and 34/8. At 131072 tokens, 64 times
# as many, with 8-way tensor and sequence parallelism and fused attention: 64 * 34/8.
_SBH = 2048 * 12288
FACTS += [(_MODEL, "act_layer_gb", lambda v: _SBH * 114 / 1e9),
          (_MODEL, "act_model_gb", lambda v: 96 * _SBH * 114 / 1e9),
          (_MODEL, "act_tp8_gb", lambda v: 96 * _SBH * 23 / 1e9),
          (_MODEL, "act_sp8_gb", lambda v: 96 * _SBH * 114 / 8 / 1e9),
          (_MODEL, "act_flash_gb", lambda v: 96 * _SBH * 34 / 1e9),
          (_MODEL, "act_tp8_flash_gb", lambda v: 96 * _SBH * 13 / 1e9),
          (_MODEL, "act_sp8_flash_gb", lambda v: 96 * _SBH * 34 / 8 / 1e9),
          (_MODEL, "attention_units", lambda v: 80.0),
          (_MODEL, "act_units", lambda v: 114.0),
          (_MODEL, "act_long_gb", lambda v: 96 * 64 * _SBH * 34 / 8 / 1e9),
          (_MODEL, "states_tb", lambda v: 175e9 * 16 / 1e12),
          (_MODEL, "zero3_64_gb", lambda v: 175e9 * 16 / 64 / 1e9),
          (_MODEL, "bubble_4_8", lambda v: 100 * 3 / 11)]
_AK = "chapters/attention-kernels"


def _ak_growth(name):
    """attention-kernels: a fitted log-log exponent of peak memory against sequence length."""
    def rule(v):
        e = v[name]
        if e >= 1.75:
            return "grew about as the square of the sequence length"
        if e > 1.25:
            return "grew faster than linearly but slower than the square"
        return "grew no faster than about linearly"
    return rule


def _ak_flash(v):
    """attention-kernels: the flash backend against the naive version (the same dtype; the math
    backend computes 16-bit inputs in float32), fastest runs, 10% rule."""
    if "FLASH_ATTENTION" not in v["backends_ran"].split(" and "):
        return "could not be compared, because it did not run here"
    return _mp_time("flash_speedup", "faster than the naive version",
                    "slower than the naive version",
                    "about as fast as the naive version, within 10%")(v)


def _ak_outlook(name):
    """attention-kernels: a GPU run explains what it measured; a CPU run only expects, hedged."""
    def rule(v):
        said = v[name]
        if v["on_gpu"]:
            assert not said.startswith(("This run had no GPU", "On a GPU")), said
        else:
            assert "can be expected" in said and "measures" in said, said
        return said
    return rule


def _ak_graph(v):
    """attention-kernels: CUDA graph replay against eager launches (GPU only), 10% rule."""
    s = v["graph_speedup"]
    if not v["on_gpu"]:
        return "this run had no GPU, so it recorded and replayed no graph"
    if s >= 1.10:
        return f"the replay was {s:.2f} times as fast as eager launches"
    if s <= 1 / 1.10:
        return f"the replay was slower than eager launches, {s:.2f} times their speed"
    return "the replay and eager launches took about the same time, within 10%"


CLAIMS += [
    *[(_AK, f"{key}_growth_verdict", _ak_growth(f"{key}_exponent"), False)
      for key in ("naive", "sdpa", "blockwise")],
    (_AK, "flash_verdict", _ak_flash, False),
    (_AK, "flat_verdict",
     lambda v: ("within 50% of each other, so a fixed cost per operation, not the arithmetic, "
                "set the time" if v["small_ratio"] < 1.5 else
                "more than 50% apart, so the arithmetic already showed at these sizes"), False),
    (_AK, "graph_verdict", _ak_graph, False),
    (_AK, "flash_outlook", _ak_outlook("flash_outlook"), False),
    (_AK, "graph_outlook", _ak_outlook("graph_outlook"), False),
    (_AK, "recompile_verdict",
     lambda v: ("fewer than the changes of input, so at least one new input was served by a "
                "graph compiled before it" if v["recompiles_default"] < v["input_changes"]
                else "one for every new input"), False),
    (_AK, "float_verdict",
     lambda v: ("fewer than one per new value, so later values reused a graph compiled before "
                "them" if v["float_recompiles"] < v["float_calls"] - 1
                else "one for every new value"), False),
    (_AK, "dynamic_verdict",
     lambda v: ("fewer than with the default setting"
                if v["recompiles_dynamic"] < v["recompiles_default"] else
                "as many as with the default setting"
                if v["recompiles_dynamic"] == v["recompiles_default"] else
                "more than with the default setting"), False),
]

FACTS += [(_AK, "h100_bf16_tflops", lambda v: 989.5)]  # the H100 SXM datasheet, dense bf16
_TK = "chapters/triton-kernels"


def _tk_speed(key):
    """triton-kernels: a Triton kernel against PyTorch's (GPU only), fastest runs, 10% rule."""
    def rule(v):
        if not v["on_gpu"]:
            return "not timed, since this run had no GPU"
        r = v[f"{key}_speedup"]
        if r >= 1.10:
            return f"faster, {r:.2f} times PyTorch's speed"
        if r <= 1 / 1.10:
            return f"slower, {r:.2f} times PyTorch's speed"
        return f"about as fast, within 10%: {r:.2f} times PyTorch's speed"
    return rule


def _tk_race(v):
    """triton-kernels: the read-add-write sum against the right total."""
    if v["racy_total"] == v["sum_n"]:
        return ("gave the right total: no program read the total while another was between "
                "its read and its write")
    return (f"gave {v['racy_total']:,.0f} instead of {v['sum_n']:,}: programs that read the total "
            "at the same time overwrote each other's additions")


def _tk_smem(v):
    """triton-kernels: what became of a tile configuration too large for shared memory."""
    if v["smem_outcome"] == "refused":
        return ("refused it before running: the compiled kernel needs more shared memory than "
                "the GPU gives a block")
    if v["interpreted"]:
        return "ran it without complaint, since the interpreter has no shared memory and no limit on it"
    return ("ran it: the compiler fitted it into this GPU's shared memory, with fewer stages than "
            "asked for or a GPU that has more")


CLAIMS += [
    *[(_TK, f"{key}_speed_verdict", _tk_speed(key), False)
      for key in ("add", "softmax", "matmul", "attention")],
    (_TK, "race_verdict", _tk_race, False),
    (_TK, "smem_verdict", _tk_smem, False),
    (_TK, "roof_outlook", _ak_outlook("roof_outlook"), False),
]

FACTS += [(_TK, "h100_ridge", lambda v: 989.5 / 3.35),  # the H100 SXM datasheet, dense float16
          (_TK, "attention_intensity", lambda v: 4096 / 2)]

_MOE = "chapters/mixture-of-experts"


def _moe_balance(key):
    """mixture-of-experts: a run with the auxiliary loss against the run without it, at the
    last step; 1 percentage point fewer dropped choices and a busiest expert 5% less
    loaded count as differences."""
    def rule(v):
        fewer = v[f"{key}_dropped_last"] <= v["none_dropped_last"] - 1
        evener = v[f"{key}_busiest_last"] <= 0.95 * v["none_busiest_last"]
        if fewer and evener:
            return "evened out the load and dropped fewer choices than training without it"
        if evener:
            return "evened out the load, but dropped no fewer choices than training without it"
        if fewer:
            return ("dropped fewer choices, but left the busiest expert about as loaded as "
                    "training without it")
        return "changed neither the load nor the dropped share against training without it"
    return rule


def _moe_error(v):
    """mixture-of-experts: the last squared error of both runs with the auxiliary loss
    against the run without it, 10% either way."""
    ratios = [v[f"{key}_error_last"] / v["none_error_last"] for key in ("small", "large")]
    if max(ratios) <= 0.9:
        return "lower with the auxiliary loss than without it, by more than 10%"
    if min(ratios) >= 1.1:
        return "higher with the auxiliary loss than without it, by more than 10%"
    return "not lower by more than 10% for both values of alpha, nor higher by more than 10% for both"


def _moe_time(v):
    """mixture-of-experts: the MoE layer against a dense block of its active size, fastest
    runs, 10% either way."""
    r = v["moe_over_dense"]
    if r > 1.1:
        return ("more than 10% slower than the dense block: routing, gathering and scattering "
                "the tokens and the smaller products cost time that the FLOP count leaves out")
    if r >= 1 / 1.1:
        return ("within 10% of the dense block's time: routing and the smaller products cost "
                "little here")
    return ("more than 10% faster than the dense block, although both do the same FLOPs: on "
            "this machine the experts' smaller products ran at a higher rate than the one "
            "large product")


CLAIMS += [
    (_MOE, "match_verdict",
     lambda v: ("the same output, to float32 rounding" if v["match_diff"] < 1e-5
                else "a different output"), False),
    (_MOE, "aux_small_verdict", _moe_balance("small"), False),
    (_MOE, "aux_large_verdict", _moe_balance("large"), False),
    (_MOE, "error_verdict", _moe_error, False),
    (_MOE, "mixtral_verdict",
     lambda v: "within 1% of" if v["mixtral_gap_pct"] <= 1 else "more than 1% away from", False),
    (_MOE, "moe_time_verdict", _moe_time, False),
    (_MOE, "ep_match_verdict",
     lambda v: ("the same outputs and gradients as the whole layer, to float32 rounding"
                if max(v["ep_out_diff"], v["ep_grad_diff"]) < 1e-5
                else "different outputs or gradients from the whole layer's"), False),
    (_MOE, "ep_bytes_verdict", lambda v: "exactly" if v["ep_bytes_gap"] == 0 else "not", False),
    (_MOE, "fit_verdict",
     lambda v: ("within 25% of every measured time" if v["a2a_worst_pct"] <= 25 else
                "more than 25% away from at least one measured time, so a straight line does "
                "not describe this machine's all-to-all at every size"), False),
]

FACTS += [
    (_MOE, "experts_over_k", lambda v: 8 / 2),
    (_MOE, "gpu_buffer_mib", lambda v: 4096 * 2 * 4096 * 2 / 2**20),  # top-2 rows, bfloat16
    # across nodes 56/64 of the buffer at 50 GB/s, within one 7/8 at 450 GB/s
    (_MOE, "ib_over_nvlink", lambda v: (56 / 64 / 50) / (7 / 8 / 450)),
    (_MOE, "mixtral_total_b", lambda v: 46.702792704),
    (_MOE, "mixtral_active_b", lambda v: 12.879925248),
]

# Verdicts glued under names made in a loop, which the source scan below cannot read.
LOOPED = set()


# Verdicts a page glues for a table or a later sentence rather than quoting whole.
QUOTED_ELSEWHERE = set()


SMART_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"'})


def page_values(executed_page, page: str) -> dict:
    return {name: value(text) for name, text in glued(executed_page(page), page).items()}


def rendered(built_book, page: str) -> str:
    text = html_lib.unescape(re.sub(r"<[^>]+>", "", (built_book.html / f"{page}.html").read_text()))
    # Sphinx's smart quotes print a glued "step's" as "step’s"; the sentence is still the same.
    text = text.translate(SMART_QUOTES)
    return re.sub(r"\s+", " ", text)


@pytest.mark.parametrize("page, verdict, rule, prefix", CLAIMS,
                         ids=[f"{page.split('/')[-1]}:{verdict}" for page, verdict, *_ in CLAIMS])
def test_each_verdict_follows_from_its_number(built_book, executed_page, page, verdict, rule,
                                              prefix):
    values = page_values(executed_page, page)
    expected, said = rule(values), values[verdict]
    assert (said.startswith(expected) if prefix else said == expected), (
        f"{page}: the page says {verdict} = {said!r}; its numbers give {expected!r}")
    if (page, verdict) not in QUOTED_ELSEWHERE:
        assert said in rendered(built_book, page), f"{page}: the sentence with {said!r} is not shown"


@pytest.mark.parametrize("page, name, rule", FACTS, ids=[name for _, name, _ in FACTS])
def test_counted_facts_hold(executed_page, page, name, rule):
    assert page_values(executed_page, page)[name] == pytest.approx(rule({}))


def test_the_rules_catch_a_verdict_that_disagrees():
    assert _gelu({"gelu_speedup": 5.11}) == "faster"
    assert _gelu({"gelu_speedup": 1.02}) != "faster"  # the kind of claim the review caught
    assert not _logging({"logging_ratio": 1.16, "logging_spread_pct": 3.0}).startswith("took")
    # async-computation once judged the logging ratio against 10% while its controls differed
    # by about as much; the controls' spread is the yardstick now
    assert _logging({"logging_ratio": 1.08, "logging_spread_pct": 9.0}).startswith("took about")
    assert _logging({"logging_ratio": 1.08, "logging_spread_pct": 2.0}).endswith("slower")
    assert _logging({"logging_ratio": 0.9, "logging_spread_pct": 2.0}).endswith("faster")
    # performance-model once read a compiled GELU 3% slower than the eager tanh, both at the
    # memory roof of an H200, as "arithmetic is part of its cost"
    gelu = {"tanh_share": 97.39, "gelu_into_share": 94.57, "gelu_ops": 8}
    assert "hidden behind the memory traffic" in _pm_gelu_tanh(gelu)
    assert _pm_gelu_tanh({**gelu, "gelu_into_share": 80.0}).endswith("part of its cost")
    # ... and once, on an H200, called the .item() loop faster (0.969) against the 1.9% of
    # the controls' fastest runs while their medians differed by 6.6%
    h200 = {"logging_ratio": 0.969, "logging_spread_pct": 1.9}
    assert _logging({**h200, "logging_median_spread_pct": 6.6}).startswith("took about")
    # async-computation once read a blocker's cost from noise; the controls' spread bounds it
    assert _blockers({"plain_step_us": 80.0, "noise_step_us": 30.0, "item_loop_step_us": 126.0,
                      "numpy_loop_step_us": 100.0}).startswith("only one")
    # ... and once said the .item() loop paid what the call costs alone, where it paid 6 times that
    gap = _call_gap("item_excess_us", "noise_step_us")
    cpu = {"item_alone_us": 2.7, "item_excess_us": 15.6, "logging_device": "CPU: AMD EPYC"}
    assert gap({**cpu, "noise_step_us": 14.7}).startswith("no more than")
    assert "does not show why" in gap({**cpu, "noise_step_us": 5.0})
    # multiple-gpus-concise once showed a DDP speedup of 1.04 against an ideal of 2, unjudged
    ddp = {"ddp_nproc": 2, "ddp_spread_pct": 3.0, "ddp_band_pct": 10.0}
    assert _speedup_against_ideal({**ddp, "ddp_speedup": 1.04}).startswith("no gain")
    assert _speedup_against_ideal({**ddp, "ddp_speedup": 1.60}).startswith("a gain, short")
    assert _speedup_against_ideal({**ddp, "ddp_speedup": 1.90}).startswith("close to the ideal")
    noisy = {**ddp, "ddp_spread_pct": 50.0, "ddp_band_pct": 50.0, "ddp_speedup": 1.40}
    assert _speedup_against_ideal(noisy).startswith("within the 50% margin of both")
    # multiple-gpus once quoted its time ratio unjudged, from the fastest epochs alone
    two = {"virtual_devices": False, "time_spread_pct": 4.0, "time_band_pct": 10.0}
    assert _time_ratio({**two, "time_ratio": 0.52}).startswith("close to the ideal of 0.5")
    # auto-parallelism once called 103.5% of the ideal overlap "almost perfectly", unremarked
    lanes = {"lane_speedup": 1.035 * 1.9, "lane_ideal": 1.9, "lane_share": 103.5}
    assert _lanes(lanes).endswith("(above the ideal, within noise)")
    # ... and, on an H200, called 0.817 "about the same" within a 67% margin
    h200 = {"virtual_devices": True, "time_spread_pct": 67.4, "time_band_pct": 67.4}
    assert _time_ratio({**h200, "time_ratio": 0.817}).startswith("too uncertain")
    assert _time_ratio({**two, "time_ratio": 0.7}).startswith("shorter than on one device, but")
    assert _time_ratio({**two, "time_ratio": 1.05}).startswith("no shorter")
    assert _time_ratio({**two, "time_ratio": 0.7, "time_spread_pct": 60.0,
                        "time_band_pct": 60.0}).startswith("too uncertain")
    virtual = {**two, "virtual_devices": True}
    assert _time_ratio({**virtual, "time_ratio": 0.8}).startswith("shorter than on one device by")
    assert _time_ratio({**virtual, "time_ratio": 1.3}).startswith("longer")
    derived = {"peak_basis": "reported clock", "peak_ghz": 2.6, "flop_per_cycle": 64.0}
    assert _peak({**derived, "peak_share": 123.0, "implied_ghz": 3.2}).startswith("exceeded")
    assert "2.60 GHz that /proc/cpuinfo reports" in _peak({**derived, "peak_share": 123.0,
                                                           "implied_ghz": 3.2})
    assert _peak({**derived, "peak_share": 80.0}).startswith("came within")
    # auto-parallelism once compared its factor with 2; 8 equal chunks allow 16/9
    assert _pipeline_bound(8, 1.0, 1.0, 1.0) == pytest.approx(16 / 9)
    assert _pipeline({"n_chunks": 8, "compute_ms": 1.0, "copy_in_turn_ms": 1.0,
                      "copy_overlapped_ms": 1.0, "overlap_speedup": 1.70}).startswith("close to")
    # hybridize once called torch.export's graph Core ATen; aten.linear is not in that set.
    exported = {"exported_ops": ["aten.linear", "aten.relu"], "exported_noncore": ["aten.linear"],
                "decomposed_ops": ["aten.addmm", "aten.permute", "aten.relu"],
                "decomposed_noncore": []}
    assert not _decomp(exported).startswith("had nothing to replace")
    assert _decomp(exported).startswith("replaced aten.linear with aten.addmm and aten.permute")
    # performance-model once called a tanh at 8% of its memory roof "memory-bound", and
    # predicted fusion's gain for GELU points far below their roofs.
    assert "not what holds it back" in _pm_roof("tanh")({"tanh_share": 8.0, "ridge": 2.33,
                                                          "tanh_point_intensity": 0.125})
    far_below = {"gelu_eager_share": 11.0, "gelu_compiled_share": 6.0, "gelu_speedup": 5.4,
                 "gelu_roof_ratio": 9.0}
    assert _pm_gelu_bound(far_below).endswith("predicts nothing for this run")
    # utilization-memory: a CPU run compares nothing; a conversion that gave NaN is no saturation
    assert _um_expandable({"on_gpu": False, "default_ratio": float("nan"),
                           "expandable_ratio": float("nan")}).startswith("so this run says nothing")
    assert _um_reuse({"on_gpu": True, "last_new_segments": 2}).startswith("so even the third")
    # utilization-memory once judged a 1.24 time ratio against 10% while its runs varied by 24%
    noisy = {"ckpt_time_ratio": 1.2, "ckpt_spread_pct": 24.0, "ckpt_band_pct": 24.0}
    assert _um_ckpt_time(noisy).startswith("about as fast")
    assert _um_ckpt_time({**noisy, "ckpt_spread_pct": 3.0, "ckpt_band_pct": 10.0}).startswith("slower")
    assert _um_count_rule({"count_rule_gap": 0.05}).startswith("the count and the rule differ")
    assert _um_expandable({"on_gpu": True, "default_ratio": 1.4, "expandable_ratio": 1.1}) == (
        "so expandable segments reserved less")
    assert _um_overflow({"e4m3_of_500": float("nan"), "e4m3_max": 448.0}).startswith("NaN")
    # attention-kernels: a CPU run states no graph speed-up; a sweep's exponent decides its words
    assert _ak_graph({"on_gpu": False, "graph_speedup": float("nan")}).startswith("this run had no")
    assert _ak_graph({"on_gpu": True, "graph_speedup": 1.05}).startswith("the replay and eager")
    assert _ak_growth("e")({"e": 1.6}) != "grew about as the square of the sequence length"
    assert _ak_flash({"backends_ran": "MATH", "flash_speedup": float("nan")}).startswith("could not")
    assert _ak_flash({"backends_ran": "MATH and FLASH_ATTENTION", "flash_speedup": 3.2}) == (
        "faster than the naive version")
    # memory-precision once told readers to expect a GPU's peak above the counted activations
    # and gradients; on an H100 it came to 192.07 MiB against 192.12 MiB counted
    assert _mp_peak(192.07 / 192.12).startswith("on this run the peak came within 2%")
    assert _mp_peak(1.3).startswith("on this run the peak lay above")
    with pytest.raises(AssertionError):  # a GPU prediction stated on a CPU run, unhedged
        _ak_outlook("o")({"on_gpu": False, "o": "On a GPU the replay is several times as fast."})
    # triton-kernels: a CPU run times nothing; a GPU run judges each kernel by the 10% rule
    assert _tk_speed("add")({"on_gpu": False, "add_speedup": float("nan")}).startswith("not timed")
    assert _tk_speed("add")({"on_gpu": True, "add_speedup": 1.05}).startswith("about as fast")
    assert _tk_speed("add")({"on_gpu": True, "add_speedup": 0.5}).startswith("slower")
    assert _tk_race({"racy_total": 1000.0, "sum_n": 4096}).startswith("gave 1,000 instead of 4,096")
    assert _tk_smem({"smem_outcome": "ran", "interpreted": False}).startswith("ran it: the compiler")
    # auto-parallelism once called two workers 6.4 times as fast as one lane with all threads
    # "faster", where two cores allow at most 2
    assert "held up" in _threads({"setup": "two CPU workers", "threads_ratio": 6.38,
                                   "threads_lanes": 2})
    # performance-model once called a product at 100.4% of its roof "above" it
    assert _pm_matmul_roof({"matmul_max_share": 100.4}).startswith("at or below")
    # parallel-layout: a DP step below the planner's bound is a wrong rate, not a fast step
    small = {"small_overlapped_ms": 65.0, "small_in_turn_ms": 71.0}
    assert _pl_small_step({**small, "small_measured_ms": 44.0}).startswith("shorter")
    assert _pl_small_step({**small, "small_measured_ms": 66.0}).startswith("between")
    assert _pl_small_step({**small, "small_measured_ms": 70.0}).startswith("within 5%")
    assert _pl_small_step({**small, "small_measured_ms": 83.0}).startswith("longer")
    assert _pl_published_rank({"published_rank": 0}) == "not among the layouts that fit"
    # mixture-of-experts: a loss that evens the load but drops as many is not called a win
    same_drop = {"none_dropped_last": 20.0, "small_dropped_last": 19.5,
                 "none_busiest_last": 2.0, "small_busiest_last": 1.5}
    assert _moe_balance("small")(same_drop).startswith("evened out the load, but")
    assert _moe_time({"moe_over_dense": 1.05}).startswith("within 10%")


def test_every_verdict_a_page_glues_is_checked():
    checked = {(page, verdict) for page, verdict, *_ in CLAIMS} | LOOPED
    root = Path(__file__).resolve().parent.parent
    for chapter in sorted((root / "chapters").glob("*.md")):
        page = f"chapters/{chapter.stem}"
        for name in re.findall(r'glue\("(\w+_(?:verdict|balance|margin))"', chapter.read_text()):
            assert (page, name) in checked, f"{page} glues {name}, which no rule here checks"
