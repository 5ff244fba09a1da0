"""The GPU kit, proven on a stand-in for the lent GPU machines, which is also the course on the
lowest PyTorch it supports (2.11, what those machines have).

The stand-in is a Python 3.12 environment made once under ``_build/gpu-stand-in`` (a few
minutes, about 5 GB) with ``torch==2.11.*``, the matching torchvision, and of the machines' own
packages only those the course or the kit relies on: no Jupyter, papermill, jupytext, nbgrader or
d2l. ``make gpu-kit`` makes the kit as a user would; it is installed into the stand-in with
``pip install --no-index --no-deps`` (by ``scripts/gpu-run`` itself), and ``scripts/gpu-run``
then runs every step in the quick profile on the CPU. A package missing from the kit, or a step
that breaks, fails here.

Its chapters are the built book's published notebooks (``--notebooks``), what Colab and Binder
open: so this one run of each chapter after the book build also shows that they run from top to
bottom where ``import myst_nb`` fails (the stand-in has no myst-nb) and in a folder with no file
of the repository, printing every value the page glues (``dlperf.glue``).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest

from tests.helpers import python312

ROOT = Path(__file__).resolve().parent.parent
STAND_IN = ROOT / "_build" / "gpu-stand-in"
KIT = ROOT / "_build" / "gpu-kit"
LOWEST = ["torch==2.11.*", "torchvision==0.26.*"]
# The machines' packages the course imports itself (dlperf, the tests); the kit's manifest adds
# those the kit's wheels depend on.
MACHINE_USED = ["numpy", "matplotlib", "pandas", "scipy", "pytest"]
DLPERF_TESTS = ["test_parallel.py", "test_timing.py", "test_distributed.py", "test_profile.py",
                "test_hardware.py", "test_data.py"]
# In a folder the kit is installed in, once the install is through (tests/test_gpu_kit.py's own).
INSTALLED = ".kit-installed"
WHEEL = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?-(?P<python>[^-]+)-"
                   r"(?P<abi>[^-]+)-(?P<platform>[^-]+)\.whl$")

sys.path.insert(0, str(ROOT / "scripts"))
import gpu_kit  # noqa: E402  (scripts/ is no package)

# A tier of its own (``make gpu-rehearsal``, which CI runs after ``make test``): a second
# environment and a second run of every chapter, like a CI matrix's lowest-version entry.
pytestmark = [pytest.mark.integration, pytest.mark.gpu_kit]


def installs_on_python_312(python: str, abi: str) -> bool:
    """Whether a wheel's python and ABI tags fit CPython 3.12."""
    if python in ("py3", "py2.py3"):
        return abi == "none"
    stable = re.fullmatch(r"cp3(\d+)", python)
    return python == "cp312" or bool(stable and abi == "abi3" and int(stable.group(1)) <= 12)


def run(command, **kwargs):
    done = subprocess.run([str(c) for c in command], capture_output=True, text=True, **kwargs)
    assert done.returncode == 0, f"{command}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done


@pytest.fixture(scope="module")
def kit():
    """``make gpu-kit``, run as the README says; its manifest."""
    run(["make", "--no-print-directory", "gpu-kit"], cwd=ROOT, timeout=900)
    return json.loads((KIT / gpu_kit.MANIFEST).read_text())


@pytest.fixture(scope="module")
def stand_in(kit):
    """The stand-in's python, and its environment variables (the stand-in first on PATH)."""
    base = python312()
    if base is None:
        pytest.skip("no Python 3.12 on this machine")
    python, ready = STAND_IN / "bin" / "python", STAND_IN / ".ready"
    wanted = " ".join(LOWEST + MACHINE_USED + kit["relied_on"])
    if not ready.exists() or ready.read_text() != wanted:
        shutil.rmtree(STAND_IN, ignore_errors=True)
        run([base, "-m", "venv", STAND_IN])
        run([python, "-m", "pip", "install", "--quiet", *wanted.split()], timeout=1800)
        ready.write_text(wanted)
    env = {**os.environ, "PATH": f"{STAND_IN / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    for name in ("VIRTUAL_ENV", "PYTHONPATH", "DLPERF_PROFILE"):
        env.pop(name, None)
    missing = run([python, "-c", "import importlib.util as u; print([m for m in ('papermill', "
                   "'jupytext', 'ipykernel', 'nbgrader', 'd2l', 'myst_nb') if u.find_spec(m)])"], env=env)
    assert missing.stdout.strip() == "[]", f"the stand-in has more than the machines: {missing.stdout}"
    return python, env


def test_the_kit_fits_the_machines_one_version_each(kit):
    wheels = sorted(KIT.glob("*.whl"))
    assert [w.name for w in wheels] == kit["wheels"]
    assert sum(w.stat().st_size for w in wheels) <= gpu_kit.LIMIT_MIB * 2**20
    names = [gpu_kit.normalize(WHEEL.match(w.name).group("name")) for w in wheels]
    assert len(names) == len(set(names)), "two versions of one package would stop the install"
    machine = {gpu_kit.normalize(name) for name in gpu_kit.MACHINE}
    assert not machine & set(names), "the kit must not shadow the machines' own packages"
    for wheel in wheels:
        tags = WHEEL.match(wheel.name).groupdict()
        assert tags["platform"] == "any" or "x86_64" in tags["platform"], wheel.name
        assert tags["platform"] == "any" or "manylinux" in tags["platform"], wheel.name
        assert installs_on_python_312(tags["python"], tags["abi"]), wheel.name
    assert {"papermill", "jupytext", "ipykernel", "nbclient", "nbformat", "d2l"} <= set(names)


@pytest.fixture(scope="module")
def kit_site(tmp_path_factory):
    """Where the kit is installed for this module's tests: ``scripts/gpu-run`` installs it
    there itself, and the other tests use what it installed (else install it as it does)."""
    return tmp_path_factory.mktemp("kit") / "site"


def install_kit(python, env, site: Path) -> None:
    """The kit as ``scripts/gpu-run`` installs it, unless it already did into ``site``."""
    if (site / INSTALLED).exists():
        return
    run([python, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--upgrade",
         "--target", site, *sorted(KIT.glob("*.whl"))], env=env, timeout=600)
    (site / INSTALLED).write_text("")


def test_gpu_run_passes_on_the_stand_in(stand_in, built_book, tmp_path, kit_site):
    """``scripts/gpu-run`` as on a GPU machine (quick profile, the CPU): every step passes, and
    every published chapter notebook runs there."""
    python, env = stand_in
    out, site = tmp_path / "out", kit_site
    before = (ROOT / "status" / "gpu-runs.json").read_text()
    published = built_book.html / "_sources" / "chapters"
    done = subprocess.run([str(ROOT / "scripts" / "gpu-run"), "--profile", "quick", "--out",
                           str(out), "--site", str(site), "--budget", "2400",
                           "--chapter-jobs", "2",  # no GPU here: the pages only have to run
                           "--notebooks", str(published)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=3000)
    summary = json.loads((out / "summary.json").read_text())
    steps = {step["step"]: step for step in summary["steps"]}
    assert done.returncode == 0 and summary["ok"], (
        f"{json.dumps(summary, indent=1)[-6000:]}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    assert summary["python"].startswith("3.12")
    assert steps["install"]["wheels"] == len(list(KIT.glob("*.whl")))
    (site / INSTALLED).write_text("")  # the kit as gpu-run installed it, for the next tests
    # pytest -m gpu collected the whole suite there; without a GPU every GPU test skips.
    gpu_tests = steps["pytest -m gpu"]
    assert gpu_tests["failures"] == gpu_tests["errors"] == 0 and gpu_tests["skipped"] > 10
    chapters = steps["chapters"]["chapters"]
    assert steps["chapters"]["jobs"] == 2
    toc = re.findall(r"- file: (chapters/[\w-]+)", (ROOT / "_toc.yml").read_text())
    assert [c["page"] for c in chapters] == toc
    assert all(c["outcome"] == "passed" for c in chapters)
    with zipfile.ZipFile(out / "chapters.zip") as archive:
        assert sorted(archive.namelist()) == sorted(f"{p.split('/')[-1]}.ipynb" for p in toc)
        text = archive.read(f"{toc[0].split('/')[-1]}.ipynb").decode()
        assert "PyTorch 2.11" in text and "Run profile quick" in text
        for page in toc:
            assert_glued_values_printed(page, nbformat.reads(
                archive.read(f"{page.split('/')[-1]}.ipynb").decode(), as_version=4))
    cases = steps["grading"]["cases"]
    assert {c["assignment"] for c in cases} == {p.name for p in (ROOT / "solutions").iterdir()
                                                if p.is_dir()}
    assert len(cases) == len(list((ROOT / "tests" / "wrong_submissions").glob("*/*.toml"))) \
        + 2 * len({c["assignment"] for c in cases})
    assert all(c["outcome"] == "as expected" for c in cases)
    # No GPU here: no run is recorded, and the repository's file is left alone.
    assert steps["status page"]["gpu_runs"] == 0
    assert (ROOT / "status" / "gpu-runs.json").read_text() == before
    files = list(out.iterdir())
    assert len(files) <= 8 and all(f.stat().st_size <= 16 * 2**20 for f in files), files


def assert_glued_values_printed(page: str, nb) -> None:
    """Without myst-nb, ``dlperf.glue`` prints each value the page glues as ``name: value``."""
    printed = "".join(output.get("text", "") for cell in nb.cells
                      for output in cell.get("outputs", []) if output.get("name") == "stdout")
    glued = re.findall(r'glue\("([^"]+)"', "\n".join(cell.source for cell in nb.cells))
    assert glued, f"{page}: glues nothing"
    for key in glued:
        assert f"{key}: " in printed, f"{page}: {key} was neither glued nor printed"


def test_dlperf_passes_its_tests_on_the_lowest_torch(stand_in, kit_site):
    python, env = stand_in
    site = kit_site
    install_kit(python, env, site)
    env = {**env, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}"}
    version = run([python, "-c", "import torch; print(torch.__version__)"], env=env).stdout
    assert version.startswith("2.11."), version
    run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "ignore",
         *[str(ROOT / "tests" / name) for name in DLPERF_TESTS]], env=env, cwd=ROOT, timeout=1800)
