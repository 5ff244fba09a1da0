"""The benchmark scripts' own code: benchmarks/assignment_throughput.py's table and verdicts."""
from __future__ import annotations

import csv
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from autograder.sandbox.imports import imported_modules
from tests.helpers import checkout_env

ROOT = Path(__file__).resolve().parent.parent


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


throughput = load("assignment_throughput")


def test_table_has_one_line_per_assignment_with_its_numbers():
    rows = [throughput.Row("data_parallel", 1000, 254.0, 0.48, 1000, 1000),
            throughput.Row("gradient_bucketing", 4, 10.0, None, 3, None)]
    lines = throughput.table(rows).splitlines()
    assert lines[0].split()[:4] == ["assignment", "copies", "wall", "s"]
    assert set(lines[1]) == {"-"}
    assert lines[2].split() == ["data_parallel", "1000", "254.0", "0.254", "0.48", "1000/1000",
                                "1000"]
    assert lines[3].split() == ["gradient_bucketing", "4", "10.0", "2.500", "?", "3/4", "?"]


def write_grades(path: Path, rows: list) -> None:
    fields = ["student_id", "assignment", "notebook", "score", "max_score", "status", "message",
              "seconds"]
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            writer.writerow(dict(zip(fields, row)))


def test_a_copy_without_full_marks_or_without_a_row_is_a_problem(tmp_path):
    grades = tmp_path / "grades.csv"
    write_grades(grades, [("s0001", "a", "a", "9", "9", "graded", "ok", "1.0"),
                          ("s0002", "a", "a", "7", "9", "graded", "lost 2", "3.0"),
                          ("s0003", "a", "a", "0", "9", "timeout", "too slow", "2.0")])
    full, median, problems = throughput.verdicts(grades, ["s0001", "s0002", "s0003", "s0004"])
    assert full == 1
    assert median == 2.0
    assert [line.split(":")[0] for line in problems] == ["s0002", "s0003", "s0004"]


def test_copies_differ_so_each_draws_its_own_seed(tmp_path):
    names = throughput.ASSIGNMENTS
    course = throughput.make_course(tmp_path, {"data_parallel": names["data_parallel"]})
    students = throughput.hand_in(course, "data_parallel", names["data_parallel"], 3)
    files = [course / "submitted" / who / "data_parallel" / "data_parallel.ipynb"
             for who in students]
    assert len({path.read_bytes() for path in files}) == 3
    for who, path in zip(students, files):
        cells = json.loads(path.read_text())["cells"]
        answers = [c for c in cells if c["metadata"].get("nbgrader", {}).get("solution")]
        assert "".join(answers[0]["source"]).endswith(f"# handed in by {who}")
        assert not any("### BEGIN SOLUTION" in "".join(c["source"]) for c in cells)
    assert throughput.seeds(course, "data_parallel", "data_parallel", students) == 3


@pytest.mark.integration
def test_two_copies_of_one_assignment_print_a_full_row(capsys):
    """The whole script, small: two copies of data_parallel graded by the real grader."""
    assert throughput.main(["--copies", "2", "--assignment", "data_parallel", "--jobs", "2"]) == 0
    printed = capsys.readouterr().out
    row = next(line for line in printed.splitlines() if line.startswith("data_parallel "))
    fields = row.split()
    assert fields[1] == "2" and fields[5] == "2/2" and fields[6] == "2", printed
    wall, per_submission = float(fields[2]), float(fields[3])
    assert wall > 0 and per_submission == pytest.approx(wall / 2, abs=0.06)


# Modules PyTorch imports lazily, on first use, at a cost of seconds in every process that uses
# them (the grader's kernels and checks processes are forked from a server that imported torch
# only): sympy through Module.to_empty() on meta tensors, torch._dynamo and triton through
# torch.optim. gradient_bucketing's tests once paid them twice per submission (5 s instead of 1).
LAZY = ("sympy", "torch._dynamo", "triton")
RUN_CELLS = """
import json, sys
import torch
nb = json.load(open(sys.argv[1]))
scope = {"__name__": "__main__"}
for cell in nb["cells"]:
    if cell["cell_type"] == "code":
        exec("".join(cell["source"]), scope)  # the test cells' probes and checks, in one go
print(json.dumps([name for name in sys.argv[2:] if name in sys.modules]))
"""


@pytest.mark.integration
@pytest.mark.parametrize("assignment", sorted(throughput.ASSIGNMENTS))
def test_grading_an_assignment_imports_nothing_slow_beyond_torch(assignment, tmp_path):
    notebook = ROOT / "solutions" / assignment / f"{throughput.ASSIGNMENTS[assignment]}.ipynb"
    env = checkout_env(DLPERF_DATA="synthetic", CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([sys.executable, "-c", RUN_CELLS, str(notebook), *LAZY], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    pulled = json.loads(done.stdout.strip().splitlines()[-1])
    # What the notebook imports by name is its subject, not a cost pulled in by the way
    # (fused_layernorm's kernel is Triton's).
    cells = json.loads(notebook.read_text())["cells"]
    own = set(imported_modules("".join(c["source"]) for c in cells if c["cell_type"] == "code"))
    pulled = [name for name in pulled if name not in own]
    assert pulled == [], (f"{assignment}'s cells import {pulled}, seconds per grading process; "
                          "see the comment above LAZY")


submit_load = load("submit_load")


def test_the_learners_mix_and_the_kinds_of_result_expected(tmp_path):
    course = throughput.make_course(tmp_path, {"ring_allreduce": "ring_allreduce"})
    learners = [throughput.student(n + 1) for n in range(20)]
    files = submit_load.hand_in(course, "ring_allreduce", "ring_allreduce", learners)
    kinds = [kind for kind, _ in files.values()]
    assert (kinds.count("correct"), kinds.count("wrong"), kinds.count("broken")) == (14, 4, 2)
    bodies = {who: path.read_bytes() for who, (_, path) in files.items()}
    assert len(set(bodies.values())) == 20  # each its own file, each its own TEST_SEED
    for who, (kind, path) in files.items():
        assert path == course / "submitted" / who / "ring_allreduce" / "ring_allreduce.ipynb"
        if kind == "broken":
            with pytest.raises(ValueError):
                json.loads(bodies[who])
    assert submit_load.expected("correct", "graded", 10, 10)
    assert not submit_load.expected("correct", "graded", 9, 10)
    assert submit_load.expected("wrong", "graded", 9, 10)
    assert not submit_load.expected("wrong", "invalid", 0, 0)
    assert submit_load.expected("broken", "invalid", 0, 0)
    assert not submit_load.expected("broken", "graded", 0, 10)
    assert submit_load.expected("broken", submit_load.REFUSED, 0, 0)  # refused at the upload
    assert not submit_load.expected("correct", submit_load.REFUSED, 0, 0)
    assert submit_load.percentile([5, 1, 4, 2, 3], 0.95) == 5
    assert submit_load.percentile(list(range(1, 101)), 0.95) == 95


@pytest.mark.integration
def test_four_learners_hand_in_to_the_real_service_and_all_get_feedback(capsys):
    """The whole script, small: the real service, four learners, then grade on their files."""
    assert submit_load.main(["--learners", "4", "--spread", "2", "--alone", "1",
                             "--deadline", "300"]) == 0
    printed = capsys.readouterr().out
    header = next(line for line in printed.splitlines() if line.lstrip().startswith("learners"))
    row = printed.splitlines()[printed.splitlines().index(header) + 2].split()
    assert row[0] == "4" and len(row) == 9, printed
    wall, median, p95, rate, grade_wall, grade_rate, ratio, alone = map(float, row[1:])
    assert 0 < median <= p95 <= wall + 1 and alone > 0 and grade_wall > 0
    assert rate == pytest.approx(4 / wall, rel=0.05) and ratio == pytest.approx(
        rate / grade_rate, rel=0.05)
