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
                                       else "about as fast as eager code (within 10%)")


def _logging(v):
    r = v["logging_ratio"]
    if abs(r - 1) <= 0.10:
        return "took about the same time"
    return ("differed: the version that calls .item() every step was slower" if r > 1
            else "differed: the version that calls .item() every step was faster")


def _lanes(v):
    speedup, ideal = v["lane_speedup"], v["lane_ideal"]
    if speedup > 1.05 * ideal:
        return ("a gain above what perfect overlap of the fastest sequential run allows, so "
                "the lanes' own speed varied from run to run")
    if speedup >= 0.9 * ideal:
        return "close to perfect overlap (at least 90% of the ideal factor)"
    if speedup > 1:
        return "partial overlap (a factor above 1 but below 90% of the ideal)"
    return "no gain: running the lanes together was not faster"


def _peak(v):
    share = v["peak_share"]
    if math.isnan(share):
        return "cannot be compared with a peak, because none is known for this device"
    if share > 100:
        return "exceeded the float32 peak above, so that peak is too low for this machine"
    if share >= 70:
        return "came within 30% of the float32 peak above"
    return "stayed more than 30% below the float32 peak above"


def _drop_prefix(v):
    """The start of the sentence on the largest fall (the rest names the cache)."""
    if math.isnan(v["drop_cache_factor"]):
        return "the system reported no cache sizes to compare it with"
    if v["largest_drop"] < 1.1:
        return "too small a change to tie to any cache"
    return ("at or near the " if v["drop_cache_factor"] <= 2
            else "far from every cache size the system reports")


def _d2l(change):
    """The verdict on one change of the replay of d2l's two runs (its loss effect against a
    threshold of twice the effect of the data order alone, at least 0.1)."""
    def rule(v):
        threshold = max(0.1, 2 * abs(v["d2l_effect_order"]))
        effect = v[f"d2l_effect_{change}"]
        if effect > threshold:
            return "a higher loss by more than the threshold: slower training"
        if effect < -threshold:
            return "a lower loss by more than the threshold: faster training"
        return "within the threshold: no clear difference"
    return rule


# (page, glued verdict, rule from the page's numbers, whether the verdict is a prefix)
CLAIMS = [
    ("chapters/hybridize", "mlp_verdict",
     lambda v: "faster" if v["mlp_speedup"] > 1 else "slower", False),
    ("chapters/hybridize", "mlp_margin",
     lambda v: ("a difference of less than 10% either way" if abs(v["mlp_speedup"] - 1) < 0.10
                else "a difference of 10% or more"), False),
    ("chapters/hybridize", "gelu_verdict", _gelu, False),
    ("chapters/hybridize", "cpu_naive_verdict",
     lambda v: ("happens to give the right answer" if v["cpu_naive_share"] >= 90
                else "falls well short of the real time"), False),
    ("chapters/async-computation", "queue_verdict",
     lambda v: ("came out right, since nothing was left to wait for" if v["reported_share"] >= 90
                else "would have been far too flattering"), False),
    ("chapters/async-computation", "logging_verdict", _logging, False),
    ("chapters/auto-parallelism", "lane_balance",
     lambda v: ("about equally long (the shorter took at least 80% of the longer's time)"
                if v["lane_ideal"] >= 1.8 else
                "of unequal length (the shorter took less than 80% of the longer's time)"), False),
    ("chapters/auto-parallelism", "lane_verdict", _lanes, False),
    ("chapters/hardware", "peak_verdict", _peak, False),
    ("chapters/hardware", "smallest_verdict",
     lambda v: "reached only" if v["smallest_share"] < 90 else "already reached", False),
    ("chapters/hardware", "drop_verdict", _drop_prefix, True),
    ("chapters/multiple-gpus-concise", "ddp_acc_gap_verdict",
     lambda v: ("within 0.02 of each other" if v["ddp_acc_gap"] <= 0.02
                else "more than 0.02 apart"), False),
    ("chapters/multiple-gpus-concise", "ddp_acc_swing_verdict",
     lambda v: "no larger than" if v["ddp_acc_gap"] <= v["ddp_acc_swing"] else "larger than",
     False),
    *[("chapters/multiple-gpus-concise", f"d2l_verdict_{change}", _d2l(change), False)
      for change in ("init", "batch", "steps", "state", "total")],
]

# Counted facts the pages state (not measurements: they hold on any machine).
FACTS = [
    ("chapters/hybridize", "block_flops", lambda v: 2 * 4 * 8 * 8 + 3 * 4 * 8),
    ("chapters/parameter-server", "ring_vectors_sent", lambda v: 2 * (4 - 1) / 4),
    ("chapters/parameter-server", "ring_vectors_sent_2", lambda v: 2 * (2 - 1) / 2),
    ("chapters/parameter-server", "ring_vectors_sent_16", lambda v: 2 * (16 - 1) / 16),
]

# Verdicts glued under names made in a loop, which the source scan below cannot read.
LOOPED = {("chapters/multiple-gpus-concise", f"d2l_verdict_{change}")
          for change in ("order", "init", "batch", "steps", "state", "total")}


# Verdicts a page glues for a table or a later sentence rather than quoting whole.
QUOTED_ELSEWHERE = set()


def page_values(executed_page, page: str) -> dict:
    return {name: value(text) for name, text in glued(executed_page(page), page).items()}


def rendered(built_book, page: str) -> str:
    text = html_lib.unescape(re.sub(r"<[^>]+>", "", (built_book.html / f"{page}.html").read_text()))
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
    assert _logging({"logging_ratio": 1.16}) != "took about the same time"
    assert _peak({"peak_share": 116.0}).startswith("exceeded")


def test_every_verdict_a_page_glues_is_checked():
    checked = {(page, verdict) for page, verdict, *_ in CLAIMS} | LOOPED
    root = Path(__file__).resolve().parent.parent
    for chapter in sorted((root / "chapters").glob("*.md")):
        page = f"chapters/{chapter.stem}"
        for name in re.findall(r'glue\("(\w+_(?:verdict|balance|margin))"', chapter.read_text()):
            assert (page, name) in checked, f"{page} glues {name}, which no rule here checks"
