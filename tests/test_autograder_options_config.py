"""The grader's defaults from the course's nbgrader_config.py (c.Autograder.*, and nbgrader's
own c.Execute.timeout): a flag typed > nbgrader_config.py > the built-in default."""
from __future__ import annotations

import shutil

import pytest

from autograder.commands import cli
from autograder.options import default, service_limits
from tests.autograder_fixtures.submissions import COURSE, answered, write
from tests.helpers import autograder


def course(tmp_path, *settings: str):
    """The fixture course, with ``settings`` added to its nbgrader_config.py."""
    root = tmp_path / "course"
    shutil.copytree(COURSE, root)
    with (root / "nbgrader_config.py").open("a") as handle:
        handle.write("".join(f"{line}\n" for line in settings))
    return root


def grade_args(root, *flags):
    return cli.arguments(["grade", "submitted", "--assignment", "demo", "--out", "out",
                          "--course", str(root), *map(str, flags)])


def test_flag_beats_config_beats_default(tmp_path):
    root = course(tmp_path, "c.Autograder.cell_timeout = 30", "c.Autograder.jobs = 4",
                  'c.Autograder.device = "cpu"')
    args = grade_args(root)
    assert (args.cell_timeout, args.jobs, args.device) == (30.0, 4, "cpu")
    assert args.timeout == default("notebook")  # not set anywhere: built-in
    args = grade_args(root, "--cell-timeout", 7, "--jobs", 1, "--device", "cuda")
    assert (args.cell_timeout, args.jobs, args.device) == (7.0, 1, "cuda")
    assert cli.grade_options(args).limits.cell == 7.0
    plain = grade_args(course(tmp_path / "plain"))
    assert (plain.cell_timeout, plain.device) == (default("cell"), default("device"))


def test_nbgrader_execute_timeout_under_autograder(tmp_path):
    assert grade_args(course(tmp_path / "a", "c.Execute.timeout = 12")).cell_timeout == 12.0
    root = course(tmp_path / "b", "c.Execute.timeout = 12", "c.Autograder.cell_timeout = 5")
    assert grade_args(root).cell_timeout == 5.0
    assert grade_args(root, "--cell-timeout", 9).cell_timeout == 9.0


def test_service_limits_from_config(tmp_path):
    root = course(tmp_path, "c.Autograder.learner_storage = 2", "c.Autograder.max_cells = 50")
    args = cli.arguments(["serve", "--course", str(root)])
    got = service_limits(vars(args))
    assert (got.learner_bytes, got.max_cells) == (2 * 1024 ** 2, 50)


def test_settings_of_other_commands_are_ignored(tmp_path):
    root = course(tmp_path, "c.Autograder.max_connections = 5")  # serve's only
    assert grade_args(root).device == default("device")
    assert cli.arguments(["check", "nb.ipynb"]).kernel == default("kernel")  # no course


@pytest.mark.parametrize("setting,words", [
    ('c.Autograder.cell_timeout = "30"', "c.Autograder.cell_timeout must be a number"),
    ("c.Autograder.jobs = 2.5", "c.Autograder.jobs must be an integer"),
    ("c.Autograder.jobs = 0", "c.Autograder.jobs must be positive"),
    ('c.Autograder.device = "gpu"', "c.Autograder.device must be one of"),
    ("c.Autograder.cel_timeout = 3", "unknown setting c.Autograder.cel_timeout"),
    ('c.Execute.timeout = "x"', "c.Execute.timeout must be a number"),
])
def test_a_wrong_setting_is_exit_2_naming_it(tmp_path, setting, words):
    root = course(tmp_path, setting)
    done = autograder("gradescope", "--assignment", "demo", "--course", root,
                      "--out", tmp_path / "demo.zip")
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert words in done.stderr and "nbgrader_config.py" in done.stderr, done.stderr


def test_grade_end_to_end(tmp_path):
    """As an instructor runs it: the course says fresh kernels and the full profile on the
    CPU; the typed --profile wins over the course."""
    root = course(tmp_path, 'c.Autograder.device = "cpu"', 'c.Autograder.kernel = "fresh"',
                  'c.Autograder.profile = "full"', "c.Autograder.jobs = 1")
    write(tmp_path / "submitted", "alice", answered())
    done = autograder("grade", tmp_path / "submitted", "--assignment", "demo", "--out",
                      tmp_path / "out", "--course", root, "--no-progress",
                      "--profile", "quick")
    assert done.returncode == 0, done.stderr
    assert "on cpu (profile quick, fresh kernels" in done.stdout, done.stdout
