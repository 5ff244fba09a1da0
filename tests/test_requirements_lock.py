"""requirements.lock, the course's pins for Gradescope's image (``make lock``, scripts/lock.py):
it meets every line of requirements.txt and requirements-nodeps.txt, and regenerating it after
adding a requirement pins the new package and keeps every other pin."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from autograder.commands.gradescope import TOOLS, locked_versions, unlocked

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements.lock"


def requirement_lines(path: Path) -> list:
    return [line.split("#", 1)[0].strip() for line in path.read_text().splitlines()
            if line.split("#", 1)[0].strip() and not line.lstrip().startswith("-")]


def test_the_lock_meets_every_requirement_of_the_course():
    """Fails when a line was added to (or changed in) requirements.txt without `make lock`."""
    locked = locked_versions(LOCK.read_text())
    wanted = [*requirement_lines(ROOT / "requirements.txt"), *TOOLS]
    assert not unlocked(wanted, locked), (
        f"requirements.lock does not meet {unlocked(wanted, locked)}: run `make lock`")
    for line in requirement_lines(ROOT / "requirements-nodeps.txt"):  # copied in as they are
        name, version = line.split("==")
        assert locked[name] == version, line
    assert len(locked) > 100  # the dependencies too, not only the course's own lines


def test_the_check_names_each_requirement_the_lock_misses():
    locked = locked_versions("torch==2.14.1\n    # via -r requirements.txt\nnumpy==2.5.5\n"
                             "typing-extensions==4.16.0\n")
    assert locked == {"torch": "2.14.1", "numpy": "2.5.5", "typing-extensions": "4.16.0"}
    assert unlocked(["torch>=2.4", "numpy>=2,<3", "Typing_Extensions"], locked) == []
    assert unlocked(["torch==2.11.0", "numpy<2", "pandas", "numpy>=2"], locked) == [
        "torch==2.11.0", "numpy<2", "pandas"]
    # a line for another platform than the lock's (Python 3.12, x86-64 Linux) asks nothing
    assert unlocked(["pywin32; sys_platform == 'win32'", "tomli; python_version < '3.11'"],
                    locked) == []
    assert unlocked(["pandas; sys_platform == 'linux'"], locked) == ["pandas; sys_platform == 'linux'"]


@pytest.mark.integration
def test_make_lock_pins_a_new_requirement_and_keeps_every_other_pin(tmp_path):
    """What a helper adding a package does: a line in requirements.txt, then scripts/lock.py
    (`make lock`), resolving from PyPI for real. An older pin the lock holds (sympy, which
    torch allows at several versions) stays as it was; the new package and its dependencies
    are pinned; nothing else changes."""
    for name in ("requirements.txt", "requirements-nodeps.txt"):
        shutil.copy2(ROOT / name, tmp_path / name)
    with open(tmp_path / "requirements.txt", "a") as f:
        f.write("\n# added by the test\nhumanize\n")
    old = LOCK.read_text()
    sympy = re.search(r"^sympy==(.*)$", old, re.MULTILINE)
    assert sympy and sympy.group(1) != "1.13.3"
    (tmp_path / "requirements.lock").write_text(old.replace(sympy.group(0), "sympy==1.13.3"))
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "lock.py"),
                           "--lock", tmp_path / "requirements.lock",
                           "--requirements", tmp_path / "requirements.txt",
                           "--nodeps", tmp_path / "requirements-nodeps.txt"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    new = locked_versions((tmp_path / "requirements.lock").read_text())
    before = locked_versions(old)
    assert new["sympy"] == "1.13.3"
    assert "humanize" in new and "humanize" not in before
    assert {name: version for name, version in new.items() if name not in ("humanize", "sympy")
            } == {name: version for name, version in before.items() if name != "sympy"}
    assert not unlocked(requirement_lines(tmp_path / "requirements.txt"), new)
    text = (tmp_path / "requirements.lock").read_text()
    assert text.startswith("# Every package of the course at one version, for Python 3.12")
    assert text.rstrip().endswith("d2l==1.0.3")
