"""A real Dask cluster on loopback for the tests: a scheduler and two one-thread workers,
started as an instructor would (``dask scheduler``, ``dask worker``), each in a process of its
own. Import :func:`cluster` into a test module to use it there (one cluster per module).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Tuple

import pytest

ROOT = Path(__file__).resolve().parent.parent
CLUSTER_ENV = {
    "PYTHONPATH": str(ROOT),
    "DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "1",
    "DASK_DISTRIBUTED__SCHEDULER__WORKER_SATURATION": "1.0",
    "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "3s",
}


def dask(command: str, *args, log: Path) -> subprocess.Popen:
    module = {"scheduler": "distributed.cli.dask_scheduler",
              "worker": "distributed.cli.dask_worker"}[command]
    with log.open("w") as handle:
        return subprocess.Popen([sys.executable, "-m", module, *map(str, args)], cwd=ROOT,
                                env=dict(os.environ, **CLUSTER_ENV), stdout=handle,
                                stderr=subprocess.STDOUT, start_new_session=True)


def stop(process: subprocess.Popen) -> None:
    for signum, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(process.pid, signum)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def scheduler(folder: Path) -> Tuple[subprocess.Popen, str]:
    """A ``dask scheduler`` on loopback, its file and log in ``folder``, and its address once
    it has written it (stopped again if it does not within a minute)."""
    file = folder / "scheduler.json"
    process = dask("scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                   "--scheduler-file", file, log=folder / "scheduler.log")
    try:
        deadline = time.monotonic() + 60
        while not file.exists() or not file.read_text().strip():
            assert time.monotonic() < deadline, (folder / "scheduler.log").read_text()
            time.sleep(0.2)
        return process, json.loads(file.read_text())["address"]
    except BaseException:
        stop(process)
        raise


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    distributed = pytest.importorskip("distributed")
    base = tmp_path_factory.mktemp("dask")
    process, address = scheduler(base)
    processes = [process]
    client = None
    try:
        for n in (1, 2):
            processes.append(dask("worker", address, "--nthreads", "1", "--host", "127.0.0.1",
                                  "--no-dashboard", "--name", f"w{n}",
                                  log=base / f"worker{n}.log"))
        client = distributed.Client(address, timeout=30, set_as_default=False)
        client.wait_for_workers(2, timeout=120)
        yield SimpleNamespace(address=address, client=client, base=base)
    finally:
        if client is not None:
            client.close()
        for process in reversed(processes):
            stop(process)


