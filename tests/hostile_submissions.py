"""Broken and hostile submissions of the ``data_parallel`` assignment, each with what it must get.

Every hostile submission is built on one *baseline*: a correct ``split_batch`` and an
``allreduce`` that does nothing. A fair grader gives the baseline the points of the
``split_batch`` tests and nothing for ``allreduce``; a trick that earned more than the
baseline would have faked something. Most tricks sit in a cell of the learner's own right
after the ``allreduce`` answer, so they run before every ``allreduce`` test.

``expect`` is the score: ``"full"`` (what the solution gets), ``"baseline"``, ``"at most
baseline"`` or a number; ``status`` is the ``grades.csv`` status; ``says`` a phrase its row's
message must hold.

Cases marked ``isolated`` run native code that only the kernel's namespaces and resource
group contain (a fork bomb, signals to the grader's processes): they are graded only where
the grader can build that isolation (as root on Linux), never against a bare kernel.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Union

import nbformat

from coursebook.cases import ROOT, answer_cells, nbgrader_meta, submission

ASSIGNMENT, NOTEBOOK = "data_parallel", "data_parallel"
SOLUTION_FILE = ROOT / "solutions" / ASSIGNMENT / f"{NOTEBOOK}.ipynb"
NOTHING = "def allreduce(data):\n    pass  # does nothing: the baseline earns no allreduce points"


@dataclass
class Case:
    name: str
    threat: str
    trick: str = ""                     # a learner's own cell, after the allreduce answer
    allreduce: Optional[str] = NOTHING  # the allreduce answer (None: the solution's)
    transform: Optional[Callable] = None  # changes the built notebook
    raw: Optional[Union[bytes, str]] = None  # the file's bytes instead of a notebook
    filename: str = f"{NOTEBOOK}.ipynb"
    expect: Union[str, float] = "baseline"
    status: Union[str, tuple] = "graded"  # or the statuses that are all right
    student: str = field(default="")
    says: str = ""                      # a phrase the row's message must hold
    place: Optional[Callable] = None    # place(folder, notebook): puts an odd file there
    isolated: bool = False              # needs namespaces and a resource group to be safe

    def __post_init__(self):
        self.student = self.student or self.name


def build(case: Case, places: dict):
    """The notebook (or bytes) a case submits; None for no file at all.

    ``places`` fills the ``{submitted}``, ``{out}`` and ``{gradebook}`` of a trick: the
    folders a real attacker would guess.
    """
    if case.raw is not None:
        return case.raw
    answers = {} if case.allreduce is None else {"allreduce_answer": case.allreduce}
    nb = submission(ASSIGNMENT, answers)
    if case.trick:
        trick = case.trick
        for name, value in places.items():
            trick = trick.replace("{" + name + "}", str(value))
        at = next(i for i, c in enumerate(nb.cells)
                  if nbgrader_meta(c).get("grade_id") == "allreduce_answer")
        nb.cells.insert(at + 1, nbformat.v4.new_code_cell(trick))
    if case.transform is not None:
        nb = case.transform(nb) or nb  # it changes the notebook in place, or returns another
    return nb


def _tests(nb):
    return [c for c in nb.cells if nbgrader_meta(c).get("grade") and not nbgrader_meta(c).get("solution")]


def _edit_tests(nb):
    for cell in _tests(nb):
        cell.source = "pass  # the learner's version of the test"


def _delete_tests(nb):
    tests = {id(c) for c in _tests(nb)}
    nb.cells = [c for c in nb.cells if id(c) not in tests]


def _retag(nb):
    for cell in _tests(nb):
        cell.metadata["tags"] = ["skip-execution", "raises-exception", "parameters"]
        cell.metadata["nbgrader"]["points"] = 100
        cell.metadata["nbgrader"]["solution"] = True
    for cell in answer_cells(nb).values():
        cell.metadata.setdefault("tags", []).append("injected-parameters")


def _strip_metadata(nb):
    for cell in nb.cells:
        cell.metadata = {}
    nb.metadata = {}


def _reorder(nb):
    answers = answer_cells(nb)
    first, second = answers["split_batch_answer"], answers["allreduce_answer"]
    i, j = nb.cells.index(first), nb.cells.index(second)
    nb.cells[i], nb.cells[j] = nb.cells[j], nb.cells[i]


def _old_format(nb):
    return nbformat.v3.new_notebook(worksheets=[nbformat.v3.new_worksheet(cells=[
        nbformat.v3.new_code_cell(input=c.source) for c in nb.cells if c.cell_type == "code"])])


def _huge(nb):
    nb.cells.append(nbformat.v4.new_markdown_cell("x" * (25 * 2**20)))


SOLUTION_PATH = str(SOLUTION_FILE)
PROCESS_LIMIT = 128  # the grading run's --processes


def native(code: str) -> str:
    """A trick that runs ``code`` as a compiled extension would: under an installed
    library's file name, so that the audit hook's rule for ``ctypes`` lets it through and
    only the kernel's isolation stands in its way."""
    return ("import sysconfig\n"
            f"exec(compile({code!r}, sysconfig.get_paths()['purelib'] + '/innocent.py', "
            "'exec'))")


def _link_to_solution(folder: Path, notebook: Path) -> None:
    notebook.symlink_to(SOLUTION_FILE)


def _pipe(folder: Path, notebook: Path) -> None:
    os.mkfifo(notebook)


def _folder(folder: Path, notebook: Path) -> None:
    notebook.mkdir()


def _student_folder_elsewhere(folder: Path, notebook: Path) -> None:
    """The student's folder is a link to a folder outside the submissions."""
    elsewhere = folder.parent.parent.parent / "elsewhere" / folder.name
    elsewhere.mkdir(parents=True)
    nbformat.write(build(Case("x", "", allreduce=None), {}), str(elsewhere / notebook.name))
    folder.rmdir()
    folder.parent.rmdir()
    folder.parent.symlink_to(elsewhere.parent)

CASES = [
    # --- good submissions -----------------------------------------------------------------
    Case("good_solution", "none: the solution", allreduce=None, expect="full"),
    Case("good_noisy", "fairness: a correct solution that warns and writes to stderr",
         allreduce=None, expect="full",
         trick="import sys, warnings\nwarnings.warn('a UserWarning from the learner')\n"
               "print('progress on stderr', file=sys.stderr)\n"
               "import torch\ntorch.tensor([1.0]).data_ptr()"),
    Case("baseline", "none: correct split_batch, allreduce does nothing"),
    # --- broken input -----------------------------------------------------------------------
    Case("broken_not_json", "not JSON", raw=b"this is not a notebook \x00\xff", expect=0.0,
         status="invalid"),
    Case("broken_not_notebook", "JSON, but not a notebook", raw=json.dumps({"answer": 42}),
         expect=0.0, status="invalid"),
    Case("broken_old_nbformat", "nbformat 3 (upgraded; its cells lost their metadata)",
         transform=_old_format, allreduce=None, expect=0.0),
    Case("broken_empty", "a notebook without cells", raw=nbformat.writes(nbformat.v4.new_notebook()),
         expect=0.0),
    # Graded in the assignment's order, whatever order the learner left the cells in.
    Case("broken_reordered", "answer cells swapped", transform=_reorder, allreduce=None,
         expect="full"),
    Case("broken_metadata_stripped", "all cell metadata stripped: nothing to match the answers by",
         transform=_strip_metadata, allreduce=None, expect=0.0),
    Case("broken_huge", "a 25 MiB notebook", transform=_huge, expect=0.0, status="invalid"),
    Case("broken_wrong_name", "submitted under another file name (the expected one is missing)",
         filename="Data Parallel (1).ipynb", expect=0.0, status="invalid"),
    Case("broken_missing", "no notebook at all in the submission folder", raw=None,
         filename="", expect=0.0, status="invalid"),
    Case("broken_odd_student", "an odd student id (spaces, accents)", allreduce=None, expect="full",
         student="élève un"),
    # --- files that are not what they seem ---------------------------------------------------
    Case("file_symlink", "the notebook is a symbolic link to the instructor's notebook",
         place=_link_to_solution, expect=0.0, status="invalid",
         says="the notebook is a symbolic link, not a file"),
    Case("file_fifo", "the notebook is a named pipe (reading it would block for ever)",
         place=_pipe, expect=0.0, status="invalid", says="the notebook is a named pipe, not a file"),
    Case("file_folder", "a folder where the notebook should be", place=_folder, expect=0.0,
         status="invalid", says="the notebook is a folder, not a file"),
    Case("file_outside", "the student's folder links outside the submissions",
         place=_student_folder_elsewhere, expect=0.0, status="invalid",
         says="a link to somewhere outside the submissions"),
    # A spreadsheet would evaluate the id as a formula; grades.csv writes it as '=1+1.
    Case("file_formula_student", "a student id that starts with =", allreduce=None,
         expect="full", student="=1+1"),
    # --- runaway code -----------------------------------------------------------------------
    Case("runaway_loop", "an infinite loop", trick="while True:\n    pass", status="timeout"),
    Case("runaway_sleep", "sleeping forever", trick="import time\ntime.sleep(10**6)",
         status="timeout"),
    Case("runaway_ignores_signals", "a loop that ignores SIGINT (the interrupt)",
         trick="import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass",
         status="timeout"),
    Case("runaway_memory", "a memory bomb",
         trick="hog = []\nwhile True:\n    hog.append(bytearray(64 * 2**20))"),
    Case("runaway_fork_bomb", "a fork bomb",
         trick="import os\nwhile True:\n    os.fork()"),
    Case("runaway_children", "a child process and a thread left running",
         trick="import subprocess, threading, time\n"
               "threading.Thread(target=lambda: time.sleep(10**6), daemon=False).start()\n"
               "subprocess.Popen(['sleep', '1000000'])"),
    # Output past 2 MiB is dropped; the cell limit stops the loop, or the data memory limit
    # stops the kernel's output buffer first (a MemoryError) on a busy machine.
    Case("runaway_output", "gigabytes of printed output",
         trick="line = 'x' * 1_000_000\nwhile True:\n    print(line)", expect="baseline",
         status=("timeout", "graded")),
    Case("runaway_big_file", "writing a huge file",
         trick="with open('big.bin', 'wb') as f:\n    for _ in range(4096):\n"
               "        f.write(bytes(2**20))"),
    # --- dying code -------------------------------------------------------------------------
    Case("dying_sys_exit", "sys.exit(0) before the tests",
         trick="import sys\nsys.exit(0)"),
    Case("dying_os_exit", "os._exit(0): the kernel ends", trick="import os\nos._exit(0)",
         status="error"),
    Case("dying_segfault", "a segmentation fault",
         trick="import faulthandler\nfaulthandler._sigsegv()", status="error"),
    Case("dying_keyboard_interrupt", "KeyboardInterrupt raised", trick="raise KeyboardInterrupt"),
    Case("dying_base_exception", "a BaseException subclass raised",
         trick="class Out(BaseException):\n    pass\nraise Out('bye')"),
    Case("dying_mid_test", "the kernel dies inside a test (allreduce exits the process)",
         allreduce="import os\ndef allreduce(data):\n    os._exit(3)", status="error"),
    # --- cheating ---------------------------------------------------------------------------
    Case("cheat_edit_tests", "test cells edited to `pass`", transform=_edit_tests),
    Case("cheat_delete_tests", "test cells deleted", transform=_delete_tests),
    # (isinstance always true breaks IPython itself: the kernel hangs and is stopped, or dies)
    Case("cheat_redefine_checks", "torch.equal, torch.allclose, isinstance and print redefined",
         status=("timeout", "error"),
         trick="import builtins, torch\ntorch.equal = lambda *a, **k: True\n"
               "torch.allclose = lambda *a, **k: True\nbuiltins.isinstance = lambda *a: True\n"
               "builtins.print = lambda *a, **k: None"),
    Case("cheat_patch_tensor", "Tensor.__eq__, tolist and time.perf_counter patched",
         trick="import torch, time\ntorch.Tensor.__eq__ = lambda *a: True\n"
               "torch.Tensor.tolist = lambda self: [111.0, 222.0]\n"
               "time.perf_counter = lambda: 0.0"),
    Case("cheat_always_equal", "objects whose __eq__ always says yes, put into the caller's list",
         allreduce="class Yes:\n    def __eq__(self, other):\n        return True\n"
                   "    def tolist(self):\n        return self\n"
                   "def allreduce(data):\n    for i in range(len(data)):\n        data[i] = Yes()"),
    Case("cheat_read_solutions", "reading the reference solution from disk and running it",
         trick=f"import json\nnb = json.load(open({SOLUTION_PATH!r}))\n"
               "code = [''.join(c['source']) for c in nb['cells'] "
               "if 'def allreduce' in ''.join(c['source'])]\nexec(code[0])"),
    Case("cheat_read_native", "reading the solutions with torch.from_file and a subprocess",
         trick=f"import torch, subprocess\ndata = torch.from_file({SOLUTION_PATH!r}, size=100, "
               "dtype=torch.uint8)\nsubprocess.run(['cat', " + repr(SOLUTION_PATH) + "])"),
    Case("cheat_search_disk", "walking the file system for hidden tests",
         trick="import os\nfound = []\nfor top in ('{submitted}', '{out}'):\n"
               "    for folder, _, files in os.walk(top):\n        for name in files:\n"
               "            if name.endswith('.ipynb'):\n                found.append(name)\n"
               "assert not found, found"),
    Case("cheat_write_results", "writing results, grades and the gradebook directly",
         trick="import glob, os, sqlite3\n"
               "for path in glob.glob('{out}/**/*', recursive=True):\n"
               "    open(path, 'w').write('{\"score\": 100}')\n"
               "open('{out}/grades.csv', 'w').write('cheat_write_results,data_parallel,x,100')\n"
               "sqlite3.connect('{gradebook}').execute('drop table grade')\n"
               "open('/tmp/hostile-was-here', 'w').write('x')"),
    Case("cheat_other_students", "changing the other students' submissions",
         trick="import os\n"
               "for folder, _, files in os.walk('{submitted}'):\n"
               "    for name in files:\n"
               "        open(os.path.join(folder, name), 'w').write('overwritten')\n"
               "os.remove('{submitted}/baseline/data_parallel/data_parallel.ipynb')"),
    Case("cheat_canned", "detecting the grader and returning canned answers to the visible test",
         allreduce="import torch\ndef allreduce(data):\n"
                   "    if 'autograder_device' in globals() or len(data) == 3:\n"
                   "        for t in data:\n            t.copy_(torch.tensor([111.0, 222.0]))"),
    Case("cheat_retag", "tags and nbgrader metadata changed on the tests and answers",
         transform=_retag),
    Case("cheat_input_transformer", "an input transformer that rewrites every later cell",
         trick="get_ipython().input_transformers_cleanup.append(lambda lines: ['pass\\n'])"),
    Case("cheat_trace_hook", "a trace hook that skips the tests' code",
         trick="import sys\nsys.settrace(lambda *a: None)"),
    Case("cheat_fake_report", "replacing the grader's report function in the kernel",
         trick="import autograder.kernel.evidence as ev\nev.emit = lambda *a, **k: None"),
    Case("cheat_network_ctypes", "network access and libc through ctypes",
         trick="import ctypes, os, socket\n"
               "try:\n    socket.create_connection(('127.0.0.1', 9), timeout=1)\n"
               "except ConnectionError:\n    pass\n"
               "ctypes.CDLL(None).kill(os.getppid(), 9)"),
    Case("cheat_raise_limits", "lifting its own resource limits",
         trick="import resource\nresource.setrlimit(resource.RLIMIT_DATA, (-1, -1))"),
    # --- native code on the network: {port} is a listener the test opens on 127.0.0.1 ---------
    Case("net_pyzmq_stream", "a pyzmq STREAM socket to the grader's loopback (no audit event)",
         trick="import time, zmq\nstream = zmq.Context().socket(zmq.STREAM)\n"
               "stream.connect('tcp://127.0.0.1:{port}')\ntime.sleep(2)"),
    Case("net_tcp_store", "torch.distributed's TCPStore as a client of the grader's loopback",
         trick="import datetime\nimport torch.distributed as dist\ntry:\n"
               "    dist.TCPStore('127.0.0.1', {port}, 2, False,\n"
               "                  timeout=datetime.timedelta(seconds=1))\n"
               "except Exception:\n    pass"),
    Case("net_libc_connect", "libc's connect() through ctypes, compiled under a library's name",
         trick=native("import ctypes, socket, struct\n"
                      "libc = ctypes.CDLL(None)\n"
                      "fd = libc.socket(2, 1, 0)\n"
                      "address = struct.pack('=H', 2) + struct.pack('!H', {port})"
                      " + socket.inet_aton('127.0.0.1') + bytes(8)\n"
                      "libc.connect(fd, address, len(address))\n")),
    # --- native processes: only the PID namespace and the resource group hold these -------------
    Case("native_daemons", "five daemons made with fork() + setsid() + fork(), left running",
         isolated=True,
         trick=native("import ctypes\nlibc = ctypes.CDLL(None)\n"
                      "for _ in range(5):\n"
                      "    if libc.fork() == 0:\n"
                      "        libc.setsid()\n"
                      "        if libc.fork() == 0:\n"
                      "            while True:\n                libc.pause()\n"
                      "        libc._exit(0)\n")),
    Case("native_kill_outside", "kill() of a process outside the grader, and of every process "
         "it may signal (kill(-1))", isolated=True,
         trick=native("import ctypes\nlibc = ctypes.CDLL(None)\n"
                      "libc.kill({victim}, 9)\nlibc.kill(-1, 9)\n")),
    # Every process forks until the resource group refuses; the kernel then goes on.
    Case("native_fork_bomb", "a fork bomb in native code", isolated=True,
         expect="at most baseline", status=("graded", "error", "timeout"),
         trick=native("import ctypes\nlibc = ctypes.CDLL(None)\nchild = False\n"
                      "while True:\n"
                      "    pid = libc.fork()\n"
                      "    if pid == 0:\n        child = True\n"
                      "    elif pid < 0:\n"
                      "        if not child:\n            break\n"
                      "        while True:\n            libc.pause()\n")),
    Case("native_disk_fill", "files that together fill the disk, each under the file size limit",
         isolated=True,
         trick="written = 0\ntry:\n"
               "    for i in range(64):\n"
               "        with open(f'fill-{i}.bin', 'wb') as f:\n"
               "            for _ in range(128):\n"
               "                f.write(bytes(2**20))\n                written += 2**20\n"
               "except OSError as error:\n"
               "    print('stopped after', written >> 20, 'MiB:', error)\n"),
]
