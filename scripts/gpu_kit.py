#!/usr/bin/env python3
"""``make gpu-kit``: the wheels a lent GPU machine lacks to run the course, in one folder.

The GPU machines we borrow have no network and Python 3.12 with PyTorch 2.11 and a long list of
scientific packages (``MACHINE`` below), but no Jupyter, papermill, jupytext or d2l. This script
asks pip which wheels running the chapters, the autograder and the GPU tests needs on such a
machine (Python 3.12, manylinux x86-64), drops every package the machine already has, and
downloads the rest, one version each, into ``_build/gpu-kit``, which ``scripts/gpu-run`` installs
there with ``pip install --no-index --no-deps``. It stops with an error if the kit would pass
``LIMIT_MIB`` (a run carries at most 64 MiB, the repository included).

    python scripts/gpu_kit.py [--out FOLDER]
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KIT = ROOT / "_build" / "gpu-kit"
MANIFEST = "kit.json"
LIMIT_MIB = 60

# What the kit is for. Versions come from the course's requirements files, so the kit runs
# what CI tests: executing chapters (papermill, jupytext for the .md pages, ipykernel), the
# autograder (papermill, nbclient, nbformat, ipykernel) and the tests' own imports (nbformat).
NEEDED = ["papermill", "jupytext", "ipykernel", "nbclient", "nbformat", "nbgrader"]
# nbgrader's preprocessors make the graded view of a source notebook (autograder.layout).
# Its web front end (JupyterLab and widgets, 30 MiB) is never imported by grading: not carried.
NOT_CARRIED = ["jupyterlab", "jupyterlab-server", "babel", "json5", "jupyter-lsp", "async-lru",
               "jupyter-builder", "widgetsnbextension", "jupyterlab-widgets", "ipywidgets"]
NEEDED_WITHOUT_DEPS = ["d2l"]  # its exact pins would pull numpy 1.23 (requirements-nodeps.txt)

# The packages of the machines' image ('cuda'), as /work/.library/device/KINDS.md listed them
# on 2026-11-17 (Python 3.12.3, torch 2.11.0, torchvision 0.26.0, numpy 2.5.2). The kit never
# carries these: a second version of one of them would shadow the machine's own.
MACHINE = """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch
build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage
cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn
einops equinox etils execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec
gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna imageio
iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib
kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown
markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict
multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro
nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13
nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir
onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker
prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout
pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors
scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers
setuptools shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch
torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope
triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt
xarray xxhash yarl zipp
""".split()

PYTHON_VERSION = "3.12"
# pip matches manylinux_2_N tags exactly, so name every glibc up to the machines' (Ubuntu 24.04: 2.39).
PLATFORMS = (["manylinux1_x86_64", "manylinux2010_x86_64", "manylinux2014_x86_64"]
             + [f"manylinux_2_{n}_x86_64" for n in range(5, 40)])


def normalize(name: str) -> str:
    """A distribution's name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned(names, requirement_files=("requirements.txt", "requirements-nodeps.txt")):
    """Each name with the version specifier the course's requirements give it (or none)."""
    found = {}
    for filename in requirement_files:
        for line in (ROOT / filename).read_text().splitlines():
            line = line.split("#")[0].strip()
            match = re.match(r"([A-Za-z0-9_.-]+)\s*(.*)", line)
            if match:
                found[normalize(match.group(1))] = match.group(1) + match.group(2).replace(" ", "")
    return [found.get(normalize(name), name) for name in names]


def target_options():
    options = ["--only-binary=:all:", "--python-version", PYTHON_VERSION, "--implementation", "cp"]
    for platform in PLATFORMS + ["any"]:
        options += ["--platform", platform]
    return options


def pip(*args, python=sys.executable):
    done = subprocess.run([python, "-m", "pip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"pip {' '.join(args[:3])} ... failed:\n{done.stderr[-4000:]}")
    return done


def resolve(requirements, scratch: Path):
    """[(name, version)] of everything ``requirements`` needs on the GPU machine's Python."""
    report = scratch / "report.json"
    pip("install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report),
        "--target", str(scratch / "target"), *target_options(), *requirements)
    return [(item["metadata"]["name"], item["metadata"]["version"])
            for item in json.loads(report.read_text())["install"]]


def plan():
    """What the course needs there, split in two: ``(kit, relied_on)``. ``kit`` is
    ``[(name, version)]`` of what the machine lacks; ``relied_on`` names the machine's own
    packages the kit depends on (a stand-in of the machine must have them)."""
    machine = {normalize(name) for name in MACHINE}
    with tempfile.TemporaryDirectory() as scratch:
        wanted = resolve(pinned(NEEDED), Path(scratch))
        wanted += resolve(["--no-deps", *pinned(NEEDED_WITHOUT_DEPS)], Path(scratch))
    left_out = machine | {normalize(name) for name in NOT_CARRIED}
    kit = {normalize(name): (name, version) for name, version in wanted
           if normalize(name) not in left_out}
    relied_on = {normalize(name) for name, _ in wanted} & machine
    return sorted(kit.values(), key=lambda item: normalize(item[0])), sorted(relied_on)


def build(out: Path = KIT, echo=print) -> dict:
    packages, relied_on = plan()
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.whl"):  # one version of each: nothing from an earlier kit stays
        old.unlink()
    echo(f"==> Downloading {len(packages)} wheels for Python {PYTHON_VERSION}, manylinux x86-64, "
         f"into {out}")
    pip("download", "--quiet", "--no-deps", "--dest", str(out), *target_options(),
        *[f"{name}=={version}" for name, version in packages])
    wheels = sorted(out.glob("*.whl"))
    total = sum(wheel.stat().st_size for wheel in wheels)
    if len(wheels) != len(packages):
        raise SystemExit(f"expected {len(packages)} wheels, found {len(wheels)} in {out}")
    if total > LIMIT_MIB * 2**20:
        raise SystemExit(f"the kit is {total / 2**20:.1f} MiB, over its limit of {LIMIT_MIB} MiB")
    manifest = {"python": PYTHON_VERSION, "platform": "manylinux x86-64",
                "needed": pinned(NEEDED) + pinned(NEEDED_WITHOUT_DEPS),
                "packages": {name: version for name, version in packages},
                "wheels": [wheel.name for wheel in wheels], "mib": round(total / 2**20, 2),
                "relied_on": relied_on, "machine": sorted(MACHINE)}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    echo(f"==> The kit: {len(wheels)} wheels, {total / 2**20:.1f} MiB (limit {LIMIT_MIB} MiB)")
    return manifest


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=KIT, help=f"the kit's folder (default {KIT})")
    args = parser.parse_args(argv)
    build(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
