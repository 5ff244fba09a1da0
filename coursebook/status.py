"""Record the book's chapters as run on a GPU, for the status page.

The status page (``status.md``) shows two tables. The first is made by every
book build from its own execution records (:mod:`coursebook.sphinxext`). The
second lists runs measured on GPUs, which the machine that builds the book
usually lacks; they are kept in the repository in ``status/gpu-runs.json``.

On a machine with a CUDA GPU, ``make gpu-status`` (= ``python -m coursebook.status
record``) builds the book in a folder of its own, ``_build/gpu-status``, with
an empty execution cache and the ``full`` profile, so that every chapter really
runs here (the shared cache would hand back CPU runs: it knows the notebook,
not the machine). It then adds the runs the build recorded to
``status/gpu-runs.json``, replacing earlier runs of the same page on the same
hardware and profile. Commit that file; the next build shows the runs.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

ROOT = Path(__file__).resolve().parent.parent
GPU_RUNS = ROOT / "status" / "gpu-runs.json"
FOLDER = ROOT / "_build" / "gpu-status"
# The lines each page's first cell prints (dlperf.environment_line; one line before it was
# split in two), read back into a run's record.
ENVIRONMENT_LINE = re.compile(
    r"Run profile (?P<profile>.*);\s+PyTorch (?P<torch>[^,]+), Python (?P<python>[^;]+); "
    r"(?P<hardware>.+)")


def environment(text: str) -> Dict[str, str]:
    """profile, torch, python and hardware from the first environment line in ``text``."""
    found = ENVIRONMENT_LINE.search(text)
    return {key: value.strip() for key, value in found.groupdict().items()} if found else {}


def merge_runs(recorded: List[Dict[str, Any]], new: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """``recorded`` with ``new`` added; a new run replaces one of the same page, hardware and profile."""
    def key(run):
        return run["page"], run.get("hardware"), (run.get("profile") or "").split(" ")[0]
    merged = {key(run): run for run in recorded}
    merged.update({key(run): run for run in new})
    return sorted(merged.values(), key=lambda r: (r["page"], r.get("hardware") or "", r.get("ran_at") or ""))


# How dlperf.environment_line names a machine with GPUs: "1 GPU: <name> (cuda:0)", "2 GPUs: ...".
ON_GPUS = re.compile(r"^\d+ GPUs?: ")


def gpu_runs(runs: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The runs whose page said it ran on GPUs (``dlperf.environment_line``)."""
    return [run for run in runs if run.get("succeeded") and ON_GPUS.match(run.get("hardware") or "")]


def record(gpu_runs_file: Path = GPU_RUNS, echo=print) -> int:
    import torch
    if not torch.cuda.is_available():
        echo("==> No CUDA GPU here: GPU runs can only be recorded on a machine with one. Nothing changed.")
        return 2
    from . import book
    shutil.rmtree(FOLDER, ignore_errors=True)  # an empty execution cache: every chapter runs here
    env = {**os.environ, "DLPERF_PROFILE": os.environ.get("DLPERF_PROFILE", "full")}
    echo(f"==> Building the book in {FOLDER} with the {env['DLPERF_PROFILE']} profile, executing every chapter")
    result = book.build(echo=True, env=env, extra=("--path-output", str(FOLDER)),
                        html=FOLDER / "_build" / "html")
    if not result.ok:
        echo(f"==> The build failed; nothing recorded.\n{result.reports()}")
        return 1
    runs = gpu_runs(json.loads((result.html / "status.json").read_text())["runs"])
    if not runs:
        echo("==> No page reported a GPU run; nothing recorded.")
        return 1
    recorded = json.loads(gpu_runs_file.read_text())["runs"] if gpu_runs_file.exists() else []
    gpu_runs_file.parent.mkdir(parents=True, exist_ok=True)
    gpu_runs_file.write_text(json.dumps({"runs": merge_runs(recorded, runs)}, indent=2) + "\n")
    echo(f"==> Recorded {len(runs)} GPU run(s) in {gpu_runs_file}; commit it to show them on the status page:")
    for run in runs:
        echo(f"    {run['page']}: {run.get('seconds')} s on {run.get('hardware')}")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] != ["record"]:
        print(__doc__)
        return 0 if argv[:1] in ([], ["-h"], ["--help"]) else 2
    return record()


if __name__ == "__main__":
    sys.exit(main())
