#!/usr/bin/env python3
"""``make lock``: write ``requirements.lock``, every package the course installs at one version,
for the image Gradescope builds (Python 3.12 on x86-64 Linux; ``python -m autograder
gradescope`` puts the lock in the zip and setup.sh installs with it as constraints).

uv resolves ``requirements.txt`` (``uv pip compile``) from PyPI for that Python and platform,
whatever this machine runs, and keeps each version the lock already pins: uv prefers the versions
of the file it writes. So after adding a line to requirements.txt, ``make lock`` pins the new
package and what it brings and leaves every other pin as it was; ``make lock UPGRADE=1``
(``--upgrade``) takes the newest versions requirements.txt allows instead. The lines of
requirements-nodeps.txt (installed without their dependencies) are copied in as they are.

    python scripts/lock.py [--upgrade]

tests/test_requirements_lock.py checks that the lock still meets every line of requirements.txt.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements.lock"
REQUIREMENTS = ROOT / "requirements.txt"
NODEPS = ROOT / "requirements-nodeps.txt"
PYTHON_VERSION = "3.12"                     # Ubuntu 22.04's uv-installed Python on Gradescope
PLATFORM = "x86_64-manylinux_2_35"          # Ubuntu 22.04's glibc is 2.35
TOOLS = ["uv"]                              # what setup.sh installs with, pinned here too
NODEPS_MARK = "# requirements-nodeps.txt, installed without dependencies"

HEADER = f"""\
# Every package of the course at one version, for Python {PYTHON_VERSION} on x86-64 Linux
# (Gradescope's image; setup.sh installs with this file as constraints). Do not edit: change
# requirements.txt, then run `make lock` (scripts/lock.py), which keeps the other pins.
# The torch pin also takes PyTorch's CPU build of that version (torch==X matches X+cpu); the
# CUDA packages below come with PyPI's build only and are never installed with the CPU one.
"""


def compile_command(lock: Path, requirements: Path, upgrade: bool) -> list:
    command = [sys.executable, "-m", "uv", "pip", "compile", str(requirements.name), "-",
               "--python-version", PYTHON_VERSION, "--python-platform", PLATFORM,
               "--custom-compile-command", "make lock", "--output-file", str(lock),
               "--no-python-downloads"]  # resolving needs no Python 3.12, only wheels' metadata
    return command + (["--upgrade"] if upgrade else [])


def nodeps_lines(path: Path) -> list:
    return [line.strip() for line in path.read_text().splitlines()
            if line.split("#", 1)[0].strip()]


def write_lock(lock: Path = LOCK, requirements: Path = REQUIREMENTS, nodeps: Path = NODEPS,
               upgrade: bool = False) -> None:
    done = subprocess.run(compile_command(lock, requirements, upgrade), cwd=requirements.parent,
                          input="\n".join(TOOLS) + "\n", text=True,
                          stdout=subprocess.DEVNULL)  # uv prints the lock too
    if done.returncode:
        sys.exit(f"uv pip compile failed (exit status {done.returncode}); {lock.name} unchanged")
    resolved = lock.read_text().rstrip("\n")  # uv wrote the whole file afresh
    lock.write_text(HEADER + resolved + "\n" + NODEPS_MARK + "\n"
                    + "\n".join(nodeps_lines(nodeps)) + "\n")


def main(argv: list) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upgrade", action="store_true",
                        help="take the newest versions requirements.txt allows")
    parser.add_argument("--lock", type=Path, default=LOCK)
    parser.add_argument("--requirements", type=Path, default=REQUIREMENTS)
    parser.add_argument("--nodeps", type=Path, default=NODEPS)
    args = parser.parse_args(argv)
    write_lock(args.lock.resolve(), args.requirements.resolve(), args.nodeps.resolve(),
               args.upgrade)
    print(f"Wrote {args.lock}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
