"""Speed tests: the arithmetic (autograder.pipeline.speed), the comparison and audits of the
timing (autograder.pipeline.timing), and, end to end, a small course whose one test is a
speed test (tests/autograder_fixtures/speed_course), graded with ``python -m autograder grade``:
a malformed declaration stops the grading, and on a GPU the test is timed there. The real
assignment's speed test against every trick we know of is tests/test_autograder_hostile_speed.py.
"""
from __future__ import annotations

import json
import math
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import torch

from autograder.kernel.evidence import compare_outputs, dump_inputs, dump_outputs, load_inputs
from autograder.pipeline.speed import (DeclarationError, SpeedTest, Speedup, clean_source,
                                       declaration, points_for, t975, t999)
from autograder.pipeline.timing import Audit, Reply, SpeedProblem, round_seeds
from tests.helpers import checkout_env

ROOT = Path(__file__).resolve().parent.parent
COURSE = ROOT / "tests" / "autograder_fixtures" / "speed_course"

DECLARED = '''
import torch
def slow(x):
    return torch.stack([r.exp() / r.exp().sum() for r in x])
def draw(seed):
    return (torch.randn(8, 4, generator=torch.Generator().manual_seed(seed)),)
SPEED_TEST = {"candidate": "fast", "baseline": "slow", "inputs": "draw",
              "points": {"cpu": [1.5, 4]}, "seconds": 2}
'''


def test_a_declaration_is_read_from_the_cell():
    test = declaration(DECLARED)
    assert (test.candidate, test.baseline, test.inputs) == ("fast", "slow", "draw")
    assert test.points == {"cpu": (1.5, 4.0)} and test.seconds == 2.0
    assert test.rounds >= 2 and test.precision == 0.05
    assert SpeedTest.from_dict(test.to_dict()) == test
    assert test.check == ""  # the baseline's outputs are the expected ones
    checked = declaration(DECLARED.replace('"seconds": 2', '"seconds": 2, "check": "slow"'))
    assert checked.check == "slow" and SpeedTest.from_dict(checked.to_dict()) == checked
    assert declaration("assert f(1) == 2") is None


@pytest.mark.parametrize("change, says", [
    ('"points": {"cpu": [1.5, 4]}', None),
    ('"points": {"tpu": [1.5, 4]}', "maps devices"),
    ('"points": {"cpu": [4, 1.5]}', "0 < low < high"),
    ('"points": {"cpu": [1.5]}', "[low, high]"),
    ('"points": {"cuda": [1.5, 10]}', None),
])
def test_a_bad_schedule_is_the_instructors_error(change, says):
    source = DECLARED.replace('"points": {"cpu": [1.5, 4]}', change)
    if says is None:
        assert declaration(source) is not None
    else:
        with pytest.raises(DeclarationError, match=re_escape(says)):
            declaration(source)


def re_escape(text: str) -> str:
    import re
    return re.escape(text)


@pytest.mark.parametrize("source, says", [
    (DECLARED.replace('"inputs": "draw",', ""), "missing inputs"),
    (DECLARED.replace('"seconds": 2', '"seconds": 2, "speed": 3'), "unknown speed"),
    (DECLARED.replace('"baseline": "slow"', '"baseline": "slower"'), "not defined in the cell"),
    (DECLARED.replace('SPEED_TEST = {', 'SPEED_TEST = dict(**{').replace('"seconds": 2}',
                                                                          '"seconds": 2})'),
     "literal dict"),
    (DECLARED + "\nSPEED_TEST = {}", "assigned 2 times"),
    (DECLARED.replace('"seconds": 2', '"seconds": -2'), "positive number"),
    (DECLARED.replace('"seconds": 2', '"rounds": 0'), "positive integer"),
    (DECLARED.replace('"seconds": 2', '"seconds": 2, "check": "exact"'), "not defined in the cell"),
    (DECLARED.replace('"seconds": 2', '"seconds": 2, "check": 3'), "must name a function"),
])
def test_every_malformed_declaration_says_what_is_wrong(source, says):
    with pytest.raises(DeclarationError, match=re_escape(says)):
        declaration(source)


def test_the_clean_kernel_runs_setup_and_all_but_what_calls_the_candidate():
    cell = "x = torch.ones(3)\nassert torch.equal(fast(x), x)\n" + DECLARED
    kept = clean_source("import torch\nSIZE = 4", cell, "fast")
    assert kept.startswith("import torch\nSIZE = 4")
    assert "fast(x)" not in kept and "x = torch.ones(3)" in kept
    assert "def slow" in kept and "SPEED_TEST" in kept
    namespace: dict = {}
    exec(kept, namespace)  # it runs on its own
    assert set(namespace) >= {"slow", "draw", "SPEED_TEST"}


def test_the_interval_narrows_with_steady_rounds_and_its_centre_is_a_trimmed_geometric_mean():
    steady = Speedup()
    for candidate, baseline in [(1.0, 4.0), (1.0, 4.1), (1.02, 4.0), (0.99, 3.95), (1.0, 4.02)]:
        steady.add(candidate, baseline)
    low, centre, high = steady.interval()
    ratios = sorted(b / c for c, b in steady.pairs)[1:-1]  # 20 % of 5 rounds: one each end
    assert centre == pytest.approx(math.exp(sum(map(math.log, ratios)) / len(ratios)))
    assert low < centre < high and steady.precise(0.05)
    noisy = Speedup()
    for candidate, baseline in [(1.0, 4.0), (1.0, 2.0), (1.0, 6.0)]:
        noisy.add(candidate, baseline)
    assert not noisy.precise(0.05)
    assert steady.seconds() == (1.0, 4.0)
    with pytest.raises(ValueError):
        Speedup().add(0.0, 1.0)
    assert t975(1) > t975(5) > t975(30) > t975(1000) > 1.96
    assert t999(4) > t999(11) == t999(10) > t999(1000) > 3.09


def test_a_round_another_program_slowed_moves_the_speedup_little():
    rounds = [(1.0, 4.0 + 0.01 * (n % 5)) for n in range(20)]
    clean, disturbed = Speedup(), Speedup()
    for pair in rounds:
        clean.add(*pair)
    for number, (candidate, baseline) in enumerate(rounds):
        # two rounds in which the candidate's calls shared their CPU (three times as slow)
        disturbed.add(candidate * (3 if number in (4, 11) else 1), baseline)
    assert disturbed.interval()[1] == pytest.approx(clean.interval()[1], rel=0.01)
    assert disturbed.precise(0.05)
    plain_mean = math.exp(statistics.fmean(math.log(b / c) for c, b in disturbed.pairs))
    assert plain_mean < 0.92 * clean.interval()[1]  # what the untrimmed mean would have said


@pytest.mark.parametrize("speedup, expected", [
    (0.5, 0), (1.5, 0), (2.0, 0), (2.2, 1), (2.75, 2), (3.99, 3), (4.0, 4), (9.0, 4)])
def test_points_are_linear_between_the_two_speedups_in_whole_steps(speedup, expected):
    assert points_for(speedup, (1.5, 4.0), 4, step=1.0) == expected


def test_points_in_finer_steps():
    assert points_for(2.75, (1.5, 4.0), 4, step=0.5) == 2.0
    assert points_for(2.9, (1.5, 4.0), 4, step=0.5) == 2.0
    assert points_for(3.0, (1.5, 4.0), 4, step=0.5) == 2.0  # 2.4 rounded down
    assert points_for(3.25, (1.5, 4.0), 4, step=0.5) == 2.5


class _Lazy(torch.Tensor):
    pass


@pytest.mark.parametrize("got, says", [
    (lambda x: x.clone(), None),
    (lambda x: x + 1e-7, None),
    (lambda x: x.double(), "float64"),
    (lambda x: x.T.contiguous(), "(4, 5)"),
    (lambda x: torch.where(torch.arange(20).reshape(5, 4) == 19, x + 1, x), "flat index 19"),
    (lambda x: x.as_subclass(_Lazy), "not a plain tensor"),
    (lambda x: (x, x), "2 tensors"),
])
def test_outputs_are_compared_element_by_element_after_a_round_trip_through_the_file(
        tmp_path, got, says):
    x = torch.rand(5, 4)
    dump_outputs([x, 2.5], str(tmp_path / "mine"))
    dump_outputs([got(x), 2.5], str(tmp_path / "theirs"))
    problem = compare_outputs(str(tmp_path / "theirs"), str(tmp_path / "mine"), 1e-5, 1e-6)
    if says is None:
        assert problem is None
    else:
        assert problem is not None and says in problem and "call 1" in problem


def test_every_dtype_crosses_the_file_unchanged(tmp_path):
    values = [torch.arange(6, dtype=dtype).reshape(2, 3) for dtype in
              (torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.uint8)]
    values += [torch.tensor([True, False]), torch.zeros(0, 3), (torch.ones(2), 7)]
    dump_outputs(values, str(tmp_path / "out"))
    assert compare_outputs(str(tmp_path / "out"), str(tmp_path / "out"), 0.0, 0.0) is None
    assert "could not be read back" in compare_outputs(str(tmp_path / "missing"),
                                                       str(tmp_path / "out"), 0, 0)
    (tmp_path / "short").write_bytes((tmp_path / "out").read_bytes()[:40])
    assert compare_outputs(str(tmp_path / "short"), str(tmp_path / "out"), 0, 0) is not None


def test_the_audit_allows_noise_and_catches_work_moved_out_of_the_timed_calls():
    honest = Audit("cpu")
    for _ in range(20):
        honest.add([Reply(True, 0.01, 0.012)], [Reply(True, 0.01, 0.010)], timed=0.05)
    honest.check_totals()
    import random
    noise = random.Random(1)  # loading the inputs: 7 ms, +-3 ms either way
    noisy = Audit("cpu")
    for _ in range(60):
        noisy.add([Reply(True, 0.01, 0.007 + noise.uniform(-0.003, 0.003))],
                  [Reply(True, 0.01, 0.007 + noise.uniform(-0.003, 0.003))], timed=0.013)
    noisy.check_totals()
    moved = Audit("cpu")
    with pytest.raises(SpeedProblem, match="outside the timed calls"):
        for _ in range(20):  # a little each round: only the totals show it
            moved.add([Reply(True, 0.01, 0.030)], [Reply(True, 0.01, 0.010)], timed=0.05)
        moved.check_totals()
    with pytest.raises(SpeedProblem, match="in one round"):
        Audit("cpu").add([Reply(True, 0.01, 0.2)], [Reply(True, 0.01, 0.01)], timed=0.05)
    on_gpu = Audit("cuda")  # queued device work shows as wall time, not CPU time
    with pytest.raises(SpeedProblem, match="wall-clock"):
        on_gpu.add([Reply(True, 0.2, 0.01)], [Reply(True, 0.01, 0.01)], timed=0.05)


def test_inputs_written_by_the_clean_kernel_are_mapped_back_as_they_were(tmp_path):
    generator = torch.Generator().manual_seed(0)
    calls = [(torch.randn(2, 3, 5, generator=generator), 7, 0.5, None, True),
             (torch.arange(5), torch.ones(3, dtype=torch.bfloat16), torch.tensor(2.0)),
             (torch.zeros(0), torch.randn(4, 4, generator=generator).t())]
    path = str(tmp_path / "inputs.bin")
    dump_inputs(calls, path)
    back = load_inputs(path)
    assert len(back) == len(calls)
    for written, read in zip(calls, back):
        assert type(read) is tuple and len(read) == len(written)
        for mine, theirs in zip(written, read):
            if isinstance(mine, torch.Tensor):
                assert theirs.dtype == mine.dtype and torch.equal(theirs, mine)
                assert theirs.data_ptr() % 64 == 0  # aligned, as vectorised code likes
            else:
                assert type(theirs) is type(mine) and theirs == mine
    back[0][0].add_(1)  # a call may write to its inputs: its own copy, not the file
    assert torch.equal(load_inputs(path)[0][0], calls[0][0])
    with pytest.raises(TypeError, match="tensors or numbers"):
        dump_inputs([("text",)], path)


def test_each_call_of_each_round_has_its_own_seed():
    seeds = round_seeds(5, 0, 8) + round_seeds(5, 1, 8) + round_seeds(6, 0, 8)
    assert len(set(seeds)) == len(seeds) == 24
    assert round_seeds(5, 1, 8) == round_seeds(5, 1, 8)


# ---------------------------------------------------------------------------------------------
# End to end: the fixture course graded as an instructor would

# The fixture course's answers for the GPU test (the real assignment's corpus of tricks is in
# tests/hostile_speed_submissions.py, graded by tests/test_autograder_hostile_speed.py).
FIXTURE_ANSWERS = {
    "fast": "def row_softmax(x):\n    return torch.softmax(x, dim=1)",
    "wrong": "def row_softmax(x):\n    return torch.softmax(x, dim=0 if x.shape[0] > 10 else 1)",
}


@pytest.mark.integration
def test_a_malformed_declaration_stops_grade_before_any_submission(tmp_path):
    course = tmp_path / "course"
    shutil.copytree(COURSE, course)
    path = course / "solutions" / "speedy" / "speedy.ipynb"
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        cell.source = cell.source.replace('"cpu": [1.5, 3.0]', '"cpu": [3.0, 1.5]')
    nbformat.write(nb, path)
    (course / "submitted" / "ann" / "speedy").mkdir(parents=True)
    nbformat.write(nb, course / "submitted" / "ann" / "speedy" / "speedy.ipynb")
    done = subprocess.run([sys.executable, "-m", "autograder", "grade", "submitted",
                           "--assignment", "speedy", "--out", "graded", "--no-progress"],
                          cwd=course, capture_output=True, text=True, timeout=300,
                          env=checkout_env())
    assert done.returncode == 2, done.stdout + done.stderr
    assert "speedy.ipynb: test cell 'speed': SPEED_TEST['points']['cpu'] must be [low, high]" \
        in done.stderr
    assert not (course / "graded").exists()


@pytest.mark.gpu
@pytest.mark.integration
def test_on_cuda_the_speed_test_is_timed_on_the_gpu(tmp_path):
    """``--device cuda``: the inputs drawn and the calls made on the GPU inside the timed
    request, the L2 cache cleared before it, the report copying from the device; the fast
    answer gets the CUDA schedule's points, a wrong one none."""
    course = tmp_path / "course"
    shutil.copytree(COURSE, course)
    env = checkout_env()
    subprocess.run([sys.executable, "-m", "nbgrader", "generate_assignment", "speedy", "--force"],
                   cwd=course, env=env, check=True, capture_output=True, timeout=300)
    released = nbformat.read(course / "exercises" / "speedy" / "speedy.ipynb", as_version=4)
    for student, answer in FIXTURE_ANSWERS.items():
        nb = nbformat.from_dict(released)
        for cell in nb.cells:
            if cell.metadata.get("nbgrader", {}).get("grade_id") == "answer":
                cell.source = answer
        (course / "submitted" / student / "speedy").mkdir(parents=True)
        nbformat.write(nb, course / "submitted" / student / "speedy" / "speedy.ipynb")
    done = subprocess.run([sys.executable, "-m", "autograder", "grade", "submitted",
                           "--assignment", "speedy", "--out", "graded", "--device", "cuda",
                           "--no-progress"], cwd=course, env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = {s: json.loads((course / "graded" / s / "speedy" / "speedy.results.json")
                             .read_text())["tests"][0] for s in FIXTURE_ANSWERS}
    fast = results["fast"]
    assert fast["extra_data"]["speed"]["device"] == "cuda", fast["output"]
    assert fast["score"] > 0 and "on the CUDA" in fast["output"], fast["output"]
    assert results["wrong"]["score"] == 0 and "wrong result" in results["wrong"]["output"]
