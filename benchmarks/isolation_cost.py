"""What isolating a kernel costs, and why the grader forks kernels rather than start them
under bubblewrap: one table, every row measured in one run on this machine.

Each row runs a one-cell notebook (``import torch, dlperf``, what every assignment's first
cell does) in a new kernel, ``--repeats`` times, and reports the median wall time from
asking for the kernel to having the cell's reply:

* a kernel forked from a warm fork server, without isolation, then with the grader's full
  isolation (resource group, PID, mount, network and IPC namespaces, tmpfs working
  directory, user ``nobody``), as ``python -m autograder grade`` runs them;
* a fresh interpreter with the same isolation (``--kernel fresh``);
* and, for the tool a fresh start would use, a fresh interpreter importing the same
  modules without a kernel, then the same under ``bwrap --unshare-all`` (bubblewrap gives
  namespaces to a program it starts, so it cannot confine a process forked from a warm
  server: a kernel under it pays at least this).

    .venv/bin/python benchmarks/isolation_cost.py --repeats 10
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

IMPORTS = "import torch, dlperf"


def one_cell_notebook():
    from nbformat.v4 import new_code_cell, new_notebook
    return new_notebook(cells=[new_code_cell(IMPORTS)], metadata={"kernelspec": {
        "name": "python3", "language": "python", "display_name": "Python 3"}})


def kernel_run(spawner, isolated: bool) -> float:
    from autograder.pipeline.execute import execute
    from autograder.sandbox.workdir import run_dir
    from autograder.sandbox.cgroups import ResourceGroup
    from autograder.protocol import Policy, python_paths
    from autograder.sandbox.policy import closed_folders, shown_paths
    workdir = Path(tempfile.mkdtemp(prefix="submission-", dir=run_dir()))
    group, sandbox = None, None
    if isolated:
        group = ResourceGroup.create(5 * 2**30, 512)
        hidden = (str(run_dir()), *closed_folders(python_paths()))
        sandbox = Policy(workdir=str(workdir), hidden=hidden,
                         shown=shown_paths(hidden, python_paths()),
                         cgroups=group.paths if group else ()).to_dict()
    start = time.perf_counter()
    try:
        done = execute(one_cell_notebook(), workdir, parameters={}, spawner=spawner,
                       sandbox=sandbox, group=group,
                       env={"HOME": str(workdir), "TMPDIR": str(workdir)})
    finally:
        if group is not None:
            group.close()
        shutil.rmtree(workdir, ignore_errors=True)
    seconds = time.perf_counter() - start
    if not done.completed or done.notebook.cells[-1].outputs:
        raise SystemExit(f"the kernel did not run the cell: {done.ended} {done.message}")
    return seconds


def command_run(command: list) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    from autograder.sandbox.imports import KERNEL_MODULES
    from autograder.sandbox.policy import process_environment
    from autograder.sandbox.spawn import open_spawner
    rows = []
    server = open_spawner("fork", [*KERNEL_MODULES, "torch", "dlperf"], process_environment())
    fresh = open_spawner("fresh", env=process_environment())
    try:
        kernel_run(server, True)  # warm the page cache and the server's first fork
        for name, fork, isolated in (("forked from the warm server, no isolation", server, False),
                                     ("forked from the warm server, full isolation", server, True),
                                     ("fresh interpreter (--kernel fresh), full isolation",
                                      fresh, True)):
            rows.append((name, [kernel_run(fork, isolated) for _ in range(args.repeats)]))
    finally:
        server.close()
    python = [sys.executable, "-c", f"import ipykernel.kernelapp; {IMPORTS}"]
    rows.append(("fresh interpreter, the imports alone (no kernel)",
                 [command_run(python) for _ in range(args.repeats)]))
    bwrap = shutil.which("bwrap")
    if bwrap:
        wrapped = [bwrap, "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/",
                   "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", *python]
        rows.append(("the same under bwrap --unshare-all",
                     [command_run(wrapped) for _ in range(args.repeats)]))
    print(f"# {platform.node()}: {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"{args.repeats} runs each, medians")
    print("| a kernel that runs `import torch, dlperf` | median s | fastest s |")
    print("|---|---|---|")
    for name, times in rows:
        print(f"| {name} | {statistics.median(times):.3f} | {min(times):.3f} |")
    if not bwrap:
        print("(bubblewrap is not installed: apt-get install bubblewrap for its row)")


if __name__ == "__main__":
    main()
