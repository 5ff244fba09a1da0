"""autograder.pipeline.judge: each test cell's verdict from its own outputs (no kernels here)."""
from __future__ import annotations

import nbformat
from nbformat.v4 import new_code_cell, new_notebook, new_output

from autograder.pipeline.judge import (FAILED, MANUAL, NOT_RUN, PARTIAL, PASSED, SKIPPED, describe_error,
                              judge, partial_credit)
from autograder.pipeline.execute import _record_reply
from autograder.protocol import REPLY_KEY, TIMEOUT_ENAME
from autograder.pipeline.rebuild import ManualCell, TestCell

TRACEBACK = [
    "\x1b[0;31mAssertionError\x1b[0m  Traceback (most recent call last)",
    "Cell \x1b[0;32mIn[7], line 2\x1b[0m\n      1 x = squares(3)\n"
    "\x1b[0;32m----> 2\x1b[0m \x1b[38;5;28;01massert\x1b[39;00m x == [0, 1, 4], 'bad squares'\n",
    "\x1b[0;31mAssertionError\x1b[0m: bad squares",
]


def run_cell(outputs, count=7, source="assert True", reply="ok"):
    """A test cell as execute leaves it: ``reply`` is the kernel's answer (None: none)."""
    cell = new_code_cell(source, outputs=outputs, execution_count=count)
    cell["id"] = "t"
    if count is not None:
        cell.metadata[REPLY_KEY] = {"reply": reply}
    return cell


def verdict(cell, points=2.0, hidden=False, skipped=False, stopped=""):
    nb = new_notebook(cells=[cell])
    test = TestCell("test_x", points, "t", hidden, skipped, skipped)
    return judge(nb, [test], stopped=stopped)[0]


def error(ename="AssertionError", evalue="bad squares"):
    return new_output("error", ename=ename, evalue=evalue, traceback=TRACEBACK)


def test_no_error_passes_with_full_points():
    result = verdict(run_cell([new_output("stream", name="stdout", text="ok\n")]))
    assert (result.outcome, result.score, result.output) == (PASSED, 2.0, "ok")


def test_stderr_is_not_a_failure():
    result = verdict(run_cell([new_output("stream", name="stderr", text="UserWarning: x\n")]))
    assert result.outcome == PASSED and result.score == 2.0


def test_an_error_fails_and_shows_the_message_and_line():
    result = verdict(run_cell([error()]))
    assert result.outcome == FAILED and result.score == 0.0
    assert result.output.startswith("AssertionError: bad squares")
    assert "assert x == [0, 1, 4]" in result.output
    assert "\x1b" not in result.output


def test_a_hidden_test_failure_shows_no_source_line():
    result = verdict(run_cell([error()]), hidden=True)
    assert result.output == "AssertionError: bad squares"
    assert result.visibility == "after_published"


def test_a_timeout_says_so():
    result = verdict(run_cell([error("CellTimeoutError", "ran longer than 5 s")]))
    assert result.outcome == FAILED and result.output.startswith("Timed out")


def test_a_cell_that_never_ran_failed_and_says_why():
    result = verdict(run_cell([], count=None), stopped="the kernel died")
    assert result.outcome == NOT_RUN and result.score == 0.0
    assert "the kernel died" in result.output


def test_a_skipped_gpu_test_counts_for_nothing_either_way():
    result = verdict(run_cell([], count=None), skipped=True)
    assert result.outcome == SKIPPED and not result.counts


def test_partial_credit_from_the_cells_value():
    value = new_output("execute_result", data={"text/plain": "1.5"}, execution_count=7)
    result = verdict(run_cell([value]))
    assert (result.outcome, result.score) == (PARTIAL, 1.5)


def test_partial_credit_rules():
    def result(text):
        return [new_output("execute_result", data={"text/plain": text}, execution_count=1)]
    assert partial_credit(result("np.float64(0.5)"), 2) == 0.5
    assert partial_credit(result("2"), 2) == 2.0
    assert partial_credit(result("7"), 2) is None      # out of range: an ordinary value
    assert partial_credit(result("[1, 2]"), 2) is None
    assert partial_credit(result("-1"), 2) is None
    assert verdict(run_cell(result("7"))).score == 2.0


def test_missing_cell_is_not_run():
    nb = new_notebook(cells=[])
    result = judge(nb, [TestCell("gone", 1.0, "nowhere", False, False, False)])[0]
    assert result.outcome == NOT_RUN


def test_manual_cells_are_listed_after_the_tests():
    nb = new_notebook(cells=[run_cell([])])
    results = judge(nb, [TestCell("test_x", 1.0, "t", False, False, False)],
                    [ManualCell("essay", 3.0, answered=True)])
    assert [r.outcome for r in results] == [PASSED, MANUAL]
    assert not results[1].counts and results[1].max_score == 3.0


def test_describe_error_without_traceback():
    assert describe_error({"ename": "NameError", "evalue": "name 'f' is not defined",
                           "traceback": []}, hidden=False) == "NameError: name 'f' is not defined"
    bare = {"ename": "AssertionError", "evalue": ""}
    assert describe_error(bare, hidden=True) == "AssertionError"


def test_judge_is_a_pure_function_of_the_notebook():
    nb = new_notebook(cells=[run_cell([error()])])
    before = nbformat.writes(nb)
    tests = [TestCell("test_x", 2.0, "t", False, False, False)]
    assert judge(nb, tests) == judge(nb, tests)
    assert nbformat.writes(nb) == before


def test_a_plain_test_passes_only_when_the_kernel_says_it_ran_to_its_end():
    # No error output is no evidence: the error may not have reached us (judge.py).
    for reply in (None, "error", "aborted"):
        result = verdict(run_cell([new_output("stream", name="stdout", text="ok\n")],
                                  reply=reply))
        assert (result.outcome, result.score) == (FAILED, 0.0), reply
        assert "never confirmed" in result.output and str(reply or "none") in result.output
    value = new_output("execute_result", data={"text/plain": "2"}, execution_count=7)
    assert verdict(run_cell([value], reply="error")).outcome == FAILED
    assert verdict(run_cell([], source="")).outcome == PASSED  # an empty cell runs nothing


def reply(status, **content):
    return {"content": {"status": status, **content}}


def test_execute_records_the_reply_and_shows_an_error_it_was_not_sent():
    silenced = new_code_cell("assert squares(3) == [0, 1, 4]")
    _record_reply(silenced, reply("error", ename="UnicodeEncodeError",
                                  evalue="can't encode character '\ud800'"))
    assert silenced.metadata[REPLY_KEY] == {"reply": "error"}
    [shown] = silenced.outputs
    assert shown.output_type == "error" and shown.ename == "UnicodeEncodeError"
    assert "could not be shown" in shown.evalue and "\ud800" not in shown.evalue
    nbformat.writes(new_notebook(cells=[silenced]))  # the record can be saved
    assert verdict(run_cell(silenced.outputs, reply="error")).outcome == FAILED

    bare = new_code_cell("x")  # a reply without a name or message still says it raised
    _record_reply(bare, reply("error"))
    assert bare.outputs[0].ename == "Error" and "could not be shown" in bare.outputs[0].evalue

    shown_error = new_code_cell("1/0", outputs=[error("ZeroDivisionError", "division by zero")])
    _record_reply(shown_error, reply("error", ename="ZeroDivisionError", evalue="x"))
    assert len(shown_error.outputs) == 1  # already visible: nothing added

    fine = new_code_cell("pass")
    _record_reply(fine, reply("ok"))
    assert fine.outputs == [] and fine.metadata[REPLY_KEY] == {"reply": "ok"}

    timed_out = new_code_cell("while True: pass", outputs=[error("KeyboardInterrupt", "")])
    _record_reply(timed_out, reply("error", ename=TIMEOUT_ENAME, evalue="ran past 5 s"))
    assert [o.ename for o in timed_out.outputs] == [TIMEOUT_ENAME]
