"""autograder.sandbox.spawn: every process the grader needs is started by naming its target."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from autograder.sandbox import spawn
from autograder.sandbox.spawn import ForkServer, FreshInterpreter, fork_supported, open_spawner

KINDS = ["fresh"] + (["fork"] if fork_supported() else [])


def report(path: str, *words: str) -> None:
    """A target: write what this process is and got."""
    Path(path).write_text(" ".join([str(os.getpid()), str(os.getsid(0)), os.getcwd(),
                                    os.environ.get("SPAWN_TEST", "-"), *words]))


def paths(path: str) -> None:
    """A target: write whether this package's root is on sys.path and PYTHONPATH."""
    root = str(spawn.PACKAGE_ROOT)
    Path(path).write_text(f"{root in sys.path} {root in os.environ.get('PYTHONPATH', '')}")


@pytest.fixture(scope="module")
def server():
    if not fork_supported():
        pytest.skip("this platform cannot fork")
    with ForkServer(["json"]) as started:
        yield started.wait_ready()


@pytest.mark.parametrize("kind", KINDS)
def test_a_target_runs_alone_with_its_arguments_cwd_and_env(kind, request, tmp_path):
    spawner = request.getfixturevalue("server") if kind == "fork" else FreshInterpreter()
    out = tmp_path / "out.txt"
    process = spawner.start("tests.test_autograder_spawn:report", str(out), "a b", "c",
                            cwd=str(tmp_path), env={**os.environ, "SPAWN_TEST": "yes"})
    process.wait(timeout=60)
    pid, sid, cwd, env, *words = out.read_text().split(" ")
    assert int(pid) == process.pid != os.getpid() and int(sid) == process.pid  # own session
    assert (cwd, env, words) == (str(tmp_path), "yes", ["a", "b", "c"])


@pytest.mark.parametrize("kind", KINDS)
def test_a_target_that_fails_ends_its_process_only(kind, request, tmp_path):
    spawner = request.getfixturevalue("server") if kind == "fork" else FreshInterpreter()
    log = tmp_path / "stderr.log"
    process = spawner.start("tests.test_autograder_spawn:no_such_function", stderr=str(log))
    process.wait(timeout=60)
    assert "no_such_function" in log.read_text()
    assert process.returncode != 0 or kind == "fork"  # a forked child is not ours to reap


def test_fresh_is_used_where_fork_is_unavailable(monkeypatch, tmp_path):
    monkeypatch.setattr(spawn, "fork_supported", lambda: False)
    spawner = open_spawner("fork", ["json"])
    assert isinstance(spawner, FreshInterpreter) and spawner.kind == "fresh"
    out = tmp_path / "out.txt"
    spawner.start("tests.test_autograder_spawn:report", str(out)).wait(timeout=60)
    assert out.read_text().split(" ")[3] == os.environ.get("SPAWN_TEST", "-")


def test_targets_are_dotted_names():
    assert spawn.resolve_target("os.path:join") is os.path.join
    with pytest.raises(ValueError):
        spawn.resolve_target("os.path.join")
    with pytest.raises(ValueError):
        open_spawner("thread")


def test_the_cuda_probe_is_a_target(server):
    from autograder.sandbox.device import cuda_available
    from autograder.options import GradeOptions
    assert cuda_available(server) == cuda_available(FreshInterpreter()) in (True, False)
    resolved = GradeOptions().resolve(lambda: cuda_available(server))
    assert resolved.device == ("cuda" if cuda_available(server) else "cpu")


@pytest.mark.parametrize("kind", KINDS)
def test_only_a_given_environment_is_kept_exactly(kind, request, tmp_path):
    """Without env, the target can import what the grader can (the setup code of the checks
    imports the course's package); with one (a kernel's), it gets just that."""
    spawner = request.getfixturevalue("server") if kind == "fork" else FreshInterpreter()
    out = tmp_path / "paths.txt"
    spawner.start("tests.test_autograder_spawn:paths", str(out)).wait(timeout=60)
    assert out.read_text() == "True True"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    spawner.start("tests.test_autograder_spawn:paths", str(out), env=env).wait(timeout=60)
    assert out.read_text() == "False False"
