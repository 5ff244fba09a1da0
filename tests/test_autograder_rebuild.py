"""autograder.pipeline.rebuild: the notebook that runs is the instructor's, plus the learner's answers."""
from __future__ import annotations

import copy

import nbformat
import pytest

from autograder.layout import SourceNotebook
from autograder.pipeline.rebuild import (CONTROL_TAGS, SKIP_WHEN_GRADING, grade_id_of, rebuild,
                                visible_part)
from tests.autograder_fixtures.submissions import (GOOD_MEAN, GOOD_SQUARES, SOURCE, answered,
                                                   grade_id, released, tampered)


@pytest.fixture(scope="module")
def reference():
    return SourceNotebook.read(SOURCE, "demo").graded_view


def cell(nb, gid):
    matches = [c for c in nb.cells if grade_id_of(c) == gid]
    assert len(matches) == 1, f"{gid}: {len(matches)} cells"
    return matches[0]


def order(nb):
    return [grade_id_of(c) for c in nb.cells if grade_id_of(c)]


def test_tests_are_the_instructors_with_hidden_tests(reference):
    rebuilt = rebuild(reference, released())
    source = cell(rebuilt.notebook, "test_squares").source
    assert "squares(0) == []" in source  # a hidden test, absent from the release
    assert source == cell(reference, "test_squares").source
    assert cell(rebuilt.notebook, "test_mean_hidden").source.strip()  # empty in the release


def test_learners_answers_are_kept_and_solutions_never_enter(reference):
    rebuilt = rebuild(reference, answered())
    assert cell(rebuilt.notebook, "mean").source == GOOD_MEAN
    unanswered = rebuild(reference, released()).notebook
    text = "\n".join(c.source for c in unanswered.cells)
    assert "NotImplementedError" in cell(unanswered, "squares").source
    assert "BEGIN SOLUTION" not in text
    assert "return [i * i for i in range(n)]" not in text  # the instructor's solution


def test_edited_test_cell_is_restored_and_noted(reference):
    rebuilt = rebuild(reference, tampered())
    assert cell(rebuilt.notebook, "test_squares").source == cell(reference, "test_squares").source
    assert any("test_squares" in note and "edited" in note for note in rebuilt.notes)


def test_deleted_test_cell_is_put_back_after_its_predecessor(reference):
    rebuilt = rebuild(reference, tampered())
    ids = order(rebuilt.notebook)
    assert ids.index("test_mean_hidden") == ids.index("test_mean_stderr") + 1
    assert ids == order(reference)
    assert any("test_mean_hidden" in note and "missing" in note for note in rebuilt.notes)


def test_deleted_answer_cell_comes_back_as_the_stub_not_the_solution(reference):
    nb = released()
    nb.cells = [c for c in nb.cells if grade_id(c) != "squares"]
    rebuilt = rebuild(reference, nb)
    assert cell(rebuilt.notebook, "squares").source == cell(reference, "squares").source
    assert "range(n)" not in cell(rebuilt.notebook, "squares").source
    assert rebuilt.answered["squares"] is False


@pytest.mark.parametrize("tag", sorted(CONTROL_TAGS))
def test_learner_control_tags_have_no_effect(reference, tag):
    nb = answered()
    for c in nb.cells:
        c.metadata["tags"] = [tag, "keep-me"]
    rebuilt = rebuild(reference, nb)
    for c in rebuilt.notebook.cells[2:]:  # past the grader's parameters and setup cells
        tags = c.metadata.get("tags", [])
        if grade_id_of(c) != "test_squares_gpu":
            assert not set(tags) & CONTROL_TAGS, (grade_id_of(c), tags)


def test_learner_added_cells_are_kept_without_metadata(reference):
    nb = answered()
    helper = nbformat.v4.new_code_cell("HELPER = 1", metadata={"tags": ["parameters"],
                                                              "nbgrader": {"grade_id": "fake"}})
    nb.cells.insert(3, helper)
    rebuilt = rebuild(reference, nb)
    mine = [c for c in rebuilt.notebook.cells if c.source == "HELPER = 1"]
    assert len(mine) == 1 and dict(mine[0].metadata) == {}


def test_duplicate_test_cells_are_dropped(reference):
    nb = answered()
    test = next(c for c in nb.cells if grade_id_of(c) == "test_mean")
    twin = copy.deepcopy(test)
    twin.source = "pass"
    nb.cells.append(twin)
    rebuilt = rebuild(reference, nb)
    assert sum(grade_id_of(c) == "test_mean" for c in rebuilt.notebook.cells) == 1
    assert "pass" not in [c.source for c in rebuilt.notebook.cells]
    assert any("dropped a duplicate of cell 'test_mean'" in note for note in rebuilt.notes)


@pytest.mark.parametrize("worked_in", [0, 1])
def test_a_copied_answer_cell_is_graded_where_the_learner_wrote(reference, worked_in):
    nb = answered()
    first = cell(nb, "mean")
    stub = cell(reference, "mean").source
    twin = copy.deepcopy(first)
    nb.cells.insert(nb.cells.index(first) + 1, twin)
    (twin if worked_in == 0 else first).source = stub  # the other copy holds the work
    rebuilt = rebuild(reference, nb)
    graded = [c for c in rebuilt.notebook.cells if grade_id_of(c) == "mean"]
    assert [c.source for c in graded] == [GOOD_MEAN]
    # the copy still holding the stub is left out: run after the work, it would undo it
    assert stub not in [c.source for c in rebuilt.notebook.cells]
    assert any(f"graded copy {worked_in + 1} of 2, the one you wrote in" in note
               for note in rebuilt.notes), rebuilt.notes


def test_of_several_worked_copies_the_last_is_graded(reference):
    nb = answered()
    twin = copy.deepcopy(cell(nb, "mean"))
    twin.source = "def mean(values):\n    return 0"
    nb.cells.append(twin)
    rebuilt = rebuild(reference, nb)
    assert cell(rebuilt.notebook, "mean").source == twin.source
    assert GOOD_MEAN in [c.source for c in rebuilt.notebook.cells if grade_id_of(c) is None]


def test_the_assignments_order_is_restored(reference):
    nb = answered()
    mine = nbformat.v4.new_code_cell("HELPER = 1")
    at = nb.cells.index(cell(nb, "mean"))
    nb.cells.insert(at + 1, mine)
    nb.cells.reverse()  # the helper now comes right *before* the mean answer...
    rebuilt = rebuild(reference, nb)
    known = [grade_id_of(c) for c in rebuilt.notebook.cells if grade_id_of(c)]
    assert known == [grade_id_of(c) for c in reference.cells if grade_id_of(c)]
    # ...and stays among the cells right after the known cell it followed in the submission
    followed = [grade_id_of(c) for c in nb.cells[:nb.cells.index(mine)] if grade_id_of(c)][-1]
    cells = rebuilt.notebook.cells
    at = next(i for i, c in enumerate(cells) if grade_id_of(c) == followed)
    after = []
    for c in cells[at + 1:]:
        if grade_id_of(c):
            break
        after.append(c.source)
    assert "HELPER = 1" in after
    assert any("not in the assignment's order" in note for note in rebuilt.notes)
    assert not any("order" in note for note in rebuild(reference, answered()).notes)


def test_parameters_then_setup_come_first(reference):
    nb = rebuild(reference, answered(), device="cpu", profile="quick").notebook
    first, second = nb.cells[0], nb.cells[1]
    assert first.metadata["tags"] == ["parameters"]
    assert "autograder_device = 'cpu'" in first.source
    assert "autograder_profile = 'quick'" in first.source
    assert "DLPERF_PROFILE" in second.source and "CUDA_VISIBLE_DEVICES" in second.source
    assert sum("parameters" in c.metadata.get("tags", []) for c in nb.cells) == 1
    nbformat.validate(nb)


@pytest.mark.parametrize("device, skipped", [("cpu", True), ("cuda", False)])
def test_gpu_tests_are_skipped_only_without_cuda(reference, device, skipped):
    rebuilt = rebuild(reference, answered(), device=device)
    gpu = [t for t in rebuilt.tests if t.grade_id == "test_squares_gpu"]
    assert len(gpu) == 1 and gpu[0].gpu_only and gpu[0].skipped == skipped
    tags = cell(rebuilt.notebook, "test_squares_gpu").metadata.get("tags", [])
    assert ("skip-execution" in tags) == skipped
    assert rebuilt.max_score == (8.0 if skipped else 9.0)


def test_test_list_knows_points_hidden_tests_and_cell_ids(reference):
    rebuilt = rebuild(reference, answered())
    by_id = {t.grade_id: t for t in rebuilt.tests}
    assert set(by_id) == {"test_squares", "test_mean", "test_mean_stderr", "test_mean_hidden",
                          "test_partial", "test_squares_gpu"}
    assert by_id["test_squares"].points == 2 and by_id["test_squares"].hidden
    assert not by_id["test_mean"].hidden
    ids = {c.get("id") for c in rebuilt.notebook.cells}
    assert all(t.cell_id in ids for t in rebuilt.tests)
    assert [m.grade_id for m in rebuilt.manual] == ["explain"]
    assert rebuilt.manual[0].answered is False


def test_visible_part_drops_the_hidden_region():
    source = "a = 1\n### BEGIN HIDDEN TESTS\nsecret = 2\n### END HIDDEN TESTS\nb = 3"
    assert visible_part(source) == "a = 1\nb = 3"


def test_bad_device_or_profile_is_refused(reference):
    with pytest.raises(ValueError):
        rebuild(reference, released(), device="tpu")
    with pytest.raises(ValueError):
        rebuild(reference, released(), profile="huge")


# --- an answer cell re-created by the learner (its nbgrader metadata gone) -----------------

def recreated(source: str, gid: str = "squares", at_offset: int = 0):
    """The answered release with answer cell ``gid`` replaced by a fresh cell of the
    learner's (no metadata) holding ``source``, ``at_offset`` cells after where it was."""
    nb = answered()
    old = cell(nb, gid)
    at = nb.cells.index(old)
    nb.cells.remove(old)
    nb.cells.insert(at + at_offset, nbformat.v4.new_code_cell(source))
    return nb


def test_a_recreated_answer_cell_is_graded_as_the_answer(reference):
    rebuilt = rebuild(reference, recreated(GOOD_SQUARES))
    graded = cell(rebuilt.notebook, "squares")
    assert graded.source == GOOD_SQUARES and rebuilt.answered["squares"] is True
    # it is not also left as a cell of the learner's own, and the stub never runs
    sources = [c.source for c in rebuilt.notebook.cells]
    assert sources.count(GOOD_SQUARES) == 1
    assert "NotImplementedError" not in graded.source
    assert any("answer cell 'squares' was missing (its nbgrader metadata was gone): graded "
               "your cell 4 in its place, which defines squares" in note
               for note in rebuilt.notes), rebuilt.notes


def test_a_recreated_answer_above_its_place_is_not_undone_by_the_stub(reference):
    # the fresh cell went in right after the setup cell, before the exercise's text
    rebuilt = rebuild(reference, recreated(GOOD_SQUARES, at_offset=-1))
    ids = [grade_id_of(c) for c in rebuilt.notebook.cells]
    graded = cell(rebuilt.notebook, "squares")
    assert graded.source == GOOD_SQUARES
    assert not any("NotImplementedError" in c.source and "def squares" in c.source
                   for c in rebuilt.notebook.cells[ids.index("squares"):])


def test_a_recreated_answer_with_magics_and_shell_commands(reference):
    nb = recreated("%%time\ndef squares(n):\n    return [k * k for k in range(n)]")
    at = next(i for i, c in enumerate(nb.cells) if "%%time" in c.source)
    nb.cells.insert(at, nbformat.v4.new_code_cell("!echo hello\n%time x = 1\nimport math"))
    rebuilt = rebuild(reference, nb)
    assert "def squares" in cell(rebuilt.notebook, "squares").source
    assert "%time x = 1" not in cell(rebuilt.notebook, "squares").source  # defines no squares
    assert any("graded your cell 5 in its place" in note for note in rebuilt.notes), rebuilt.notes


def test_cells_elsewhere_or_without_every_name_are_not_taken(reference):
    far = rebuild(reference, recreated(GOOD_SQUARES, at_offset=4))  # past test_squares
    assert "NotImplementedError" in cell(far.notebook, "squares").source
    assert any("answer cell 'squares' was missing: graded as unanswered" in note
               for note in far.notes)
    other = rebuild(reference, recreated("def cubes(n):\n    return []"))
    assert "NotImplementedError" in cell(other.notebook, "squares").source


@pytest.mark.parametrize("extra, says", [
    ("import math as sys", "also redefines sys of the given code"),
    ("def math():\n    pass", "also redefines math of the given code"),
    ("assert squares(3) == [0, 1, 4], f\"squares(3) gave {squares(3)}, expected [0, 1, 4]\"",
     "repeats the code of a test cell"),
])
def test_a_recreated_answer_that_redefines_helpers_or_copies_a_test_gains_nothing(
        reference, extra, says):
    rebuilt = rebuild(reference, recreated(GOOD_SQUARES + "\n" + extra))
    assert "NotImplementedError" in cell(rebuilt.notebook, "squares").source
    assert rebuilt.answered["squares"] is False
    assert any(says in note and "graded as unanswered" in note for note in rebuilt.notes), \
        rebuilt.notes
    # the same import as the given code is not a redefinition
    same = rebuild(reference, recreated("import math\n" + GOOD_SQUARES))
    assert "return [k * k" in cell(same.notebook, "squares").source


def test_without_any_known_cell_nothing_is_recreated(reference):
    nb = answered()
    for c in nb.cells:
        c.metadata = {}
    rebuilt = rebuild(reference, nb)
    assert "NotImplementedError" in cell(rebuilt.notebook, "squares").source
    assert rebuilt.answered == {"squares": False, "mean": False, "explain": False}


def with_skipped_cell(reference):
    """The reference with one more read-only cell after the setup, tagged by the instructor
    ``skip-when-grading``; it calls the learner's function, as a measure part would."""
    nb = copy.deepcopy(reference)
    meta = {"grade": False, "grade_id": "measure", "locked": True, "schema_version": 3,
            "solution": False}
    nb.cells.insert(2, nbformat.v4.new_code_cell(
        "MEASURED = squares(3)", metadata={"nbgrader": meta, "tags": [SKIP_WHEN_GRADING]}))
    return nb


def test_read_only_cells_tagged_skip_when_grading_do_not_run(reference):
    ref = with_skipped_cell(reference)
    untagged = answered()  # the learner's copy of the cell, its tag removed and edited
    untagged.cells.insert(2, nbformat.v4.new_code_cell("MEASURED = 0", metadata={
        "nbgrader": dict(cell(ref, "measure").metadata["nbgrader"])}))
    for submitted in (answered(), untagged):  # the cell missing, or the learner's copy
        rebuilt = rebuild(ref, submitted)
        skipped = cell(rebuilt.notebook, "measure")
        assert "skip-execution" in skipped.metadata["tags"]
        assert skipped.source == "MEASURED = squares(3)"
        assert "MEASURED" not in rebuilt.setup_code  # never in the trusted checks' process
        assert all("skip-execution" not in c.metadata.get("tags", [])
                   for c in rebuilt.notebook.cells if grade_id_of(c) in ("squares", "mean"))


def test_only_the_instructors_tag_on_a_read_only_cell_skips(reference):
    nb = answered()
    nb.cells.insert(3, nbformat.v4.new_code_cell(
        "MINE = 1", metadata={"tags": [SKIP_WHEN_GRADING]}))  # a learner's own cell
    rebuilt = rebuild(reference, nb)
    mine = [c for c in rebuilt.notebook.cells if c.source == "MINE = 1"]
    assert len(mine) == 1 and "skip-execution" not in mine[0].metadata.get("tags", [])
    # on an answer cell the instructor's tag means nothing: answers always run
    ref = copy.deepcopy(reference)
    cell(ref, "squares").metadata["tags"] = [SKIP_WHEN_GRADING]
    assert "skip-execution" not in cell(rebuild(ref, answered()).notebook, "squares"
                                        ).metadata.get("tags", [])


@pytest.mark.parametrize("device, skipped", [("cpu", True), ("cuda", False)])
def test_a_gpu_only_speed_test_is_skipped_once_without_cuda(reference, device, skipped):
    # A `_gpu` cell whose speed test has a schedule for CUDA only (fused_layernorm's
    # layernorm_speed_gpu): off CUDA both rules skip it, and its cell is tagged once (a tag
    # listed twice makes the notebook invalid, and the grading of every submission failed).
    gpu_speed = copy.deepcopy(reference)
    target = cell(gpu_speed, "test_squares_gpu")
    target.source += (
        "\n### BEGIN HIDDEN TESTS\ndef slow_squares(n):\n    return [i * i for i in range(n)]\n\n\n"
        "def squares_inputs(seed):\n    return (100 + seed % 7,)\n\n\n"
        'SPEED_TEST = {"candidate": "squares", "baseline": "slow_squares", '
        '"inputs": "squares_inputs", "points": {"cuda": [1.0, 2.0]}}\n### END HIDDEN TESTS\n')
    rebuilt = rebuild(gpu_speed, answered(), device=device)
    test = [t for t in rebuilt.tests if t.grade_id == "test_squares_gpu"][0]
    assert test.speed is not None and test.skipped == skipped
    tags = cell(rebuilt.notebook, "test_squares_gpu").metadata.get("tags", [])
    assert tags.count("skip-execution") == (1 if skipped else 0)
    nbformat.validate(rebuilt.notebook)
