"""autograder.commands.mutants and ``python -m autograder mutants``: mutation analysis for instructors."""
from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from autograder.commands.mutants import (EQUIVALENT_FILE, Equivalent, classify, format_report,
                                mutants_of, read_equivalents, solution_code,
                                solution_lines)
from tests.autograder_fixtures.submissions import COURSE

CODE = '''def roofline_time(flops, bytes_moved, peak_flops, bandwidth=2.0):
    """(seconds, bound): the docstring is no site of a mutant."""
    if flops < 0 or bytes_moved < 0:
        raise ValueError("counts must not be negative")  # a message for people, not a rule
    computing, moving = flops / peak_flops, bytes_moved / bandwidth
    if moving > computing and not flops == 0:
        return moving, "memory"
    return max(computing, -moving), f"compute {flops}"
'''


def changes(code=CODE):
    return {(m.line, m.operator, m.changed) for m in mutants_of("roofline_answer", code)}


def test_each_kind_of_change_is_made_on_the_syntax_tree():
    made = changes()
    expected = {
        (3, "compare", "if flops <= 0 or bytes_moved < 0:"),               # moved by one
        (3, "boolean", "if flops < 0 and bytes_moved < 0:"),
        (3, "constant", "if flops < 1 or bytes_moved < 0:"),
        (3, "negate", "if not (flops < 0 or bytes_moved < 0):"),
        (4, "statement", "(line dropped)"),
        (5, "binary", "computing, moving = (flops * peak_flops, bytes_moved / bandwidth)"),
        (6, "compare", "if moving > computing and (not flops != 0):"),
        (6, "unary", "if moving > computing and flops == 0:"),
        (7, "return", "(line dropped)"),
        (7, "constant", "return (moving, 'memory_')"),
        (8, "arguments", "return (max(-moving, computing), f'compute {flops}')"),
        (1, "constant", "def roofline_time(flops, bytes_moved, peak_flops, bandwidth=4.0):"),
    }
    assert expected <= made, expected - made
    texts = " ".join(changed for _, _, changed in made)
    assert "docstring" not in texts and "negative_" not in texts and "compute {flops}_" not in texts


def test_every_mutant_compiles_differs_and_has_a_stable_id():
    mutants = mutants_of("roofline_answer", CODE)
    assert len({m.code for m in mutants}) == len(mutants) > 20
    for mutant in mutants:
        compile(mutant.code, "mutant", "exec")
        assert mutant.code != CODE
        assert mutant.id == f"roofline_answer:{mutant.line}:{mutant.column}:{mutant.operator}"
        assert mutant.original == CODE.splitlines()[mutant.line - 1].strip()
    assert [m.id for m in mutants] == [m.id for m in mutants_of("roofline_answer", CODE)]


def test_only_what_the_learner_writes_is_mutated():
    source = ('class Timer:\n    def __init__(self, start=0):\n        self.start = start\n\n'
              '    def stop(self, now):\n        ### BEGIN SOLUTION\n        return now - self.start\n'
              '        ### END SOLUTION\n')
    assert solution_lines(source) == {6}
    assert solution_lines("x = 1\n") is None
    made = mutants_of("timer", source)
    assert {m.line for m in made} == {6} and {m.operator for m in made} == {"binary", "return"}
    assert all("### " not in m.code for m in made)


def test_solution_markers_are_removed_and_the_code_kept():
    assert solution_code("def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION") \
        == "def f():\n    return 1\n"


def test_classify_kills_survives_and_justifies():
    mutants = mutants_of("roofline_answer", CODE)
    a, b, c, d = mutants[:4]
    scores = {a.id: [2.0], b.id: [4.0], c.id: [4.0], d.id: [None]}  # d: an error or a time-out
    marked = {c.id: Equivalent(c.id, c.original, "same behaviour"),
              "roofline_answer:99:0:binary": Equivalent("roofline_answer:99:0:binary", "x", "gone")}
    report = classify("predict", mutants[:4], scores, 4.0, 4.0, marked)
    assert report.killed == [a, d] and report.survived == [b]
    assert [m for m, _ in report.equivalent] == [c]
    assert [e.id for e in report.stale] == ["roofline_answer:99:0:binary"]
    assert not report.ok
    # an entry whose line changed since it was written no longer justifies its mutant
    moved = {c.id: Equivalent(c.id, "some other line", "same behaviour")}
    again = classify("predict", mutants[:4], scores, 4.0, 4.0, moved)
    assert c in again.survived and [e.id for e in again.stale] == [c.id]


def test_a_mutant_is_killed_only_if_every_seed_kills_it():
    """Each copy of a mutant is graded with its own TEST_SEED, as different learners' files
    are: one that keeps full marks for some seeds is a survivor, and the report says so."""
    mutants = mutants_of("roofline_answer", CODE)
    a, b, c = mutants[:3]
    scores = {a.id: [2.0, None, 3.0], b.id: [4.0, 2.0, 4.0], c.id: [4.0, 4.0, 4.0]}
    report = classify("predict", [a, b, c], scores, 4.0, 4.0, {})
    assert report.killed == [a] and report.survived == [b, c] and report.seeds == 3
    text = format_report(report)
    assert "(4/4 points, each handed in 3 times)" in text
    assert f"{b.original}  [full marks for 2 of 3 seeds: a seeded case only]" in text
    assert f"{c.original}\n" in text  # kept full marks for every seed: nothing to add


def test_copies_differ_in_their_bytes_not_their_cells():
    import copy
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook
    from autograder.commands.mutants import another_copy
    original = new_notebook(cells=[new_code_cell("x = 1")])
    made = lambda: copy.deepcopy(original)
    first, second = another_copy(made(), 0), another_copy(made(), 1)
    assert nbformat.writes(first) == nbformat.writes(original)
    assert nbformat.writes(second) != nbformat.writes(first)
    assert [c.source for c in second.cells] == [c.source for c in first.cells]


def test_a_bad_equivalents_file_is_a_clear_error(tmp_path):
    (tmp_path / EQUIVALENT_FILE).write_text('[[equivalent]]\nid = "x"\n')
    with pytest.raises(ValueError, match="needs id, line and reason"):
        read_equivalents(tmp_path)
    (tmp_path / EQUIVALENT_FILE).write_text("[[equivalent\n")
    with pytest.raises(ValueError, match="not valid TOML"):
        read_equivalents(tmp_path)
    assert read_equivalents(tmp_path / "absent") == {}


def mutants_command(course, *extra):
    return subprocess.run([sys.executable, "-m", "autograder", "mutants", "demo", "--course",
                           str(course), "--device", "cpu", "--jobs", "2", *extra],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.integration
def test_the_command_grades_every_mutant_and_reads_the_instructors_justifications(tmp_path):
    """The demo's tests never hand mean() an iterator, so dropping ``values = list(values)``
    keeps full marks: marked equivalent here (for the test's sake), it is justified; an entry
    that matches no mutant is stale and fails the run."""
    course = tmp_path / "course"
    shutil.copytree(COURSE, course)
    (course / "solutions" / "demo" / EQUIVALENT_FILE).write_text(
        '[[equivalent]]\nid = "mean:3:4:statement"\nline = "values = list(values)"\n'
        'reason = "the tests hand mean() lists only"\n\n'
        '[[equivalent]]\nid = "squares:9:0:binary"\nline = "gone"\nreason = "old"\n')
    done = mutants_command(course, "--seeds", "2")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "demo: 9 mutants of the reference answers (8/8 points, each handed in 2 times): " \
           "8 killed, 1 equivalent, 0 survived" in done.stdout
    assert "Stale entry in equivalent_mutants.toml: squares:9:0:binary" in done.stdout


def test_the_report_shows_each_survivor_with_its_changed_line():
    mutants = mutants_of("roofline_answer", CODE)
    report = classify("predict", mutants, {m.id: [4.0] for m in mutants[1:]}, 4.0, 4.0, {})
    report.seconds = 1.25
    text = format_report(report)
    assert text.startswith(f"predict: {len(mutants)} mutants of the reference answers "
                           f"(4/4 points): 1 killed, 0 equivalent, {len(mutants) - 1} survived "
                           "(1.2 s)")
    survivor = mutants[1]
    assert f"  {survivor.id}  line {survivor.line}: {survivor.original}\n" \
           f"      {survivor.operator}: {survivor.changed}" in text


def test_the_justifications_stay_with_the_instructor(tmp_path):
    """Beside the notebook, but never copied into a kernel's folder (nor, by nbgrader's
    CourseDirectory.ignore, into the release)."""
    from autograder.layout import Course
    course = tmp_path / "course"
    shutil.copytree(COURSE, course)
    folder = course / "solutions" / "demo"
    (folder / EQUIVALENT_FILE).write_text("")
    (folder / "data.csv").write_text("1,2\n")
    source = Course.discover(course).source_notebooks("demo")["demo"]
    assert [p.name for p in source.support_files()] == ["data.csv"]
    from traitlets.config.loader import PyFileConfigLoader
    from coursebook.cases import ROOT
    ignored = PyFileConfigLoader("nbgrader_config.py", path=str(ROOT)).load_config()
    assert EQUIVALENT_FILE in ignored.CourseDirectory.ignore
