"""The parts of scripts/gpu-run that judge what ran (the whole run: tests/test_gpu_kit.py)."""
from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import gpu_run  # noqa: E402  (scripts/ is no package)


def results(tmp_path: Path, scores: dict, skipped=()) -> Path:
    tests = [{"name": name, "score": score,
              "extra_data": {"points": points,
                             "outcome": "skipped" if name in skipped else "graded"}}
             for name, (score, points) in scores.items()]
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"score": sum(s for s, _ in scores.values()), "tests": tests}))
    return path


def test_a_case_is_as_expected_only_when_it_loses_exactly_its_points(tmp_path):
    path = results(tmp_path, {"visible": (2, 2), "hidden": (0, 3), "x_gpu": (0, 2)},
                   skipped={"x_gpu"})
    judge = lambda losses: gpu_run.judge_case("a", "s", losses, path, 0, cuda=False)["outcome"]
    assert judge({"hidden": 3}) == "as expected"
    assert judge({"hidden": 2}) == judge({}) == "unexpected"
    # zero losses listed change nothing; a GPU test skipped without CUDA loses nothing
    assert judge({"hidden": 3, "visible": 0}) == judge({"hidden": 3, "x_gpu": 2}) == "as expected"


def test_only_gpu_tests_may_be_skipped_and_only_without_cuda(tmp_path):
    gpu_skipped = results(tmp_path, {"hidden": (3, 3), "x_gpu": (0, 2)}, skipped={"x_gpu"})
    assert gpu_run.judge_case("a", "s", {}, gpu_skipped, 0, cuda=True)["outcome"] == "unexpected"
    other_skipped = results(tmp_path, {"hidden": (0, 3), "x_gpu": (0, 2)}, skipped={"hidden"})
    assert gpu_run.judge_case("a", "s", {"x_gpu": 2}, other_skipped, 0, cuda=True)["outcome"] \
        == "unexpected"


def test_the_unedited_release_must_lose_every_counted_point(tmp_path):
    lost_all = results(tmp_path, {"visible": (0, 2), "hidden": (0, 3)})
    assert gpu_run.judge_case("a", "u", None, lost_all, 0, cuda=True)["outcome"] == "as expected"
    kept_one = results(tmp_path, {"visible": (2, 2), "hidden": (0, 3)})
    assert gpu_run.judge_case("a", "u", None, kept_one, 0, cuda=True)["outcome"] == "unexpected"


def test_a_surprise_keeps_the_lost_tests_messages_and_every_speed_measurement(tmp_path):
    # What the GPU machine's one run leaves for the next session, which has no GPU.
    path = tmp_path / "results.json"
    speed = {"device": "cuda", "clock": "wall", "speedup": 21.5, "low": 20.1, "high": 23.0}
    path.write_text(json.dumps({"score": 6, "tests": [
        {"name": "visible", "score": 2, "output": "",
         "extra_data": {"points": 2, "outcome": "passed"}},
        {"name": "speed", "score": 0, "output": "21.5 times as fast" + "." * 2000,
         "extra_data": {"points": 4, "outcome": "failed", "speed": speed}}]}))
    surprise = gpu_run.judge_case("a", "solution", {}, path, 0, cuda=True)
    assert surprise["outcome"] == "unexpected"
    assert surprise["why"] == {"speed": ("21.5 times as fast" + "." * 2000)[:800]}
    assert surprise["speed"]["speed"]["speedup"] == 21.5
    expected = gpu_run.judge_case("a", "slow", {"speed": 4}, path, 0, cuda=True)
    assert expected["outcome"] == "as expected" and "why" not in expected
    assert expected["speed"]["speed"]["low"] == 20.1


def test_a_case_the_grader_never_wrote_is_not_graded(tmp_path):
    case = gpu_run.judge_case("a", "s", {}, tmp_path / "missing.json", 1, cuda=False)
    assert case["outcome"] == "not graded" and case["grader_exit"] == 1


def test_junit_counts_read_pytests_report(tmp_path):
    report = tmp_path / "report.xml"
    report.write_text('<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="5" '
                      'failures="1" errors="0" skipped="3"></testsuite></testsuites>')
    assert gpu_run.junit_counts(report) == {"tests": 5, "failures": 1, "errors": 0,
                                            "skipped": 3, "passed": 1}
    assert gpu_run.junit_counts(tmp_path / "none.xml") == {}


def test_chapters_come_in_the_books_order():
    toc = re.findall(r"- file: (chapters/[\w-]+)", (ROOT / "_toc.yml").read_text())
    assert gpu_run.chapters() == toc and toc
    assert gpu_run.title("chapters/hybridize").startswith("Compilers")


def test_a_chapter_runs_from_its_page_or_from_its_published_notebook(tmp_path):
    """The .md path (a GPU machine) and the published path (the stand-in: tests/test_gpu_kit.py)."""
    import nbformat
    (tmp_path / "out").mkdir()
    run = gpu_run.Run(tmp_path / "out", budget=120)
    made = tmp_path / "made.ipynb"
    assert gpu_run.chapter_notebook(run, "chapters/hybridize", made, None, dict(os.environ)) == 0
    code = [c.source for c in nbformat.read(made, as_version=4).cells if c.cell_type == "code"]
    assert code and "import dlperf" in "\n".join(code)
    published = tmp_path / "published"
    published.mkdir()
    (published / "hybridize.ipynb").write_text("{}")
    copied = tmp_path / "copied.ipynb"
    assert gpu_run.chapter_notebook(run, "chapters/hybridize", copied, published, {}) == 0
    assert copied.read_text() == "{}"
    assert gpu_run.chapter_notebook(run, "chapters/profiling", copied, published, {}) == 1
    run.log.close()


def test_gpu_runs_are_recorded_for_the_status_page_and_cpu_runs_are_not(tmp_path, monkeypatch):
    from coursebook import status
    recorded = tmp_path / "gpu-runs.json"
    recorded.write_text('{"runs": []}\n')
    monkeypatch.setattr(status, "GPU_RUNS", recorded)
    out = tmp_path / "out"
    out.mkdir()
    run = gpu_run.Run(out, budget=60)
    import dlperf  # the line a page prints on one GPU, made by the function pages call
    monkeypatch.setattr(dlperf, "gpu_count", lambda: 1)
    monkeypatch.setattr(dlperf, "describe", lambda device: "NVIDIA H100 80GB HBM3 (cuda:0)")
    line = dlperf.environment_line(dlperf.run_profile())
    on_gpu = {"page": "chapters/hardware", "title": "Hardware", "ran_at": "2026-11-23T00:00:00+00:00",
              "seconds": 12.5, "succeeded": True, **status.environment(line), "driver": "580.159.04",
              "cuda": "13.0"}
    on_cpu = {**on_gpu, "page": "chapters/hybridize", "hardware": "CPU: AMD EPYC"}
    step = gpu_run.record_gpu_runs(run, [on_gpu, on_cpu])
    assert step["gpu_runs"] == 1
    written = json.loads((out / "gpu-runs.json").read_text())["runs"]
    assert written == json.loads(recorded.read_text())["runs"] == [on_gpu]
    assert on_gpu["hardware"] == "1 GPU: NVIDIA H100 80GB HBM3 (cuda:0)"


def test_a_pages_environment_is_read_from_what_it_printed(tmp_path, monkeypatch):
    """The record's hardware is the page's line as printed, not the notebook's JSON text."""
    import dlperf
    import nbformat
    from coursebook.status import environment, gpu_runs
    from nbformat.v4 import new_code_cell, new_notebook, new_output
    monkeypatch.setattr(dlperf, "gpu_count", lambda: 2)
    monkeypatch.setattr(dlperf, "describe", lambda device: "NVIDIA H100 80GB HBM3 (cuda:0)")
    line = dlperf.environment_line(dlperf.run_profile())
    cell = new_code_cell("profile = dlperf.page_setup()",
                         outputs=[new_output("stream", name="stdout", text=line + "\nmore\n")])
    executed = tmp_path / "page.ipynb"
    nbformat.write(new_notebook(cells=[cell]), executed)
    found = environment(gpu_run.printed(executed))
    assert found["hardware"] == "2 GPUs: NVIDIA H100 80GB HBM3 (cuda:0)"
    assert gpu_runs([{"succeeded": True, **found}])


def test_a_line_printed_in_two_pieces_is_read_whole(tmp_path):
    """A kernel can send ``print("a:", [1])`` as two stream messages; neither the pages' tests
    nor gpu-run may read it as two lines."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook, new_output
    from tests.helpers import glued
    from coursebook.executed import page_text
    pieces = [new_output("stream", name="stdout", text="activation bytes per token:"),
              new_output("stream", name="stdout", text=" [10256, 10256]\nwidth: 64\n")]
    nb = new_notebook(cells=[new_code_cell("print(...)", outputs=pieces)])
    assert "activation bytes per token: [10256, 10256]" in page_text(nb).splitlines()
    assert glued(nb)["width"] == "64"
    path = tmp_path / "page.ipynb"
    nbformat.write(nb, path)
    assert gpu_run.printed(path).splitlines()[0] == "activation bytes per token: [10256, 10256]"


@pytest.mark.integration  # three real kernels
def test_chapters_run_two_at_a_time_are_reported_in_the_books_order(tmp_path, monkeypatch):
    """``--chapter-jobs 2`` (the stand-in): the first page finishes only after the second has
    run, yet the record, the runs and the archive list the pages in the book's order."""
    import zipfile

    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook
    pages = ["chapters/slow", "chapters/quick", "chapters/broken"]
    monkeypatch.setattr(gpu_run, "chapters", lambda: pages)
    monkeypatch.setattr(gpu_run, "title", lambda page: page)
    published = tmp_path / "published"
    published.mkdir()
    flag = tmp_path / "quick-ran"  # the first page waits for the second: they must overlap
    waits = (f"import pathlib, time\nfor _ in range(600):\n    if pathlib.Path({str(flag)!r})"
             f".exists():\n        break\n    time.sleep(0.1)\nelse:\n    raise SystemExit(1)")
    for page, code in zip(pages, [waits, f"open({str(flag)!r}, 'w').close()", "1 / 0"]):
        nb = new_notebook(cells=[new_code_cell(code)],
                          metadata={"kernelspec": {"name": "python3", "language": "python",
                                                   "display_name": "Python 3"}})
        nbformat.write(nb, published / f"{page.split('/')[-1]}.ipynb")
    (tmp_path / "out").mkdir()
    run = gpu_run.Run(tmp_path / "out", budget=300)
    record, runs, executed = gpu_run.run_chapters(run, tmp_path / "no-site", "quick", {},
                                                  published, reserve=0, jobs=2)
    run.log.close()
    assert [(c["page"], c["outcome"]) for c in record["chapters"]] == [
        ("chapters/slow", "passed"), ("chapters/quick", "passed"), ("chapters/broken", "failed")]
    assert record["outcome"] == "failed" and record["jobs"] == 2
    assert [r["page"] for r in runs] == pages  # papermill writes a failed page's notebook too
    assert [r["succeeded"] for r in runs] == [True, True, False]
    with zipfile.ZipFile(tmp_path / "out" / "chapters.zip") as archive:
        assert archive.namelist() == ["slow.ipynb", "quick.ipynb", "broken.ipynb"]
