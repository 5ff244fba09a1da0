"""The target a spawner starts for a submission's kernel (it runs in the kernel's process).

``autograder.protocol.KERNEL_TARGET`` (this module's :func:`main`) gets the sandbox policy (JSON, empty for none) and
ipykernel's own arguments. It is the same whether the process was forked from the warm
server or is a fresh interpreter.
"""
from __future__ import annotations

import json
import os
import sys

def main(policy: str, *argv: str) -> None:
    # ipykernel exits when its parent is gone; the parent is whoever started us (the
    # grader, or the fork server), not the pid jupyter_client wrote into the environment.
    os.environ["JPY_PARENT_PID"] = str(os.getppid())
    threads = os.environ.get("OMP_NUM_THREADS")
    if threads and "torch" in sys.modules:  # preloaded: it read the variable too early
        sys.modules["torch"].set_num_threads(int(threads))
    if policy:
        from autograder.kernel.confine import start_kernel
        from autograder.protocol import Policy
        start_kernel(Policy.from_dict(json.loads(policy)), list(argv))
        return
    from ipykernel.kernelapp import IPKernelApp
    app = IPKernelApp.instance()
    app.initialize(list(argv))
    app.start()
